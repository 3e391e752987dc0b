"""Grammar-constrained requests under asynchronous scheduling.

Step N+1's forward is launched before step N's tokens are read back; only then are they accepted
into the matchers and N+1's masks filled. The outputs must be exactly those of synchronous
scheduling (the reference here), requests that stop at step N must get no mask at N+1, and steps
must stay pipelined (the previous step completed after the next forward was queued).
"""

from __future__ import annotations

import json
import random
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from shardinfer import LLM, SamplingParams
from shardinfer.engine.llm_engine import LLMEngine
from shardinfer.engine.structured import GrammarMatcher, StructuredOutputCompiler

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
JSON = {"schema_type": "json", "schema": SCHEMA}
EMAIL = r"[a-z]{2,5}@[a-z]{2,5}\.(com|org)"
REGEX = {"schema_type": "regex", "schema": EMAIL}
LARK = {"schema_type": "lark", "schema": 'start: NUM ("+" NUM){1,3}\nNUM: /[1-9][0-9]?/'}
FIXED = {"schema_type": "regex", "schema": "[a-z]{3}"}  # the grammar itself ends after 3 letters


def _key(outs: list[Any]) -> list[tuple[Any, ...]]:
    return [
        (c.token_ids, c.logprobs, c.top_logprobs, c.text, c.finish_reason, c.stop_reason)
        for o in outs
        for c in o.outputs
    ]


def _workload(vocab: int, eos: int) -> tuple[list[list[int]], list[SamplingParams]]:
    """Constrained and unconstrained requests, greedy and seeded temperature 1, ending on grammar
    completion, eos, stop strings, stop ids and max_tokens, penalties, n > 1."""
    rng = random.Random(7)
    params = [
        SamplingParams(temperature=1.0, max_tokens=80, seed=1, so_args=JSON, logprobs=2),
        SamplingParams(temperature=0.0, max_tokens=80, so_args=JSON),
        SamplingParams(temperature=1.0, max_tokens=4, seed=2, so_args=JSON),  # "length" mid-object
        SamplingParams(temperature=0.0, max_tokens=40, so_args=REGEX),
        SamplingParams(temperature=1.0, max_tokens=40, seed=3, so_args=REGEX, stop=["@"]),  # stop string
        SamplingParams(temperature=1.0, max_tokens=40, seed=4, so_args=LARK, n=3),
        SamplingParams(temperature=1.0, max_tokens=10, seed=5, so_args=FIXED),
        SamplingParams(temperature=1.0, max_tokens=60, seed=6, so_args=JSON, repetition_penalty=1.2),
        SamplingParams(temperature=0.0, max_tokens=rng.randint(5, 30), ignore_eos=True),
        SamplingParams(temperature=1.0, max_tokens=25, seed=8, logprobs=1),
        SamplingParams(temperature=1.0, max_tokens=40, seed=9, stop_token_ids=[eos, 5, 17, 42]),
        SamplingParams(temperature=1.0, max_tokens=30, seed=10, stop=["e", " t"]),
        SamplingParams(temperature=1.0, max_tokens=20, seed=11, presence_penalty=0.5, frequency_penalty=0.3),
        SamplingParams(temperature=0.0, max_tokens=20, repetition_penalty=1.3),
    ]
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(2, 30))] for _ in params]
    return prompts, params


class StepWatch:
    """Records, per engine step, the order of forwards and completions, and checks every mask.

    Wraps the engine's own methods (the test observes the engine, it does not change it)."""

    def __init__(self, engine: LLMEngine) -> None:
        self.steps: list[list[str]] = []
        self.masked_rows = 0
        self.skipped_rows = 0  # grammar requests finished before their row's sampling
        self.fill_threads: list[str] = []  # the thread each mask fill ran on
        self.completes_beside_fill = 0
        self._wrap(engine, "step", self._on_step)
        self._wrap(engine, "_complete", self._on_complete)
        self._wrap(engine.grammar_masks, "fill", self._on_masks)
        self._wrap(engine, "_launch_sampling", self._on_launch_sampling)
        self._wrap(engine.runner, "execute", self._on_execute)

    @staticmethod
    def _wrap(obj: Any, name: str, hook: Callable[..., Any]) -> None:
        original = getattr(obj, name)
        setattr(obj, name, lambda *args: hook(original, *args))

    def _on_step(self, original: Callable[[], Any]) -> Any:
        self.steps.append([])
        return original()

    def _on_complete(self, original: Callable[..., Any], *args: Any) -> Any:
        self.steps[-1].append("complete")
        # Given the tokens already read back and accepted: the masks were being filled meanwhile.
        self.completes_beside_fill += len(args) > 1 and args[1] is not None
        return original(*args)

    def _on_execute(self, original: Callable[..., Any], *args: Any) -> Any:
        self.steps[-1].append("execute")
        return original(*args)

    def _on_masks(self, original: Callable[..., Any], constrained: list[Any]) -> Any:
        # Never a mask for a finished grammar. (On the mask thread the previous step's other
        # checks may be ending a request meanwhile, by a stop string: its row is then discarded.)
        for req, _ in constrained:
            assert not req.grammar.is_finished(), req.request_id
        self.masked_rows += len(constrained)
        self.fill_threads.append(threading.current_thread().name)
        return original(constrained)

    def _on_launch_sampling(self, original: Callable[..., Any], plan: Any, grammar: Any) -> Any:
        # Grammar requests that ended while their row was in the forward: sampled for nothing,
        # their token dropped (the previous step's bookkeeping is complete here).
        self.skipped_rows += sum(
            r.grammar is not None and r.status.finished for r in plan.step_logits.sample_requests
        )
        return original(plan, grammar)


