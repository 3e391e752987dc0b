"""Randomized differential stress: a request's output does not depend on how the engine ran it.

A seeded workload (shared prefixes, exact duplicates, repetitive prompts that ngram drafts hit,
n > 1, stop strings, min_tokens, logprobs, prompt logprobs, prompt-only scoring requests, lengths
that end exactly at max_model_len) runs once per request alone on a plain engine, the reference, then all together
under engine configurations that force preemption, chunked prefill, single-token blocks,
speculative decoding and asynchronous scheduling. Every output field must match bit for bit, and
every KV block must be free again afterwards.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from shardinfer import LLM, SamplingParams
from shardinfer.engine.llm_engine import LLMEngine
from shardinfer.engine.outputs import RequestOutput
from shardinfer.errors import PromptTooLong

MAX_MODEL_LEN = 64
NUM_REQUESTS = 18

CONFIGS: list[dict[str, Any]] = [
    # preemption and recomputation, with and without the prefix cache
    dict(num_kv_blocks=6, block_size=16),
    dict(num_kv_blocks=5, block_size=16, enable_prefix_caching=False),
    # one-token blocks, tight enough to preempt
    dict(block_size=1, num_kv_blocks=90),
    # chunked prefill: one sequence at a time, then many with a tiny token budget
    dict(max_num_seqs=1, max_num_batched_tokens=7),
    dict(max_num_seqs=64, max_num_batched_tokens=5, num_kv_blocks=7),
    dict(max_num_seqs=3, async_scheduling=True, num_kv_blocks=6, max_num_batched_tokens=13),
    dict(speculative="ngram", speculative_depth=1, max_num_seqs=3),
    dict(
        speculative="ngram",
        speculative_depth=3,
        speculative_budget="fixed",
        num_kv_blocks=6,
        async_scheduling=True,
    ),
    dict(
        speculative="ngram",
        speculative_depth=2,
        speculative_budget="fixed",
        block_size=1,
        num_kv_blocks=100,
        max_num_batched_tokens=11,
    ),
]


def _workload(vocab: int, decode: Any, seed: int) -> tuple[list[list[int]], list[SamplingParams]]:
    rng = random.Random(seed)
    bases = [[rng.randrange(3, vocab) for _ in range(rng.randint(10, 40))] for _ in range(3)]
    prompts: list[list[int]] = []
    params: list[SamplingParams] = []
    for _ in range(NUM_REQUESTS):
        kind = rng.random()
        if kind < 0.3:  # a shared prefix and a private tail: prefix-cache hits
            prompt = rng.choice(bases)[: rng.randint(1, 40)] + [
                rng.randrange(3, vocab) for _ in range(rng.randint(0, 12))
            ]
        elif kind < 0.45 and prompts:  # an exact duplicate of an earlier prompt
            prompt = list(rng.choice(prompts))
        elif kind < 0.6:  # a repeated pattern: ngram drafts get accepted
            pattern = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 5))]
            prompt = pattern * rng.randint(2, 8)
        else:
            prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 50))]
        if rng.random() < 0.15:  # prompt-only scoring: its last token is scored, never fed
            if rng.random() < 0.4:  # the longest such prompt, one token past max_model_len
                prompt = prompt + [rng.randrange(3, vocab) for _ in range(MAX_MODEL_LEN + 1)]
            prompt = [*prompt, rng.randrange(3, vocab)][: MAX_MODEL_LEN + 1]
            prompts.append(prompt)
            params.append(
                SamplingParams(max_tokens=0, prompt_logprobs=rng.choice([0, 2]), seed=rng.randrange(1 << 30))
            )
            continue
        prompt = prompt[: MAX_MODEL_LEN - 1]
        room = MAX_MODEL_LEN - len(prompt)
        # Some requests end exactly at max_model_len: max_tokens filling the room, or None.
        max_tokens = rng.choice([room, None]) if rng.random() < 0.25 else min(rng.randint(1, 20), room)
        kw: dict[str, Any] = dict(
            max_tokens=max_tokens, seed=rng.randrange(1 << 30), temperature=rng.choice([0.0, 0.7, 1.0, 1.3])
        )
        if rng.random() < 0.3:
            kw["n"] = rng.randint(2, 3)
        if rng.random() < 0.35:
            kw["logprobs"] = rng.choice([0, 1, 3])
        if rng.random() < 0.25:
            kw["prompt_logprobs"] = rng.choice([0, 2])
        if rng.random() < 0.2:
            kw["min_tokens"] = min(rng.randint(1, 5), max_tokens or room)
        if rng.random() < 0.3:
            kw["ignore_eos"] = True
        if rng.random() < 0.15:
            kw["top_p"] = 0.9
        if rng.random() < 0.15:
            kw["repetition_penalty"] = 1.2
        if rng.random() < 0.25:
            kw["stop"] = [decode([rng.randrange(3, vocab)])[:2] or "a"]
            kw["include_stop_str_in_output"] = rng.random() < 0.5
        if rng.random() < 0.1:
            kw["stop_token_ids"] = [rng.randrange(3, vocab)]
        prompts.append(prompt)
        params.append(SamplingParams(**kw))
    return prompts, params


def _key(out: RequestOutput) -> tuple[Any, ...]:
    """Every output field that must not depend on the batch (num_cached_tokens is checked apart)."""
    completions = tuple(
        (
            c.index,
            c.text,
            c.token_ids,
            c.logprobs,
            c.top_logprobs,
            c.finish_reason,
            c.stop_reason,
            c.error,
            c.seed,
        )
        for c in out.outputs
    )
    return (out.prompt_token_ids, out.prompt_logprobs, out.prompt_top_logprobs, out.finished, completions)


def _llm(model: Path, **kwargs: Any) -> LLM:
    return LLM(model, device="cpu", dtype="float32", max_model_len=MAX_MODEL_LEN, **kwargs)


def _assert_no_block_held(engine: LLMEngine) -> None:
    blocks = engine.block_manager
    assert blocks.num_free_blocks == blocks.num_blocks
    assert all(b.ref_count == 0 for b in blocks.blocks)
    assert not engine.requests and not engine.scheduler.has_unfinished() and engine.in_flight is None


@pytest.fixture(scope="module")
def reference(qwen3_dir: Path) -> tuple[list[list[int]], list[SamplingParams], list[tuple[Any, ...]]]:
    """The workload and each request's output when it runs alone on a plain engine."""
    plain = _llm(qwen3_dir, max_num_seqs=1, enable_prefix_caching=False, async_scheduling=False)
    tokenizer = plain.get_tokenizer()
    prompts, params = _workload(plain.llm_engine.model_config.vocab_size, tokenizer.decode, seed=0)
    alone = [_key(plain.generate([p], [q], use_tqdm=False)[0]) for p, q in zip(prompts, params, strict=True)]
    return prompts, params, alone


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_batched_output_equals_each_request_alone(
    qwen3_dir: Path, reference: Any, config: dict[str, Any]
) -> None:
    prompts, params, alone = reference
    llm = _llm(qwen3_dir, **config)
    outs = llm.generate(prompts, params, use_tqdm=False)
    mismatched = [i for i, out in enumerate(outs) if _key(out) != alone[i]]
    assert not mismatched, f"requests {mismatched} differ from their run alone under {config}"
    for out, prompt in zip(outs, prompts, strict=True):
        cached = out.num_cached_tokens
        assert 0 <= cached < len(prompt) and (config.get("enable_prefix_caching", True) or cached == 0)
    engine = llm.llm_engine
    _assert_no_block_held(engine)
    stats = engine.stats()
    # The configuration did what it is here for.
    if "num_kv_blocks" in config:
        assert stats["preemptions"] > 0
    if "speculative" in config:
        assert stats["accepted_draft_tokens"] > 0


