"""Job specs: TOML sections, a properties file and `--conf` overrides merged into one JobConfig.

Precedence, highest first: `--conf` > `--properties-file` > the job file > defaults (the
JobConfig field defaults). Every key is checked against its section — dataclass fields for
job/input/model/output, `EngineConfig` fields for engine, `SamplingParams` fields for
sampling — and an unknown one is an error naming the nearest valid key, so a typo such as
`sampling.temprature` fails before any GPU time is spent instead of being silently ignored.

`{run_id}`, `{ds}` and `{name}` in input/output paths are replaced after merging, so scheduled
runs write to their own location and a re-run of a completed run finds its own `_SUCCESS`.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardinfer.engine.sampling_params import SamplingParams
from shardinfer.errors import ConfigError, UsageError
from shardinfer.pipeline.config import SCHEMA_FIELDS, TASKS, TYPED_SECTIONS, JobConfig
from shardinfer.pipeline.row_limits import LimitError, check_limits
from shardinfer.pipeline.timeline import check_timeline_path
from shardinfer.redaction import has_userinfo, is_credential_key, redact_url

SECTIONS = ("job", "input", "model", "engine", "sampling", "output", "ray")
# LLM arguments a job sets elsewhere -> the key that sets them: the model's through [model], and
# request seeds through job.seed (every row carries its own seed, so an engine seed would be unused).
_ENGINE_EXCLUDED = {
    "model": "model.path",
    "device": "model.device",
    "dtype": "model.dtype",
    "seed": "job.seed",
}
# List keys that name input columns: a string is a comma-separated list of names (`--conf
# input.passthrough_columns=a,b`). Any other list key given a string (sampling.stop) holds that
# string as its one item, commas and whitespace included.
_COLUMN_LISTS = ("input.override_columns", "input.passthrough_columns")


# Keys other tools (Spark, vLLM, transformers) use that a job file may bring along -> what a job
# does instead. The nearest valid name would mislead here (job.master is not job.start_over).
_WORKERS = "the workers are chosen when the job is submitted: --master local[N], or --master ray with ray.num_workers"
_OVERWRITE = (
    "job.start_over = true discards an output that holds another job (an output of this same job "
    "is resumed instead)"
)
_FOREIGN_KEYS = {
    "job.master": _WORKERS,
    "job.workers": _WORKERS,
    "job.num_workers": _WORKERS,
    "engine.tensor_parallel_size": (
        "tensor parallelism is not supported: each worker runs the whole model; add workers (--master "
        "local[N] or ray), or split a MoE model's experts with engine.expert_parallel_size"
    ),
    "engine.pipeline_parallel_size": (
        "pipeline parallelism is not supported: each worker runs the whole model; add workers (--master "
        "local[N] or ray), or split a MoE model's experts with engine.expert_parallel_size"
    ),
    "sampling.do_sample": "temperature = 0 decodes greedily and temperature > 0 samples: there is no do_sample switch",
    "output.overwrite": _OVERWRITE,
    "output.mode": _OVERWRITE,
    "model.trust_remote_code": (
        "no code from a model folder is ever run: the supported families load from config.json and the weights"
    ),
}


def _field_defaults(cls: type) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
        else:
            out[f.name] = None
    return out


def valid_keys(section: str) -> dict[str, Any]:
    """key -> default value (whose type drives coercion; None = any) for one section."""
    if section in TYPED_SECTIONS:
        return _field_defaults(TYPED_SECTIONS[section])
    if section == "sampling":
        return {k: v for k, v in _field_defaults(SamplingParams).items() if k != "seed"}
    if section == "engine":
        from shardinfer.engine.config import EngineConfig

        return {k: v for k, v in _field_defaults(EngineConfig).items() if k not in _ENGINE_EXCLUDED}
    raise KeyError(section)


def nearest(name: str, choices: list[str]) -> str:
    near = difflib.get_close_matches(name, choices, n=1, cutoff=0.5)
    return f" (did you mean {near[0]!r}?)" if near else ""


def parse_value(text: str) -> Any:
    """A --conf / properties value: TOML literal syntax if it parses (0.7, true, ["a"]), else the raw string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def coerce(key: str, value: Any, default: Any, raw: str | None = None) -> Any:
    """Bring a value to the type of the key's default; raise ConfigError naming key, value and type."""
    if default is None or value is None:
        return value
    want = type(default)
    if want is bool:
        if isinstance(value, bool):
            return value
    elif want is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif want is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif want is str:
        if isinstance(value, str):
            return value
        if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
            return value.isoformat()  # an unquoted TOML date (ds = 2024-05-06) is its ISO text
        if raw is not None:  # --conf job.run_id=20240101 is the string "20240101", not a number
            return raw
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
    elif want is list:
        _check_unparsed(key, value, raw, "[", 'a list, like ["a", "b"] (each string quoted)')
        if key in _COLUMN_LISTS:
            return _column_list(key, value)
        if isinstance(value, list):
            return value
        if isinstance(value, str):  # one stop string, untouched (as OpenAI's and vLLM's `stop`)
            return [value]
    elif want is dict:
        _check_unparsed(key, value, raw, "{", 'a TOML inline table, like {name = "value", flag = true}')
        if isinstance(value, dict):
            return value
    else:
        return value
    shown = "a value" if holds_credentials(key) else repr(value)  # never quote a key or secret back
    raise ConfigError(f"{key}={shown} has the wrong type: expected {want.__name__} (like {default!r})")


