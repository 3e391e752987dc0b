"""`shardinfer status` and the `--dry-run` report: what a job location holds, read from its markers.

Status trusts `_job.json`, the commit markers and `_SUCCESS`, never a listing of part files, for
what counts (an uncommitted part may be lying there from a killed attempt); one listing only checks
that each committed part is there with the size its marker records. It only reads: nothing is
created at the location it is pointed at.
"""

from __future__ import annotations

import datetime as _dt
import json
import sys
import time
from collections import Counter
from typing import Any

from shardinfer.errors import EXIT_OK, CorruptOutputError, InputMissing, UsageError
from shardinfer.jobs.spec import ResolvedSpec
from shardinfer.pipeline.job import OpenedJob, part_totals
from shardinfer.redaction import redact_config, redact_url


def job_state(store: Any, job: dict[str, Any]) -> dict[str, Any]:
    """What an output location holds: state, the problems found, the newest run, the totals.

    States: done (a `_SUCCESS` that agrees with the markers and every part present, of the size
    its marker records), damaged (they disagree, or a part is missing or resized: the problems say how), running (the newest run's heartbeat is fresh),
    interrupted (killed, or stopped by a signal), failed (with the run's reason), not started.
    """
    from shardinfer.jobs.run_record import STALE_AFTER_S
    from shardinfer.writers.run_records import read_run_records

    store.use_generation(str(job.get("generation", "")))
    committed = store.committed()
    # The same cheap check of the parts as a submit's (one listing: missing or resized parts).
    problems = [f"split {i}: {why}" for i, why in sorted(store.listed_damage(committed).items())]
    success, unreadable = _read_success(store)
    if unreadable:
        problems = [unreadable, *problems]
    if success is not None:
        problems = store.success_problems(success, committed) + problems
    runs = read_run_records(store)
    last = runs[-1] if runs else None
    if last is not None:
        # A run record says "running" until its run writes an end, which a killed run never does:
        # the record is shown with the state it is judged to be in, so the two lines agree.
        last = {**last, "state": run_state(last, STALE_AFTER_S)}
    if success is not None and not problems:
        state = "done"
    elif last is not None and last["state"] in ("running", "failed", "interrupted"):
        state = str(last["state"])
    elif problems:
        state = "damaged"
    else:
        state = "interrupted" if committed else "not started"
    return {"state": state, "problems": problems, "committed": committed, "success": success, "last": last}


def _read_success(store: Any) -> tuple[dict[str, Any] | None, str]:
    """`_SUCCESS` (None when absent or unreadable) and, for one that cannot be read (a kill while
    it was written, a truncated copy), the problem to report: not a job that never finished."""
    try:
        success = store.read_success()
    except CorruptOutputError:
        return None, "_SUCCESS unreadable: delete it and run the job again"
    return (dict(success) if success is not None else None), ""


def run_state(run: dict[str, Any], stale_after_s: float) -> str:
    """A run record's state: as recorded once the run has ended; before that "running" while its
    heartbeat is fresh and its process may be alive, else "interrupted" (killed: no end recorded)."""
    if "ended" in run:
        return str(run.get("state"))
    age = _age_s(str(run.get("heartbeat", "")))
    fresh = age is not None and age < stale_after_s
    return "running" if fresh and _may_be_alive(run) else "interrupted"


def live_runs(store: Any, generation: str) -> list[tuple[dict[str, Any], float]]:
    """The runs of a job generation at an output location that `status` calls running (no end
    recorded, a fresh heartbeat, a process that may be alive), each with its heartbeat's age in
    seconds. A run of another generation is left out: the job it runs was started over, and it
    stops at its next commit."""
    from shardinfer.jobs.run_record import STALE_AFTER_S
    from shardinfer.writers.run_records import read_run_records

    live = []
    for run in read_run_records(store):
        recorded = str(run.get("generation") or "")
        if recorded and generation and recorded != generation:
            continue
        if run_state(run, STALE_AFTER_S) == "running":
            age = _age_s(str(run.get("heartbeat", ""))) or 0.0
            live.append((run, max(age, 0.0)))  # a clock a little ahead of this one's: just now
    return live