@pytest.mark.parametrize(
    "config",
    [
        dict(async_scheduling=True, num_kv_blocks=6),
        dict(
            speculative="ngram",
            speculative_depth=3,
            speculative_budget="fixed",
            async_scheduling=True,
            block_size=1,
            num_kv_blocks=90,
        ),
    ],
    ids=["async-preempting", "ngram-async-block1"],
)
def test_aborts_mid_flight_free_their_blocks_and_spare_the_others(
    qwen3_dir: Path, reference: Any, config: dict[str, Any]
) -> None:
    """Requests arrive and are aborted at random steps (while their tokens are in flight, drafted
    or preempted): an aborted one's output is a prefix of its run alone, the rest match theirs,
    and no block stays held."""
    prompts, params, alone = reference
    engine = LLMEngine(qwen3_dir, device="cpu", dtype="float32", max_model_len=MAX_MODEL_LEN, **config)
    rng = random.Random(1)
    singles = [i for i, p in enumerate(params) if p.n == 1]
    pending = singles[::-1]
    finished: dict[str, RequestOutput] = {}
    aborted = 0
    while pending or engine.has_unfinished():
        for _ in range(rng.randint(0, 2)):
            if pending:
                i = pending.pop()
                engine.add_request(str(i), prompts[i], params[i])
        if engine.requests and rng.random() < 0.2:
            rid = rng.choice(sorted(engine.requests))
            out = engine.abort(rid)
            assert out is not None
            aborted += 1
            done = out.outputs[0]
            want = alone[int(rid)][-1][0]  # the reference's completion fields
            assert done.finish_reason == "abort"
            assert done.token_ids == want[2][: len(done.token_ids)]
            assert done.logprobs == want[3][: len(done.logprobs)]
        for out in engine.step():
            finished[out.request_id] = out
    assert aborted and finished
    for rid, out in finished.items():
        assert _key(out) == alone[int(rid)], f"request {rid} differs from its run alone"
    _assert_no_block_held(engine)


def test_prompt_larger_than_the_kv_cache_is_refused_and_the_engine_goes_on(qwen3_dir: Path) -> None:
    engine = LLMEngine(qwen3_dir, device="cpu", dtype="float32", num_kv_blocks=2, block_size=16)
    with pytest.raises(PromptTooLong, match=r"prompt has 40 tokens.*more than its 2 blocks of 16 tokens"):
        engine.add_request("big", list(range(3, 43)), SamplingParams(max_tokens=1))
    engine.add_request(
        "small", list(range(3, 23)), SamplingParams(max_tokens=None, temperature=0, ignore_eos=True)
    )
    outs: list[RequestOutput] = []
    while engine.has_unfinished():
        outs += engine.step()
    # The KV cache caps the sequence at 32 tokens: the request ends there, by length.
    assert [(o.request_id, len(o.outputs[0].token_ids), o.outputs[0].finish_reason) for o in outs] == [
        ("small", 12, "length")
    ]
    _assert_no_block_held(engine)