def _check_unparsed(key: str, value: Any, raw: str | None, opener: str, form: str) -> None:
    """A --conf value written as a list or table that TOML could not read is a ConfigError naming
    the syntax error: taken as a plain string it would become one stop string `[a, b]`, or fail as
    a value of the wrong type without saying why. A bracketed word with no comma or quote
    (`sampling.stop=[INST]`) is a plain string, as a value that is not TOML always was."""
    if raw is None or not isinstance(value, str) or not raw.startswith(opener):
        return
    if opener == "[" and not any(c in raw for c in ",\"'"):
        return
    prefix = "v = "
    try:
        tomllib.loads(prefix + raw)
    except tomllib.TOMLDecodeError as exc:
        # The parser counts the columns of `v = VALUE`; the user wrote VALUE.
        where = re.sub(
            r"\(at line 1, column (\d+)\)",
            lambda m: f"(at character {int(m.group(1)) - len(prefix)})",
            str(exc),
        )
        # Never quote a value that may hold a key or a secret (a storage_options table).
        shown = "the value" if holds_credentials(key) else repr(raw)
        single = f", or quote a single string: --conf '{key}=\"...\"'" if opener == "[" else ""
        raise ConfigError(f"{key}: {shown} is not valid TOML ({where}); write it as {form}{single}") from None


def _column_list(key: str, value: Any) -> list[str]:
    """A list of input column names, from a list of strings or a comma-separated string."""
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list):
        raise ConfigError(
            f'{key}={value!r} has the wrong type: expected a list of column names, like ["a", "b"]'
        )
    for item in value:
        if not isinstance(item, str):
            raise ConfigError(
                f"{key}={value!r}: {item!r} is not a column name; give the names as strings, "
                'like ["a", "b"] (or a,b in --conf)'
            )
    return value


def holds_credentials(dotted: str) -> bool:
    """Whether the value of this key (e.g. input.storage_options) may hold a key or a secret."""
    name = dotted.rsplit(".", 1)[-1]
    if name.endswith("token_ids"):  # vocabulary ids (sampling.stop_token_ids), not an access token
        return False
    return name in ("storage_options", "runtime_env") or is_credential_key(name)


@dataclass
class ResolvedSpec:
    config: JobConfig
    sources: dict[str, str] = field(default_factory=dict)  # "section.key" -> where its value came from
    # "input.path" / "output.path" as written, before the placeholders were filled: which of them a
    # path holds decides whether a value made up for this run ({run_id}, {ds}) picks its location.
    written_paths: dict[str, str] = field(default_factory=dict)


