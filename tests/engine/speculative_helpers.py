"""Set-up shared by the GPU speculative-decoding tests: a plain run to record, a speculative engine
drafting by replaying it, and driving that engine's steps by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from shardinfer import LLM, SamplingParams
from shardinfer.engine.llm_engine import LLMEngine
from shardinfer.engine.outputs import RequestOutput
from shardinfer.testing.replay_drafter import ReplayProposer

DEMO = Path(__file__).resolve().parents[2] / "examples" / "models" / "tiny-dsv3-demo"


def random_prompts(vocab: int, lengths: tuple[int, ...], seed: int) -> list[list[int]]:
    """Prompts of random token ids, one per length, the same for a seed."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def recorded(outs: list[RequestOutput]) -> dict[str, list[int]]:
    """A plain run's outputs as the replay drafter's recording: request r<i> -> its token ids."""
    return {f"r{i}": list(o.outputs[0].token_ids) for i, o in enumerate(outs)}


def replay_drafts(engine: LLMEngine, outs: list[RequestOutput], alpha: float, seed: int) -> None:
    """Make the engine draft by replaying `outs`, each draft token right with probability alpha."""
    assert engine.drafter is not None
    engine.drafter.proposer = ReplayProposer(recorded(outs), alpha, engine.model_config.vocab_size, seed=seed)


def add_requests(engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams]) -> None:
    """Requests r0, r1, ... (the ids the replay drafter's recording uses)."""
    for i, (ids, p) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(f"r{i}", ids, p)


def finish(engine: LLMEngine, count: int) -> list[RequestOutput]:
    """Step the engine until every request is done; the outputs of r0 .. r<count - 1> in order."""
    done: dict[str, RequestOutput] = {}
    while engine.has_unfinished():
        for out in engine.step():
            done[out.request_id] = out
    return [done[f"r{i}"] for i in range(count)]


def replay_setup(
    qwen3_dir: Path, prompt_seed: int, **spec_kwargs: Any
) -> tuple[LLMEngine, list[RequestOutput]]:
    """Five random prompts (160 sampled tokens each, no end of sequence) decoded plainly on CUDA,
    then a speculative engine (spec_kwargs) drafting by replaying that run at alpha 0.7, with the
    same requests added and not yet stepped. Returns the engine and the plain outputs."""
    plain = LLM(qwen3_dir, device="cuda", dtype="bfloat16", max_num_seqs=8)
    prompts = random_prompts(plain.llm_engine.model_config.vocab_size, (5, 33, 70, 2, 129), prompt_seed)
    params = [
        SamplingParams(temperature=1.0, top_p=0.9, max_tokens=160, ignore_eos=True, seed=i, logprobs=2)
        for i in range(len(prompts))
    ]
    outs = plain.generate(prompts, params)
    engine = LLM(qwen3_dir, device="cuda", dtype="bfloat16", max_num_seqs=8, **spec_kwargs).llm_engine
    replay_drafts(engine, outs, 0.7, seed=1)
    add_requests(engine, prompts, params)
    return engine, outs
