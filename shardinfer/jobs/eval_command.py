"""`shardinfer eval`: lm-evaluation-harness on the engine, its results and every sample dumped.

    <output>/results.json                                 the harness's results (metrics, configs,
                                                          versions), merged from the tasks' runs
    <output>/part-{split}-{generation}-{attempt}.parquet  one part per requested task (split k = the
                                                          k-th task of --tasks): the logged samples of
                                                          the task, or of each task of a group
                                                          (writers.schema.eval_samples_schema), and in
                                                          its metadata the rest of the task's results
    <output>/_commits/, _job.json, _SUCCESS               the job commit protocol, one split per task

The harness runs once per requested task, on one engine, and each task is committed as soon as it
has run, so an eval stopped part-way keeps the tasks it finished. A group runs as one task: its
aggregate is computed by the harness over its subtasks, as in a run of all the tasks. results.json
is written once every task is committed, from the results kept with the parts (`eval_dump.
merge_results`): what a single harness run over all the tasks returns, but for the run's own fields
(date, config, environment), those of the run that evaluated the first task.

The run is fingerprinted like a job (model files, tasks and the files under --include-path,
shots, limit, seed, chat template, device, engine numerics, harness version): a rerun of the same
command over a complete output does nothing, one over an interrupted output runs only the tasks not
yet committed, and one with other settings is refused naming what changed. A committed part deleted
or truncated since is found by one listing, and its task run again as a job repairs a split (under
the split's next marker number, `OutputStore.plan_repairs`). The evaluation is
deterministic, and with the engine batch-invariant (its default) a task's scores do not depend on
the tasks run beside it: run alone, resumed or not, each task gives what one run of all gives.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardinfer.errors import (
    ConfigError,
    CorruptOutputError,
    FingerprintMismatch,
    IncompleteOutputError,
    InputMissingError,
    UsageError,
)
from shardinfer.jobs.storage_flag import parse_storage_options
from shardinfer.pipeline.fingerprint import span_rule_of
from shardinfer.pipeline.scoring import SPAN_RULE
from shardinfer.splits import Split

RESULTS_FILE = "results.json"
# The part metadata key holding a task's results, all but its samples (JSON).
RESULTS_METADATA = "shardinfer.eval_results"


@dataclass
class EvalSettings:
    model: str
    tasks: list[str]
    output: str
    include_path: str | None = None
    num_fewshot: int | None = None
    limit: float | None = None
    seed: int = 1234
    apply_chat_template: bool = False
    device: str = "auto"
    dtype: str = "auto"
    engine: dict[str, Any] = field(default_factory=dict)
    storage_options: dict[str, Any] = field(default_factory=dict)
    run_id: str = "eval"


def settings_from_args(args: Any) -> EvalSettings:
    """EvalSettings from `shardinfer eval`'s parsed flags (engine arguments through --conf engine.KEY=...)."""
    from shardinfer.jobs.spec import coerce, parse_conf, valid_keys

    engine_keys = valid_keys("engine")
    engine: dict[str, Any] = {}
    for item in args.conf:
        key, value, raw = parse_conf(item)
        section, _, name = key.partition(".")
        if section != "engine" or name not in engine_keys:
            raise ConfigError(
                f"--conf {item!r}: shardinfer eval takes engine.KEY=VALUE with KEY one of {', '.join(sorted(engine_keys))}"
            )
        engine[name] = coerce(key, value, engine_keys[name], raw)
    # A task named twice is run once: each requested task is one split of the output.
    tasks = list(dict.fromkeys(t.strip() for t in args.tasks.split(",") if t.strip()))
    if not tasks:
        raise ConfigError(f"--tasks {args.tasks!r} names no task")
    limit = _limit(args.limit)
    if args.num_fewshot is not None and args.num_fewshot < 0:
        raise UsageError(f"--num-fewshot {args.num_fewshot}: give the number of few-shot examples, 0 or more")
    storage = parse_storage_options(args.storage_options)
    return EvalSettings(
        model=args.model,
        tasks=tasks,
        output=args.output,
        include_path=args.include_path,
        num_fewshot=args.num_fewshot,
        limit=limit,
        seed=args.seed,
        apply_chat_template=args.apply_chat_template,
        device=args.device,
        dtype=args.dtype,
        engine=engine,
        storage_options=storage,
        run_id=args.run_id,
    )