def parse_conf(item: str, source: str = "--conf") -> tuple[str, Any, str]:
    """'section.key=value' -> (dotted key, parsed value, raw text)."""
    if "=" not in item:
        raise UsageError(f"{source} {item!r} is not KEY=VALUE (for example sampling.temperature=0.7)")
    key, raw = item.split("=", 1)
    key = key.strip()
    if "." not in key:
        raise UsageError(
            f"{source} key {key!r} needs a section: one of {', '.join(SECTIONS)} (like job.seed)"
        )
    return key, parse_value(raw.strip()), raw.strip()


def _read_text(path: str | Path, what: str, fix: str) -> str:
    """The file's text (UTF-8, as TOML is); a usage error naming the file when there is none to read."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(
            f"{what} {str(path)!r} is a directory: give the file itself (e.g. {str(p / 'job.toml')!r})"
        )
    if not p.exists():  # not is_file(): a pipe (`--properties-file <(...)`) is read as a file is
        raise UsageError(f"{what} {str(path)!r} does not exist")
    data = p.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{what} {str(path)!r} is not a text file (byte {data[exc.start]:#04x} at offset {exc.start} is "
            f"not UTF-8): {fix}"
        ) from None


def load_toml(path: str | Path, what: str = "job file") -> dict[str, Any]:
    text = _read_text(path, what, "give a TOML file")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{what} {str(path)!r} is not valid TOML: {exc}") from None


def load_properties(path: str | Path) -> list[tuple[str, Any, str | None]]:
    """A spark-defaults style file: `section.key=value` or `section.key value` lines, # comments; or TOML.

    Each item is (dotted key, value, the text written, or None where TOML typed the value)."""
    p = Path(path)
    if p.suffix == ".toml":  # typed as a job file's values are: a quoted "[a, b]" is a string
        return [(k, v, None) for k, v in flatten(load_toml(p, "properties file")).items()]
    text = _read_text(p, "properties file", "give key=value lines or a .toml file")
    items: list[tuple[str, Any, str | None]] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "=" not in line:  # the `key value` form of spark-defaults.conf
            key, _, value = line.partition(" ")
            line = f"{key}={value.strip()}"
        items.append(parse_conf(line, f"{path}:{lineno}"))
    return items


def flatten(doc: dict[str, Any]) -> dict[str, Any]:
    """{"sampling": {"temperature": 0.7}} -> {"sampling.temperature": 0.7}; sections must be tables."""
    flat: dict[str, Any] = {}
    for section, body in doc.items():
        if not isinstance(body, dict):
            raise ConfigError(
                f"top-level key {section!r} must be a [section] table; sections: {', '.join(SECTIONS)}"
            )
        for key, value in body.items():
            flat[f"{section}.{key}"] = value
    return flat


def _check_key(dotted: str) -> tuple[str, str, Any]:
    section, key = dotted.split(".", 1)
    if section not in SECTIONS:
        raise ConfigError(
            f"unknown section {section!r} in {dotted!r}{nearest(section, list(SECTIONS))}; "
            f"sections: {', '.join(SECTIONS)}"
        )
    keys = valid_keys(section)
    if key not in keys:
        if section in ("sampling", "engine") and key == "seed":
            raise ConfigError(
                f"{dotted} is not a job setting: use job.seed (each row's seed is derived from "
                "it and the row id) or a per-row `seed` override column"
            )
        if section == "engine" and key in _ENGINE_EXCLUDED:
            raise ConfigError(
                f"{dotted} is not an [engine] key: set it as {_ENGINE_EXCLUDED[key]} (the [model] section)"
            )
        if dotted in _FOREIGN_KEYS:
            raise ConfigError(f"{dotted} is not a job setting: {_FOREIGN_KEYS[dotted]}")
        table, _, inner = key.partition(".")
        if inner and isinstance(keys.get(table), dict):  # one entry of a table key: give the table whole
            raise ConfigError(
                f"{dotted}: {section}.{table} is set as a whole table, e.g. --conf "
                f"'{section}.{table}={{{inner} = \"...\"}}' (list every entry it needs)"
            )
        raise ConfigError(
            f"unknown key {dotted!r}{nearest(key, list(keys))}; valid [{section}] keys: "
            f"{', '.join(sorted(keys))}"
        )
    return section, key, keys[key]


def name_layer(name: str | None) -> list[tuple[str, Any, str | None]]:
    """`--name` as a layer's items: job.name, or nothing when the flag is absent."""
    return [("job.name", name, name)] if name else []


