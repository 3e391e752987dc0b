"""Prompt-only requests (max_tokens=0 with prompt_logprobs): the prompt is scored, its last token
never fed, nothing sampled.

The reference is transformers on the same tiny checkpoint: a float64 log-softmax of its logits
over the prompt without its last token, read at every scored position.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hf_reference import hf_logits, hf_model

from shardinfer import LLM, SamplingParams
from shardinfer.engine.llm_engine import LLMEngine
from shardinfer.engine.outputs import RequestOutput
from shardinfer.errors import EmptyPrompt, PromptTooLong

SCORE = SamplingParams(temperature=0.0, max_tokens=0, prompt_logprobs=3, seed=0)


def _prompt(n: int, salt: int = 0) -> list[int]:
    return [(7 * i + 3 + salt) % 300 + 20 for i in range(n)]


@pytest.fixture(scope="module")
def hf(qwen3_dir: Path) -> torch.nn.Module:
    return hf_model(qwen3_dir)


def _reference(hf: torch.nn.Module, ids: list[int]) -> tuple[list[float], list[list[int]]]:
    """Per scored position p (1 .. len - 1): logprob of ids[p] and the top-3 ids, from the logits
    at p - 1 of the prompt fed without its last token."""
    lps = torch.log_softmax(hf_logits(hf, ids[:-1]).double(), dim=-1)
    values = [lps[p - 1, ids[p]].item() for p in range(1, len(ids))]
    tops = [lps[p - 1].topk(3).indices.tolist() for p in range(1, len(ids))]
    return values, tops


def _drain(engine: LLMEngine) -> dict[str, RequestOutput]:
    outs: dict[str, RequestOutput] = {}
    while engine.has_unfinished():
        for out in engine.step():
            outs[out.request_id] = out
    return outs


def _check_scored(out: RequestOutput, hf: torch.nn.Module, ids: list[int], start: int = 1) -> None:
    """Logprobs and top-3 of every wanted position equal the reference; nothing was generated."""
    want, want_tops = _reference(hf, ids)
    assert out.prompt_logprobs is not None and out.prompt_top_logprobs is not None
    assert out.prompt_logprobs[:start] == [None] * start
    got = out.prompt_logprobs[start:]
    assert len(got) == len(ids) - start
    assert max(abs(a - b) for a, b in zip(got, want[start - 1 :], strict=True)) < 1e-4
    tops = [[t for t, _ in top] for top in out.prompt_top_logprobs[start:]]
    assert tops == want_tops[start - 1 :]
    completion = out.outputs[0]
    assert completion.token_ids == [] and completion.logprobs == [] and completion.text == ""
    assert completion.finish_reason == "length" and completion.stop_reason is None


@pytest.mark.parametrize(
    "engine_kwargs",
    [
        {"async_scheduling": False},
        {"async_scheduling": True},
        {"async_scheduling": False, "max_num_batched_tokens": 7},
        {"async_scheduling": True, "max_num_batched_tokens": 7},
    ],
    ids=["sync", "async", "chunked", "async-chunked"],
)
def test_every_scored_position_equals_transformers(
    qwen3_dir: Path, hf: torch.nn.Module, engine_kwargs
) -> None:
    engine = LLMEngine(qwen3_dir, device="cpu", dtype="float32", num_kv_blocks=64, **engine_kwargs)
    prompts = {"short": _prompt(2), "mid": _prompt(19, 1), "long": _prompt(45, 2)}
    for rid, ids in prompts.items():
        engine.add_request(rid, ids, SCORE)
    outs = _drain(engine)
    for rid, ids in prompts.items():
        _check_scored(outs[rid], hf, ids)
    assert engine.counters["generated_tokens"] == 0
    # Every fed token was a prompt token but each prompt's last.
    assert engine.counters["prompt_tokens"] == sum(len(ids) - 1 for ids in prompts.values())
    assert (
        engine.in_flight is None and engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    )


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_continuation_after_a_cached_context(
    qwen3_dir: Path, hf: torch.nn.Module, async_scheduling: bool
) -> None:
    """prompt_logprobs_from = the context's length: the context's full blocks come from the prefix
    cache (those a first request computed), and the continuation's scores are unchanged."""
    engine = LLMEngine(
        qwen3_dir,
        device="cpu",
        dtype="float32",
        num_kv_blocks=64,
        block_size=16,
        async_scheduling=async_scheduling,
    )
    context = _prompt(37)
    for n, tail in enumerate(([40, 41, 42], [50, 51])):
        ids = context + tail
        engine.add_request(f"c{n}", ids, SCORE, prompt_logprobs_from=len(context))
        out = _drain(engine)[f"c{n}"]
        _check_scored(out, hf, ids, start=len(context))
        # The second finds the context's full blocks (the last context position is recomputed).
        assert out.num_cached_tokens == (0 if n == 0 else (len(context) - 1) // 16 * 16)


def test_a_prompt_of_max_model_len_plus_one_is_scored_and_one_more_is_refused(
    qwen3_dir: Path, hf: torch.nn.Module
) -> None:
    """Four blocks of 16 tokens cap max_model_len at 64: a prompt of 65 tokens feeds 64 of them, so
    it fits only if the unfed last token takes no block; with a budget of 20 tokens a step, it is
    also prefilled in chunks."""
    llm = LLM(
        qwen3_dir, device="cpu", dtype="float32", num_kv_blocks=4, block_size=16, max_num_batched_tokens=20
    )
    engine = llm.llm_engine
    assert engine.max_model_len == 64
    ids = _prompt(65)
    (out,) = llm.generate([ids], SCORE, use_tqdm=False)
    _check_scored(out, hf, ids)
    assert engine.block_manager.num_free_blocks == 4
    with pytest.raises(
        PromptTooLong,
        match="prompt has 66 tokens; max_tokens=0 feeds all but the last, so "
        "max_model_len=64 scores prompts of at most 65",
    ):
        engine.add_request("over", _prompt(66), SCORE)
    with pytest.raises(PromptTooLong, match="prompt 0: prompt has 66 tokens"):
        llm.generate([_prompt(66)], SCORE, use_tqdm=False)
    # A request that generates still needs room for one token after its prompt.
    with pytest.raises(PromptTooLong, match="prompt has 64 tokens; max_model_len=64 leaves no room"):
        engine.add_request("gen", _prompt(64), SCORE.replace(max_tokens=1))
    assert not engine.has_unfinished()


def test_the_unfed_token_takes_no_kv_block(qwen3_dir: Path) -> None:
    """Two prompts of 33 tokens feed 32 each: two blocks apiece, so both fit four blocks at once and
    are scored in the first step. Fed whole, each would need a third block and one would wait."""
    engine = LLMEngine(
        qwen3_dir, device="cpu", dtype="float32", num_kv_blocks=4, block_size=16, async_scheduling=False
    )
    engine.add_request("a", _prompt(33), SCORE)
    engine.add_request("b", _prompt(33, 5), SCORE)
    planned: list[tuple[list[int], list[int]]] = []
    schedule = engine.scheduler.schedule

    def recording_schedule():  # type: ignore[no-untyped-def]
        batch = schedule()
        planned.append((list(batch.num_new_tokens), [len(r.block_table) for r in batch.requests]))
        return batch

    engine.scheduler.schedule = recording_schedule  # type: ignore[method-assign]
    finished = engine.step()
    assert planned == [([32, 32], [2, 2])]
    assert sorted(o.request_id for o in finished) == ["a", "b"]
    assert engine.scheduler.num_preemptions == 0 and not engine.has_unfinished()


def _gen_key(outs: list[RequestOutput]) -> list[tuple]:
    return [
        (c.token_ids, c.logprobs, c.top_logprobs, c.text, c.finish_reason, o.prompt_logprobs)
        for o in outs
        for c in o.outputs
    ]


@pytest.mark.parametrize(
    "engine_kwargs",
    [
        {"async_scheduling": False},
        {"async_scheduling": True},
        {"async_scheduling": True, "max_num_batched_tokens": 9},
        {"async_scheduling": True, "speculative": "ngram", "speculative_depth": 3},
    ],
    ids=["sync", "async", "async-chunked", "async-ngram"],
)
def test_beside_generation_requests(qwen3_dir: Path, hf: torch.nn.Module, engine_kwargs) -> None:
    """Scoring requests in the same steps as generating ones change no generated token or logprob,
    and are scored as when alone (bit for bit: batch invariance)."""
    base = [5, 6, 7, 8, 9, 10, 11, 12]
    gen_prompts = [base * 3, [20, 21, 22] * 5 + [23], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]]
    gen_params = [
        SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=1.0, max_tokens=15, seed=3, prompt_logprobs=1),
        SamplingParams(temperature=0.8, max_tokens=18, seed=7),
    ]
    scored = [_prompt(30), _prompt(12, 3), base * 2 + [40]]
    alone = LLM(qwen3_dir, device="cpu", dtype="float32", **engine_kwargs)
    want_gen = _gen_key(alone.generate(gen_prompts, gen_params, use_tqdm=False))
    want_scores = [o.prompt_logprobs for o in alone.generate(scored, SCORE, use_tqdm=False)]
    mixed = LLM(qwen3_dir, device="cpu", dtype="float32", **engine_kwargs)
    prompts = [scored[0], gen_prompts[0], scored[1], gen_prompts[1], gen_prompts[2], scored[2]]
    params = [SCORE, gen_params[0], SCORE, gen_params[1], gen_params[2], SCORE]
    outs = mixed.generate(prompts, params, use_tqdm=False)
    assert _gen_key([outs[1], outs[3], outs[4]]) == want_gen
    assert [outs[0].prompt_logprobs, outs[2].prompt_logprobs, outs[5].prompt_logprobs] == want_scores
    for out, ids in zip((outs[0], outs[2], outs[5]), scored, strict=True):
        _check_scored(out, hf, ids)
    engine = mixed.llm_engine
    assert (
        not engine.has_unfinished()
        and engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    )