@pytest.fixture
def strict_matchers(monkeypatch: pytest.MonkeyPatch) -> None:
    """A finished matcher must never be handed another token (every accept path checks first)."""
    check = GrammarMatcher.check_acceptable

    def checked(self: GrammarMatcher, token_id: int) -> None:
        assert not self.is_finished(), f"token {token_id} given to a finished matcher"
        check(self, token_id)

    monkeypatch.setattr(GrammarMatcher, "check_acceptable", checked)


def _run(
    model_dir: Path, async_scheduling: bool, device: str = "cpu", dtype: str = "float32", **kwargs: Any
) -> tuple[list[Any], LLMEngine, StepWatch]:
    parallel_accept = kwargs.pop("parallel_accept", None)
    mask_threads = kwargs.pop("mask_threads", None)
    llm = LLM(model_dir, device=device, dtype=dtype, async_scheduling=async_scheduling, **kwargs)
    engine = llm.llm_engine
    if mask_threads is not None:  # copies of one template per thread, each template's rows on one thread
        engine.grammar_masks._compiler = StructuredOutputCompiler(
            str(engine.tokenizer.path),
            list(engine.tokenizer.eos_token_ids),
            engine.model_config.vocab_size,
            num_threads=mask_threads,
            independent_matchers=False,
        )
    if parallel_accept is not None:  # the default follows the machine's CPU count
        engine.grammar_compiler().parallel_accept = parallel_accept
    watch = StepWatch(engine)
    prompts, params = _workload(engine.model_config.vocab_size, engine.tokenizer.eos_token_ids[0])
    return llm.generate(prompts, params), engine, watch


@pytest.mark.parametrize(
    "engine_kwargs",
    [
        {},
        {"num_kv_blocks": 16, "block_size": 8},
        {"max_num_seqs": 4, "admission_batch": 2},
        {"parallel_accept": True},
        {"parallel_accept": True, "mask_threads": 3},
    ],
    ids=["plain", "preempting", "few-seqs", "parallel-accept", "copies-per-template-thread"],
)
def test_async_grammar_equals_sync(
    qwen3_dir: Path, engine_kwargs: dict[str, Any], strict_matchers: None
) -> None:
    import jsonschema  # a test dependency the GPU machine's tests in this file do not need

    want, sync_engine, sync_watch = _run(
        qwen3_dir,
        False,
        **{k: v for k, v in engine_kwargs.items() if k not in ("parallel_accept", "mask_threads")},
    )
    got, engine, watch = _run(qwen3_dir, True, **engine_kwargs)
    assert _key(got) == _key(want)
    # Asynchronously, masks are filled on the mask thread (while the engine thread schedules the
    # next step), at least for the steps that follow a deferred read-back; synchronously, never.
    assert any(name.startswith("shardinfer-masks") for name in watch.fill_threads)
    assert sync_watch.fill_threads and not any(
        n.startswith("shardinfer-masks") for n in sync_watch.fill_threads
    )
    # ...and, once the previous step's tokens are accepted, while its bookkeeping runs.
    assert watch.completes_beside_fill > 0 and sync_watch.completes_beside_fill == 0
    stats = engine.stats()
    assert stats["synchronous_steps"] == 0 and stats["deferred_sampling_steps"] > 0
    assert sync_engine.stats()["deferred_sampling_steps"] == 0
    assert sync_engine.stats()["grammar_mask_wait_s"] == 0 <= stats["grammar_mask_wait_s"]
    # The workload exercises what it is meant to: grammar requests ending while their next row was
    # already in the forward (skipped, not masked), every finish reason, preemption where asked.
    assert watch.skipped_rows > 0 and watch.masked_rows > 0
    reasons = {c.finish_reason for o in got for c in o.outputs}
    assert reasons == {"stop", "length"}
    if "num_kv_blocks" in engine_kwargs:
        assert stats["preemptions"] > 0
    if "mask_threads" in engine_kwargs:  # the fills and accepts ran per template slot
        assert engine.grammar_compiler()._slot_pool is not None
    assert not engine.has_unfinished() and engine.in_flight is None
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    # Constrained outputs that ended on their own are valid: the masks applied on the right state.
    checks: list[tuple[int, Callable[[str], object]]] = [
        (0, lambda t: jsonschema.validate(json.loads(t), SCHEMA)),
        (1, lambda t: jsonschema.validate(json.loads(t), SCHEMA)),
        (3, lambda t: re.fullmatch(EMAIL, t) or pytest.fail(t)),
        (6, lambda t: re.fullmatch("[a-z]{3}", t) or pytest.fail(t)),
    ]
    for i, check in checks:
        c = got[i].outputs[0]
        if c.finish_reason == "stop":
            check(c.text)
    # A grammar that cannot go on ends its request with "stop" at once, without an eos.
    fixed = got[6].outputs[0]
    assert (fixed.finish_reason, fixed.stop_reason) == ("stop", None) and len(fixed.text) == 3