def resolve(
    job_file: dict[str, Any],
    *,
    properties: Sequence[tuple[str, Any, str | None]] = (),
    confs: Sequence[tuple[str, Any, str]] = (),
    name: str | None = None,
    run_id: str | None = None,
    today: datetime.date | None = None,
) -> ResolvedSpec:
    """Merge the layers, validate every key and value, fill `{run_id}`/`{ds}`; returns the JobConfig."""
    _check_flag_given("--name", name, "job name")
    _check_flag_given("--run-id", run_id, "run id (e.g. your scheduler's)")
    data: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
    sources: dict[str, str] = {}
    layers: list[tuple[str, list[tuple[str, Any, str | None]]]] = [
        ("job file", [(k, v, None) for k, v in flatten(job_file).items()]),
        ("properties file", list(properties)),
        ("--name", name_layer(name)),  # its own layer so the dry run credits it; a --conf must agree
        ("--conf", list(confs)),
    ]
    for source, items in layers:
        for dotted, value, raw in items:
            try:
                section, key, default = _check_key(dotted)
                data[section][key] = coerce(dotted, value, default, raw)
            except ConfigError as exc:
                if source != "properties file":
                    raise
                # A defaults file the command line names only once: without this, the key is looked for
                # in the job file.
                raise ConfigError(f"{exc} (set in the properties file)") from None
            sources[dotted] = source
    if name:
        _check_flag_and_conf("--name", name, "job.name", data["job"].get("name"), sources.get("job.name"))
    if run_id:
        _check_flag_and_conf(
            "--run-id", run_id, "job.run_id", data["job"].get("run_id"), sources.get("job.run_id")
        )
        data["job"]["run_id"] = run_id
        sources["job.run_id"] = "--run-id"
    try:
        config = JobConfig.from_dict(data)
    except TypeError as exc:
        raise ConfigError(f"invalid job spec: {exc}") from None
    written = {"input.path": config.input.path, "output.path": config.output.path}
    _fill_defaults(config, sources, today or datetime.datetime.now(datetime.UTC).date())
    validate(config)
    return ResolvedSpec(config, sources, written)


def _check_flag_given(flag: str, value: str | None, what: str) -> None:
    """A flag given an empty value (`--run-id "$RUN_ID"` with the variable unset) is refused: taken as
    absent, it would quietly give the run a made-up run id, or the job file's name, and with them
    another output folder than the one the scheduler resumes."""
    if value is not None and not value.strip():
        raise UsageError(f"{flag} is empty: give the {what}, or leave the flag out")


def _check_flag_and_conf(flag: str, value: str, key: str, conf_value: Any, source: str | None) -> None:
    """--run-id (--name) and --conf job.run_id (job.name) both on one command line and disagreeing:
    either may be the one the scheduler meant, and both values pick the output folder ({run_id},
    {name}), so neither is chosen silently. A job file's or properties file's value is a default
    the flag overrides, as every command-line value overrides those files."""
    if source == "--conf" and str(conf_value) != value:
        what = key.removeprefix("job.").replace("_", " ")  # "run id", "name"
        raise UsageError(
            f"{flag} {value!r} and --conf {key}={conf_value!r} disagree: give the {what} once (drop one of "
            "them) or give both the same value"
        )


# The sources of the values a run makes up when none is given: a rerun makes up others.
RUN_DATE = "run date (UTC)"
GENERATED = "generated"


