"""Speculative decoding (prompt-lookup and MTP drafts) is token-identical to plain decoding, greedy and sampled,
because every drafted position is sampled with the same (seed, position) noise and the logits
do not depend on how the positions were batched."""

from __future__ import annotations

import pytest

from shardinfer import LLM, SamplingParams
from shardinfer.engine.drafting import lookup, propose
from shardinfer.testing.replay_drafter import ReplayProposer


def test_propose_takes_the_latest_longest_match() -> None:
    tokens = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert propose(tokens, 2) == [7, 8]  # the suffix [1, 2, 3] last appeared before 7, 8
    assert propose([4, 5, 6, 5], 3) == [6, 5]  # falls back to one-token matches
    assert propose([1, 2, 3], 4) == []
    assert propose(tokens, 0) == []


def test_lookup_measures_the_match_length_back_to_four() -> None:
    # The suffix 3, 4, 5 occurred before 9; the token before both is 2 too, then they differ.
    assert lookup([1, 2, 3, 4, 5, 9, 2, 3, 4, 5], 2) == ([9, 2], 4)
    assert lookup([6, 6, 2, 3, 4, 5, 9, 6, 2, 3, 4, 5], 1) == ([9], 4)  # counted no further than 4
    assert lookup([8, 3, 4, 5, 9, 2, 3, 4, 5], 1) == ([9], 3)
    assert lookup([7, 8, 7], 3) == ([8, 7], 1)
    assert lookup([1, 2, 3], 2) == ([], 0)


def _reference_propose(tokens: list[int], max_draft: int) -> list[int]:
    """The definition, spelled out: the latest earlier start of the last 3 (then 2, then 1) tokens
    within the last 2048, and what followed it."""
    if max_draft <= 0 or len(tokens) < 2:
        return []
    lo = max(0, len(tokens) - 2048)
    for n in (3, 2, 1):
        if len(tokens) <= n:
            continue
        for i in range(len(tokens) - n - 1, lo - 1, -1):
            if tokens[i : i + n] == tokens[-n:]:
                return tokens[i + n : i + n + max_draft]
    return []


def test_propose_agrees_with_its_definition_on_random_sequences() -> None:
    import random

    rng = random.Random(4)
    for trial in range(600):
        length = rng.randint(0, 3000 if trial % 50 == 0 else 40)
        tokens = [rng.randrange(rng.choice([2, 3, 7, 60])) for _ in range(length)]
        k = rng.randint(0, 5)
        assert propose(tokens, k) == _reference_propose(tokens, k), (tokens, k)


def _key(outs) -> list[tuple]:
    return [
        (c.token_ids, c.logprobs, c.top_logprobs, c.text, c.finish_reason) for o in outs for c in o.outputs
    ]


@pytest.mark.parametrize(
    "engine_kwargs",
    [{}, {"max_num_batched_tokens": 5}, {"num_kv_blocks": 12, "block_size": 8}],
    ids=["plain", "small-budget", "preempting"],
)
def test_ngram_speculation_equals_plain_decoding(qwen3_dir, engine_kwargs) -> None:
    plain = LLM(qwen3_dir, device="cpu", dtype="float32", **engine_kwargs)
    spec = LLM(qwen3_dir, device="cpu", dtype="float32", speculative_ngram_tokens=4, **engine_kwargs)
    # Repetitive prompts give the drafter something to copy; a random model repeats itself too.
    base = [5, 6, 7, 8, 9, 10, 11, 12]
    prompts = [base * 3, [20, 21, 22] * 5 + [23], base + [40, 41] * 6, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]]
    params = [
        SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=1.0, max_tokens=25, seed=3),
        SamplingParams(temperature=0.7, top_p=0.9, max_tokens=28, seed=11, stop=["e"]),
        SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, stop_token_ids=[12]),
    ]
    assert _key(spec.generate(prompts, params)) == _key(plain.generate(prompts, params))
    stats = spec.llm_engine.counters
    assert stats["draft_tokens"] > 0 and stats["accepted_draft_tokens"] > 0
    engine = spec.llm_engine
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def _mixed_workload() -> tuple[list[list[int]], list[SamplingParams]]:
    """Repetitive prompts (the drafter has something to copy; a random model repeats itself too),
    and beside the drafting rows some that never draft: penalties, min_tokens."""
    base = [5, 6, 7, 8, 9, 10, 11, 12]
    prompts = [
        base * 3,
        [20, 21, 22] * 5 + [23],
        base + [40, 41] * 6,
        [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5],
        [30, 31, 32, 33] * 4,
        [7, 8, 9] * 6,
    ]
    params = [
        SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=1.0, max_tokens=25, seed=3),
        SamplingParams(temperature=0.7, top_p=0.9, max_tokens=28, seed=11, stop=["e"]),
        SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, stop_token_ids=[12]),
        SamplingParams(temperature=0.9, max_tokens=24, seed=5, repetition_penalty=1.2),
        SamplingParams(temperature=0.0, max_tokens=26, min_tokens=9, ignore_eos=True),
    ]
    return prompts, params


