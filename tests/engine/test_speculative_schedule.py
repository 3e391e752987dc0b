"""The confidence schedule inside the engine (CPU): whatever depth it chooses, output equals
plain decoding; it learns step times from the timed steps and reports its choices in stats().

CPU steps are not timed on a device, so these tests give the budget a step-time seed and the
engine a step timer whose events read a fake device clock, advanced by each step's forward by a
cost the test sets per verify width."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shardinfer import LLM, SamplingParams
from shardinfer.engine.draft_budget import DraftBudget
from shardinfer.engine.drafting import PROBE_EVERY
from shardinfer.engine.model_runner import ModelRunner
from shardinfer.engine.step_timer import StepTimer
from tests.engine.speculative_helpers import add_requests, finish, replay_drafts

DEMO = Path(__file__).resolve().parents[2] / "examples" / "models" / "tiny-dsv3-demo"
BUCKETS = [1, 2, 4, 8]


def _key(outs) -> list[tuple]:
    return [
        (c.token_ids, c.logprobs, c.top_logprobs, c.text, c.finish_reason) for o in outs for c in o.outputs
    ]


class FakeDevice:
    """A device clock: each forward advances it by cost[width] (width 0: a step with prefill)."""

    def __init__(self, cost: dict[int, float]) -> None:
        self.cost = cost
        self.now = 0.0

    def event(self) -> FakeDevice.Event:
        return FakeDevice.Event(self)

    class Event:
        def __init__(self, device: FakeDevice) -> None:
            self.device, self.at = device, 0.0

        def record(self) -> None:
            self.at = self.device.now

        def query(self) -> bool:
            return True

        def elapsed_time(self, end: FakeDevice.Event) -> float:
            return end.at - self.at


def _schedule(
    llm: LLM, seed: dict[tuple[int, int], float], cost: dict[int, float] | None
) -> list[tuple[int, int, int]]:
    """Give the engine a step-time seed and (with `cost`) a timer on a fake device clock; returns
    the list that (running requests, chosen depth, host proposals made) of every step where some
    request could draft is appended to."""
    engine = llm.llm_engine
    drafter = engine.drafter
    drafter.budget = DraftBudget(drafter.depth, seed, BUCKETS, engine.config.speculative_mode)
    chosen: list[tuple[int, int, int]] = []
    add_drafts = drafter.add_drafts
    proposer = drafter.proposer
    proposals = [0]

    def propose_and_count(req, room, in_flight):
        proposals[0] += 1
        return proposer(req, room, in_flight)

    def add_and_note() -> None:
        before = proposals[0]
        add_drafts()
        if drafter.last_depth is not None:  # some request could draft
            chosen.append((len(engine.scheduler.running), drafter.last_depth, proposals[0] - before))

    drafter.proposer = propose_and_count

    drafter.add_drafts = add_and_note
    if cost is not None:
        device = FakeDevice(cost)
        engine.step_timer = StepTimer(device.event)
        # The wall time between steps, which the budget also weighs, runs on the fake clock at
        # half the device's pace (a host that keeps up): the real time of a CPU forward, longer on
        # a busy machine, must not decide the schedule.
        engine.pace_clock = lambda: device.now / 2000.0
        execute = engine.runner.execute

        def timed_execute(batch, fixup=None):
            device.now += device.cost.get(ModelRunner.decode_width(batch), 50.0)
            return execute(batch, fixup)

        engine.runner.execute = timed_execute
    return chosen


def _ngram_workload() -> tuple[list[list[int]], list[SamplingParams]]:
    """Requests that all draft (no penalties, no min_tokens), so their decode steps are timed."""
    base = [5, 6, 7, 8, 9, 10, 11, 12]
    prompts = [base * 3, [20, 21, 22] * 5 + [23], base + [40, 41] * 6, [7, 8, 9] * 6]
    params = [
        SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=1.0, max_tokens=36, seed=3, ignore_eos=True),
        SamplingParams(temperature=0.7, top_p=0.9, max_tokens=38, seed=11, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=34, ignore_eos=True, stop_token_ids=[12]),
    ]
    return prompts, params


def _ngram_runs(
    qwen3_dir: Path, overlap: bool
) -> tuple[list[list[int]], list[SamplingParams], list[tuple], LLM]:
    """The n-gram workload, plain decoding's output of it, and a prompt-lookup engine (depth 3) to
    compare against it."""
    prompts, params = _ngram_workload()
    want = _key(
        LLM(qwen3_dir, device="cpu", dtype="float32", async_scheduling=False).generate(prompts, params)
    )
    spec = LLM(
        qwen3_dir,
        device="cpu",
        dtype="float32",
        speculative="ngram",
        speculative_depth=3,
        async_scheduling=overlap,
    )
    return prompts, params, want, spec


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "async"])
def test_measured_expensive_verification_switches_ngram_speculation_off(qwen3_dir, overlap) -> None:
    prompts, params, want, spec = _ngram_runs(qwen3_dir, overlap)
    # The seed says a draft row is nearly free; the timed steps say each row costs a full step,
    # which no draft short of certain repays.
    seed = {(w, b): 10.0 + 0.1 * (w - 1) for w in range(1, 5) for b in BUCKETS}
    steps = _schedule(spec, seed, {w: 10.0 * w for w in range(1, 5)})
    assert _key(spec.generate(prompts, params)) == want
    stats = spec.llm_engine.stats()
    budget = spec.llm_engine.drafter.budget
    assert stats["timed_draft_steps"] > 0
    # Every measured (width, bucket) holds exactly the cost of its width.
    assert budget.times.estimate and all(ms == 10.0 * w for (w, _), ms in budget.times.estimate.items())
    # While all four requests decode (bucket 4), the schedule tries each width the seed makes
    # look cheap once, deepest first, and drafts no more once each was measured.
    four = [k for n, k, _ in steps if n == 4]
    assert four[:3] == [3, 2, 1] and set(four[3:]) == {0} and len(four) > 20
    # Once plain decoding was measured too, not even certain drafts would pay: no proposals.
    made = [m for n, _, m in steps if n == 4]
    assert set(made[:3]) == {4} and set(made[5:]) == {0}
    chosen = [k for _, k, _ in steps]
    # As requests finish the batch moves to smaller buckets, which take what bucket 4 measured.
    assert set(chosen[3:]) == {0}
    assert stats["speculation_off_share"] == chosen.count(0) / len(chosen) > 0.5
    assert stats["mean_draft_depth"] == sum(chosen) / len(chosen)
    assert stats["mean_draft_tokens_per_step"] == stats["draft_tokens"] / len(chosen) > 0


def test_measured_free_verification_keeps_ngram_speculation_at_full_depth(qwen3_dir) -> None:
    """Verify rows that cost nothing (a step bound by reading the weights): any draft with a
    chance of acceptance pays, so every step drafts the maximum."""
    prompts, params, want, spec = _ngram_runs(qwen3_dir, True)
    seed = {(w, b): 12.0 for w in range(1, 5) for b in BUCKETS}
    steps = _schedule(spec, seed, {w: 12.0 for w in range(1, 5)})
    assert _key(spec.generate(prompts, params)) == want
    stats = spec.llm_engine.stats()
    assert stats["timed_draft_steps"] > 0
    assert stats["speculation_off_share"] == 0.0 and min(k for _, k, _ in steps) > 0
    # Fewer only where no request has room for more (near its max_tokens): not while all decode.
    assert {k for n, k, _ in steps if n == 4} == {3}
    # Every verified draft reached the calibration with its match length (0: a filler): the
    # confidences travel with their step through the asynchronous pipeline.
    budget = spec.llm_engine.drafter.budget
    assert sum(budget.calibration.reached[0]) == budget.drafted[0] > 0
    assert sum(budget.calibration.accepted[0]) == budget.accepted[0]
    assert budget.calibration.reached[0][0] > 0 and sum(budget.calibration.reached[0][1:]) > 0
    assert stats["accepted_draft_tokens"] > 0


def _demo_chats() -> tuple[list[list[dict[str, str]]], list[SamplingParams]]:
    chats = [
        [{"role": "user", "content": c}]
        for c in (
            "What is 4821 + 377?",
            "Reverse the letters: p a r q u e t",
            "Sort these words alphabetically: zebra anchor kitten",
        )
    ]
    # Past the answer's end (ignore_eos) the model rambles: drafts of every confidence.
    params = [
        SamplingParams(temperature=0.0, max_tokens=40, logprobs=1, ignore_eos=True),
        SamplingParams(temperature=0.8, max_tokens=40, seed=5, ignore_eos=True),
        SamplingParams(temperature=1.0, top_p=0.9, max_tokens=40, seed=9, ignore_eos=True),
    ]
    return chats, params


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "async"])
def test_mtp_confidence_schedule_keeps_the_output_of_plain_decoding(overlap) -> None:
    """Drafting pays here only for drafts likelier than 2/5 to be accepted (a draft row adds 40%
    to the step), so the depth follows the MTP head's probabilities; output stays plain
    decoding's, and the calibration counts every verified draft."""
    chats, params = _demo_chats()
    want = _key(LLM(DEMO, device="cpu", dtype="float32").chat(chats, params))
    spec = LLM(
        DEMO, device="cpu", dtype="float32", speculative="mtp", speculative_depth=2, async_scheduling=overlap
    )
    seed = {(w, b): 10.0 + 4.0 * (w - 1) for w in range(1, 4) for b in BUCKETS}
    steps = _schedule(spec, seed, None)
    assert _key(spec.chat(chats, params)) == want
    stats = spec.llm_engine.stats()
    budget = spec.llm_engine.drafter.budget
    for name in (
        "mean_draft_depth",
        "mean_draft_tokens_per_step",
        "speculation_off_share",
        "draft_acceptance_p1",
    ):
        assert name in stats
    assert stats["draft_tokens"] > 0 and max(k for _, k, _ in steps) > 0
    # Every verified first draft with a known probability is counted in its decile.
    reached = sum(budget.calibration.reached[0])
    assert 0 < reached <= budget.drafted[0]
    assert sum(budget.calibration.accepted[0]) <= budget.accepted[0]