def _fill_defaults(config: JobConfig, sources: dict[str, str], today: datetime.date) -> None:
    job = config.job
    if not job.ds:
        job.ds = today.isoformat()
        sources["job.ds"] = RUN_DATE
    if not job.run_id:
        job.run_id = f"manual__{datetime.datetime.now(datetime.UTC).strftime('%Y%m%dT%H%M%SZ')}"
        sources["job.run_id"] = GENERATED
    if config.job.task == "generate" and not config.input.prompt_column and not config.input.messages_column:
        config.input.prompt_column = "prompt"
        sources.setdefault("input.prompt_column", "default")
    for section in (config.input, config.output):
        section.path = render_path(section.path, config)


PLACEHOLDERS = ("{run_id}", "{ds}", "{name}")
_PLACEHOLDER = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*\}")
# What a scheduler's templates call the same values (Airflow's {ds} is ours; {date} is not).
_PLACEHOLDER_SYNONYMS = {
    "{date}": "{ds}",
    "{dt}": "{ds}",
    "{day}": "{ds}",
    "{runid}": "{run_id}",
    "{run}": "{run_id}",
    "{job}": "{name}",
    "{job_name}": "{name}",
}


def render_path(path: str, config: JobConfig) -> str:
    """Replace the placeholders; a {word} that is none of them is a ConfigError (a misspelt one would
    become a folder of that name). Other braces in a URL ({a,b}, a lone brace) are left alone."""
    for name, value in zip(PLACEHOLDERS, (config.job.run_id, config.job.ds, config.job.name), strict=True):
        if name in path and (value in ("", ".", "..") or "/" in value or "\\" in value or ".." in value):
            # A placeholder fills one path segment: `..` or a slash would move the output out of its base.
            raise ConfigError(
                f"job.{name.strip('{}')}={value!r} cannot fill {name} in {path!r}: it must be one path "
                "segment without '/', '\\' or '..'; choose another value"
            )
        path = path.replace(name, value)
    unknown = _PLACEHOLDER.search(path)
    if unknown is not None:  # a misspelt placeholder would silently become a folder of that name
        word = unknown.group(0)
        near = (
            [_PLACEHOLDER_SYNONYMS[word]]
            if word in _PLACEHOLDER_SYNONYMS
            else difflib.get_close_matches(word, list(PLACEHOLDERS), n=1, cutoff=0.6)
        )
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise ConfigError(
            f"{unknown.group(0)} in path {path!r} is not a placeholder{hint}: the placeholders are "
            f"{', '.join(PLACEHOLDERS)}; fix the path"
        )
    return path


def _validate_engine(config: JobConfig) -> None:
    """The engine's own value checks, run on the spec: a bad [engine] value (or a bad model.device
    or model.dtype) is a configuration error found before the output location is touched and by a
    dry run, not an engine failure after planning. Nothing is loaded: the checks read values only."""
    from shardinfer.engine.config import EngineConfig

    args = dict(config.engine)
    if config.model.quantization:
        args["quantization"] = config.model.quantization
    try:
        EngineConfig(model=config.model.path, device=config.model.device, dtype=config.model.dtype, **args)
    except (ValueError, TypeError) as exc:
        message = str(exc)
        # The engine names its argument ("speculative='x': ..."); the job file's key is [section].key.
        name = message.split("=", 1)[0]
        section = (
            "engine" if name in config.engine or name not in ("device", "dtype", "quantization") else "model"
        )
        if name.isidentifier() and (name in config.engine or section == "model"):
            message = f"{section}.{message}"
        raise ConfigError(f"{message} (fix it in the job file's [{section}] or with --conf)") from None


