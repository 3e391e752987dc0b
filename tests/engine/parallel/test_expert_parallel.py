"""Expert-parallel ranks (gloo, CPU) against the one-process engine on the same DeepSeek-V3 checkpoint.

The reference is a plain LLM on one process: every rank count, placement and replica choice must
give its tokens and logprobs bit for bit, also when requests are preempted and recomputed.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from shardinfer import LLM, SamplingParams
from shardinfer.engine.outputs import RequestOutput
from shardinfer.engine.parallel.group import ExpertParallelError
from shardinfer.engine.parallel.placement import static_placement
from shardinfer.engine.parallel.ranks import ExpertParallelEngine

PROMPTS = [[1 + (i * 7 + j * 3) % 300 for j in range(4 + 5 * i)] for i in range(7)]


def _params() -> list[SamplingParams]:
    return [
        SamplingParams(temperature=1.0, max_tokens=6 + 2 * i, seed=50 + i, logprobs=2, ignore_eos=True)
        for i in range(len(PROMPTS))
    ]


@pytest.fixture(scope="module")
def dsv3(tiny_checkpoint: Callable[..., Path]) -> Path:
    return tiny_checkpoint("deepseek_v3")


@pytest.fixture(scope="module")
def single(dsv3: Path) -> list[RequestOutput]:
    return LLM(dsv3, device="cpu", dtype="float32").generate(PROMPTS, _params(), use_tqdm=False)


def _run(
    engine: ExpertParallelEngine, prompts: list[list[int]], params: list[SamplingParams], tag: str = "r"
) -> dict[str, RequestOutput]:
    for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(f"{tag}{i}", p, sp)
    done: dict[str, RequestOutput] = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    return done


def _same(reference: list[RequestOutput], got: dict[str, RequestOutput], tag: str = "r") -> None:
    for i, ref in enumerate(reference):
        a, b = ref.outputs[0], got[f"{tag}{i}"].outputs[0]
        assert b.token_ids == a.token_ids, f"request {i}: tokens differ"
        assert b.logprobs == a.logprobs, f"request {i}: logprobs differ"
        assert b.top_logprobs == a.top_logprobs, f"request {i}: top logprobs differ"


@pytest.mark.parametrize(("ranks", "redundant", "rebalance_steps"), [(2, 0, 0), (4, 0, 0), (4, 4, 3)])
def test_ranks_give_the_one_process_bits_under_preemption(
    dsv3: Path, single: list[RequestOutput], ranks: int, redundant: int, rebalance_steps: int
) -> None:
    # 4 blocks of 16 tokens per rank hold the longest request but not all of a rank's: ranks preempt and recompute.
    # With rebalance_steps the experts move between ranks every few steps, requests in flight.
    engine = ExpertParallelEngine(
        dsv3,
        expert_parallel_size=ranks,
        expert_redundancy=redundant,
        dtype="float32",
        num_kv_blocks=4,
        expert_rebalance_steps=rebalance_steps,
    )
    start = engine.placement
    try:
        _same(single, _run(engine, PROMPTS, _params()))
        stats = engine.stats()
    finally:
        engine.close()
    assert stats["preemptions"] > 0  # the case the test is about happened
    if rebalance_steps:
        assert stats["expert_rebalances"] >= 2 and engine.placement != start  # experts did move
    assert stats["expert_parallel_size"] == ranks
    assert stats["finished_requests"] == len(PROMPTS)
    rows = [stats[f"rank{i}_expert_rows"] for i in range(ranks)]
    assert all(r > 0 for r in rows)  # every rank computed experts for others' tokens
    assert stats["moe_lb"] >= 1.0


def test_llm_api_and_rebalanced_placement_keep_the_bits(dsv3: Path, single: list[RequestOutput]) -> None:
    llm = LLM(
        dsv3, device="cpu", dtype=torch.float32, expert_parallel_size=2
    )  # a torch dtype reaches the ranks
    engine = llm.llm_engine
    assert isinstance(engine, ExpertParallelEngine)
    try:
        first = llm.generate(PROMPTS, _params(), use_tqdm=False)
        for ref, got in zip(single, first, strict=True):
            assert got.outputs[0].token_ids == ref.outputs[0].token_ids
            assert got.outputs[0].logprobs == ref.outputs[0].logprobs
        load = engine.expert_load()
        assert load.shape == (2, 8) and float(load.sum()) > 0  # two MoE layers, eight experts
        before = engine.placement
        after = engine.rebalance(redundant=2)
        assert after != before and after.num_physical == 10
        hottest = int(load.sum(dim=0).argmax())
        assert len(after.replicas(hottest)) >= 2  # the busiest expert got a replica
        second = llm.generate(PROMPTS, _params(), use_tqdm=False)
    finally:
        engine.close()
    for ref, got in zip(single, second, strict=True):
        assert got.outputs[0].token_ids == ref.outputs[0].token_ids
        assert got.outputs[0].logprobs == ref.outputs[0].logprobs


def _on_two_ranks(
    model: Path, run: Callable[[LLM], list[RequestOutput]], **engine: Any
) -> tuple[list[RequestOutput], dict[str, float]]:
    """run(llm) on an LLM of two expert-parallel ranks; its outputs and the engine's stats."""
    llm = LLM(model, device="cpu", dtype="float32", expert_parallel_size=2, **engine)
    try:
        return run(llm), llm.llm_engine.stats()
    finally:
        llm.llm_engine.close()