def _limit(limit: float | None) -> float | int | None:
    """--limit as the harness takes it: a whole number of documents per task, or a fraction of them."""
    if limit is None:
        return None
    # NaN fails every comparison and infinity every conversion: both are refused here with the rest.
    if not 0 < limit <= sys.maxsize or (limit >= 1 and limit != int(limit)):
        raise UsageError(
            f"--limit {limit:g}: give a whole number of documents per task (>= 1), or a fraction of "
            "them (between 0 and 1)"
        )
    return int(limit) if limit >= 1 else limit


def fingerprint(
    settings: EvalSettings,
    path_as_written: bool = False,
    dtype_as_written: str | None = None,
    span_rule: str | None = SPAN_RULE,
) -> dict[str, Any]:
    """The eval's identity. The --include-path folder counts by its files, not by where it is: the
    same tasks given by a relative path from elsewhere, or by an absolute one, are the same eval.
    The dtype counts as resolved on this machine (--dtype auto on a CPU is float32), and the local
    data files the tasks name outside the folder count by their content.
    The span rule (pipeline.scoring) sets how long a scored span may be, so how a long document is
    cut into windows.
    (`path_as_written`: the fingerprint of an earlier shardinfer, which held the path as given;
    `dtype_as_written`: the dtype such a fingerprint held, --dtype as given; `span_rule` None: one
    from before spans could hold max_model_len + 1 tokens, which held no rule.)"""
    from shardinfer.pipeline.fingerprint import NUMERICS_ENGINE_KEYS, model_identity

    parts: dict[str, Any] = dict(model_identity(settings.model))
    parts["eval"] = {
        "tasks": list(settings.tasks),
        "include_path": settings.include_path if path_as_written else settings.include_path is not None,
        # The task definitions and local data under it: an edited task or a shorter dataset is another eval.
        "include_files": _folder_hashes(settings.include_path) if settings.include_path else {},
        "device": settings.device,
        **{k: settings.engine[k] for k in (*NUMERICS_ENGINE_KEYS, "batch_invariant") if k in settings.engine},
        "num_fewshot": settings.num_fewshot,
        "limit": settings.limit,
        "seed": settings.seed,
        "apply_chat_template": settings.apply_chat_template,
        "dtype": dtype_as_written or resolved_dtype(settings.device, settings.dtype),
        "lm_eval": importlib.metadata.version("lm_eval"),
    }
    if span_rule is not None:
        parts["eval"]["span_rule"] = span_rule
    outside = _outside_data_hashes(settings.include_path) if settings.include_path else {}
    if outside:  # only when the tasks name such files, so the other evals keep their fingerprint
        parts["eval"]["data_files"] = outside
    parts["hash"] = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()
    return parts


def resolved_dtype(device: str, dtype: str) -> str:
    """--dtype as the engine resolves it on this machine ("auto": bfloat16 on CUDA, float32 on a
    CPU); as given where the engine refuses it (the eval then names the flag to fix)."""
    from shardinfer.engine.config import EngineConfig

    try:
        return str(EngineConfig(model="", device=device, dtype=dtype).torch_dtype).removeprefix("torch.")
    except (TypeError, ValueError):
        return dtype


def _fingerprint_of(settings: EvalSettings, job: dict[str, Any] | None) -> dict[str, Any]:
    """This eval's fingerprint, or the one an earlier shardinfer gave it where that is what the
    output holds, so that its eval resumes under the fingerprint it was planned with."""
    fp = fingerprint(settings)
    held = (job or {}).get("fingerprint", {}).get("hash")
    if job is None or held == fp["hash"]:
        return fp
    for legacy in _older_fingerprints(settings, fp):
        if legacy["hash"] == held:
            return legacy
    return fp