def validate(config: JobConfig) -> None:
    """Checks that need more than one key: required paths, exclusive columns, override fields."""
    for key, value in (
        ("model.path", config.model.path),
        ("input.path", config.input.path),
        ("output.path", config.output.path),
    ):
        if not value:
            raise ConfigError(f"{key} is not set: add it to the job file or pass --conf {key}=...")
        check_no_credentials_in_url(key, value)
    if config.model.quantization not in ("", "fp8", "none"):
        raise ConfigError(
            f'model.quantization={config.model.quantization!r} is not supported; use "fp8" (block-scaled '
            'FP8 weights), "none" (dequantise FP8 checkpoints) or leave it unset (follow the checkpoint)'
        )
    if config.model.quantization and config.engine.get("quantization", config.model.quantization) != (
        config.model.quantization
    ):
        raise ConfigError(
            f"model.quantization={config.model.quantization!r} and engine.quantization="
            f"{config.engine['quantization']!r} disagree; set it once, as model.quantization"
        )
    _validate_engine(config)
    inp = config.input
    validate_task(config)
    if inp.prompt_column and inp.messages_column:
        raise ConfigError(
            f"input.prompt_column={inp.prompt_column!r} and input.messages_column="
            f"{inp.messages_column!r} are both set: a row's prompt comes from one of them; keep "
            "prompt_column for plain text, messages_column for chat messages, and remove the other (or "
            "empty it on the command line: --conf input.prompt_column= or --conf input.messages_column=)"
        )
    if inp.chat_template_kwargs and not inp.messages_column:
        raise ConfigError(
            "input.chat_template_kwargs are variables of the chat template, which renders "
            "input.messages_column; a prompt_column's text is used as written: remove them, or give "
            "the rows as messages"
        )
    _validate_passthrough(config)
    allowed = [f for f in SamplingParams.field_names() if f not in SCHEMA_FIELDS]
    for col in inp.override_columns:
        if col not in allowed:
            raise ConfigError(
                f"input.override_columns names {col!r}, which is not a per-row sampling setting"
                f"{nearest(col, allowed)}; allowed: {', '.join(allowed)}"
            )
    job = config.job
    counts = {
        "job.split_rows": job.split_rows,
        "job.max_inflight_requests": job.max_inflight_requests,
        "job.batch_rows": job.batch_rows,
    }
    for key, count in counts.items():
        if count < 1:
            raise ConfigError(f"{key}={count}: must be >= 1")
    if job.max_splits_in_flight < 0:
        raise ConfigError(
            f"job.max_splits_in_flight={job.max_splits_in_flight}: must be >= 1, or 0 for enough splits "
            "to keep job.max_inflight_requests rows admitted"
        )
    if not 0.0 <= job.max_error_fraction <= 1.0:
        raise ConfigError(f"job.max_error_fraction={job.max_error_fraction}: must be in [0, 1]")
    check_ds(job.ds)
    # Before the job runs, not when its last split is done; the timeline may go into a local output.
    output = config.output.path.removeprefix("file://")
    check_timeline_path(job.timeline_path, "" if "://" in output else output)
    if config.sampling.get("max_tokens") == 0:
        # The engine's prompt-only requests (max_tokens=0) are what score jobs send; a generate job
        # of them would write rows of empty text.
        raise ConfigError(
            "sampling.max_tokens=0 generates nothing: give max_tokens >= 1 (or leave it unset), or to "
            'score the prompts instead, run a score job (job.task = "score", docs/jobs.md)'
        )
    try:
        check_limits(SamplingParams(**config.sampling))
    except LimitError as exc:
        raise ConfigError(f"[sampling]: {exc}; see the per-row limits in docs/jobs.md") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"[sampling]: {exc}") from None


_ISO_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


def check_ds(ds: str) -> None:
    """job.ds is a date. Another ISO form than YYYY-MM-DD (20240506, the week date 2024-W19-1) is
    taken as written, with a warning before the run (jobs/start_warnings.py): a scheduled job
    planned with it must still resume."""
    try:
        datetime.date.fromisoformat(ds)
    except ValueError:
        raise ConfigError(f"job.ds={ds!r} is not a date: use YYYY-MM-DD") from None


def is_dashed_date(ds: str) -> bool:
    """Whether ds is written YYYY-MM-DD, the form the docs give."""
    return bool(_ISO_DATE.fullmatch(ds))