def test_the_mtp_confidence_is_the_heads_probability_of_its_draft() -> None:
    """Checked against a float64 softmax of the MTP head's logits, captured as the engine runs."""
    llm = LLM(
        DEMO, device="cpu", dtype="float32", speculative="mtp", speculative_depth=1, async_scheduling=False
    )
    engine = llm.llm_engine
    captured: list[torch.Tensor] = []
    head = engine.model.mtp_compute_logits

    def capture(hidden: torch.Tensor) -> torch.Tensor:
        logits = head(hidden)
        captured.append(logits.detach().clone())
        return logits

    engine.model.mtp_compute_logits = capture
    engine.add_request(
        "q",
        engine.tokenizer.encode("What is 4821 + 377?"),
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
    )
    req = engine.requests["q"]
    checked = 0
    while engine.has_unfinished():
        captured.clear()
        engine.step()
        if req.status.finished or not captured:
            continue
        probs = torch.softmax(captured[-1].double(), dim=-1)[0]
        draft = req.mtp_draft[0]
        assert draft == int(probs.argmax())  # greedy: the head's top token
        assert req.mtp_confidence[0] == pytest.approx(float(probs[draft]), abs=1e-6)
        checked += 1
    assert checked >= 5


def test_a_host_slower_than_the_device_switches_ngram_speculation_off(qwen3_dir) -> None:
    """The device says a verify row is free, but the host needs ten times longer to prepare a
    verify step than a plain one (what the wall clock between steps shows): the paced times make
    the schedule stop drafting, and the output stays plain decoding's."""
    prompts, params, want, spec = _ngram_runs(qwen3_dir, True)
    seed = {(w, b): 10.0 for w in range(1, 5) for b in BUCKETS}
    steps = _schedule(spec, seed, {w: 10.0 for w in range(1, 5)})
    engine = spec.llm_engine
    host = [0.0]  # seconds
    engine.pace_clock = lambda: host[0]
    execute = engine.runner.execute

    def host_paced_execute(batch, fixup=None):
        width = ModelRunner.decode_width(batch)
        host[0] += (0.010 if width <= 1 else 0.100) if width else 0.050
        return execute(batch, fixup)

    engine.runner.execute = host_paced_execute
    assert _key(spec.generate(prompts, params)) == want
    budget = engine.drafter.budget
    assert budget.times.paced.estimate
    # Every verify width was charged its host time, more than its device time.
    for (w, _), ms in budget.times.paced.estimate.items():
        assert ms == pytest.approx(10.0 if w == 1 else 100.0)
    four = [k for n, k, _ in steps if n == 4]
    assert four[:3] == [3, 2, 1] and set(four[3:]) == {0} and len(four) > 20


