"""The bytes a decode step reads (bench/gpu_timing.decode_bytes), which every HBM floor in the
benchmarks divides by: checked on tiny CPU engines against a count of the model's own tensors."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.gpu_timing import StepBytes, decode_bytes
from shardinfer import LLM
from shardinfer.engine.models.deepseek_moe import DeepseekMoE
from shardinfer.testing.tiny_checkpoint import make_tiny_checkpoint


def _bytes(params) -> int:
    return sum(p.numel() * p.element_size() for p in params)


@pytest.fixture(scope="module")
def dsv3_engine(tmp_path_factory: pytest.TempPathFactory):
    model_dir = make_tiny_checkpoint(tmp_path_factory.mktemp("dsv3"), "deepseek_v3")
    return LLM(model_dir, device="cpu", dtype="float32").llm_engine


def test_moe_steps_read_the_dense_weights_and_the_experts_their_rows_touch(dsv3_engine) -> None:
    model = dsv3_engine.model
    moe = [m for m in model.modules() if isinstance(m, DeepseekMoE)]
    assert moe and model.mtp is not None
    sb = decode_bytes(dsv3_engine)
    experts = _bytes(p for m in moe for p in m.experts.parameters())
    left_out = _bytes(model.model.embed_tokens.parameters()) + _bytes(model.mtp.parameters())
    assert sb.experts == experts
    assert sb.dense == _bytes(model.parameters()) - experts - left_out
    e, k = moe[0].gate.routing.n_routed_experts, moe[0].gate.routing.top_k
    assert (sb.num_experts, sb.top_k) == (e, k)
    # One row reads exactly its k experts of e; many rows read nearly all of them.
    assert sb.weights(1) == pytest.approx(sb.dense + experts * k / e, rel=1e-12)
    assert sb.weights(10_000) == pytest.approx(sb.dense + experts, rel=1e-9)
    assert sb.weights(1) < sb.weights(2) < sb.weights(8)
    # The MTP layer counts only when it drafts.
    assert decode_bytes(dsv3_engine, drafting_mtp=True).dense == sb.dense + _bytes(model.mtp.parameters())


def test_dense_steps_read_every_weight_but_an_unshared_embedding(tmp_path: Path) -> None:
    for tied in (False, True):
        model_dir = make_tiny_checkpoint(tmp_path / str(tied), "qwen3", tie_word_embeddings=tied)
        engine = LLM(model_dir, device="cpu", dtype="float32").llm_engine
        sb = decode_bytes(engine)
        total = _bytes(engine.model.parameters())
        embed = _bytes(engine.model.embed_tokens.parameters())
        assert sb.experts == 0 and sb.weights(1) == sb.weights(256)
        assert sb.dense == (total if tied else total - embed)


def test_a_floor_is_its_bytes_over_the_bandwidth() -> None:
    sb = StepBytes(dense=1000, experts=0, num_experts=0, top_k=0, kv_per_token=10)
    assert sb.floor_s(4, 50, 100.0) == pytest.approx((1000 + 50 * 10) / 100.0)
