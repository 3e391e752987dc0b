"""A step's memory peak, set aside before the KV cache takes its share (engine/step_peak.py,
engine/kv_cache.py). The measurement itself needs CUDA's allocator statistics: its GPU test checks
it against the peak of real steps of the budget it measured (pytest -m gpu)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from shardinfer.engine.kv_cache import bytes_per_block, plan_num_blocks
from shardinfer.engine.llm_engine import LLMEngine
from shardinfer.engine.models.base import KVLayerSpec
from shardinfer.engine.step_peak import run_peak_step

SPECS = [KVLayerSpec(((2, 8), (2, 8)), None)]


def _cfg(**overrides: object) -> SimpleNamespace:
    base = {
        "num_kv_blocks": None,
        "kv_cache_memory_bytes": None,
        "gpu_memory_utilization": 0.5,
        "block_size": 16,
        "kv_cache_dtype": "auto",
        "num_seqs": 8,
        "token_budget": 4096,
    }
    return SimpleNamespace(**{**base, **overrides})


@pytest.fixture
def free_bytes(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    def set_free(n: int) -> None:
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (n, 2 * n))

    return set_free


def test_the_step_peak_comes_out_of_the_share_of_free_memory(free_bytes: Callable[[int], None]) -> None:
    per_block = bytes_per_block(SPECS, 16, torch.float16)
    free_bytes(1000 * per_block)
    cuda = torch.device("cuda")
    assert plan_num_blocks(_cfg(), SPECS, cuda, torch.float16, 4096) == 500
    assert plan_num_blocks(_cfg(), SPECS, cuda, torch.float16, 4096, step_peak=100 * per_block + 1) == 399
    # An explicit byte budget or block count is the user's: the peak is not taken out of it.
    explicit = _cfg(kv_cache_memory_bytes=30 * per_block)
    assert plan_num_blocks(explicit, SPECS, cuda, torch.float16, 4096, step_peak=10**12) == 30
    assert plan_num_blocks(_cfg(num_kv_blocks=7), SPECS, cuda, torch.float16, 4096, step_peak=10**12) == 7


def test_a_peak_that_leaves_no_room_names_it_and_the_fix(free_bytes: Callable[[int], None]) -> None:
    free_bytes(8 * 2**30)
    with pytest.raises(ValueError) as e:
        plan_num_blocks(_cfg(), SPECS, torch.device("cuda"), torch.float16, 4096, step_peak=4 * 2**30)
    msg = str(e.value)
    assert "gpu_memory_utilization=0.5 of the free memory leaves 0.00 GiB" in msg
    assert "measured peak of 4.00 GiB (max_num_batched_tokens=4096, max_num_seqs=8)" in msg
    assert "raise gpu_memory_utilization, or lower max_num_batched_tokens / max_num_seqs" in msg


@pytest.mark.parametrize(
    ("family", "overrides"),
    [("qwen3", {}), ("deepseek_v3", {})],
)
def test_the_peak_step_runs_on_a_one_block_cache_and_writes_nothing(
    tiny_checkpoint: Callable[..., Path], family: str, overrides: dict[str, int]
) -> None:
    """The pass the GPU measures, run on the CPU: a full budget of prefill longer than one KV block
    holds, the LM head, the sampler and a chunk of prompt scores, on a cache of one block that it
    leaves as it was."""
    engine = LLMEngine(tiny_checkpoint(family, **overrides), device="cpu", dtype="float32", num_kv_blocks=8)
    runner = engine.runner
    kept = runner.kv_caches
    from shardinfer.engine.kv_cache import allocate_kv_caches

    runner.kv_caches = allocate_kv_caches(runner.kv_specs, 1, runner.block_size, runner.dtype, runner.device)
    try:
        run_peak_step(runner, 100, 7)
        assert all(not t.any() for layer in runner.kv_caches for t in layer)
    finally:
        runner.kv_caches = kept


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["qwen3", "deepseek_v3"])
def test_gpu_the_measured_peak_covers_real_steps_of_its_budget(
    tiny_checkpoint: Callable[..., Path], family: str
) -> None:
    """Full-budget prefill steps scoring every prompt position, sampling with filters, then decode
    steps: what they allocate beyond the engine's start-up stays within the peak it measured."""
    from shardinfer import LLM, SamplingParams

    overrides = {"qk_rope_head_dim": 16, "kv_lora_rank": 64} if family == "deepseek_v3" else {}
    llm = LLM(
        tiny_checkpoint(family, **overrides),
        device="cuda",
        max_num_batched_tokens=2048,
        max_num_seqs=32,
        enable_prefix_caching=False,
    )
    runner = llm.llm_engine.runner
    assert runner.step_peak_bytes > 0
    prompts = [[(7 * i + 3 * s) % 300 + 20 for i in range(400)] for s in range(12)]
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=8, prompt_logprobs=2, seed=0)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    outs = llm.generate(prompts, params, use_tqdm=False)
    torch.cuda.synchronize()
    used = torch.cuda.max_memory_allocated() - before
    assert all(len(o.outputs[0].token_ids) == 8 for o in outs)
    assert 0 < used <= runner.step_peak_bytes * 1.1 + (8 << 20), (used, runner.step_peak_bytes)


def test_a_step_that_runs_out_of_memory_names_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from shardinfer.engine import step_peak

    def out_of_memory(*args: object) -> None:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")

    monkeypatch.setattr(step_peak, "run_peak_step", out_of_memory)
    with pytest.raises(ValueError) as e:
        step_peak.run_or_explain(SimpleNamespace(), 16384, 512)  # type: ignore[arg-type]
    assert str(e.value).startswith(
        "one step of max_num_batched_tokens=16384 tokens and 512 sampling rows does not fit"
    )
    assert "lower max_num_batched_tokens (and max_num_seqs)" in str(e.value)
    assert isinstance(e.value.__cause__, torch.cuda.OutOfMemoryError)