@pytest.mark.gpu
@pytest.mark.parametrize(
    "engine_kwargs",
    [{}, {"num_kv_blocks": 16, "block_size": 8}, {"parallel_accept": True}],
    ids=["plain", "preempting", "parallel-accept"],
)
def test_gpu_async_grammar_equals_sync(
    qwen3_dir: Path, engine_kwargs: dict[str, Any], strict_matchers: None
) -> None:
    """On CUDA (bf16, CUDA graphs): masks filled on the mask thread while the next step is
    scheduled, the pending sampling queued at the next step, give synchronous scheduling's outputs."""
    want, _, _ = _run(qwen3_dir, False, "cuda", "bfloat16", **engine_kwargs)
    got, engine, watch = _run(qwen3_dir, True, "cuda", "bfloat16", **engine_kwargs)
    assert _key(got) == _key(want)
    assert any(name.startswith("shardinfer-masks") for name in watch.fill_threads)
    assert engine.stats()["deferred_sampling_steps"] > 0 and watch.masked_rows > 0
    if "num_kv_blocks" in engine_kwargs:
        assert engine.stats()["preemptions"] > 0


def test_grammar_steps_stay_pipelined(qwen3_dir: Path) -> None:
    """With grammar rows in the batch, each step queues its forward before the previous step's
    tokens are read back (on the old synchronous path the completion came first)."""
    llm = LLM(qwen3_dir, device="cpu", dtype="float32", async_scheduling=True)
    engine = llm.llm_engine
    watch = StepWatch(engine)
    params = [SamplingParams(temperature=1.0, max_tokens=60, seed=i, so_args=JSON) for i in range(6)]
    params += [
        SamplingParams(temperature=1.0, max_tokens=30, seed=9, repetition_penalty=1.2),
        SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True),
    ]
    outs = llm.generate([[3 + i, 7, 11 + i] for i in range(len(params))], params)
    assert all(o.outputs[0].finish_reason in ("stop", "length") for o in outs)
    launched = [s for s in watch.steps if "execute" in s]
    # The first step has nothing pending; every later one completes its predecessor after its forward.
    assert launched[0] == ["execute"]
    assert all(s == ["execute", "complete"] for s in launched[1:]), launched
    assert engine.stats()["synchronous_steps"] == 0 and engine.stats()["deferred_sampling_steps"] > 0


