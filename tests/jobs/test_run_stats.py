"""The run summary: the speculative-decoding section combined over the run's engines, and the tokens
of workers that died before reporting their engine's statistics."""

from __future__ import annotations

import io
import queue
import threading

import pytest

from shardinfer.errors import Interrupted
from shardinfer.jobs.progress import Reporter
from shardinfer.jobs.split_driver import Inbox, RunStats, drive
from shardinfer.jobs.split_scheduler import SplitScheduler
from shardinfer.splits import Split


def test_summary_reports_speculative_acceptance_weighted_by_drafts() -> None:
    stats = RunStats()
    stats.add(
        {
            "engine_stats": {
                "generated_tokens": 100.0,
                "draft_tokens": 60.0,
                "accepted_draft_tokens": 45.0,
                "mean_draft_depth": 3.0,
                "draft_acceptance_p1": 0.9,
                "draft_acceptance_p2": 0.7,
            }
        },
        worker="0",
    )
    stats.add(
        {
            "engine_stats": {
                "generated_tokens": 50.0,
                "draft_tokens": 20.0,
                "accepted_draft_tokens": 5.0,
                "mean_draft_depth": 1.0,
                "draft_acceptance_p1": 0.25,
            }
        },
        worker="1",
    )
    spec = stats.summary(10.0, 2)["speculative"]
    assert spec == {
        "draft_tokens": 80,
        "accepted_draft_tokens": 50,
        "acceptance_rate": 0.625,
        "mean_draft_depth": 2.0,
        "acceptance_p1": round((0.9 * 60 + 0.25 * 20) / 80, 4),  # 0.7375
        "acceptance_p2": 0.7,
    }


def test_summary_has_no_speculative_section_without_drafts() -> None:
    stats = RunStats()
    stats.add({"engine_stats": {"generated_tokens": 10.0, "draft_tokens": 0.0}})
    assert "speculative" not in stats.summary(1.0, 1)


def test_summary_reports_the_budgets_choices_also_where_speculation_switched_off() -> None:
    stats = RunStats()
    stats.add(
        {
            "engine_stats": {
                "generated_tokens": 100.0,
                "draft_tokens": 60.0,
                "accepted_draft_tokens": 30.0,
                "mean_draft_depth": 1.5,
                "mean_draft_tokens_per_step": 6.0,
                "speculation_off_share": 0.25,
            }
        },
        worker="0",
    )
    # This engine's budget never drafted: verification cost more than it saved.
    stats.add(
        {
            "engine_stats": {
                "generated_tokens": 80.0,
                "draft_tokens": 0.0,
                "accepted_draft_tokens": 0.0,
                "mean_draft_depth": 0.0,
                "mean_draft_tokens_per_step": 0.0,
                "speculation_off_share": 1.0,
                "draft_probe_steps": 3.0,
            }
        },
        worker="1",
    )
    spec = stats.summary(10.0, 2)["speculative"]
    assert spec == {
        "draft_tokens": 60,
        "accepted_draft_tokens": 30,
        "acceptance_rate": 0.5,
        "mean_draft_depth": 1.5,
        "probe_steps": 3,
        "mean_draft_tokens_per_step": 3.0,  # (6 + 0) / 2
        "speculation_off_share": 0.625,
    }  # (0.25 + 1) / 2
    off = RunStats()
    off.add(
        {
            "engine_stats": {
                "generated_tokens": 80.0,
                "draft_tokens": 0.0,
                "mean_draft_tokens_per_step": 0.0,
                "speculation_off_share": 1.0,
            }
        }
    )
    assert off.summary(1.0, 1)["speculative"] == {
        "draft_tokens": 0,
        "accepted_draft_tokens": 0,
        "acceptance_rate": 0.0,
        "mean_draft_tokens_per_step": 0.0,
        "speculation_off_share": 1.0,
    }


def test_summary_reports_the_slowest_engine_start_and_what_was_compiled_ahead() -> None:
    import io

    from shardinfer.jobs.progress import Reporter

    stats = RunStats()
    stats.add(
        {
            "engine_stats": {
                "generated_tokens": 10.0,
                "engine_start_s": 12.5,
                "compiled_ahead_variants": 40.0,
                "compiled_ahead_s": 3.25,
            }
        },
        worker="0",
    )
    stats.add(
        {
            "engine_stats": {
                "generated_tokens": 10.0,
                "engine_start_s": 14.0,
                "compiled_ahead_variants": 38.0,
                "compiled_ahead_s": 3.5,
            }
        },
        worker="1",
    )
    summary = stats.summary(10.0, 2)
    assert (
        summary["engine_start_s"],
        summary["kernels_compiled_ahead"],
        summary["kernels_compiled_ahead_s"],
    ) == (14.0, 40, 3.5)
    out = io.StringIO()
    Reporter(run_id="r", stream=io.StringIO()).summary({**summary, "run_id": "r"}, out=out)
    assert "engine start   14.0 s (40 kernel variants compiled or loaded ahead in 3.5 s)" in out.getvalue()
    cpu = RunStats()
    cpu.add({"engine_stats": {"generated_tokens": 10.0, "engine_start_s": 0.5}})
    assert "kernels_compiled_ahead" not in cpu.summary(1.0, 1)