def _validate_passthrough(config: JobConfig) -> None:
    """Passthrough names the output schema would refuse, found from the names alone: before the
    output location is written (whose fingerprint the fix would then change) and by `validate`."""
    names = config.input.passthrough_columns
    if not names:
        return
    from shardinfer.writers.schema import RESERVED_COLUMNS, SCORE_COLUMNS

    reserved = frozenset(SCORE_COLUMNS) if config.job.task == "score" else RESERVED_COLUMNS
    for name in names:
        if name in reserved:
            raise ConfigError(
                f"input.passthrough_columns names {name!r}, which is an output column: rename it in "
                f"input.query (SELECT *, {name} AS input_{name} ...) and pass input_{name} through, or "
                "leave it out"
            )
        if name.startswith("__"):
            raise ConfigError(
                f"input.passthrough_columns names {name!r}: names starting with '__' are internal to the "
                "reader and are not passed through; rename the column in input.query"
            )
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"input.passthrough_columns names {', '.join(map(repr, repeated))} more than once")


# These object stores take credentials only through storage options: in such a URL, `key:secret@` would
# be read as part of the bucket name, and quoted back in every error naming the path.
_OPTION_ONLY_SCHEMES = ("s3", "s3a", "gs", "gcs", "oci", "r2")


def check_no_credentials_in_url(key: str, url: str) -> None:
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in _OPTION_ONLY_SCHEMES and has_userinfo(url):
        section = key.split(".", 1)[0]
        raise ConfigError(
            f"{key}={redact_url(url)!r} carries credentials before '@': {scheme}:// URLs do not take them; "
            f"remove them from the URL and set {section}.storage_options (e.g. key and secret), or use "
            "the environment or a profile"
        )


def validate_task(config: JobConfig) -> None:
    """job.task and the input columns it reads: a score job names a context and its continuations,
    or a document, and nothing that only a generation job reads."""
    job, inp = config.job, config.input
    if job.task not in TASKS:
        raise ConfigError(
            f"job.task={job.task!r}{nearest(job.task, list(TASKS))}: must be one of {', '.join(TASKS)}"
        )
    score_columns = {
        "input.context_column": inp.context_column,
        "input.continuations_column": inp.continuations_column,
        "input.document_column": inp.document_column,
    }
    if job.task == "generate":
        named = [k for k, v in score_columns.items() if v]
        if named:
            raise ConfigError(
                f"{', '.join(named)} only {'applies' if len(named) == 1 else 'apply'} to score jobs: set "
                f'job.task="score" or remove {"it" if len(named) == 1 else "them"}'
            )
        return
    if inp.prompt_column or inp.messages_column or inp.override_columns:
        raise ConfigError(
            "a score job reads input.context_column + input.continuations_column (or "
            "input.document_column), not input.prompt_column, input.messages_column or "
            "input.override_columns: remove those keys"
        )
    if config.sampling:
        keys = sorted(config.sampling)
        raise ConfigError(
            f"a score job samples nothing (scoring is greedy and deterministic), so [sampling] "
            f"{', '.join(keys)} would have no effect: remove {'it' if len(keys) == 1 else 'them'}"
        )
    pair = bool(inp.context_column or inp.continuations_column)
    if pair and inp.document_column:
        raise ConfigError(
            f"input.document_column={inp.document_column!r} and input.context_column/continuations_column "
            "are both set: a score job scores continuations after a context, or whole documents, not both"
        )
    if pair and not (inp.context_column and inp.continuations_column):
        missing = "input.context_column" if not inp.context_column else "input.continuations_column"
        raise ConfigError(
            f"{missing} is not set: scoring continuations needs both a context and a continuations column"
        )
    if not pair and not inp.document_column:
        raise ConfigError(
            'job.task="score" needs input.context_column and input.continuations_column (multiple choice, '
            "cloze) or input.document_column (rolling perplexity)"
        )
    if job.rolling_window_tokens < 0:
        raise ConfigError(
            f"job.rolling_window_tokens={job.rolling_window_tokens}: must be >= 1, or 0 for the longest"
        )
    if pair and job.rolling_window_tokens:
        raise ConfigError(
            f"job.rolling_window_tokens={job.rolling_window_tokens} only applies to documents "
            "(input.document_column); continuations are scored whole after their context: remove it"
        )