def test_drafts_never_accepted_stop_the_proposals_but_for_a_probe_every_so_often(qwen3_dir) -> None:
    """Verify rows nearly free (certain drafts would pay), but every draft is wrong (replay at
    alpha 0): once the estimates have seen that, the requests stop proposing, and only every
    PROBE_EVERY-th step without proposals verifies one draft each to keep the estimates learning.
    The output stays plain decoding's."""
    prompts = [[5, 6, 7, 8] * 4, [9, 10, 11] * 5, [12, 13] * 6]
    params = [
        SamplingParams(temperature=0.0, max_tokens=260, ignore_eos=True),
        SamplingParams(temperature=1.0, max_tokens=250, seed=4, ignore_eos=True),
        SamplingParams(temperature=0.8, max_tokens=240, seed=9, ignore_eos=True),
    ]
    plain = LLM(qwen3_dir, device="cpu", dtype="float32").generate(prompts, params)
    spec = LLM(qwen3_dir, device="cpu", dtype="float32", speculative="ngram", speculative_depth=2)
    engine = spec.llm_engine
    replay_drafts(engine, plain, 0.0, seed=5)
    seed = {(w, b): 10.0 + 0.5 * (w - 1) for w in range(1, 4) for b in BUCKETS}
    steps = _schedule(spec, seed, {1: 10.0, 2: 10.5, 3: 11.0})
    add_requests(engine, prompts, params)
    got = finish(engine, len(prompts))
    assert _key(got) == _key(plain)
    stats = engine.stats()
    assert stats["accepted_draft_tokens"] == 0 and stats["draft_tokens"] > 0
    proposed = [i for i, (_, _, made) in enumerate(steps) if made]
    # The learning stretch at the start, then probes only: each a PROBE_EVERY-th unproposed step,
    # verifying one draft per request.
    learned = next(i for i in range(len(proposed) - 1) if proposed[i + 1] - proposed[i] > 1)
    probes = proposed[learned + 1 :]
    assert len(probes) >= 2 and stats["draft_probe_steps"] == len(probes)
    assert all(b - a == PROBE_EVERY for a, b in zip(proposed[learned:], probes, strict=False))
    assert all(steps[i][1] == 1 for i in probes)
    assert len(proposed) < 0.2 * len(steps)