def test_scores_equal_those_of_the_prompt_fed_whole(qwen3_dir: Path) -> None:
    """The logits of the fed positions do not depend on whether the last token is fed after them:
    a prompt-only request gives the prompt logprobs of a request that generates one token, bit for bit."""
    llm = LLM(qwen3_dir, device="cpu", dtype="float32", max_num_batched_tokens=11)
    prompts = [_prompt(40), _prompt(9, 4)]
    scored = llm.generate(prompts, SCORE, use_tqdm=False)
    fed = llm.generate(prompts, SCORE.replace(max_tokens=1), use_tqdm=False)
    for a, b in zip(scored, fed, strict=True):
        assert a.prompt_logprobs == b.prompt_logprobs
        assert a.prompt_top_logprobs == b.prompt_top_logprobs
        assert len(b.outputs[0].token_ids) == 1


def test_mtp_speculation_beside_prompt_only_requests() -> None:
    """The MTP layer runs over every row of a step, a prompt-only request's last chunk too (its
    next token is the unfed prompt token): generation stays as without speculation."""
    model = Path(__file__).resolve().parents[2] / "examples" / "models" / "tiny-dsv3-demo"
    plain = LLM(model, device="cpu", dtype="float32")
    tok = plain.get_tokenizer()
    prompts = [
        tok.encode(t)
        for t in (
            "What is 4821 + 377?",
            "Reverse the letters: p a r q u e t",
            "Sort these words alphabetically: zebra anchor kitten",
        )
    ]
    params = [
        SamplingParams(temperature=0.0, max_tokens=24, logprobs=1),
        SCORE,
        SamplingParams(temperature=0.8, max_tokens=24, seed=5),
    ]
    want = _gen_key(plain.generate(prompts, params, use_tqdm=False))
    for overlap in (False, True):
        spec = LLM(
            model,
            device="cpu",
            dtype="float32",
            speculative="mtp",
            speculative_depth=2,
            async_scheduling=overlap,
        )
        assert _gen_key(spec.generate(prompts, params, use_tqdm=False)) == want, overlap
        assert spec.llm_engine.counters["draft_tokens"] > 0