def _may_be_alive(run: dict[str, Any]) -> bool:
    """False when the run's process is known dead: it ran on this host and its pid is gone."""
    import os
    import socket

    if run.get("host") != socket.gethostname() or not isinstance(run.get("pid"), int):
        return True
    try:
        os.kill(int(run["pid"]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _age_s(stamp: str) -> float | None:
    try:
        when = _dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (_dt.datetime.now(_dt.UTC) - when).total_seconds()


def _open(output: str, storage_options: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The store and its `_job.json`; reads only (a mistyped URL must not leave a folder behind)."""
    from shardinfer.writers.output_store import OutputStore

    if not output.strip():
        raise UsageError("OUTPUT_URL is empty: give the output location of a job (output.path)")
    store = OutputStore(output, storage_options)
    try:
        job = store.read_job()
    except (NotADirectoryError, IsADirectoryError):  # a file on the way, or `_job.json` a folder
        job = None
    if job is None:
        absent = store.location_problem()
        if absent is not None:
            hint = ""
            if any(ch in output for ch in "*?["):
                hint = " (status takes one output location; wildcards are not expanded)"
            raise InputMissing(f"{output} holds no job: {absent}{hint}; check the output URL")
        if store.has_protocol_files():
            raise CorruptOutputError(
                f"{output} holds commit markers or parts but no _job.json: the location is damaged; "
                "rerun the job with --conf job.start_over=true, or write to a new output path"
            )
        raise InputMissing(f"{output} holds no job (_job.json is missing): check the output URL")
    return store, job


def show_status(output: str, storage_options: dict[str, Any], as_json: bool = False) -> int:
    store, job = _open(output, storage_options)
    if "eval_tasks" in job:  # `shardinfer eval`'s output: its parts hold samples, not job rows
        return show_eval_status(output, store, job, as_json)
    found = job_state(store, job)
    committed, success, last = found["committed"], found["success"], found["last"]
    revisions: Counter[str] = Counter()
    totals, unreadable = _readable_totals(store, committed, found["problems"], revisions)
    found["problems"] += unreadable
    if found["state"] == "done" and unreadable:
        found["state"] = "damaged"  # never "done" beside a problem: a part's footer cannot be read
    total_splits = len(job.get("splits", []))
    report: dict[str, Any] = {
        "output": output,
        "state": found["state"],
        "problems": found["problems"],
        "splits_committed": len(committed),
        "splits_total": total_splits,
        **totals,
        "fingerprint": job.get("fingerprint", {}).get("hash"),
        "generation": job.get("generation"),
        "numerics_revisions": dict(sorted(revisions.items())),
    }
    if last is not None:
        report["last_run"] = {
            k: last.get(k)
            for k in ("run_id", "state", "started", "ended", "heartbeat", "exit_code", "reason", "repaired")
        }
    if success is not None:
        summary = success.get("summary", {})
        for key in (
            "run_id",
            "task",
            "wall_time_s",
            "output_tokens_per_s",
            "run_prompt_tokens",
            "prefix_cache_hit_rate",
            "repaired",
        ):
            if key in summary:
                report[key] = summary[key]
    if _print_head(report, as_json, f"{output}: {report['state']}", found["problems"]):
        return EXIT_OK
    print(f"  splits     {len(committed)}/{total_splits} committed")
    print(f"  rows       {totals['rows_ok']} ok, {totals['rows_error']} error")
    print(f"  tokens     {totals['prompt_tokens']} in, {totals['completion_tokens']} out")
    if len(revisions) > 1:  # runs of versions whose kernels compute differently committed splits
        counts = ", ".join(f"{parts} under {name}" for name, parts in sorted(revisions.items()))
        print(f"  revisions  parts by numerics revision: {counts} (may differ in bits; docs/jobs.md)")
    if last is not None:
        if "ended" in last:
            ended = f", exit {last.get('exit_code')}: {last.get('reason')}"
        elif last.get("state") == "interrupted":
            ended = f", no end recorded (last heartbeat {last.get('heartbeat')})"
        else:
            ended = ""
        print(f"  last run   {last.get('run_id')} ({last.get('state')}) started {last.get('started')}{ended}")
        if last.get("repaired"):
            print(f"  repaired   {last['repaired']}")
    if "output_tokens_per_s" in report:
        print(f"  speed      {_speed(report)}, prefix-cache hit rate {report.get('prefix_cache_hit_rate')}")
    return EXIT_OK


def _speed(report: dict[str, Any]) -> str:
    """The finishing run's rate: tokens generated, or for a score job (which generates none worth
    counting) the prompt tokens it read, as its summary says."""
    wall = report.get("wall_time_s")
    if report.get("task") == "score" and "run_prompt_tokens" in report:
        read = report["run_prompt_tokens"] / wall if wall else 0.0
        return f"{read:.2f} prompt tok/s read over {wall} s"
    return f"{report['output_tokens_per_s']} tok/s over {wall} s"


def _readable_totals(
    store: Any, committed: dict[int, dict[str, Any]], problems: list[str], revisions: Counter[str]
) -> tuple[dict[str, int], list[str]]:
    """Totals over the parts whose footers can be read, and in `revisions` those parts by numerics
    revision; the parts that cannot be read become problems, not crashes. The footers are read
    several at once (writers.parts.map_parts)."""
    from shardinfer.writers.parts import map_parts

    damaged = {p.split(":", 1)[0] for p in problems}
    readable = [(i, m) for i, m in committed.items() if f"split {i}" not in damaged]

    def read(marker: dict[str, Any]) -> tuple[dict[str, int], str] | Exception:
        try:
            return part_totals(store, marker)
        except (OSError, ValueError) as exc:  # a truncated or replaced part: ArrowInvalid is a ValueError
            return exc

    totals = {"records": 0, "rows_ok": 0, "rows_error": 0, "prompt_tokens": 0, "completion_tokens": 0}
    unreadable = []
    for (index, marker), outcome in zip(readable, map_parts(read, [m for _, m in readable]), strict=True):
        if isinstance(outcome, Exception):
            # A submit trusts a part of the recorded size without opening it (see open_job):
            # deleting the part is what makes the rerun that repairs it see the damage.
            unreadable.append(
                f"split {index}: {marker['part']} cannot be read ({type(outcome).__name__}: {outcome}); "
                "delete that part file and rerun the job to recompute it"
            )
            continue
        counts, revision = outcome
        for key in totals:
            totals[key] += counts[key]
        revisions[revision] += 1
    return totals, unreadable


def eval_state(store: Any, job: dict[str, Any]) -> dict[str, Any]:
    """What an eval's output holds, task by task (one split per requested task).

    A task's samples are the rows its marker records; its metrics are read from its part's footer,
    which also proves the part readable. States: done (as a job's), damaged (the problems say how;
    a rerun of the same eval command repairs it), incomplete (some task not committed: the eval
    was stopped, or is running now, which an eval does not record), not started.
    """
    from shardinfer.jobs.eval_command import RESULTS_FILE, RESULTS_METADATA, _results_problem
    from shardinfer.writers.job_file import splits_from_job

    store.use_generation(str(job.get("generation", "")))
    committed = store.committed()
    damaged = store.listed_damage(committed)  # one listing, as for a job
    success, unreadable = _read_success(store)
    problems = [unreadable] if unreadable else []
    if success is not None:
        problems += store.success_problems(success, committed)
        # A finished eval's results are its results.json: one deleted or cut since is no result.
        lost = _results_problem(store)
        if lost is not None:
            problems.append(f"{RESULTS_FILE} {lost}: run the same eval command again to write it")
    tasks: list[dict[str, Any]] = []
    metrics: dict[str, dict[str, Any]] = {}
    for split in splits_from_job(job):
        marker = committed.get(split.index)
        task: dict[str, Any] = {
            "task": split.path,
            "split": split.index,
            "state": "not committed",
            "samples": None,
        }
        tasks.append(task)
        if marker is None:
            continue
        task.update(state="committed", samples=int(marker.get("rows", 0)))
        why = damaged.get(split.index)
        if why is None:
            try:
                results = json.loads(store.read_part_metadata(marker["part"])[RESULTS_METADATA.encode()])
            except (OSError, ValueError, KeyError) as exc:  # ArrowInvalid is a ValueError
                why = (
                    f"{marker['part']} cannot be read ({type(exc).__name__}: {exc}); delete that part "
                    "file and run the same eval command again"
                )
            else:
                for name, values in (results.get("results") or {}).items():
                    metrics[name] = {k: v for k, v in values.items() if isinstance(v, int | float)}
        if why is not None:
            task["state"] = "damaged"
            problems.append(f"task {split.path} (split {split.index}): {why}")
    if success is not None and not problems:
        state = "done"
    elif problems:
        state = "damaged"
    else:
        state = "incomplete" if committed else "not started"
    return {"state": state, "problems": problems, "tasks": tasks, "metrics": metrics, "success": success}


def show_eval_status(output: str, store: Any, job: dict[str, Any], as_json: bool = False) -> int:
    from shardinfer.jobs.eval_command import RESULTS_FILE, metric_lines

    found = eval_state(store, job)
    tasks = found["tasks"]
    done = [t for t in tasks if t["state"] != "not committed"]
    samples = sum(t["samples"] for t in done)
    report: dict[str, Any] = {
        "output": output,
        "kind": "eval",
        "state": found["state"],
        "problems": found["problems"],
        "tasks_committed": len(done),
        "tasks_total": len(tasks),
        "splits_committed": len(done),  # one split per task, as the commit protocol counts them
        "splits_total": len(tasks),
        "samples_committed": samples,
        "tasks": tasks,
        "metrics": found["metrics"],
        "results_file": RESULTS_FILE if found["state"] == "done" else None,
        "fingerprint": job.get("fingerprint", {}).get("hash"),
        "generation": job.get("generation"),
    }
    if _print_head(report, as_json, f"{output}: {report['state']} (eval)", found["problems"]):
        return EXIT_OK
    damaged = sum(t["state"] == "damaged" for t in tasks)
    of_which = f" ({damaged} damaged)" if damaged else ""
    print(f"  tasks      {len(done)}/{len(tasks)} committed{of_which}, {samples} samples")
    for task in tasks:
        shown = "not committed" if task["samples"] is None else f"{task['samples']} samples"
        print(f"  task       {task['task']}: {shown}{' (damaged)' if task['state'] == 'damaged' else ''}")
    for line in metric_lines(found["metrics"]):
        print(f"  metrics    {line}")
    if report["results_file"]:
        print(f"  results    {RESULTS_FILE}")
    elif found["state"] != "not started":
        print("  results    not final: the same eval command, run again, runs the tasks missing or damaged")
    return EXIT_OK


def show_history(output: str, storage_options: dict[str, Any], as_json: bool = False) -> int:
    from shardinfer.jobs.run_record import STALE_AFTER_S
    from shardinfer.writers.run_records import read_run_records

    store, _ = _open(output, storage_options)
    runs = read_run_records(store)  # as recorded: a killed run's record still says "running"
    for run in runs:
        # What status would say of it: a killed run's record says "running" for ever.
        now = run_state(run, STALE_AFTER_S)
        if as_json:
            print(json.dumps({**run, "state_now": now}, default=str))
            continue
        end = f"ended {run.get('ended')} exit {run.get('exit_code')}" if "ended" in run else "no end recorded"
        if now != run.get("state"):
            end += f" (now {now}: last heartbeat {run.get('heartbeat')})"
        reason = f": {run.get('reason')}" if run.get("reason") and run.get("exit_code") else ""
        # A record of a version before runs named their version and numerics revision has neither.
        version = f" version={run['version']}/{run['numerics_revision']}" if "version" in run else ""
        print(
            f"{run.get('run_id')}  {run.get('state')}  started {run.get('started')}  {end}  "
            f"workers={run.get('workers')} host={run.get('host')}{version} "
            f"splits_committed={run.get('splits_committed', '?')}{reason}"  # "?": killed before it could say
        )
    if not runs and not as_json:
        print(f"{output}: no runs recorded (_runs/ is empty)")
    return EXIT_OK


def print_dry_run(
    job: OpenedJob, spec: ResolvedSpec, num_workers: int, out: Any = None, as_json: bool = False
) -> None:
    """The resolved spec (with each value's source), the fingerprint and the split plan."""
    out = out if out is not None else sys.stdout
    cfg, sources = shown_spec(job, spec)
    if as_json:  # --log-format json: one object, so that every line of the run parses
        print(
            json.dumps(dry_run_record(job, spec, num_workers, cfg, sources), default=str),
            file=out,
            flush=True,
        )
        return
    print("# resolved job spec", file=out)
    for section, body in cfg.items():
        print(f"[{section}]", file=out)
        for key, value in body.items():
            print(f"{key} = {json.dumps(value, default=str)}  # {sources[f'{section}.{key}']}", file=out)
    print("\n# fingerprint", file=out)
    print(json.dumps(job.fingerprint, indent=2, sort_keys=True, default=str), file=out)
    committed = set(job.committed)
    print(
        f"\n# plan: {len(job.splits)} split(s), {num_workers} worker(s), output state: {job.state}", file=out
    )
    for line in dry_run_actions(job):
        print(f"# submitting would {line}", file=out)
    for s in job.splits:
        mark = " (committed)" if s.index in committed else ""
        chosen = f" ({s.num_rows} rows with new ids)" if s.only_rows is not None else ""
        print(
            f"split {s.index}: {redact_url(s.path)} rows [{s.row_start}, {s.row_end}){chosen}{mark}", file=out
        )


def shown_spec(job: OpenedJob, spec: ResolvedSpec) -> tuple[dict[str, Any], dict[str, str]]:
    """The spec a dry run shows, credentials as ***, and where each value came from ("section.key"
    -> source). A generation job's [sampling] is every value its requests take, the defaults
    included: the keys the spec leaves out still decide the rows (max_tokens above all)."""
    data = spec.config.to_dict()
    sources = dict(spec.sources)
    if spec.config.job.task == "generate":
        data["sampling"], sampling_sources = sampling_in_use(job, spec)
        sources.update({f"sampling.{key}": source for key, source in sampling_sources.items()})
    cfg = redact_config(data)
    shown = {
        f"{section}.{key}": sources.get(f"{section}.{key}", "default")
        for section, body in cfg.items()
        for key in body
    }
    return cfg, shown


CHECKPOINT_DEFAULT = "model's generation_config.json"  # the source of a value the checkpoint sets


def sampling_in_use(job: OpenedJob, spec: ResolvedSpec) -> tuple[dict[str, Any], dict[str, str]]:
    """The sampling values of the job's requests (as open_job resolved them: [sampling] over the
    checkpoint's generation_config.json over SamplingParams' own defaults) and the source of each.
    `seed` is left out: it is no sampling key, a row's seed derives from job.seed."""
    from shardinfer.engine.sampling_params import checkpoint_sampling_defaults

    given = spec.config.sampling
    checkpoint = checkpoint_sampling_defaults(spec.config.model.path)
    resolved = job.sampling.to_json_dict()
    values = {k: resolved[k] for k in type(job.sampling).field_names() if k in resolved and k != "seed"}
    sources = {}
    for key in values:
        # `so_args` is structured_output's older name: a spec giving it gives structured_output.
        named = (
            key if key in given else "so_args" if key == "structured_output" and "so_args" in given else ""
        )
        if named:
            sources[key] = spec.sources.get(f"sampling.{named}", "job file")
        else:
            sources[key] = CHECKPOINT_DEFAULT if key in checkpoint else "default"
    return values, sources


def dry_run_record(
    job: OpenedJob,
    spec: ResolvedSpec,
    num_workers: int,
    cfg: dict[str, Any],
    sources: dict[str, str],
) -> dict[str, Any]:
    """The dry run's report as data: the same spec, sources (shown_spec's), fingerprint and plan
    as its text."""
    committed = set(job.committed)
    splits = [
        {
            "split": s.index,
            "path": redact_url(s.path),
            "row_start": s.row_start,
            "row_end": s.row_end,
            "rows": s.num_rows,
            "committed": s.index in committed,
        }
        for s in job.splits
    ]
    return {
        "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),  # the keys of every JSON log line
        "level": "info",
        "run_id": spec.config.job.run_id,
        "msg": "dry run",
        "event": "dry_run",
        "spec": cfg,
        "sources": sources,
        "fingerprint": job.fingerprint,
        "state": job.state,
        "workers": num_workers,
        "actions": dry_run_actions(job),
        "splits": splits,
    }


def dry_run_actions(job: OpenedJob) -> list[str]:
    """What a submit would do beyond running the plan: discard another job's output, extend the plan."""
    actions = []
    if job.discards:
        actions.append(
            f"discard the output at {redact_url(job.config.output.path)}, which holds {job.discards}: every part, "
            "marker and _SUCCESS (job.start_over = true), then run this job afresh"
        )
    if job.growth is not None:
        growth = job.growth.describe()
        actions.append(
            f"plan the input that is new since the job was planned (job.incremental = true): {growth}"
        )
    if job.kept_plan:
        actions.append(f"keep the job's plan: {job.kept_plan}")
    for note in job.notes:  # a stale or damaged output: what the run's repair step will redo
        actions.append(f"recompute what is missing or damaged ({note})")
    if job.state == "done":
        actions.append("do nothing: _SUCCESS matches this job")
    return actions


def _print_head(report: dict[str, Any], as_json: bool, header: str, problems: list[str]) -> bool:
    """Print the whole report as JSON (True: nothing more to print), or its header and problem lines."""
    if as_json:
        print(json.dumps(report, default=str))
        return True
    print(header)
    for problem in problems:
        print(f"  problem    {problem}")
    return False
