"""The `shardinfer` command: submit, generate, validate, status (spark-submit style).

Every path out of `main` is an exit code from shardinfer.errors, so a scheduler can tell a
retryable failure (75) from a job that needs fixing (64/65/66/78) without reading logs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from shardinfer.errors import (
    EXIT_OK,
    FingerprintMismatch,
    InputChanged,
    InputColumnError,
    Interrupted,
    JobError,
    UsageError,
    exit_code_for,
    is_credentials_error,
)
from shardinfer.jobs.progress import Reporter
from shardinfer.jobs.secrets_guard import guard_job, guarded_run
from shardinfer.jobs.spec import (
    GENERATED,
    ResolvedSpec,
    load_properties,
    load_toml,
    name_layer,
    parse_conf,
    resolve,
)
from shardinfer.jobs.storage_flag import parse_storage_options

# The executor (and with it torch) is imported only once a job is about to run, so usage and
# spec errors come back in a fraction of a second.

CTRL_C = "interrupted (Ctrl-C): the committed splits are kept; rerun the same command to resume"
# An eval commits whole tasks: a rerun runs those it had not committed.
CTRL_C_EVAL = (
    "interrupted (Ctrl-C): the tasks this eval committed are kept, the one running is not; rerun the "
    "same command to run the rest"
)
SIGTERM_BEFORE_SPLITS = (
    "interrupted (SIGTERM) before the run started its splits: it committed nothing; rerun the same "
    "command to run the job"
)


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on bad usage; schedulers expect sysexits' 64."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            self.error(f"unrecognized arguments: {' '.join(extra)}{_unrecognized_hint(extra, parsed)}")
        return parsed


# submit's flags that say how to run a job, which `validate` does not do.
_RUN_ONLY_FLAGS = ("--master", "--deploy-mode", "--dry-run", "--verbose", "--log-format")


def _unrecognized_hint(extra: list[str], parsed: argparse.Namespace) -> str:
    """What a stray argument most likely meant: a flag of another tool, or a glob the shell expanded."""
    flags = [e.split("=", 1)[0] for e in extra if e.startswith("-")]
    if any(f in ("--set", "-D", "--define", "--config", "-c") for f in flags):
        return " (set a job key with --conf KEY=VALUE, e.g. --conf sampling.temperature=0.7)"
    spaced = [c for c in getattr(parsed, "conf", None) or [] if "=" not in c]
    if spaced:
        # `--conf KEY VALUE`: the value was taken for the job file, and the job file left over.
        return (
            f" (--conf takes KEY=VALUE as one argument: --conf {spaced[0]}=VALUE, not a space between "
            "the key and its value)"
        )
    command = getattr(parsed, "command", None)
    if command in ("status", "history") and "--log-format" in flags:
        return f" ({command} has no --log-format: give --json for machine-readable output)"
    run_only = [f for f in flags if f in _RUN_ONLY_FLAGS]
    if getattr(parsed, "command", None) == "validate" and run_only:
        one = len(run_only) == 1
        return (
            f" (validate runs nothing, so {', '.join(run_only)} {'is a flag' if one else 'are flags'} of submit: "
            f"drop {'it' if one else 'them'}; validate takes --conf, --properties-file, --name and --run-id)"
        )
    if getattr(parsed, "command", None) == "generate" and not flags:
        first = str(parsed.input)
        folder, name = os.path.split(first)
        ext = os.path.splitext(name)[1]
        if not ext or not all(os.path.splitext(e)[1] == ext for e in extra):
            return " (generate takes its settings as flags and --conf KEY=VALUE, no job file)"
        example = os.path.join(folder, f"*{ext}")
        return (
            f" (the shell expanded an unquoted glob into {len(extra) + 1} files, and --input takes one URL or "
            f"glob: quote it, e.g. --input '{example}')"
        )
    return ""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("shardinfer")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="shardinfer", description="Offline batch LLM inference jobs: Parquet in, Parquet out."
    )
    parser.add_argument("--version", action="version", version=f"shardinfer {_version()}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    def run_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--master",
            default="local",
            help="local | local[N] | local[*] | ray (ray.address, RAY_ADDRESS or a local cluster) | "
            "ray://HOST:PORT (default: local)",
        )
        p.add_argument(
            "--deploy-mode",
            choices=["client", "cluster"],
            default="client",
            help="with --master ray: run the driver here (client) or as a Ray Job on the cluster (cluster)",
        )
        p.add_argument(
            "--conf",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a job spec key, e.g. sampling.temperature=0.7 (repeatable)",
        )
        p.add_argument(
            "--properties-file", metavar="FILE", help="defaults below --conf: key=value lines or TOML"
        )
        p.add_argument("--name", help="job name (job.name)")
        p.add_argument("--run-id", help="run id, e.g. the scheduler's; fills {run_id} in paths")
        p.add_argument(
            "--dry-run",
            action="store_true",
            help="print the resolved spec, fingerprint and plan; write nothing",
        )
        p.add_argument(
            "--verbose", action="store_true", help="show where each setting came from, and debug logs"
        )
        p.add_argument(
            "--log-format",
            choices=["text", "json"],
            default="text",
            help="json: every log, progress and summary line is one JSON object (default: text)",
        )

    submit = sub.add_parser("submit", help="run a job spec (TOML)")
    run_flags(submit)
    submit.add_argument("job_file", metavar="JOB.toml")

    gen = sub.add_parser("generate", help="run a job without a spec file")
    run_flags(gen)
    gen.add_argument("--model", required=True, help="local Hugging Face model directory")
    gen.add_argument("--input", required=True, help="input URL or glob (Parquet/JSONL)")
    gen.add_argument("--output", required=True, help="output URL")

    validate = sub.add_parser("validate", help="check a job spec, its model and input, without running it")
    validate.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    validate.add_argument("--properties-file", metavar="FILE")
    # They fill {name} and {run_id} in paths: without them a scheduled run's output location is not
    # the one checked.
    validate.add_argument("--name", help="job name (job.name), as submit's")
    validate.add_argument("--run-id", help="run id, as submit's; fills {run_id} in paths")
    validate.add_argument("job_file", metavar="JOB.toml")

    ev = sub.add_parser("eval", help="run lm-evaluation-harness tasks on a model; dump results and samples")
    ev.add_argument("--model", required=True, help="local Hugging Face model directory")
    ev.add_argument("--tasks", required=True, help="comma-separated harness task names")
    ev.add_argument("--output", required=True, help="output URL (results.json and Parquet samples)")
    ev.add_argument("--include-path", help="a folder of extra task YAML files")
    ev.add_argument("--num-fewshot", type=int, help="few-shot examples per prompt (default: each task's)")
    ev.add_argument("--limit", type=float, help="documents per task (a count, or a fraction below 1)")
    ev.add_argument("--seed", type=int, default=1234, help="harness and sampling seed (default 1234)")
    ev.add_argument(
        "--apply-chat-template", action="store_true", help="render prompts through the chat template"
    )
    ev.add_argument("--device", default="auto", help="auto | cpu | cuda")
    ev.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | ...")
    ev.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="engine.KEY=VALUE",
        help="an engine argument (repeatable)",
    )
    ev.add_argument("--storage-options", default="{}", help="fsspec storage options of the output, as JSON")
    ev.add_argument("--run-id", default="eval", help="run id recorded with the output")

    status = sub.add_parser("status", help="progress of a job from its output location")
    status.add_argument("output", metavar="OUTPUT_URL")
    status.add_argument("--storage-options", default="{}", help="fsspec storage options as JSON")
    status.add_argument("--json", action="store_true", help="print one JSON object")

    history = sub.add_parser("history", help="the runs recorded at an output location (_runs/)")
    history.add_argument("output", metavar="OUTPUT_URL")
    history.add_argument("--storage-options", default="{}", help="fsspec storage options as JSON")
    history.add_argument("--json", action="store_true", help="print one JSON object per run")
    return parser


def _resolve(args: argparse.Namespace, job_file: dict[str, Any]) -> ResolvedSpec:
    props = load_properties(args.properties_file) if getattr(args, "properties_file", None) else []
    name = getattr(args, "name", None)
    confs = [parse_conf(c) for c in args.conf]
    layers = [props, name_layer(name), confs]
    guard_job({"job_file": job_file, "layers": layers})  # before an error can quote one
    return resolve(job_file, properties=props, confs=confs, name=name, run_id=getattr(args, "run_id", None))


def _requested_log_format(argv: list[str]) -> str:
    """`--log-format` read ahead of parsing, so that usage and spec errors obey it too; `status
    --json` and `history --json` have their errors as JSON lines too, for the script that asked."""
    if argv[:1] in (["status"], ["history"]) and "--json" in argv:
        return "json"
    for i, item in enumerate(argv):
        if item == "--log-format" and i + 1 < len(argv):
            return argv[i + 1] if argv[i + 1] in ("text", "json") else "text"
        if item.startswith("--log-format="):
            return item.split("=", 1)[1] if item.endswith(("=text", "=json")) else "text"
    return "text"


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (`shardinfer status OUT | head -1`)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows), or a stdout with no descriptor
        return False


def main(argv: list[str] | None = None) -> int:
    """The command: `argv` None when it is this process's own command line (the `shardinfer`
    script, `python -m shardinfer`), a list when a program runs it in-process."""
    # Guarded before the first reporter takes hold of stderr: nothing printed escapes it.
    with guarded_run():
        code = _main(sys.argv[1:] if argv is None else argv)
        _leave_dropped_build(code, own_process=argv is None)
        return code


def _leave_dropped_build(code: int, own_process: bool) -> None:
    """A job that ended without its prestarted engine did not wait for the build (a model load:
    jobs/engine_prestart.py), and its error is printed. The command's own process ends here,
    skipping the interpreter's teardown that a thread inside torch may abort; a program running
    the command in-process waits for the build instead, so that no build outlives the call."""
    from shardinfer.jobs.engine_prestart import (
        dropped_build_running,
        end_dropped_builds,
        wait_for_dropped_builds,
    )

    if not own_process:
        wait_for_dropped_builds()
        return
    if not dropped_build_running():
        return
    end_dropped_builds()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader gone, or a stream closed: exit anyway
            stream.flush()
    os._exit(code)


def _main(argv: list[str]) -> int:
    reporter = Reporter("-", _requested_log_format(argv), verbose="--verbose" in argv)
    spec: ResolvedSpec | None = None
    args: argparse.Namespace | None = None  # parsed, once the command line is
    locations: list[str] = []  # the paths the command uses, as far as known: they word a refused access
    try:
        args = build_parser().parse_args(argv)
        if args.command is None:
            raise UsageError(
                "shardinfer: give a command: submit, generate, eval, validate, status or history (see --help)"
            )
        locations += [str(getattr(args, flag, None) or "") for flag in ("model", "input", "output")]
        if args.command == "status":
            from shardinfer.jobs.status import show_status

            guard_job({"output": args.output})
            return show_status(args.output, parse_storage_options(args.storage_options), as_json=args.json)
        if args.command == "history":
            from shardinfer.jobs.status import show_history

            guard_job({"output": args.output})
            return show_history(args.output, parse_storage_options(args.storage_options), as_json=args.json)
        if args.command == "eval":
            from shardinfer.jobs.eval_command import run_eval, settings_from_args

            settings = settings_from_args(args)
            guard_job({"output": settings.output, "storage_options": settings.storage_options})
            with _StopAtOnce(
                "interrupted (SIGTERM): the tasks this eval committed are kept, the one running is not; "
                "rerun the same command to run the rest"
            ):
                run_eval(settings, log=lambda m: reporter.info(m))
            return EXIT_OK
        if args.command == "generate":
            flags = {
                "model.path": ("--model", args.model),
                "input.path": ("--input", args.input),
                "output.path": ("--output", args.output),
            }
            for key, (flag, value) in flags.items():
                if not value:
                    raise UsageError(f"{flag} is empty: give the {key.split('.')[0]} location")
                if any(item.split("=", 1)[0].strip() == key for item in args.conf):
                    raise UsageError(
                        f"--conf {key}=... and {flag} both set it: generate takes it from {flag} only"
                    )
            job_file = {
                "model": {"path": args.model},
                "input": {"path": args.input},
                "output": {"path": args.output},
            }
        else:
            job_file = load_toml(args.job_file)
        spec = _resolve(args, job_file)
        if args.command == "generate":
            _credit_generate_flags(spec)
        locations += [spec.config.model.path, spec.config.input.path, spec.config.output.path]
        guard_job(spec.config.to_dict())  # paths with {run_id} etc. filled in
        if args.command == "validate":
            return _validate(spec)
        reporter = Reporter(spec.config.job.run_id, args.log_format, args.verbose)
        return _submit(args, spec, reporter)
    except BaseException as exc:  # every failure leaves through an exit code
        code = exit_code_for(exc)
        if isinstance(exc, SystemExit):
            return int(exc.code or 0)
        if isinstance(exc, BrokenPipeError) and _stdout_closed():
            # The reader of our output stopped reading (`| head -1`): what it read was printed whole,
            # so end quietly, as other commands do; the interpreter's last flush goes nowhere.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_OK
        message = str(exc) if isinstance(exc, JobError) or code != 1 else f"{type(exc).__name__}: {exc}"
        command = getattr(args, "command", None)
        if isinstance(exc, KeyboardInterrupt):
            message = CTRL_C_EVAL if command == "eval" else CTRL_C
        if is_credentials_error(exc):
            # status and history take their options from a flag, not from a job's spec keys.
            where = (
                "--storage-options"
                if command in ("status", "history")
                else "input.storage_options / output.storage_options"
            )
            message = (
                f"object storage credentials not found ({exc}): set them in the environment "
                f"(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or a profile) or in {where}"
            )
        elif isinstance(exc, PermissionError) and not isinstance(exc, JobError):
            message = _permission_message(exc, locations)
        elif command == "generate" and spec is not None:
            message += _prompt_column_hint(exc, spec)
        _report_failure(reporter, message, code)
        return code


def _report_failure(reporter: Reporter, message: str, code: int) -> None:
    """The error line; with --verbose, an unexpected error's traceback too, inside the JSON record
    under --log-format json so that every line stays one object a log pipeline can parse."""
    if code != 1 or not reporter.verbose:
        reporter.error(message, exit_code=code)
        return
    import traceback

    if reporter.json:
        reporter.error(message, exit_code=code, traceback=traceback.format_exc())
        return
    reporter.error(message, exit_code=code)
    traceback.print_exc()


# generate's flags fill these keys, through the job file layer of the spec.
_GENERATE_FLAGS = {"model.path": "--model", "input.path": "--input", "output.path": "--output"}


def _credit_generate_flags(spec: ResolvedSpec) -> None:
    """generate has no job file: its --model, --input and --output are credited to those flags in
    --dry-run and --verbose, not to a "job file" the user never wrote."""
    for key, flag in _GENERATE_FLAGS.items():
        if spec.sources.get(key) == "job file":
            spec.sources[key] = flag


def _prompt_column_hint(exc: BaseException, spec: ResolvedSpec) -> str:
    """generate reads the column `prompt` by default: an input without it is most often chat data
    (a `messages` column) or prompts under another name, so say which --conf picks the right one."""
    if spec.sources.get("input.prompt_column") != "default":
        return ""
    columns = exc if isinstance(exc, InputColumnError) else exc.__cause__
    if not isinstance(columns, InputColumnError) or "prompt" not in columns.missing:
        return ""
    available = columns.available
    if "messages" in available:
        return (
            " (generate reads prompts from a column named 'prompt' unless told otherwise; this input has "
            "chat messages: add --conf input.messages_column=messages, or --conf input.prompt_column=NAME "
            "for a column of prompt text)"
        )
    return (
        " (generate reads prompts from a column named 'prompt' unless told otherwise: name the column of "
        "prompt text with --conf input.prompt_column=NAME, or of chat messages with "
        "--conf input.messages_column=NAME)"
    )


def _is_remote(location: str) -> bool:
    return "://" in location and not location.startswith("file://")


def _permission_message(exc: PermissionError, locations: list[str]) -> str:
    """What to fix for a refused access: object-store credentials only when the job uses object
    storage and the refused path is not a file on this machine; a local path otherwise, named."""
    path = exc.filename if isinstance(exc.filename, str) else None
    local_file = path is not None and not _is_remote(path) and os.path.lexists(path)
    if any(_is_remote(loc) for loc in locations) and not local_file:
        # The store refused these credentials (a wrong secret, an unknown key, no permission).
        return (
            f"the object store refused access ({exc or type(exc).__name__}): check the credentials (the "
            "environment, a profile, or input.storage_options / output.storage_options), their "
            "permissions on the bucket, and the endpoint"
        )
    fix = "change its permissions (or its folder's), or run the job as a user who may"
    if path is not None:
        return f"permission denied: this user cannot read or write {path!r} ({exc.strerror}); {fix}"
    return f"permission denied ({exc or type(exc).__name__}): this user cannot read or write that local path; {fix}"


def _validate(spec: ResolvedSpec) -> int:
    from shardinfer.pipeline.job import check_model_files, check_spec_fits_model, open_job

    job = open_job(spec.config)
    check_model_files(job)
    check_spec_fits_model(spec.config)  # what the built engine would refuse, said without building it
    print(
        f"ok: {len(job.splits)} split(s); fingerprint {job.fingerprint['hash'][:16]}; output state: {job.state}"
    )
    return EXIT_OK


def _is_ray(master: str) -> bool:
    return master == "ray" or master.startswith("ray://")


def _submit(args: argparse.Namespace, spec: ResolvedSpec, reporter: Reporter) -> int:
    if args.deploy_mode == "cluster":
        if not _is_ray(args.master):
            raise UsageError(
                f"--deploy-mode cluster needs --master ray or ray://HOST:PORT, not {args.master!r}"
            )
        from shardinfer.jobs.ray_submit import submit_to_cluster

        return submit_to_cluster(args, spec, reporter)
    cluster = None
    with _StopAtOnce(SIGTERM_BEFORE_SPLITS):
        if _is_ray(args.master) and not args.dry_run:
            from shardinfer.jobs.ray_executor import RayCluster

            cluster = RayCluster(args.master, spec.config.ray, reporter)
            cluster.resolve_device(spec.config)
            cluster.prestart(spec.config)
        try:
            return _run_job(args, spec, reporter, cluster)
        finally:
            if cluster is not None:
                cluster.shutdown()


def _run_job(args: argparse.Namespace, spec: ResolvedSpec, reporter: Reporter, cluster: Any) -> int:
    """Plan the job and run it; a one-worker local job's engine is built while it is planned
    (jobs/engine_prestart.py)."""
    from shardinfer.jobs.executor import parse_master

    num_workers = 0 if _is_ray(args.master) else parse_master(args.master)
    config = spec.config
    if args.verbose:
        for key, source in sorted(spec.sources.items()):
            reporter.log("debug", f"{key} from {source}")
    from shardinfer.jobs.model_cache import is_url

    prestart = None
    # A model in object storage is first copied into the local cache; were that copy started
    # beside the plan, a plan error (a mistyped input path) would wait for it to finish before
    # it is reported. Such a model is built after the plan, as before.
    if cluster is None and num_workers == 1 and not args.dry_run and not is_url(config.model.path):
        from shardinfer.jobs.engine_prestart import EnginePrestart
        from shardinfer.pipeline.timeline import open_timeline

        prestart = EnginePrestart(config, open_timeline(config.job.timeline_path))
    try:
        return _plan_and_run(args, spec, reporter, cluster, prestart)
    finally:
        if prestart is not None:
            prestart.close()


def _plan_and_run(
    args: argparse.Namespace, spec: ResolvedSpec, reporter: Reporter, cluster: Any, prestart: Any
) -> int:
    from shardinfer.jobs.executor import parse_master
    from shardinfer.jobs.unstarted import only_an_unstarted_plan
    from shardinfer.pipeline.job import check_model_files, check_spec_fits_model, open_job, remove_strays

    num_workers = 0 if _is_ray(args.master) else parse_master(args.master)
    config = spec.config
    try:
        job = open_job(config)
    except (FingerprintMismatch, InputChanged) as exc:
        if not only_an_unstarted_plan(config):
            _dry_run_refusal(args, exc, config.job.run_id)
            raise
        # Nothing of the old job exists but its plan (jobs/unstarted.py): plan this one in its place.
        reporter.warn(
            f"the output holds only the plan of a job that committed nothing and is not running "
            f"({exc}); planning this job in its place",
            output=config.output.path,
        )
        config = dataclasses.replace(config, job=dataclasses.replace(config.job, start_over=True))
        job = open_job(config)
    except JobError as exc:
        _dry_run_refusal(args, exc, config.job.run_id)
        raise
    try:
        check_model_files(job)  # before the output location is written, and said by a dry run
        check_spec_fits_model(job.config)  # as validate does: lengths past the local model's max_model_len
    except JobError as exc:
        _dry_run_refusal(args, exc, config.job.run_id)
        raise
    if args.dry_run:
        from shardinfer.jobs.status import print_dry_run

        _warn_before_start(args, spec, job, reporter)  # a dry run says what the submit would
        print_dry_run(job, spec, num_workers, as_json=args.log_format == "json")
        return EXIT_OK
    if job.state == "done":
        removed = remove_strays(job)
        if removed:
            shown = ", ".join(removed[:3]) + (f" and {len(removed) - 3} more" if len(removed) > 3 else "")
            reporter.info(
                f"deleted {len(removed)} part file(s) no commit marker names ({shown}): left by a run "
                "stopped between a part and its marker",
                output=config.output.path,
            )
        reporter.info(
            "already complete: _SUCCESS matches this job's fingerprint; nothing to do",
            output=config.output.path,
        )
        return EXIT_OK
    _warn_before_start(args, spec, job, reporter)
    with _StopSignals() as signals:
        return _start_run(args, job, reporter, cluster, prestart, num_workers, signals)


def _warn_before_start(args: argparse.Namespace, spec: ResolvedSpec, job: Any, reporter: Reporter) -> None:
    """What the run will do as asked but most likely not as meant (jobs/start_warnings.py), said
    before it starts; a finished job runs nothing, and is told nothing."""
    from shardinfer.jobs.start_warnings import start_warnings

    if job.state == "done":
        return
    output = job.config.output.path
    unresumable = _generated_run_id_in_paths(spec)
    if unresumable:
        reporter.warn(unresumable, output=output)
    for message, fields in start_warnings(spec, job):
        reporter.warn(message, output=output, **fields)
    unused = sorted(k for k in spec.sources if k.startswith("ray.")) if not _is_ray(args.master) else []
    if unused:
        reporter.warn(
            f"{', '.join(unused)} {'has' if len(unused) == 1 else 'have'} no effect with --master {args.master}: "
            "the [ray] section applies to --master ray or ray://HOST:PORT"
        )


def _generated_run_id_in_paths(spec: ResolvedSpec) -> str:
    """A warning when output.path holds a run id made up for this run: a rerun of the same command
    makes up another, so it writes to a new location instead of resuming this one."""
    config = spec.config
    if spec.sources.get("job.run_id") != GENERATED or config.job.run_id not in config.output.path:
        return ""
    return (
        f"output.path holds {{run_id}}, and no --run-id was given: this run writes to {config.output.path}, "
        "and rerunning the same command would start again in a new location rather than resume this one; "
        f"to resume it, rerun with --run-id {config.job.run_id}"
    )


def _dry_run_refusal(args: argparse.Namespace, exc: JobError, run_id: str) -> None:
    """A dry run says what a real submit would do before it exits as that submit would."""
    if not args.dry_run:
        return
    if args.log_format == "json":  # every line JSON: the refusal as one object (the error line follows)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        head = {"ts": now, "level": "info", "run_id": run_id, "msg": str(exc)}
        record = {**head, "event": "dry_run", "would_exit": exc.exit_code, "writes": False}
        print(json.dumps(record, default=str), flush=True)
        return
    print(f"# dry run: submitting would exit {exc.exit_code} and write nothing: {exc}", flush=True)


class _StopAtOnce:
    """SIGTERM where stopping loses nothing worth waiting for (an eval's committed tasks are kept and
    the running one is lost; a run that has not started its splits has written nothing): stop at
    once, as retryable (75) with `message`, instead of dying by the signal (143). Once a run starts
    its splits, _StopSignals takes over."""

    def __init__(self, message: str) -> None:
        self._message = message

    def __enter__(self) -> _StopAtOnce:
        self._saved = signal.signal(signal.SIGTERM, self._on_signal)
        return self

    def _on_signal(self, signum: int, frame: Any) -> None:
        raise Interrupted(self._message)

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGTERM, self._saved)


class _StopSignals:
    """SIGTERM, and a first Ctrl-C, ask the run to stop: no new rows, the requests in flight
    aborted, the splits already complete committed, exit 75 (docs/cli.md, "Signals"). A second
    Ctrl-C interrupts at once. The previous handlers come back at the end, and a SIGINT that was
    ignored (a job started in the background of a script) stays ignored."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.ctrl_c = False
        self._saved: dict[int, Any] = {}

    def __enter__(self) -> _StopSignals:
        self._saved[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._on_signal)
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            self._saved[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_signal)
        return self

    def _on_signal(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT:
            if self.ctrl_c:
                raise KeyboardInterrupt
            self.ctrl_c = True
        self.stop.set()

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._saved.items():
            signal.signal(signum, handler)


def _start_run(
    args: argparse.Namespace,
    job: Any,
    reporter: Reporter,
    cluster: Any,
    prestart: Any,
    num_workers: int,
    signals: _StopSignals,
) -> int:
    from shardinfer.jobs.run_record import RunRecorder
    from shardinfer.pipeline.job import write_plan

    config = job.config
    stop = signals.stop
    for note in job.notes:
        reporter.warn(note + "; recomputing what is missing", output=config.output.path)
    if job.kept_plan:
        reporter.warn(job.kept_plan, output=config.output.path)
    if job.discards:
        reporter.warn(
            f"job.start_over: discarding the output of {job.discards}: its parts, markers and _SUCCESS",
            output=config.output.path,
        )
    if prestart is not None and prestart.serves(config):
        # A stop while the engine is still built ends the job here, where nothing is written yet,
        # instead of after a model load it will not use.
        if not prestart.wait(stop):
            raise Interrupted(CTRL_C if signals.ctrl_c else SIGTERM_BEFORE_SPLITS)
        prestart.raise_build_error()  # before the output location is written (engine_prestart.py)
    write_plan(job, config.job.run_id)
    if job.growth is not None:
        reporter.info(f"job.incremental: planned {job.growth.describe()}", new_splits=job.growth.new_splits)
    recorder = RunRecorder(job.store, config.job.run_id, num_workers, warn=reporter.warn)
    try:
        success = _run_and_finalize(job, num_workers, args.master, stop, reporter, cluster, prestart)
    except BaseException as exc:
        done = _committed_this_run(job)
        if isinstance(exc, KeyboardInterrupt) or (isinstance(exc, Interrupted) and signals.ctrl_c):
            recorder.finish(exit_code_for(exc), CTRL_C, interrupted=True, **done)
            raise Interrupted(CTRL_C) from None
        recorder.finish(exit_code_for(exc), str(exc), interrupted=isinstance(exc, Interrupted), **done)
        raise
    summary = success.get("summary", success)
    recorder.finish(EXIT_OK, "done", **_record_counters(summary))
    reporter.summary(summary)
    return EXIT_OK


def _run_and_finalize(
    job: Any,
    num_workers: int,
    master: str,
    stop: threading.Event,
    reporter: Reporter,
    cluster: Any,
    prestart: Any = None,
) -> dict[str, Any]:
    from shardinfer.jobs.executor import make_scheduler, run_in_process, run_processes
    from shardinfer.jobs.split_driver import RunStats
    from shardinfer.pipeline.job import finalize_job, repair_damaged

    config = job.config
    scheduler = make_scheduler(job)
    n_samples = int(config.sampling.get("n", 1))
    reporter.info(
        "starting",
        output=config.output.path,
        splits=len(job.splits),
        remaining=scheduler.total,
        workers=num_workers or master,
        state=job.state,
    )
    remaining_rows = sum(s.num_rows for s in job.splits if s.index not in job.committed)
    reporter.start(remaining_rows * n_samples, scheduler.total)
    stats = RunStats()
    started = time.monotonic()
    try:
        if scheduler.total:
            if cluster is not None:
                num_workers = cluster.run(job, scheduler, stop, reporter, stats)
            elif num_workers == 1:
                run_in_process(job, scheduler, stop, reporter, stats, prestart)
            else:
                run_processes(job, scheduler, num_workers, stop, reporter, stats)
        emit = _repair_events(job, n_samples, reporter, stats)
        repaired = repair_damaged(job, stop, config.job.run_id, emit=emit, on_result=stats.repaired)
    finally:
        reporter.close()
    for index, why in sorted(repaired.items()):
        reporter.warn(f"split {index} was damaged and has been recomputed: {why}", split=index)
    run_summary = stats.summary(time.monotonic() - started, num_workers, scheduler)
    run_summary["run_rows_redone"] = reporter.progress.rows_redone
    run_summary["repaired"] = {str(i): why for i, why in sorted(repaired.items())}
    return dict(finalize_job(job, config.job.run_id, run_summary))


def _repair_events(
    job: Any, n_samples: int, reporter: Reporter, stats: Any
) -> Callable[[dict[str, Any]], None]:
    """The events of the finish step's repair, counted as this run's work: the damaged splits join
    the progress totals, and their committed rows the repair's count."""
    from shardinfer.jobs.split_driver import REPAIR_WORKER

    rows = {s.index: s.num_rows for s in job.splits}

    def emit(event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "repair":
            splits = [int(i) for i in event.get("splits", [])]
            reporter.add_work(sum(rows.get(i, 0) for i in splits) * n_samples, len(splits))
        elif kind == "split_done" and event.get("won"):
            stats.kept_split(REPAIR_WORKER, event)
        reporter.handle({**event, "worker": REPAIR_WORKER})

    return emit


def _committed_this_run(job: Any) -> dict[str, Any]:
    """For the record of a run that did not finish: the splits committed since it opened the job
    (the markers now, less those it found), or nothing when the store cannot say."""
    try:
        now = set(job.store.committed_indexes())
    except Exception:  # the failure may be the store's own: the record still gets its end
        return {}
    return {"splits_committed": len(now - set(job.committed or ()))}


def _record_counters(summary: dict[str, Any]) -> dict[str, Any]:
    keys = ("run_splits_committed", "records", "rows_ok", "rows_error", "prompt_tokens", "completion_tokens")
    counters = {k: summary[k] for k in keys if k in summary}
    return {
        "splits_committed": summary.get("run_splits_committed", 0),
        "repaired": summary.get("repaired", {}),
        "counters": counters,
    }


if __name__ == "__main__":
    sys.exit(main())