def test_ngram_speculation_on_ranks_keeps_the_bits(dsv3: Path) -> None:
    # Repetitive prompts, so that drafts are made and some accepted; 6 KV blocks a rank preempt.
    prompts = [[1 + (i * 7 + j * 3) % 20 for j in range(30)] for i in range(6)]
    params = [
        SamplingParams(
            temperature=0.0 if i % 2 else 1.0, max_tokens=20, seed=5 + i, logprobs=2, ignore_eos=True
        )
        for i in range(6)
    ]
    reference = LLM(dsv3, device="cpu", dtype="float32").generate(prompts, params, use_tqdm=False)
    got, stats = _on_two_ranks(
        dsv3, lambda llm: llm.generate(prompts, params, use_tqdm=False), speculative="ngram", num_kv_blocks=6
    )
    for ref, out in zip(reference, got, strict=True):
        assert out.outputs[0].token_ids == ref.outputs[0].token_ids
        assert out.outputs[0].logprobs == ref.outputs[0].logprobs
        assert out.outputs[0].top_logprobs == ref.outputs[0].top_logprobs
    assert (
        stats["accepted_draft_tokens"] > 0 and stats["preemptions"] > 0
    )  # drafts verified, under preemption


def test_mtp_speculation_on_ranks_keeps_the_bits() -> None:
    """The demo model's trained MTP layer drafts on each rank with its experts whole (no exchange),
    while the main layers' experts stay split; 3 KV blocks a rank preempt."""
    model = Path(__file__).resolve().parents[3] / "examples" / "models" / "tiny-dsv3-demo"
    chats = [
        [{"role": "user", "content": c}]
        for c in (
            "What is 4821 + 377?",
            "Reverse the letters: p a r q u e t",
            "Sort these words alphabetically: zebra anchor",
            "Extract name, age and city as JSON: Vera, 44, lives in Lima.",
        )
    ]
    params = [
        SamplingParams(temperature=0.0, max_tokens=60, logprobs=1),
        SamplingParams(temperature=0.8, max_tokens=60, seed=5),
        SamplingParams(temperature=0.0, max_tokens=60),
        SamplingParams(temperature=1.0, top_p=0.9, max_tokens=60, seed=9),
    ]
    reference = LLM(model, device="cpu", dtype="float32").chat(chats, params, use_tqdm=False)
    got, stats = _on_two_ranks(
        model,
        lambda llm: llm.chat(chats, params, use_tqdm=False),
        speculative="mtp",
        speculative_depth=2,
        num_kv_blocks=3,
    )
    for ref, out in zip(reference, got, strict=True):
        assert out.outputs[0].token_ids == ref.outputs[0].token_ids
        assert out.outputs[0].logprobs == ref.outputs[0].logprobs
    assert stats["accepted_draft_tokens"] > 0 and stats["preemptions"] > 0


def test_a_killed_rank_fails_the_step_naming_it(dsv3: Path) -> None:
    engine = ExpertParallelEngine(dsv3, expert_parallel_size=2, dtype="float32", timeout_s=60)
    try:
        for i, (p, sp) in enumerate(zip(PROMPTS, _params(), strict=True)):
            engine.add_request(f"r{i}", p, sp)
        engine.step()
        engine.ranks[1].proc.send_signal(signal.SIGKILL)
        engine.ranks[1].proc.wait()
        with pytest.raises(ExpertParallelError, match=r"rank 1: .*exit code -9"):
            while engine.has_unfinished():
                engine.step()
        assert engine.ranks == []  # every rank was stopped with it
        with pytest.raises(
            ExpertParallelError, match=r"has stopped \(step \d+ failed: expert-parallel rank 1"
        ):
            engine.add_request("later", PROMPTS[0], _params()[0])
    finally:
        engine.close()