def test_bad_values_are_named_with_their_fix(qwen3_dir: Path) -> None:
    with pytest.raises(ValueError, match="max_tokens=0 without prompt_logprobs asks for nothing"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="min_tokens=1 is invalid: must be <= max_tokens=0"):
        SamplingParams(max_tokens=0, min_tokens=1, prompt_logprobs=0)
    engine = LLMEngine(qwen3_dir, device="cpu", dtype="float32", num_kv_blocks=16)
    with pytest.raises(
        EmptyPrompt,
        match="prompt has 1 token; max_tokens=0 scores the prompt from its second "
        "token on, so it needs at least 2",
    ):
        engine.add_request("one", [5], SCORE)
    with pytest.raises(
        ValueError, match=r"prompt_logprobs_from=4 is outside the prompt: it must be in \[1, 3\]"
    ):
        engine.add_request("past", [5, 6, 7, 8], SCORE, prompt_logprobs_from=4)
    assert not engine.has_unfinished()


def test_prompt_logprobs_zero_gives_no_top_lists(qwen3_dir: Path, hf: torch.nn.Module) -> None:
    llm = LLM(qwen3_dir, device="cpu", dtype="float32")
    ids = _prompt(6)
    (out,) = llm.generate([ids], SCORE.replace(prompt_logprobs=0), use_tqdm=False)
    want, _ = _reference(hf, ids)
    assert out.prompt_top_logprobs is None and out.prompt_logprobs is not None
    assert max(abs(a - b) for a, b in zip(out.prompt_logprobs[1:], want, strict=True)) < 1e-4
    assert out.outputs[0].token_ids == [] and out.outputs[0].finish_reason == "length"


