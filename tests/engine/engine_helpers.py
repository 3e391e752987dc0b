"""Run the engine's model on a list of prompts as one varlen batch and return every position's logits."""

from __future__ import annotations

import torch

from shardinfer.engine.llm_engine import LLMEngine
from shardinfer.engine.sampling_params import SamplingParams


@torch.no_grad()
def batch_logits(engine: LLMEngine, prompts: list[list[int]]) -> list[torch.Tensor]:
    """All prompts prefilled in one step (the budget must allow it); logits [len, V] per prompt."""
    for i, ids in enumerate(prompts):
        engine.add_request(f"logits-{i}", ids, SamplingParams(max_tokens=1))
    batch = engine.scheduler.schedule()
    assert len(batch) == len(prompts), "the step must hold every prompt whole"
    input_ids, positions, ctx = engine.runner._prepare(batch)
    hidden = engine.model(input_ids, positions, ctx)
    logits = engine.model.compute_logits(hidden)
    out, start = [], 0
    for ids in prompts:
        out.append(logits[start : start + len(ids)])
        start += len(ids)
    for i in range(len(prompts)):
        engine.abort(f"logits-{i}")
    return out


def output_key(outs) -> list[tuple]:  # type: ignore[no-untyped-def]
    """What must match bitwise between runs: (token ids, logprobs, top logprobs) of every completion."""
    return [(c.token_ids, c.logprobs, c.top_logprobs) for o in outs for c in o.outputs]
