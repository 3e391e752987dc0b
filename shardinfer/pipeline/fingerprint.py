"""The job fingerprint: everything that decides what a row's output is.

Two runs with equal fingerprints produce identical rows (sampling is a pure function of model,
prompt, params and seed), so a resumed run may keep the splits an earlier run committed. Any
difference — another checkpoint, tokenizer, chat template, sampling default, numerics mode,
prompt/id columns, output schema — would silently mix two datasets, so resuming is refused and
the message names the components that changed.

The fingerprint is a flat dict of named components plus `hash` over all of them. Weight files
are identified by their content cheaply (see `weights_identity`: size, header hash and
modification time, or an opt-in cached full hash), and only the files the engine's loader reads;
config.json and the tokenizer files are hashed in full. The input is pinned separately, by the listing stored in `_job.json`
(see `input_listing`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from shardinfer.engine.chat_template import ADDITIONAL_TEMPLATES_DIR, model_chat_templates
from shardinfer.engine.models.checkpoint_layout import INDEX_FILE
from shardinfer.errors import ConfigError
from shardinfer.pipeline.config import JobConfig
from shardinfer.pipeline.scoring import SAMPLED_TOKEN_RULE, SPAN_RULE
from shardinfer.pipeline.weights_identity import (
    check_verify_mode,
    checkpoint_file_names,
    listed_checksum,
    remote_weight_identity,
    weight_identity,
)
from shardinfer.redaction import location_identity

FINGERPRINT_VERSION = 2
# Engine arguments that change numerics (and therefore tokens); scheduling knobs such as
# max_num_seqs do not, given batch invariance, and may change between attempts.
NUMERICS_ENGINE_KEYS = ("batch_invariant", "max_model_len", "kv_cache_dtype", "quantization")


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def model_identity(
    model_dir: str,
    storage_options: dict[str, Any] | None = None,
    verify_weights: str = "stat",
    *,
    checksums: bool = True,
) -> dict[str, Any]:
    """Hashes of config.json and tokenizer files, each weight file's identity, the chat template.
    `checksums=False`: a model on object storage identified as before listed checksums were read
    (weights by size alone), to resume jobs planned then."""
    check_verify_mode(verify_weights)  # here: the remote branch ignores it, and a typo must still be refused
    if "://" in model_dir and not model_dir.startswith("file://"):
        return _remote_model_identity(model_dir, storage_options or {}, checksums)
    root = Path(model_dir.removeprefix("file://"))
    if not root.is_dir():
        # A job file's relative paths are read from where the command runs, not from the file's folder.
        relative = (
            ""
            if root.is_absolute()
            else f" (a relative path, read from the current directory {os.getcwd()!r})"
        )
        raise ConfigError(
            f"model.path={model_dir!r} is not a directory{relative}; point it at a local Hugging Face "
            "model folder (config.json, *.safetensors, tokenizer.json)"
        )
    config_file = root / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"model.path={model_dir!r} has no config.json; is it a Hugging Face model folder?")
    weights = _local_weight_files(root, model_dir)
    config_bytes = config_file.read_bytes()
    generation_config = root / "generation_config.json"
    out: dict[str, Any] = {
        "model.config_sha256": _sha256_bytes(config_bytes),
        "model.weights": {p.name: weight_identity(p, verify_weights) for p in weights},
        **_checkpoint_quantization(config_bytes),
        **_generation_eos_ids(
            config_bytes, generation_config.read_bytes() if generation_config.is_file() else None
        ),
    }
    tok = root / "tokenizer.json"
    out["tokenizer.sha256"] = _sha256_bytes(tok.read_bytes()) if tok.is_file() else None
    out["tokenizer.chat_template_sha256"] = _template_sha256(
        _config_template(_read_local(root / "tokenizer_config.json"), model_dir),
        _text(_read_local(root / "chat_template.jinja"), "chat_template.jinja", model_dir),
        _local_additional_templates(root, model_dir),
    )
    return out


def _read_local(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


def _local_additional_templates(root: Path, model_dir: str) -> dict[str, str]:
    folder = root / ADDITIONAL_TEMPLATES_DIR
    if not folder.is_dir():
        return {}
    found = {}
    for path in sorted(folder.glob("*.jinja")):
        if path.is_file():
            where = f"{ADDITIONAL_TEMPLATES_DIR}/{path.name}"
            found[path.name.removesuffix(".jinja")] = _text(path.read_bytes(), where, model_dir) or ""
    return found


def _text(data: bytes | None, name: str, model_dir: str) -> str | None:
    """A template file's text, UTF-8 as the tokenizer reads it whatever the machine's locale."""
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"model.path={model_dir!r}: {name} is not UTF-8 text ({exc}); save it as UTF-8"
        ) from None


def _config_template(data: bytes | None, model_dir: str) -> Any:
    """tokenizer_config.json's chat_template (a template, a list of named ones, or None)."""
    if data is None:
        return None
    try:
        config = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(
            f"model.path={model_dir!r}: tokenizer_config.json is not valid JSON ({exc}); fix or remove it"
        ) from None
    if not isinstance(config, dict):
        raise ConfigError(
            f"model.path={model_dir!r}: tokenizer_config.json holds a JSON {type(config).__name__}, not an "
            "object; fix or remove it"
        )
    return config.get("chat_template")