@pytest.mark.parametrize(
    "engine_kwargs",
    [{}, {"max_num_batched_tokens": 5}, {"num_kv_blocks": 16, "block_size": 8}],
    ids=["plain", "small-budget", "preempting"],
)
def test_async_ngram_speculation_equals_plain_decoding(qwen3_dir, engine_kwargs) -> None:
    """With asynchronous scheduling each step is drafted before the previous one is read back:
    the device corrects positions and tokens by the rejected drafts (engine/input_fixup.py)."""
    prompts, params = _mixed_workload()
    plain = LLM(qwen3_dir, device="cpu", dtype="float32", async_scheduling=False, **engine_kwargs)
    want = _key(plain.generate(prompts, params))
    spec = LLM(
        qwen3_dir,
        device="cpu",
        dtype="float32",
        async_scheduling=True,
        speculative="ngram",
        speculative_depth=3,
        **engine_kwargs,
    )
    assert _key(spec.generate(prompts, params)) == want
    engine = spec.llm_engine
    assert engine.counters["draft_tokens"] > 0 and engine.counters["accepted_draft_tokens"] > 0
    assert engine.counters["draft_tokens"] > engine.counters["accepted_draft_tokens"]  # some were rejected
    stats = engine.stats()
    assert stats["draft_acceptance_rate"] == stats["accepted_draft_tokens"] / stats["draft_tokens"]
    budget = engine.drafter.budget
    assert sum(budget.accepted) == stats["accepted_draft_tokens"]  # the per-position counts add up
    assert [stats[f"draft_acceptance_p{j}"] for j in (1, 2, 3)] == [
        a / d for a, d in zip(budget.accepted, budget.drafted, strict=True)
    ]
    assert stats["mean_draft_depth"] == 3.0  # no CUDA graphs, no step times: the fixed depth
    if "num_kv_blocks" in engine_kwargs:
        assert engine.scheduler.num_preemptions > 0
    assert not engine.has_unfinished() and engine.in_flight is None
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def _replay_run(
    model_dir, prompts, params, recorded, alpha: float, **kw
) -> tuple[list[tuple], dict[str, float]]:
    llm = LLM(model_dir, device="cpu", dtype="float32", speculative="ngram", speculative_depth=3, **kw)
    engine = llm.llm_engine
    engine.drafter.proposer = ReplayProposer(recorded, alpha, engine.model_config.vocab_size, seed=1)
    for i, (ids, p) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(f"r{i}", ids, p)
    done = {}
    while engine.has_unfinished():
        for out in engine.step():
            done[out.request_id] = out
    return _key([done[f"r{i}"] for i in range(len(prompts))]), engine.stats()


def test_replay_drafts_land_on_the_right_position_under_async_scheduling(qwen3_dir) -> None:
    """The replay drafter's drafts depend only on the output position, so when the device picks
    the draft for the position a request really is at (after the previous step's rejections),
    asynchronous and synchronous scheduling accept the same drafts. Picking the draft of the
    host's all-accepted layout instead would misalign every draft after a rejection."""
    prompts, params = _mixed_workload()
    plain = LLM(qwen3_dir, device="cpu", dtype="float32", async_scheduling=False)
    outs = plain.generate(prompts, params)
    want = _key(outs)
    recorded = {f"r{i}": list(o.outputs[0].token_ids) for i, o in enumerate(outs)}
    got_sync, sync = _replay_run(qwen3_dir, prompts, params, recorded, 0.7, async_scheduling=False)
    got_async, fast = _replay_run(qwen3_dir, prompts, params, recorded, 0.7, async_scheduling=True)
    assert got_sync == want and got_async == want
    rate_sync = sync["accepted_draft_tokens"] / sync["draft_tokens"]
    rate_async = fast["accepted_draft_tokens"] / fast["draft_tokens"]
    assert 0.3 < rate_sync < 0.95  # some drafts corrupted, most not
    assert abs(rate_async - rate_sync) < 0.05, (rate_sync, rate_async)
    perfect_outs, perfect = _replay_run(qwen3_dir, prompts, params, recorded, 1.0, async_scheduling=True)
    assert perfect_outs == want
    # Every recorded token proposed is accepted; only the padding past a recording's end may not be.
    assert perfect["accepted_draft_tokens"] >= perfect["draft_tokens"] - perfect["padded_draft_tokens"]
    assert perfect["padded_draft_tokens"] < 0.2 * perfect["draft_tokens"]


