"""Asynchronous scheduling (the host plans step N+1 before reading step N's tokens) must give
exactly the outputs of synchronous scheduling: same tokens, logprobs, texts and finish reasons."""

from __future__ import annotations

import random

import pytest

from shardinfer import LLM, SamplingParams


def _key(outs) -> list[tuple]:
    return [
        (
            o.prompt_token_ids,
            c.token_ids,
            c.logprobs,
            c.top_logprobs,
            c.text,
            c.finish_reason,
            c.stop_reason,
            o.prompt_logprobs,
        )
        for o in outs
        for c in o.outputs
    ]


def _workload(vocab: int, tokenizer) -> tuple[list[list[int]], list[SamplingParams]]:
    rng = random.Random(3)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(2, 50))] for _ in range(14)]
    shared = [rng.randrange(vocab) for _ in range(40)]
    prompts += [shared + [rng.randrange(vocab) for _ in range(rng.randint(1, 9))] for _ in range(4)]
    eos = tokenizer.eos_token_ids[0]
    params = []
    for i in range(len(prompts)):
        kind = i % 6
        if kind == 0:
            params.append(SamplingParams(temperature=0.0, max_tokens=rng.randint(1, 30), ignore_eos=True))
        elif kind == 1:
            params.append(SamplingParams(temperature=1.0, max_tokens=25, seed=i, logprobs=2))
        elif kind == 2:  # stops early on a common token id, sometimes eos
            params.append(
                SamplingParams(temperature=0.9, max_tokens=40, seed=i, stop_token_ids=[eos, 5, 17, 42])
            )
        elif kind == 3:
            params.append(SamplingParams(temperature=0.8, max_tokens=30, seed=i, stop=["e", " t"]))
        elif kind == 4:
            params.append(SamplingParams(temperature=0.7, max_tokens=20, seed=i, n=3))
        else:
            params.append(
                SamplingParams(
                    temperature=1.0, max_tokens=15, seed=i, repetition_penalty=1.3, prompt_logprobs=1
                )
            )
    return prompts, params


@pytest.mark.parametrize(
    "engine_kwargs",
    [
        {},
        {"max_num_batched_tokens": 7},
        {"num_kv_blocks": 14, "block_size": 8},
        {"max_num_seqs": 3, "admission_batch": 2},
    ],
    ids=["plain", "chunked", "preempting", "few-seqs"],
)
def test_async_equals_sync(qwen3_dir, engine_kwargs) -> None:
    sync = LLM(qwen3_dir, device="cpu", dtype="float32", async_scheduling=False, **engine_kwargs)
    prompts, params = _workload(sync.llm_engine.model_config.vocab_size, sync.tokenizer)
    want = _key(sync.generate(prompts, params))
    fast = LLM(qwen3_dir, device="cpu", dtype="float32", async_scheduling=True, **engine_kwargs)
    got = _key(fast.generate(prompts, params))
    assert got == want
    if "num_kv_blocks" in engine_kwargs:
        assert fast.llm_engine.scheduler.num_preemptions > 0
    engine = fast.llm_engine
    assert not engine.has_unfinished() and engine.in_flight is None
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_async_streaming_abort_and_finish_reasons(qwen3_dir) -> None:
    llm = LLM(qwen3_dir, device="cpu", dtype="float32", async_scheduling=True)
    engine = llm.llm_engine
    p = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    engine.add_request("a", [1, 2, 3], p)
    engine.add_request("b", [4, 5, 6], p.replace(max_tokens=50))
    engine.step()
    engine.step()
    aborted = engine.abort("b")
    assert aborted is not None and aborted.outputs[0].finish_reason == "abort"
    assert -1 not in aborted.outputs[0].token_ids
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    assert [o.request_id for o in outs] == ["a"] and len(outs[0].outputs[0].token_ids) == 6
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