def _template_sha256(config_template: Any, jinja: str | None, additional: dict[str, str]) -> str | None:
    """The hash of the template a job renders with: the model's default one, chosen as the tokenizer
    chooses it (engine.chat_template.model_chat_templates). No job key selects a named template (jobs
    pass no tools), so the others do not count, except that tokenizer_config.json's list of named
    templates is hashed whole, as jobs planned before named template files were read stored it."""
    default, _ = model_chat_templates(config_template, jinja, additional)
    if not default:
        return None
    hashed = config_template if jinja is None and not additional else default
    return _sha256_bytes(_canonical(hashed).encode())


def _local_weight_files(root: Path, model_dir: str) -> list[Path]:
    """The weight files the engine's loader reads, in its order: a stray *.safetensors beside them
    (Mistral's consolidated.safetensors) is never loaded, so it costs no hashing and changes no job."""
    names = {p.name for p in root.iterdir() if p.is_file()}
    index = (root / INDEX_FILE).read_bytes() if INDEX_FILE in names else None
    return [root / name for name in checkpoint_file_names(names, index, model_dir)]


def _eos_ids(value: Any) -> list[Any]:
    """An eos_token_id entry (one id, a list of them, or absent) as a list."""
    return list(value) if isinstance(value, list) else [] if value is None else [value]


def _generation_eos_ids(config_bytes: bytes, generation_bytes: bytes | None) -> dict[str, Any]:
    """{"model.generation_eos_token_ids": ids} when generation_config.json names eos ids that
    config.json's eos_token_id does not: generation stops at those too (outputs planned before that
    did not), so such a checkpoint counts as another job. {} otherwise, so every other checkpoint
    keeps its fingerprint."""
    if generation_bytes is None:
        return {}
    try:
        listed = _eos_ids(json.loads(generation_bytes).get("eos_token_id"))
        known = _eos_ids(json.loads(config_bytes).get("eos_token_id"))
    except (ValueError, AttributeError, TypeError):
        return {}  # an unreadable file fails at load with its own error
    if all(i in known for i in listed):
        return {}
    return {"model.generation_eos_token_ids": listed}


def _checkpoint_quantization(config_bytes: bytes) -> dict[str, Any]:
    """{"model.checkpoint_quantization": method} for a quantised checkpoint (FP8 ones run in FP8
    unless model.quantization says otherwise), {} for a float one (whose fingerprint stays as it was)."""
    try:
        method = (json.loads(config_bytes).get("quantization_config") or {}).get("quant_method")
    except (ValueError, AttributeError):
        return {}  # an unreadable config.json fails at load with its own error
    return {"model.checkpoint_quantization": str(method)} if method else {}