def _older_fingerprints(settings: EvalSettings, fp: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The eval's fingerprint in the forms earlier versions stored: the --include-path as written
    (before the folder counted by its files alone), --dtype as written (before it counted as
    resolved: "auto" then, or the spelling given, where it resolves to this eval's dtype) and no
    span rule (before spans could hold max_model_len + 1 tokens; such an eval keeps its shorter
    windows, pipeline.fingerprint.span_rule_of)."""
    resolved = fp["eval"]["dtype"]
    spellings = [settings.dtype] if settings.dtype != resolved else []
    if settings.dtype != "auto" and resolved_dtype(settings.device, "auto") == resolved:
        spellings.append("auto")
    paths = (False, True) if settings.include_path is not None else (False,)
    for span_rule in (SPAN_RULE, None):
        for path_as_written in paths:
            for dtype in [None, *spellings]:
                if path_as_written or dtype is not None or span_rule is None:
                    yield fingerprint(
                        settings, path_as_written=path_as_written, dtype_as_written=dtype, span_rule=span_rule
                    )


def _folder_hashes(folder: str) -> dict[str, str]:
    """sha256 of every file under a local folder, by path relative to it (a missing folder: {})."""
    root = Path(folder)
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def _outside_data_hashes(folder: str) -> dict[str, str]:
    """sha256 of every local data file the task YAMLs under `folder` name (their dataset_kwargs'
    data_files and data_dir) that lies outside it, by absolute path; the files under it count with
    the folder's. A remote or hub dataset, or a file that is not there, is not counted."""
    root = Path(folder).resolve()
    found: set[Path] = set()
    for config in _task_configs(Path(folder)):
        for kwargs in _dataset_kwargs(config):
            found.update(_local_data_files(kwargs))
    return {
        str(path): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(found)
        if not path.is_relative_to(root)
    }


def _task_configs(folder: Path) -> Iterator[dict[str, Any]]:
    """Every task YAML under the folder, its includes merged (as the harness reads it, its
    !function tags left unimported)."""
    from lm_eval.tasks._yaml_loader import load_yaml

    for path in sorted(folder.rglob("*.yaml")):
        try:
            config = load_yaml(path, resolve_func=False)
        except Exception:  # not a task the harness can read: it skips it too
            continue
        yield config


def _dataset_kwargs(value: Any) -> Iterator[dict[str, Any]]:
    """The dataset_kwargs of a task config and of the tasks defined inline in it (a group's)."""
    if isinstance(value, dict):
        kwargs = value.get("dataset_kwargs")
        if isinstance(kwargs, dict):
            yield kwargs
        for item in value.values():
            if isinstance(item, dict | list):
                yield from _dataset_kwargs(item)
    elif isinstance(value, list):
        for item in value:
            yield from _dataset_kwargs(item)


def _local_data_files(kwargs: dict[str, Any]) -> set[Path]:
    """The local files a task's dataset_kwargs load: its data_files (a path, pattern, list or a
    mapping of split to those, relative to data_dir or else the working directory, as the datasets
    library resolves them), or the files under data_dir without them."""
    import glob

    data_dir = kwargs.get("data_dir")
    local_dir = isinstance(data_dir, str) and "://" not in data_dir
    base = Path(str(data_dir)).expanduser().resolve() if local_dir else Path.cwd()
    patterns: list[str] = []
    pending: list[Any] = [kwargs.get("data_files")]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            patterns.append(item)
        elif isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
    if not patterns and local_dir and base.is_dir():
        return {path for path in base.rglob("*") if path.is_file()}
    files: set[Path] = set()
    for pattern in patterns:
        if "://" in pattern:
            continue
        full = Path(pattern).expanduser()
        full = full if full.is_absolute() else base / full
        files.update(Path(p).resolve() for p in glob.glob(str(full), recursive=True) if Path(p).is_file())
    return files


def run_eval(settings: EvalSettings, log: Any = print) -> dict[str, Any]:
    """Run the harness one requested task at a time, committing each task as it finishes, then write
    results.json and `_SUCCESS`; returns the `_SUCCESS` record. Tasks committed by an earlier run of
    the same eval are not run again."""
    lm_eval, task_manager_class = _import_harness()
    from shardinfer.pipeline.job import read_success_or_none
    from shardinfer.writers.output_store import OutputStore

    store = OutputStore(settings.output, settings.storage_options)
    job = _eval_job_or_none(store, settings)
    fp = _fingerprint_of(settings, job)
    _refuse_other_settings(job, settings, fp)
    markers = store.committed() if job is not None else {}
    success = read_success_or_none(store)  # a truncated _SUCCESS (a kill mid-write) is written again
    if success is not None and (success.get("fingerprint") or {}).get("hash") == fp["hash"]:
        problems = store.success_problems(success, markers)
        # As a job's resubmit does: one listing of the location finds a committed part deleted or
        # truncated since its commit (no part is opened).
        results_problem = _results_problem(store)
        if not problems and not store.listed_damage(markers) and results_problem is None:
            log(f"already complete: {settings.output} holds this eval's results; nothing to do")
            return dict(success)
        if results_problem is not None:
            log(f"{RESULTS_FILE} {results_problem}; writing it again from the committed tasks")
        if problems:
            log(
                f"_SUCCESS does not match the commit markers ({'; '.join(problems)}); finishing the eval again"
            )
    # This run ends in finalize, which checks every committed part's hash: find every damaged part
    # now (a replaced one too, which a listing passes), so it is run again, not refused.
    damaged = store.damaged_parts(markers) if markers else {}
    manager = _task_manager(task_manager_class, settings)
    plan = task_plan(settings.tasks)
    if job is not None:
        _check_plan(job, settings, plan)
    if damaged:
        _plan_repairs(store, plan, damaged, markers, log)
    committed = set(markers) - set(damaged)
    pending = [split for split in plan if split.index not in committed]
    if committed:
        log(
            f"resuming: {len(plan) - len(pending)} of {len(plan)} tasks already committed; to run: "
            f"{', '.join(split.path for split in pending) or 'none'}"
        )
    if pending:
        # One engine for every task: loading the model is the costly part of a small task.
        lm = _language_model(settings, span_rule_of(fp, "eval"))
        for split in pending:
            results = _evaluate(lm_eval, lm, settings, manager, split.path)
            if job is None:
                # Planned with the first commit, not before: an eval that fails before it has
                # anything to keep (an engine setting it refuses, a task whose YAML or data is
                # wrong) leaves the location empty, so the corrected command can run there.
                job = _plan_eval(store, settings, fp, plan)
            commit_task(store, settings, fp, split, results, log)
    return finish_eval(store, plan, log)


def _language_model(settings: EvalSettings, span_rule: str = SPAN_RULE) -> Any:
    """The harness model on the engine; what the engine refuses is named as the flag to fix."""
    from shardinfer.integrations.lm_eval import ShardinferLM

    try:
        return ShardinferLM(
            settings.model,
            device=settings.device,
            dtype=settings.dtype,
            seed=settings.seed,
            span_rule=span_rule,
            **settings.engine,
        )
    except TypeError as exc:
        raise ConfigError(f"--conf engine.KEY: an argument the engine does not take: {exc}") from None
    except ValueError as exc:  # ModelLoadError included
        # A model folder it cannot load, or settings this model cannot run with (a max_model_len
        # past its positions, an unknown dtype or device).
        raise ConfigError(
            f"the engine cannot run --model {settings.model!r} with these settings: {exc} (fix --device, "
            "--dtype or --conf engine.KEY=VALUE)"
        ) from None


def _results_problem(store: Any) -> str | None:
    """What is wrong with the `results.json` of a finished eval (deleted or damaged since), or None."""
    from shardinfer.storage import read_bytes_or_none

    raw = read_bytes_or_none(store.fs, f"{store.root}/{RESULTS_FILE}")
    if raw is None:
        return "is missing"
    try:
        json.loads(raw)
    except ValueError as exc:  # a truncated copy, or bytes that are not UTF-8
        return f"cannot be read ({exc})"
    return None


def _plan_repairs(
    store: Any, plan: list[Split], damaged: dict[int, str], markers: dict[int, dict[str, Any]], log: Any
) -> None:
    """Make the tasks whose committed part was damaged pending again, as a job repairs a split:
    `_SUCCESS` is deleted, and each task's next commit goes under its next marker number (created
    only if absent), which `finalize` keeps while deleting the old marker and part."""
    from shardinfer.storage import delete_if_present

    names = {split.index: split.path for split in plan}
    for index, why in sorted(damaged.items()):
        log(
            f"repairing {names.get(index, f'split {index}')}: its committed part was damaged ({why}); running "
            "the task again"
        )
    store.plan_repairs(damaged, markers)
    # results.json was merged from the damaged parts: like `_SUCCESS`, it is written again once
    # every task is committed, and is absent until then (as in an eval stopped part-way).
    delete_if_present(store.fs, f"{store.root}/{RESULTS_FILE}")


def _import_harness() -> tuple[Any, Any]:
    """The harness module and its TaskManager class, or the install command if it is missing."""
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError as exc:
        raise ConfigError(
            f"shardinfer eval needs lm-evaluation-harness ({exc}): pip install 'shardinfer[eval]'"
        ) from None
    return lm_eval, TaskManager


def _eval_job_or_none(store: Any, settings: EvalSettings) -> dict[str, Any] | None:
    """The `_job.json` of the eval at the output location, or None for a new location. A location
    that cannot hold this eval is refused before anything is written: its finish would delete every
    part and marker that is not the eval's own."""
    try:
        if store.fs.isfile(store.root):
            raise NotADirectoryError(store.root)
        job = store.read_job()
    except NotADirectoryError:
        raise ConfigError(
            f"--output {settings.output!r} is a file (or in a folder that is a file), not a directory or "
            "prefix; write the eval to a new location"
        ) from None
    if job is None and store.fs.exists(store.root) and store.has_protocol_files():
        raise CorruptOutputError(
            f"{settings.output} holds commit markers or part files but no _job.json: it is damaged or another "
            "program's, and an eval there would delete them; write to a new output URL"
        )
    if job is not None and "eval" not in (job.get("fingerprint") or {}):  # a job's has no eval settings
        task = ((job.get("config") or {}).get("job") or {}).get("task") or "generate"
        raise FingerprintMismatch(
            f"{settings.output} holds the output of a shardinfer {task} job, not of an eval; write the eval "
            "to a new output URL"
        )
    return dict(job) if job is not None else None


def _refuse_other_settings(job: dict[str, Any] | None, settings: EvalSettings, fp: dict[str, Any]) -> None:
    """An output holding an eval of other settings is never mixed with this one."""
    if job is None or job.get("fingerprint", {}).get("hash") == fp["hash"]:
        return
    from shardinfer.pipeline.fingerprint import diff_closest_form

    forms = [fp, *_older_fingerprints(settings, fp)]
    changed = "; ".join(diff_closest_form(job.get("fingerprint", {}), forms)) or "its format"
    raise FingerprintMismatch(
        f"{settings.output} holds an eval of other settings (changed: {changed}); write to a new output URL"
    )


def _task_manager(task_manager_class: Any, settings: EvalSettings) -> Any:
    """The harness's task index holding every requested task, or an error naming the unknown ones."""
    if settings.include_path and not Path(settings.include_path).is_dir():
        raise ConfigError(
            f"--include-path {settings.include_path!r} is not a folder: give the folder of the tasks' "
            "YAML files"
        )
    # Indexing the harness's built-in tasks takes a while: skip it when --include-path has them all.
    manager = (
        task_manager_class(include_path=settings.include_path, include_defaults=False)
        if settings.include_path
        else None
    )
    if manager is None or any(t not in manager.all_tasks for t in settings.tasks):
        manager = task_manager_class(include_path=settings.include_path)
    unknown = [t for t in settings.tasks if t not in manager.all_tasks]
    if unknown:
        import difflib

        near = {t: difflib.get_close_matches(t, list(manager.all_tasks), n=1) for t in unknown}
        hints = "; ".join(f"{t!r}: did you mean {m[0]!r}?" for t, m in near.items() if m)
        raise ConfigError(
            f"--tasks names {unknown}, which the harness does not know{f' ({hints})' if hints else ''}; add the "
            "folder of their YAML files with --include-path, or see `lm_eval ls tasks`"
        )
    return manager


def task_plan(tasks: list[str]) -> list[Split]:
    """One split per requested task, in the order of --tasks. A task's number of samples is known only
    once it has run, so every split's row range is empty; its marker records the rows committed."""
    return [Split(index, index, task, 0, 0) for index, task in enumerate(tasks)]


def _plan_eval(store: Any, settings: EvalSettings, fp: dict[str, Any], plan: list[Split]) -> dict[str, Any]:
    """Write `_job.json` (if absent: a run of the same eval may have planned it meanwhile, and its
    plan is then joined) and return the plan in force."""
    from shardinfer.writers.job_file import make_job_record

    job = store.create_or_read_job(
        make_job_record(settings.run_id, fp, plan, {"eval_tasks": [s.path for s in plan]})
    )
    _refuse_other_settings(job, settings, fp)
    _check_plan(job, settings, plan)
    store.use_generation(str(job["generation"]))
    return dict(job)


def _check_plan(job: dict[str, Any], settings: EvalSettings, plan: list[Split]) -> None:
    """On a resume, the plan `_job.json` holds must be this one (an output of an earlier shardinfer
    has a split per subtask, and parts that carry no results)."""
    from shardinfer.writers.job_file import splits_from_job

    held = splits_from_job(job)
    if held != plan:
        raise FingerprintMismatch(
            f"{settings.output} holds this eval planned as other splits ({', '.join(s.path for s in held)}; this "
            f"shardinfer plans one per requested task: {', '.join(s.path for s in plan)}), written by an earlier "
            "shardinfer; write to a new output URL"
        )


def _is_network_error(exc: BaseException) -> bool:
    """A failed download anywhere in the chain (the datasets and requests libraries wrap their own)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionError | TimeoutError) or "Connection" in type(seen).__name__:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _evaluate(lm_eval: Any, lm: Any, settings: EvalSettings, manager: Any, task: str) -> dict[str, Any]:
    """The harness's results of one requested task (a group runs whole, so its aggregate is the
    harness's), its samples logged."""
    try:
        results = lm_eval.simple_evaluate(
            model=lm,
            tasks=[task],
            num_fewshot=settings.num_fewshot,
            limit=settings.limit,
            task_manager=manager,
            log_samples=True,
            apply_chat_template=settings.apply_chat_template,
            random_seed=settings.seed,
            numpy_random_seed=settings.seed,
            torch_random_seed=settings.seed,
            fewshot_random_seed=settings.seed,
        )
    except Exception as exc:
        if isinstance(exc, FileNotFoundError) and not _is_network_error(exc):
            # A local dataset file the task names is not there: the task's YAML or its data is to fix.
            raise InputMissingError(
                f"task {task}: {exc}; put the file there, or fix the task's dataset_kwargs / data_files under "
                "--include-path"
            ) from None
        if not _is_network_error(exc):
            raise
        raise InputMissingError(
            f"a task's dataset could not be downloaded ({type(exc).__name__}: {exc}); on a machine without "
            "network give the task a local dataset (dataset_path: json with data_files) in a folder passed "
            "with --include-path"
        ) from None
    if results is None:
        raise RuntimeError(f"the harness returned no results for {task}")
    results = dict(results)
    # Given a model object, the harness records its class and no arguments: record what a run of
    # `lm_eval --model shardinfer --model_args ...` records, the model without credentials.
    results["config"] = {**(results.get("config") or {}), "model_args": model_args(settings)}
    return results


def model_args(settings: EvalSettings) -> str:
    """The harness's --model_args of this eval's model: `pretrained=<model>,dtype=<dtype>,device=<device>`,
    the model's location without credentials and the dtype as resolved on this machine."""
    from shardinfer.redaction import redact_url

    return (
        f"pretrained={redact_url(settings.model)},dtype={resolved_dtype(settings.device, settings.dtype)},"
        f"device={settings.device}"
    )


def metric_lines(per_task: dict[str, dict[str, Any]]) -> list[str]:
    """One line per task: its metrics (per filter) with their standard errors, as the harness's table
    shows them: `demo_tasks_mc: acc <value> ± <stderr>, acc_norm <value> ± <stderr>`."""
    lines = []
    for task in sorted(per_task):
        values = per_task[task]
        shown = []
        for key in sorted(values):
            name, _, kept = key.partition(",")
            value = values[key]
            if not kept or name.endswith("_stderr") or not isinstance(value, int | float):
                continue
            label = name if kept == "none" else f"{name} ({kept})"
            error = values.get(f"{name}_stderr,{kept}")
            shown.append(
                f"{label} {value:.4f}" + (f" ± {error:.4f}" if isinstance(error, int | float) else "")
            )
        lines.append(f"{task}: {', '.join(shown) or 'no metric'}")
    return lines


def commit_task(
    store: Any, settings: EvalSettings, fp: dict[str, Any], split: Split, results: dict[str, Any], log: Any
) -> None:
    """Commit one requested task's part: the samples of each task it ran as rows, and the rest of the
    harness's results in the part's metadata, for results.json once every task is committed."""
    import pyarrow as pa

    from shardinfer.engine import release
    from shardinfer.jobs.eval_dump import sample_rows, to_json
    from shardinfer.pipeline.runner import attempt_id
    from shardinfer.redaction import redact_text
    from shardinfer.writers.schema import eval_samples_schema

    samples: dict[str, list[dict[str, Any]]] = results.pop("samples", None) or {}
    configs = results.get("configs") or {}
    rows = [
        row
        for task in sorted(samples)
        for row in sample_rows(task, str(configs.get(task, {}).get("output_type", "")), samples[task])
    ]
    table = pa.Table.from_pylist(rows, schema=eval_samples_schema())
    meta = {
        "shardinfer.fingerprint": fp["hash"],
        "shardinfer.run_id": settings.run_id,
        "shardinfer.eval_task": split.path,
        # Which arithmetic the kernels scored with, and the version that ran them (docs/jobs.md).
        "shardinfer.numerics_revision": str(release.NUMERICS_REVISION),
        "shardinfer.version": release.VERSION,
        # Redacted as results.json is: the harness's config may quote a URL or an option.
        RESULTS_METADATA: redact_text(to_json(results)),
    }
    part = store.write_part(split, attempt_id(settings.run_id), table, meta)
    if store.commit(split, part):
        log(f"committed {split.path}: {table.num_rows} samples")
    else:
        log(f"{split.path} was committed by another run of this eval; its part counts")


def finish_eval(store: Any, plan: list[Split], log: Any) -> dict[str, Any]:
    """Write results.json merged from every committed task, then `_SUCCESS` (the job protocol's order)."""
    from shardinfer.jobs.eval_dump import merge_results, to_json
    from shardinfer.storage import put_bytes

    results = merge_results(committed_results(store, plan))
    put_bytes(store.fs, f"{store.root}/{RESULTS_FILE}", (to_json(results) + "\n").encode())
    for line in metric_lines(dict(results.get("results") or {})):
        log(line)
    headline = {
        t: {k: v for k, v in r.items() if isinstance(v, int | float)} for t, r in results["results"].items()
    }
    return dict(store.finalize({"results": headline, "results_file": RESULTS_FILE}))


def committed_results(store: Any, plan: list[Split]) -> list[dict[str, Any]]:
    """Each requested task's results, in plan order, from its committed part's metadata."""
    markers = store.committed()
    missing = [split.path for split in plan if split.index not in markers]
    if missing:
        raise IncompleteOutputError(
            f"{store.url}: the tasks {', '.join(missing)} are not committed; run the same command again"
        )
    return [_task_results(store, split, markers[split.index]) for split in plan]


def _task_results(store: Any, split: Split, marker: dict[str, Any]) -> dict[str, Any]:
    """One task's results from its part's footer. A part that cannot be read (damaged after this
    run's check of every part) is named with the fix."""
    try:
        raw = store.read_part_metadata(marker["part"])[RESULTS_METADATA.encode()]
    except (FileNotFoundError, ValueError, KeyError) as exc:  # ArrowInvalid is a ValueError
        raise CorruptOutputError(
            f"{store.url}: the committed part of task {split.path}, {marker['part']}, cannot be read "
            f"({type(exc).__name__}: {exc}); delete that part file and run the same command again to run "
            "the task again"
        ) from None
    return dict(json.loads(raw))