def test_bad_parallel_settings_are_refused_with_the_value(dsv3: Path, qwen3_dir: Path) -> None:
    with pytest.raises(ValueError, match="expert_parallel_size=2 and data_parallel_size=4"):
        ExpertParallelEngine(dsv3, expert_parallel_size=2, data_parallel_size=4)
    with pytest.raises(ValueError, match="expert_redundancy=2 needs expert_parallel_size > 1"):
        LLM(dsv3, device="cpu", expert_redundancy=2)
    with pytest.raises(ValueError, match="expert_rebalance_steps=5 needs expert_parallel_size > 1"):
        LLM(dsv3, device="cpu", expert_rebalance_steps=5)
    with pytest.raises(ValueError, match="expert_rebalance_steps=-1: must be >= 0"):
        ExpertParallelEngine(dsv3, expert_parallel_size=2, expert_rebalance_steps=-1)
    with pytest.raises(ValueError, match="expert_parallel_size=0"):
        LLM(dsv3, device="cpu", expert_parallel_size=0)
    with pytest.raises(ValueError, match="has no routed experts"):
        ExpertParallelEngine(qwen3_dir, expert_parallel_size=2)
    with pytest.raises(ValueError, match="8 slots do not split evenly over num_ranks=3"):
        ExpertParallelEngine(dsv3, expert_parallel_size=3)


def test_a_refused_request_raises_the_engines_error_and_the_ranks_go_on(
    dsv3: Path, single: list[RequestOutput]
) -> None:
    from shardinfer.errors import GrammarError, PromptTooLong

    llm = LLM(dsv3, device="cpu", dtype="float32", expert_parallel_size=2, max_model_len=64)
    engine = llm.llm_engine
    try:
        with pytest.raises(PromptTooLong, match="prompt has 64 tokens; max_model_len=64"):
            engine.add_request("long", list(range(1, 65)), SamplingParams(max_tokens=2))
        with pytest.raises(ValueError, match="takes n=1"):
            engine.add_request("two", [1, 2, 3], SamplingParams(n=2))
        bad_schema = {"schema_type": "json", "schema": {"type": "integer", "minimum": "zero"}}
        with pytest.raises(GrammarError, match="invalid json schema"):
            llm.generate(PROMPTS, SamplingParams(max_tokens=3, structured_output=bad_schema), use_tqdm=False)
        with pytest.raises(GrammarError, match="invalid json schema") as refused:  # the rank's own check
            engine.add_request(
                "schema", [1, 2, 3], SamplingParams(max_tokens=3, structured_output=bad_schema)
            )
        assert refused.value.error_code == "invalid_schema"
        assert not engine.has_unfinished()  # nothing was queued by the refusals
        after = llm.generate(PROMPTS, _params(), use_tqdm=False)  # and the ranks still serve
    finally:
        engine.close()
    for ref, got in zip(single, after, strict=True):
        assert got.outputs[0].token_ids == ref.outputs[0].token_ids


def test_an_engine_outside_a_rank_process_is_refused(dsv3: Path) -> None:
    from shardinfer.engine.llm_engine import LLMEngine

    with pytest.raises(ValueError, match="built by its rank processes"):
        LLMEngine(dsv3, device="cpu", expert_parallel_size=2)


def test_rows_and_placement_wire_format_round_trips() -> None:
    from shardinfer.engine.outputs import CompletionOutput
    from shardinfer.engine.parallel import wire

    out = RequestOutput(
        "a",
        None,
        [1, 2],
        [None, -0.5],
        [CompletionOutput(0, "x", [3], [-0.25], [[(3, -0.25), (4, -2.0)]], "length", seed=9)],
        prompt_top_logprobs=[None, [(2, -0.5)]],
    )
    import json

    back = wire.output_from_dict(json.loads(json.dumps(wire.output_to_dict(out))))
    assert back == out
    assert torch.equal(static_placement(8, 2).replica_counts(), torch.ones(8, dtype=torch.int64))