def _remote_model_identity(url: str, storage_options: dict[str, Any], checksums: bool) -> dict[str, Any]:
    """model_identity of a model folder on object storage, from its listing and its small files,
    without copying the weights (workers copy the model into their machine's cache). The weight
    files are the ones the loader will read from that copy, chosen by the same rule as locally."""
    from shardinfer.storage import filesystem

    fs, root = filesystem(url, storage_options)
    base = root.rstrip("/")
    listed, folders = _remote_entries(fs, base, url)

    def read(name: str) -> bytes | None:
        return fs.cat_file(f"{base}/{name}") if name in listed else None

    config_bytes = read("config.json")
    if config_bytes is None:
        raise ConfigError(f"model.path={url!r} holds no config.json; is it a Hugging Face model folder?")
    names = checkpoint_file_names(listed, read(INDEX_FILE), url)
    tok = read("tokenizer.json")
    additional: dict[str, str] = {}
    if ADDITIONAL_TEMPLATES_DIR in folders:
        templates, _ = _remote_entries(fs, f"{base}/{ADDITIONAL_TEMPLATES_DIR}", url)
        for name in sorted(n for n in templates if n.endswith(".jinja")):
            where = f"{ADDITIONAL_TEMPLATES_DIR}/{name}"
            additional[name.removesuffix(".jinja")] = _text(fs.cat_file(f"{base}/{where}"), where, url) or ""
    template_sha256 = _template_sha256(
        _config_template(read("tokenizer_config.json"), url),
        _text(read("chat_template.jinja"), "chat_template.jinja", url),
        additional,
    )
    return {
        "model.config_sha256": _sha256_bytes(config_bytes),
        **_checkpoint_quantization(config_bytes),
        **_generation_eos_ids(config_bytes, read("generation_config.json")),
        "model.weights": {
            n: remote_weight_identity(listed[n][0], listed[n][1] if checksums else "") for n in names
        },
        "tokenizer.sha256": _sha256_bytes(tok) if tok is not None else None,
        "tokenizer.chat_template_sha256": template_sha256,
    }


def _remote_entries(fs: Any, folder: str, url: str) -> tuple[dict[str, tuple[int, str]], set[str]]:
    """(name -> (size, listed checksum) of the files directly in `folder`, names of its sub-folders)."""
    try:
        infos = fs.ls(folder, detail=True)
    except FileNotFoundError:
        raise ConfigError(f"model.path={url!r} does not exist; give the URL of a model folder") from None
    files = {
        _base_name(i["name"]): (int(i["size"]), listed_checksum(i)) for i in infos if i.get("type") == "file"
    }
    return files, {_base_name(i["name"]) for i in infos if i.get("type") == "directory"}


def _base_name(name: Any) -> str:
    return str(name).rstrip("/").rsplit("/", 1)[-1]


def input_identity(path: str, absolute: bool = True) -> str:
    """input.path as the fingerprint holds it: without credentials, and a local path made absolute,
    so `in/*.parquet` and `/data/in/*.parquet` naming the same files are one job. `absolute=False`
    gives the form jobs planned before local paths were made absolute stored."""
    identity = location_identity(path)
    if absolute and "://" not in identity and not os.path.isabs(identity):
        return os.path.abspath(identity)
    return identity


def compute_fingerprint(
    config: JobConfig,
    sampling_defaults: dict[str, Any],
    schema_version: int | str,
    *,
    absolute_input: bool = True,
    remote_checksums: bool = True,
    span_rule: str = SPAN_RULE,
) -> dict[str, Any]:
    """The fingerprint dict of a resolved job (see the module docstring for what is in it).

    `sampling_defaults` is the fully resolved SamplingParams of the job as a JSON dict, so a
    default that changes between releases also counts as drift. `absolute_input=False` computes
    the fingerprint an older version stored for the same job (input_identity), and
    `remote_checksums=False` the one stored before a model on object storage was identified by
    its weights' listed checksums (model_identity). `span_rule` (score jobs): how long a span may
    be (pipeline/scoring.py); SAMPLED_TOKEN_RULE gives the fingerprint of a score job planned
    before spans could hold max_model_len + 1 tokens, which named no rule (span_rule_of).
    """
    inp = config.input
    parts: dict[str, Any] = {"fingerprint_version": FINGERPRINT_VERSION}
    parts.update(
        model_identity(
            config.model.path,
            config.model.storage_options,
            config.model.verify_weights,
            checksums=remote_checksums,
        )
    )
    device_type, dtype = resolved_numerics(config)
    parts["engine.numerics"] = {
        "dtype": dtype,
        "device_type": device_type,
        "batch_invariant": bool(config.engine.get("batch_invariant", True)),
        **{k: config.engine[k] for k in NUMERICS_ENGINE_KEYS if k in config.engine},
    }
    if config.model.quantization:  # only when set, so jobs without it keep their fingerprint
        parts["engine.numerics"]["quantization"] = config.model.quantization
    parts["sampling.defaults"] = sampling_defaults
    parts["job.seed"] = config.job.seed
    # Without credentials (user-info, a signature): a rotated key is not a job change.
    parts["input.source"] = {"path": input_identity(inp.path, absolute_input), "format": inp.format}
    parts["input.rows"] = {
        "query": inp.query,
        "id_column": inp.id_column,
        "prompt_column": inp.prompt_column,
        "messages_column": inp.messages_column,
        "override_columns": sorted(inp.override_columns),
        "passthrough_columns": list(inp.passthrough_columns),
    }
    if inp.chat_template_kwargs:  # only when set, so jobs without it keep their fingerprint
        parts["input.rows"]["chat_template_kwargs"] = inp.chat_template_kwargs
    if config.job.task == "score":  # absent for generation jobs, whose fingerprints stay as they were
        parts["score"] = {
            "context_column": inp.context_column,
            "continuations_column": inp.continuations_column,
            "document_column": inp.document_column,
            "rolling_window_tokens": config.job.rolling_window_tokens,
        }
        if span_rule != SAMPLED_TOKEN_RULE:
            # The longest window (rolling_window_tokens = 0) and the longest span follow the rule.
            parts["score"]["span_rule"] = span_rule
    parts["output.schema_version"] = schema_version
    if _several_samples_with_prompt_logprobs(config, sampling_defaults):
        # Prompt logprobs are stored on a row's first sample only; outputs written before that copied
        # them into every sample. Only jobs where the two layouts differ carry this component, so the
        # others keep their fingerprint.
        parts["output.prompt_logprobs"] = "first_sample"
    parts["hash"] = _sha256_bytes(_canonical({k: v for k, v in parts.items() if k != "hash"}).encode())
    return parts


