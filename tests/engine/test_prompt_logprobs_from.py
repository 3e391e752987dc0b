"""prompt_logprobs_from: logprobs of a prompt's tail only, with the head served by the prefix cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardinfer.engine.llm_engine import LLMEngine
from shardinfer.engine.sampling_params import SamplingParams

PARAMS = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)


def _run(engine: LLMEngine, rid: str, ids: list[int], start: int) -> object:
    engine.add_request(rid, ids, PARAMS, prompt_logprobs_from=start)
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    (out,) = outs
    return out


def test_tail_logprobs_equal_the_full_ones_and_reuse_the_cached_head(qwen3_dir: Path) -> None:
    context = [(7 * i + 3) % 300 + 20 for i in range(37)]
    full_engine = LLMEngine(qwen3_dir, device="cpu", dtype="float32", num_kv_blocks=64)
    engine = LLMEngine(qwen3_dir, device="cpu", dtype="float32", num_kv_blocks=64)
    for n, tail in enumerate(([40, 41, 42], [50, 51])):
        ids = context + tail
        full = _run(full_engine, f"full{n}", ids, 1)
        part = _run(engine, f"part{n}", ids, len(context))
        assert part.prompt_logprobs[: len(context)] == [None] * len(context)
        assert part.prompt_top_logprobs[: len(context)] == [None] * len(context)
        got = part.prompt_logprobs[len(context) :]
        want = full.prompt_logprobs[len(context) :]
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-5
        assert [t[0][0] for t in part.prompt_top_logprobs[len(context) :]] == [
            t[0][0] for t in full.prompt_top_logprobs[len(context) :]
        ]
        # The second tail finds the context's full blocks (the last context position is recomputed).
        assert part.num_cached_tokens == (0 if n == 0 else (len(context) - 1) // 16 * 16)
        assert full.num_cached_tokens == 0  # whole-prompt logprobs never read the cache
    with pytest.raises(ValueError, match="prompt_logprobs_from"):
        engine.add_request("bad", context, PARAMS, prompt_logprobs_from=len(context))