def test_mtp_speculation_equals_plain_decoding_on_the_demo_model() -> None:
    """The bundled DeepSeek-V3-architecture model drafts with its trained MTP layer."""
    from pathlib import Path

    model = Path(__file__).resolve().parents[2] / "examples" / "models" / "tiny-dsv3-demo"
    plain = LLM(model, device="cpu", dtype="float32")
    chats = [
        [{"role": "user", "content": c}]
        for c in (
            "What is 4821 + 377?",
            "Reverse the letters: p a r q u e t",
            "Extract name, age and city as JSON: Vera, 44, lives in Lima.",
            "Sort these words alphabetically: zebra anchor kitten",
        )
    ]
    params = [
        SamplingParams(temperature=0.0, max_tokens=40, logprobs=1),
        SamplingParams(temperature=0.8, max_tokens=40, seed=5),
        SamplingParams(temperature=0.0, max_tokens=40),
        SamplingParams(temperature=1.0, top_p=0.9, max_tokens=40, seed=9),
    ]
    want = _key(plain.chat(chats, params))
    for depth, overlap in ((1, False), (1, True), (3, True)):
        spec = LLM(
            model,
            device="cpu",
            dtype="float32",
            speculative="mtp",
            speculative_depth=depth,
            async_scheduling=overlap,
        )
        assert _key(spec.chat(chats, params)) == want, (depth, overlap)
        stats = spec.llm_engine.stats()
        assert stats["draft_tokens"] > 0
        assert stats["draft_acceptance_p1"] > 0.5  # the MTP head learned something
        if depth == 3:  # the chained layer drafts three tokens; later ones are accepted less often
            assert (
                stats["draft_acceptance_p1"] > stats["draft_acceptance_p2"] > stats["draft_acceptance_p3"] > 0
            )


def test_mtp_chain_reaching_max_model_len_equals_plain_decoding() -> None:
    """A chain of MTP drafts started near the end of a sequence runs at positions past
    max_model_len: they must not index past the rotary tables, and the output stays plain."""
    from pathlib import Path

    model = Path(__file__).resolve().parents[2] / "examples" / "models" / "tiny-dsv3-demo"
    params = SamplingParams(max_tokens=None, temperature=0.0, ignore_eos=True, logprobs=1)
    plain = LLM(model, device="cpu", dtype="float32", max_model_len=24)
    ids = plain.get_tokenizer().encode("What is 4821 + 377?")
    want = _key(plain.generate([ids], params, use_tqdm=False))
    assert len(ids) + len(want[0][0]) == 24  # the sequence fills max_model_len
    for overlap in (False, True):
        spec = LLM(
            model,
            device="cpu",
            dtype="float32",
            max_model_len=24,
            speculative="mtp",
            speculative_depth=3,
            speculative_budget="fixed",
            async_scheduling=overlap,
        )
        assert _key(spec.generate([ids], params, use_tqdm=False)) == want, overlap


def test_mtp_speculation_needs_an_mtp_layer(qwen3_dir) -> None:
    with pytest.raises(ValueError, match="has no MTP layer"):
        LLM(qwen3_dir, speculative_mtp=True)