@pytest.mark.gpu
@pytest.mark.parametrize("engine_kwargs", [{}, {"speculative": "ngram"}], ids=["plain", "ngram"])
def test_gpu_beside_graphed_decoding(qwen3_dir: Path, engine_kwargs) -> None:
    """On CUDA, with asynchronous scheduling and decode graphs (the defaults): scoring requests that
    arrive while others decode change no generated token, and score as the prompt fed whole does,
    bit for bit, and as the CPU does, within float32 rounding."""
    gen_prompts = [[5, 6, 7, 8] * 6, [9, 10, 11] * 4, [3, 1, 4, 1, 5, 9, 2, 6]]
    gen_params = [
        SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True),
        SamplingParams(temperature=1.0, max_tokens=30, seed=2, logprobs=2),
        SamplingParams(temperature=0.7, max_tokens=30, seed=4),
    ]
    scored = [_prompt(70), _prompt(2, 1), _prompt(33, 2)]

    def run(with_scores: bool) -> dict[str, RequestOutput]:
        engine = LLM(qwen3_dir, device="cuda", dtype="float32", **engine_kwargs).llm_engine
        for i, (ids, p) in enumerate(zip(gen_prompts, gen_params, strict=True)):
            engine.add_request(f"g{i}", ids, p)
        outs: dict[str, RequestOutput] = {}
        for _ in range(6):  # decoding, on the graphs, when the scoring requests arrive
            outs.update((o.request_id, o) for o in engine.step())
        if with_scores:
            for i, ids in enumerate(scored):
                engine.add_request(f"s{i}", ids, SCORE)
        outs.update(_drain(engine))
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
        return outs

    plain, mixed = run(False), run(True)
    for i in range(len(gen_prompts)):
        assert _gen_key([mixed[f"g{i}"]]) == _gen_key([plain[f"g{i}"]])
    gpu = LLM(qwen3_dir, device="cuda", dtype="float32", **engine_kwargs)
    fed = gpu.generate(scored, SCORE.replace(max_tokens=1), use_tqdm=False)
    cpu = LLM(qwen3_dir, device="cpu", dtype="float32").generate(scored, SCORE, use_tqdm=False)
    for i, (whole, on_cpu) in enumerate(zip(fed, cpu, strict=True)):
        got = mixed[f"s{i}"]
        assert got.outputs[0].token_ids == [] and got.outputs[0].finish_reason == "length"
        assert got.prompt_logprobs == whole.prompt_logprobs
        assert (
            max(abs(a - b) for a, b in zip(got.prompt_logprobs[1:], on_cpu.prompt_logprobs[1:], strict=True))
            < 1e-3
        )