def test_mask_fill_has_begun_when_the_engine_thread_goes_on(qwen3_dir: Path) -> None:
    """Handing a fill to the mask thread returns only once the fill runs there: left to take
    the GIL on its own, the mask thread would wait for the engine thread's bookkeeping to block
    or for the interpreter's switch interval, and the fill would start late."""
    llm = LLM(qwen3_dir, device="cpu", dtype="float32", async_scheduling=True)
    engine = llm.llm_engine
    fill, hand_over = engine.grammar_masks.fill, engine.grammar_masks.fill_on_mask_thread
    began: list[int] = []
    seen_on_return: list[tuple[int, int]] = []  # (fills begun when it returned, fills handed over)

    def recording_fill(constrained: Any) -> Any:
        began.append(threading.get_ident())
        return fill(constrained)

    def checked_hand_over(constrained: Any) -> Any:
        future = hand_over(constrained)
        seen_on_return.append((len(began), len(seen_on_return) + 1))
        return future

    engine.grammar_masks.fill = recording_fill  # type: ignore[method-assign]
    engine.grammar_masks.fill_on_mask_thread = checked_hand_over  # type: ignore[method-assign]
    params = [SamplingParams(temperature=1.0, max_tokens=40, seed=i, so_args=JSON) for i in range(4)]
    outs = llm.generate([[3 + i, 7, 11 + i] for i in range(4)], params)
    assert all(o.outputs[0].finish_reason in ("stop", "length") for o in outs)
    assert len(seen_on_return) > 5
    assert all(begun == handed for begun, handed in seen_on_return), seen_on_return
    main = threading.get_ident()
    assert sum(t != main for t in began) == len(
        seen_on_return
    )  # each handed-over fill ran on the mask thread


def test_abort_while_masks_are_filled(qwen3_dir: Path) -> None:
    """A request aborted while its step's masks are being filled (its sampling not yet queued)
    leaves the others exactly as they are without it (rows are batch invariant)."""
    prompts = [[3 + i, 7, 11 + i] for i in range(4)]
    params = [SamplingParams(temperature=1.0, max_tokens=30, seed=i, so_args=JSON) for i in range(4)]
    want = LLM(qwen3_dir, device="cpu", dtype="float32", async_scheduling=True).generate(
        prompts[1:], params[1:]
    )
    engine = LLM(qwen3_dir, device="cpu", dtype="float32", async_scheduling=True).llm_engine
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(f"r{i}", prompt, p)
    done = {}
    while engine.has_unfinished():
        plan = engine.in_flight.unsampled if engine.in_flight is not None else None
        if plan is not None and any(r.request_id == "r0" for r in plan.step_logits.sample_requests):
            break
        done.update({o.request_id: o for o in engine.step()})
    else:
        pytest.fail("r0 never sampled in a step whose masks were filled on the mask thread")
    aborted = engine.abort("r0")
    assert aborted is not None and aborted.outputs[0].finish_reason == "abort"
    while engine.has_unfinished():
        done.update({o.request_id: o for o in engine.step()})
    assert engine.in_flight is None
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert [done[f"r{i}"].outputs[0].token_ids for i in (1, 2, 3)] == [o.outputs[0].token_ids for o in want]
    assert "r0" not in done


def test_tokens_the_grammar_refuses_fail_their_request_alone(
    qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch, strict_matchers: None
) -> None:
    """Should a sampled token break its grammar (here: the masks of all but the first constrained
    request are dropped), that request ends with finish_reason "error" and its matcher gets no
    further mask or token; the others go on, the first one under its grammar. Asynchronously the
    refusal is known right after the read-back, before the next masks are chosen: same outputs
    as synchronous scheduling."""
    import shardinfer.engine.sampler as sampler_module
    from shardinfer.engine.structured import apply_bitmask

    def first_row_only(x: Any, grammar: Any) -> None:
        rows = [r for r in grammar.rows if r == 0]  # request 0 samples in row 0 while it runs
        if rows:
            apply_bitmask(x, grammar.bitmask[:1], torch.tensor(rows, dtype=torch.long))

    monkeypatch.setattr(sampler_module, "_apply_grammar", first_row_only)
    prompts = [[5, 6, 7], [9, 10, 11, 12], [3, 1, 4], [2, 7, 1, 8], [4, 4, 4]]
    params = [
        SamplingParams(temperature=1.0, max_tokens=30, seed=i, so_args=JSON if i % 2 == 0 else None)
        for i in range(len(prompts))
    ]

    def run(async_scheduling: bool) -> list[Any]:
        llm = LLM(qwen3_dir, device="cpu", dtype="float32", async_scheduling=async_scheduling)
        return llm.generate(prompts, params)

    want = run(False)
    got = run(True)
    assert _key(got) == _key(want)
    assert [o.outputs[0].finish_reason for o in got] == [
        got[0].outputs[0].finish_reason,
        "length",
        "error",
        "length",
        "error",
    ]
    assert got[0].outputs[0].finish_reason in ("stop", "length")
    if got[0].outputs[0].finish_reason == "stop":  # its masks held: a JSON object
        assert isinstance(json.loads(got[0].outputs[0].text), dict)