def span_rule_of(fingerprint: dict[str, Any], section: str = "score") -> str:
    """The span rule a score job (an eval: section "eval") runs under: the one its fingerprint
    names, or for one planned before fingerprints named it, the rule it was planned with
    (SAMPLED_TOKEN_RULE)."""
    return str((fingerprint.get(section) or {}).get("span_rule", SAMPLED_TOKEN_RULE))


def _several_samples_with_prompt_logprobs(config: JobConfig, sampling: dict[str, Any]) -> bool:
    if sampling.get("prompt_logprobs") is None:
        return False
    return int(sampling.get("n") or 1) > 1 or "n" in config.input.override_columns


def resolved_numerics(config: JobConfig) -> tuple[str, str]:
    """(device type, dtype name) after "auto" is resolved on this machine: what the kernels will use."""
    from shardinfer.engine.config import EngineConfig

    try:
        engine_cfg = EngineConfig(
            model=config.model.path,
            device=config.model.device,
            dtype=config.model.dtype,
            quantization=config.model.quantization or None,
        )
        return engine_cfg.device_type, engine_cfg.dtype_name
    except ValueError as exc:
        raise ConfigError(f"[model] is invalid: {exc}") from None


def diff_fingerprints(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Dotted names of the components that differ (added or removed keys count), sorted; `hash` aside.

    Nested dicts are compared key by key so the message can say `sampling.defaults.temperature`
    rather than just `sampling.defaults`; where one side is a dict and the other is not, the name
    of that level is the difference. Both sides are first put through JSON, as the stored one was,
    so a tuple and the list it was saved as compare equal.
    """
    return [name for name, _, _ in _changes(old, new)]


def diff_fingerprint_parts(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Lines `component.key: old -> new`, one per name `diff_fingerprints` reports."""
    return [f"{name}: {_short(a)} -> {_short(b)}" for name, a, b in _changes(old, new)]


def diff_closest_form(old: dict[str, Any], forms: list[dict[str, Any]]) -> list[str]:
    """diff_fingerprint_parts against the closest of `forms`, one fingerprint in the forms our
    versions stored (today's and the older ones): a job or eval an older version planned is shown
    what the user changed, not also how the fingerprint's form changed since."""
    return min((diff_fingerprint_parts(old, new) for new in forms), key=len)


def _changes(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(dotted name, old value, new value) of each difference; an absent side is None."""
    found = _walk(_as_json(old), _as_json(new), "")
    return [(name, a, b) for name, a, b in found if name != "hash"]


def _as_json(value: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(json.dumps(value, sort_keys=True, default=str)))


_ABSENT = object()


def _walk(old: dict[str, Any], new: dict[str, Any], prefix: str) -> list[tuple[str, Any, Any]]:
    changed: list[tuple[str, Any, Any]] = []
    for key in sorted(set(old) | set(new), key=str):
        a, b = old.get(key, _ABSENT), new.get(key, _ABSENT)
        name = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            changed += _walk(a, b, f"{name}.")
        elif a is _ABSENT or b is _ABSENT or a != b:
            changed.append((name, None if a is _ABSENT else a, None if b is _ABSENT else b))
    return changed


def _short(value: Any, limit: int = 80) -> str:
    text = _canonical(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