def test_async_speculation_beside_grammar_rows_equals_plain_decoding(qwen3_dir) -> None:
    """Grammar rows never draft and make a step read the previous one back between its forward and
    its sampling (masks filled on the mask thread); the drafting rows beside them keep their
    device-side shifts only until that read-back, which resolves them on the host."""
    from tests.engine.structured.test_async_structured import JSON, REGEX

    base = [5, 6, 7, 8, 9, 10, 11, 12]
    prompts = [base * 3, [20, 21, 22] * 5, base + [40, 41] * 6, [3, 1, 4, 1, 5, 9, 2, 6], [7, 8, 9] * 6]
    params = [
        SamplingParams(temperature=1.0, max_tokens=60, seed=1, so_args=JSON, logprobs=2),
        SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, logprobs=1),
        SamplingParams(temperature=1.0, max_tokens=40, seed=3, so_args=REGEX),
        SamplingParams(temperature=0.8, max_tokens=45, seed=4, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=35, ignore_eos=True),
    ]
    want = _key(
        LLM(qwen3_dir, device="cpu", dtype="float32", async_scheduling=False).generate(prompts, params)
    )
    spec = LLM(
        qwen3_dir,
        device="cpu",
        dtype="float32",
        async_scheduling=True,
        speculative="ngram",
        speculative_depth=2,
    )
    assert _key(spec.generate(prompts, params)) == want
    stats = spec.llm_engine.stats()
    assert stats["accepted_draft_tokens"] > 0 and stats["deferred_sampling_steps"] > 0


@pytest.mark.parametrize(
    "engine_kwargs",
    [{"max_num_batched_tokens": 6}, {"num_kv_blocks": 16, "block_size": 8}],
    ids=["small-budget", "preempting"],
)
def test_replay_drafts_survive_trimming_and_preemption(qwen3_dir, engine_kwargs) -> None:
    """Drafts cut to the token budget, and requests preempted with a speculative step in flight,
    keep the output of plain decoding."""
    prompts, params = _mixed_workload()
    outs = LLM(qwen3_dir, device="cpu", dtype="float32", async_scheduling=False).generate(prompts, params)
    recorded = {f"r{i}": list(o.outputs[0].token_ids) for i, o in enumerate(outs)}
    got, stats = _replay_run(
        qwen3_dir, prompts, params, recorded, 0.8, async_scheduling=True, **engine_kwargs
    )
    assert got == _key(outs)
    assert stats["accepted_draft_tokens"] > 0
    if "num_kv_blocks" in engine_kwargs:
        assert stats["preemptions"] > 0


@pytest.mark.parametrize("seed", [3, 5, 15, 31])
def test_random_mixes_of_drafts_budgets_and_preemption_equal_plain_decoding(qwen3_dir, seed) -> None:
    """Random request mixes (greedy, sampled, stop ids, min_tokens, penalties, prompt logprobs),
    token budgets, KV sizes, sequence caps and depths: asynchronous speculative decoding with the
    replay drafter always gives plain decoding's tokens and logprobs."""
    import random

    rng = random.Random(seed)
    n = rng.randint(3, 8)
    prompts = [[rng.randrange(50) for _ in range(rng.randint(2, 40))] for _ in range(n)]
    params = []
    for i in range(n):
        mt, kind = rng.randint(1, 40), rng.randrange(5)
        params.append(
            [
                SamplingParams(temperature=0.0, max_tokens=mt, ignore_eos=True),
                SamplingParams(temperature=1.0, max_tokens=mt, seed=i, stop_token_ids=[rng.randrange(50)]),
                SamplingParams(
                    temperature=0.8, max_tokens=mt, seed=i, min_tokens=rng.randint(0, mt), ignore_eos=True
                ),
                SamplingParams(temperature=0.9, top_p=0.8, max_tokens=mt, seed=i, repetition_penalty=1.1),
                SamplingParams(temperature=1.0, max_tokens=mt, seed=i, logprobs=1, prompt_logprobs=1),
            ][kind]
        )
    kw: dict = {"max_num_batched_tokens": rng.randint(4, 20), "max_num_seqs": rng.randint(1, 4)}
    kw.update(num_kv_blocks=rng.randint(12, 20), block_size=8)
    plain = LLM(qwen3_dir, device="cpu", dtype="float32", async_scheduling=False, **kw)
    outs = plain.generate(prompts, params)
    recorded = {f"r{i}": list(o.outputs[0].token_ids) for i, o in enumerate(outs)}
    got, _ = _replay_run(
        qwen3_dir, prompts, params, recorded, rng.choice([0.5, 0.8]), async_scheduling=True, **kw
    )
    assert got == _key(outs)
