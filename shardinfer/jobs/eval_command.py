"""`shardinfer eval`: lm-evaluation-harness on the engine, its results and every sample dumped.

    <output>/results.json                    the harness's results (metrics, configs, versions)
    <output>/part-{split}-{attempt}.parquet  one part per task (split k = the k-th task by name): its
                                             logged samples (writers.schema.eval_samples_schema)
    <output>/_commits/, _job.json, _SUCCESS  the job commit protocol, one split per task

The run is fingerprinted like a job (model files, tasks and the files under --include-path,
shots, limit, seed, chat template, device, engine numerics, harness version): a rerun of the same
command over a complete output does nothing, and one with other settings is refused naming what
changed. Results are committed once every task has run; a rerun over an output whose commit was
interrupted commits the tasks still missing (the evaluation is deterministic, so their samples are
those the first run would have written).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardinfer.errors import ConfigError, FingerprintMismatch, InputMissingError, UsageError

RESULTS_FILE = "results.json"


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
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks:
        raise ConfigError(f"--tasks {args.tasks!r} names no task")
    limit = args.limit
    if limit is not None and (limit <= 0 or (limit >= 1 and limit != int(limit))):
        raise UsageError(f"--limit {limit:g}: give a whole number of documents per task (>= 1), or a fraction of "
                         "them (between 0 and 1)")
    if limit is not None and limit >= 1:
        limit = int(limit)
    try:
        storage = json.loads(args.storage_options)
    except ValueError as exc:
        raise ConfigError(f"--storage-options is not JSON: {exc}") from None
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


def fingerprint(settings: EvalSettings) -> dict[str, Any]:
    from shardinfer.pipeline.fingerprint import NUMERICS_ENGINE_KEYS, model_identity

    parts: dict[str, Any] = dict(model_identity(settings.model))
    parts["eval"] = {
        "tasks": list(settings.tasks),
        "include_path": settings.include_path,
        # The task definitions and local data under it: an edited task or a shorter dataset is another eval.
        "include_files": _folder_hashes(settings.include_path) if settings.include_path else {},
        "device": settings.device,
        **{k: settings.engine[k] for k in (*NUMERICS_ENGINE_KEYS, "batch_invariant") if k in settings.engine},
        "num_fewshot": settings.num_fewshot,
        "limit": settings.limit,
        "seed": settings.seed,
        "apply_chat_template": settings.apply_chat_template,
        "dtype": settings.dtype,
        "lm_eval": importlib.metadata.version("lm_eval"),
    }
    parts["hash"] = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()
    return parts


def _folder_hashes(folder: str) -> dict[str, str]:
    """sha256 of every file under a local folder, by path relative to it (a missing folder: {})."""
    root = Path(folder)
    return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(root.rglob("*")) if path.is_file() and "__pycache__" not in path.parts}


def run_eval(settings: EvalSettings, log: Any = print) -> dict[str, Any]:
    """Run the harness and commit its results and samples; returns the `_SUCCESS` record."""
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError as exc:
        raise ConfigError(
            f"shardinfer eval needs lm-evaluation-harness ({exc}): pip install 'shardinfer[eval]'"
        ) from None
    from shardinfer.integrations.lm_eval import ShardinferLM
    from shardinfer.writers.output_store import OutputStore

    fp = fingerprint(settings)
    store = OutputStore(settings.output, settings.storage_options)
    existing = store.read_job()
    if existing is not None and existing.get("fingerprint", {}).get("hash") != fp["hash"]:
        from shardinfer.pipeline.fingerprint import diff_fingerprint_parts

        changed = "; ".join(diff_fingerprint_parts(existing.get("fingerprint", {}), fp)) or "its format"
        raise FingerprintMismatch(
            f"{settings.output} holds an eval of other settings (changed: {changed}); write to a new output URL"
        )
    success = store.read_success()
    if success is not None and (success.get("fingerprint") or {}).get("hash") == fp["hash"]:
        log(f"already complete: {settings.output} holds this eval's results; nothing to do")
        return dict(success)
    if settings.include_path and not Path(settings.include_path).is_dir():
        raise ConfigError(f"--include-path {settings.include_path!r} is not a folder: give the folder of the tasks' "
                          "YAML files")
    # Indexing the harness's built-in tasks takes a while: skip it when --include-path has them all.
    manager = (
        TaskManager(include_path=settings.include_path, include_defaults=False)
        if settings.include_path
        else None
    )
    if manager is None or any(t not in manager.all_tasks for t in settings.tasks):
        manager = TaskManager(include_path=settings.include_path)
    unknown = [t for t in settings.tasks if t not in manager.all_tasks]
    if unknown:
        import difflib

        near = {t: difflib.get_close_matches(t, list(manager.all_tasks), n=1) for t in unknown}
        hints = "; ".join(f"{t!r}: did you mean {m[0]!r}?" for t, m in near.items() if m)
        raise ConfigError(
            f"--tasks names {unknown}, which the harness does not know{f' ({hints})' if hints else ''}; add the "
            "folder of their YAML files with --include-path, or see `lm_eval ls tasks`"
        )
    lm = ShardinferLM(
        settings.model, device=settings.device, dtype=settings.dtype, seed=settings.seed, **settings.engine
    )
    try:
        results = _evaluate(lm_eval, lm, settings, manager)
    except Exception as exc:
        if not _is_network_error(exc):
            raise
        raise InputMissingError(
            f"a task's dataset could not be downloaded ({type(exc).__name__}: {exc}); on a machine without "
            "network give the task a local dataset (dataset_path: json with data_files) in a folder passed "
            "with --include-path"
        ) from None
    if results is None:
        raise RuntimeError("the harness returned no results")
    scores = metric_lines(dict(results.get("results") or {}))
    success = commit_results(store, settings, fp, dict(results), log)
    for line in scores:
        log(line)
    return success


def _is_network_error(exc: BaseException) -> bool:
    """A failed download anywhere in the chain (the datasets and requests libraries wrap their own)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionError | TimeoutError) or "Connection" in type(seen).__name__:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _evaluate(lm_eval: Any, lm: Any, settings: EvalSettings, manager: Any) -> Any:
    return lm_eval.simple_evaluate(
        model=lm,
        tasks=list(settings.tasks),
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


def metric_lines(per_task: dict[str, dict[str, Any]]) -> list[str]:
    """One line per task: its metrics (per filter) with their standard errors, as the harness's table
    shows them: `demo_tasks_mc: acc 0.7200 ± 0.0641, acc_norm 0.7000 ± 0.0655`."""
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
            shown.append(f"{label} {value:.4f}" + (f" ± {error:.4f}" if isinstance(error, int | float) else ""))
        lines.append(f"{task}: {', '.join(shown) or 'no metric'}")
    return lines


def commit_results(
    store: Any, settings: EvalSettings, fp: dict[str, Any], results: dict[str, Any], log: Any
) -> dict[str, Any]:
    """Write results.json, one committed part per task, then `_SUCCESS` (the job protocol's order)."""
    import pyarrow as pa

    from shardinfer.jobs.eval_dump import sample_rows, to_json
    from shardinfer.pipeline.runner import attempt_id
    from shardinfer.redaction import redact_text
    from shardinfer.splits import Split
    from shardinfer.storage import put_bytes
    from shardinfer.writers.job_file import make_job_record
    from shardinfer.writers.schema import eval_samples_schema

    samples: dict[str, list[dict[str, Any]]] = results.pop("samples", {}) or {}
    tasks = sorted(samples)
    request_types = {t: str(results.get("configs", {}).get(t, {}).get("output_type", "")) for t in tasks}
    rows = {t: sample_rows(t, request_types[t], samples[t]) for t in tasks}
    splits = [Split(i, i, task, 0, len(rows[task])) for i, task in enumerate(tasks)]
    if store.read_job() is None:
        store.write_job(make_job_record(settings.run_id, fp, splits, {"eval_tasks": tasks}))
    text = redact_text(to_json(results))  # the harness's config may quote a URL or an option
    put_bytes(store.fs, f"{store.root}/{RESULTS_FILE}", (text + "\n").encode())
    committed = store.committed_indexes()
    schema = eval_samples_schema()
    for split in splits:
        if split.index in committed:
            continue
        table = pa.Table.from_pylist(rows[split.path], schema=schema)
        meta = {
            "shardinfer.fingerprint": fp["hash"],
            "shardinfer.run_id": settings.run_id,
            "shardinfer.eval_task": split.path,
        }
        part = store.write_part(split, attempt_id(settings.run_id), table, meta)
        store.commit(split, part)
        log(f"committed {split.path}: {table.num_rows} samples")
    headline = {
        t: {k: v for k, v in r.items() if isinstance(v, int | float)} for t, r in results["results"].items()
    }
    return dict(store.finalize({"results": headline, "results_file": RESULTS_FILE}))