def test_summary_reports_the_batch_in_effect_and_the_preemptions() -> None:
    """The largest batch cap the run's engines took, and their preemptions added up, with a line
    naming the setting that avoids them."""
    stats = RunStats()
    for worker, (cap, preempted) in enumerate([(512.0, 3.0), (1024.0, 4.0)]):
        engine = {
            "generated_tokens": 10.0,
            "engine_start_s": 1.0,
            "max_num_seqs": cap,
            "preemptions": preempted,
        }
        stats.add({"engine_stats": engine}, worker=str(worker))
    summary = stats.summary(10.0, 2)
    assert (summary["max_num_seqs"], summary["run_preemptions"]) == (1024, 7)
    out = io.StringIO()
    Reporter(run_id="r", stream=io.StringIO()).summary({**summary, "run_id": "r"}, out=out)
    assert "batch          up to 1024 sequences a step; 7 preemption(s)" in out.getvalue()
    assert "a smaller engine.max_num_seqs avoids them" in out.getvalue()
    calm = RunStats()
    calm.add({"engine_stats": {"generated_tokens": 10.0, "engine_start_s": 1.0, "max_num_seqs": 256.0}})
    out = io.StringIO()
    Reporter(run_id="r", stream=io.StringIO()).summary({**calm.summary(1.0, 1), "run_id": "r"}, out=out)
    assert "batch          up to 256 sequences a step\n" in out.getvalue()


class _FakeWorker:
    """A worker that answers each split at once with what a real one sends; worker "0" dies (SIGKILL)
    right after its first commit, before it could report its engine's statistics."""

    def __init__(self, name: str, inbox: Inbox) -> None:
        self.name, self.inbox, self.generated, self.read = name, inbox, 0, 0
        inbox.put((name, {"event": "want_split"}))

    def give(self, split: Split | None) -> None:
        if split is None:
            engine = {"generated_tokens": self.generated, "prompt_tokens": self.read}
            self.inbox.put((self.name, {"event": "worker_done", "engine_stats": engine}))
            self.inbox.put((self.name, {"event": "exited", "code": 0}))
            return
        tokens, prompt = 10 * (split.index + 1), 1000 * (split.index + 1)
        self.generated += tokens
        self.read += prompt
        # Progress events carry no prompt tokens; the commit's split statistics do.
        self.inbox.put((self.name, {"event": "progress", "records": 4, "completion_tokens": tokens}))
        done = {
            "event": "split_done",
            "split": split.index,
            "won": True,
            "records": 4,
            "completion_tokens": tokens,
            "prompt_tokens": prompt,
        }
        self.inbox.put((self.name, done))
        if self.name == "0":
            self.inbox.put((self.name, {"event": "exited", "code": -9, "reason": "killed by signal 9"}))
        else:
            self.inbox.put((self.name, {"event": "want_split"}))

    def terminate(self) -> None:
        pass

    def kill(self) -> None:
        pass


def test_a_dead_workers_committed_tokens_count_in_this_run() -> None:
    # Four splits of 10, 20, 30 and 40 tokens, every one committed once: 100 tokens generated by this
    # run. The dead worker's split was left out of the count (it never sent its engine's statistics).
    splits = [Split(i, 0, "f.parquet", 0, 4) for i in range(4)]
    scheduler = SplitScheduler(splits)
    inbox: Inbox = queue.Queue()
    stats = RunStats()
    reporter = Reporter("r", stream=io.StringIO())
    reporter.start(16, 4)
    drive(
        scheduler,
        inbox,
        lambda name, slot: _FakeWorker(name, inbox),
        2,
        reporter,
        stats,
        threading.Event(),
        max_restarts=0,
    )
    summary = stats.summary(1.0, 2, scheduler)
    assert summary["run_splits_committed"] == 4
    assert summary["run_completion_tokens"] == 100
    workers = summary["run_workers"]
    assert sum(w["generated_tokens"] for w in workers.values()) == 100
    assert not workers["0"]["finished"] and workers["0"]["generated_tokens"] > 0
    # Prompt tokens too (a score job's only work): 1000 + 2000 + 3000 + 4000 read by this run.
    assert summary["run_prompt_tokens"] == 10000
    out = io.StringIO()
    reporter.summary({**summary, "task": "score", "run_id": "r", "prompt_tokens": 10000}, out=out)
    assert "this run       10000 tokens fed to the model in 1.0 s" in out.getvalue()


class _StartingWorker:
    """A worker still starting when the run is stopped: SIGTERM ends it before it handles the signal."""

    def __init__(self, name: str, inbox: Inbox) -> None:
        self.name, self.inbox = name, inbox

    def give(self, split: Split | None) -> None:
        pass

    def terminate(self) -> None:
        self.inbox.put((self.name, {"event": "exited", "code": -15, "reason": "killed by signal 15"}))

    def kill(self) -> None:
        pass


def test_a_worker_stopped_while_starting_is_not_reported_dead() -> None:
    inbox: Inbox = queue.Queue()
    log = io.StringIO()
    stop = threading.Event()
    stop.set()  # SIGTERM came while the workers were starting
    scheduler = SplitScheduler([Split(0, 0, "f.parquet", 0, 4)])
    with pytest.raises(Interrupted):
        drive(
            scheduler,
            inbox,
            lambda name, slot: _StartingWorker(name, inbox),
            2,
            Reporter("r", stream=log),
            RunStats(),
            stop,
            max_restarts=2,
        )
    assert "died" not in log.getvalue() and scheduler.counts.redone == []
