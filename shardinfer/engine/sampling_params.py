"""Per-request sampling settings, validated once at construction.

Every bad value raises ValueError naming the field, the value and the accepted kind or range, so a
job can turn it into an error record for that row and go on. Each field's kind (integer, number,
flag) is its annotation, checked by field_types.py before any range. The params are frozen: a field
assigned afterwards would skip these checks, so a change goes through `replace()`, which validates.

`structured_output` constrains the output (docs/structured-outputs.md); `so_args` is its older
name, still accepted as a keyword and readable as an attribute.

`max_tokens=0` (with `prompt_logprobs`) is a prompt-only request: the engine scores every prompt
token, the last one included, feeds all but that last one and samples nothing (docs/engine.md).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardinfer.engine.field_types import check_field_types, shown

MAX_TOP_LOGPROBS = 20
# A temperature below this samples greedily, as in vLLM. The sampler divides float32 logits by the
# temperature: by a float32 subnormal one (or 0 after rounding) the quotients overflow to +-inf and
# the choice among equal infinities ignores the logits; far before that, sampling is argmax anyway.
GREEDY_BELOW = 1e-5
SO_SCHEMA_TYPES = ("json", "regex", "ebnf", "lark", "choice")
TOP_K_OFF = -1  # also accepted: 0, vLLM's and generation_config.json's "off"
MAX_TOP_K = 2**31 - 1  # the sampler keeps top_k in 32-bit integers
# Samples per request, for the API and a job's rows alike. LLM.generate queues the n samples at
# once, each its own request with its own seed and KV blocks: without a bound n=10**9 hangs deriving
# seeds before any work is done. Far above best-of-n use; more samples are more calls.
MAX_N = 1024


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = TOP_K_OFF
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    n: int = 1
    seed: int | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    structured_output: dict[str, Any] | None = None
    # The older name of structured_output: a keyword alias, mirrored after construction. Not part
    # of equality, repr or to_json_dict, so either spelling makes the same params.
    so_args: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    def __new__(cls, *args: Any, **kwargs: Any) -> SamplingParams:
        # Python's own message for an unknown keyword names it but not the field meant; transformers'
        # and OpenAI's names for the same settings are the usual slips.
        unknown = [name for name in kwargs if name not in cls.field_names()]
        if unknown:
            raise TypeError(_unknown_field_message(unknown[0], cls.field_names()))
        return super().__new__(cls)

    def __post_init__(self) -> None:
        def set_(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)  # frozen: only construction sets fields

        if self.so_args is not None:
            if self.structured_output is not None and self.structured_output != self.so_args:
                raise ValueError(
                    "SamplingParams got both structured_output and so_args (its older name) with "
                    "different values: pass structured_output only"
                )
            set_("structured_output", self.so_args)
        set_("so_args", self.structured_output)
        if isinstance(self.stop, str):
            set_("stop", [self.stop])
        for name in ("stop", "stop_token_ids"):
            if getattr(self, name) is None:
                set_(name, [])
        check_field_types(self, "SamplingParams.")
        if self.top_k == 0:
            set_("top_k", TOP_K_OFF)
        self._validate()

    def _validate(self) -> None:
        def bad(name: str, value: Any, why: str) -> ValueError:
            return ValueError(f"SamplingParams.{name}={shown(value)} is invalid: {why}")

        if not (self.temperature >= 0.0):
            raise bad(
                "temperature", self.temperature, f"must be >= 0 (0, or below {GREEDY_BELOW}, means greedy)"
            )
        if not (0.0 < self.top_p <= 1.0):
            raise bad("top_p", self.top_p, "must be in (0, 1]")
        if self.top_k < -1:
            raise bad("top_k", self.top_k, "must be -1 or 0 (off) or >= 1")
        if self.top_k > MAX_TOP_K:
            raise ValueError(
                f"SamplingParams.top_k={self.top_k} is above {MAX_TOP_K}, the largest the sampler holds; "
                "use -1 to switch top-k off"
            )
        if not (0.0 <= self.min_p <= 1.0):
            raise bad("min_p", self.min_p, "must be in [0, 1]")
        if not (self.repetition_penalty > 0.0):
            raise bad("repetition_penalty", self.repetition_penalty, "must be > 0 (1 means off)")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not (-2.0 <= value <= 2.0):
                raise bad(name, value, "must be in [-2, 2]")
        if self.max_tokens is not None and self.max_tokens < 0:
            raise bad(
                "max_tokens",
                self.max_tokens,
                "must be >= 1, None (up to max_model_len), or 0 with "
                "prompt_logprobs (score the prompt, generate nothing)",
            )
        if self.max_tokens == 0 and self.prompt_logprobs is None:
            raise ValueError(
                "SamplingParams.max_tokens=0 without prompt_logprobs asks for nothing: max_tokens=0 only scores "
                "the prompt; set prompt_logprobs (0 or more top alternatives) to score it, or max_tokens >= 1 "
                "to generate"
            )
        if self.min_tokens < 0:
            raise bad("min_tokens", self.min_tokens, "must be >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise bad("min_tokens", self.min_tokens, f"must be <= max_tokens={self.max_tokens}")
        if self.n < 1:
            raise bad("n", self.n, "must be >= 1")
        if self.n > MAX_N:
            raise ValueError(
                f"SamplingParams.n={self.n} is above the limit of {MAX_N} samples per request: each sample "
                "is its own request, all queued at once; ask for more samples in several calls"
            )
        if self.seed is not None and not (0 <= self.seed < 2**63):
            raise bad("seed", self.seed, "must be in [0, 2**63)")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not (0 <= value <= MAX_TOP_LOGPROBS):
                raise bad(name, value, f"must be None or in [0, {MAX_TOP_LOGPROBS}]")
        if any(s == "" for s in self.stop):
            raise bad("stop", self.stop, "must be a list of non-empty strings")
        so = self.structured_output
        if so is not None:
            if not isinstance(so, dict) or "schema_type" not in so:
                raise bad(
                    "structured_output",
                    so,
                    'expected {"schema_type": "json"|"regex"|"ebnf"|"lark", "schema": ...} or '
                    '{"schema_type": "choice", "choices": [...]}',
                )
            if so["schema_type"] not in SO_SCHEMA_TYPES:
                raise bad("structured_output", so, f"schema_type must be one of {SO_SCHEMA_TYPES}")

    # The params are frozen, so what the engine derives from them on every step is computed once
    # (a decode step reads it for each of its rows: engine/sampler.py).
    @functools.cached_property
    def greedy(self) -> bool:
        """Whether tokens are the argmax of the (penalised, masked) logits: temperature 0, or one
        below GREEDY_BELOW."""
        return self.temperature < GREEDY_BELOW

    @functools.cached_property
    def has_penalties(self) -> bool:
        """Whether any repetition / presence / frequency penalty is on."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def replace(self, **changes: Any) -> SamplingParams:
        if "so_args" in changes:
            changes["structured_output"] = changes.pop("so_args")
        # The alias is rebuilt from structured_output, so a changed value is not contradicted by the old one.
        return dataclasses.replace(self, so_args=None, **changes)

    def to_json_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (used in fingerprints and manifests); the alias so_args is left out."""
        data = dataclasses.asdict(self)
        del data["so_args"]
        return json.loads(json.dumps(data, sort_keys=True, default=str))

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]


# Other libraries' names for SamplingParams fields (transformers' generate, OpenAI's API).
_FIELD_ALIASES = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "num_return_sequences": "n",
    "stop_sequences": "stop",
    "stop_strings": "stop",
    "top_logprobs": "logprobs",
    "response_format": "structured_output",
    "guided_decoding": "structured_output",
    "eos_token_id": "stop_token_ids",
}


def _unknown_field_message(name: str, fields: list[str]) -> str:
    """What to write instead of an unknown SamplingParams keyword."""
    if name == "do_sample":
        return (
            "SamplingParams has no field 'do_sample': use temperature=0.0 for greedy decoding "
            "(do_sample=False), or a temperature > 0 to sample"
        )
    meant = _FIELD_ALIASES.get(name) or next(
        iter(difflib.get_close_matches(name, fields, n=1, cutoff=0.6)), None
    )
    hint = f": did you mean {meant!r}?" if meant else f"; its fields are {', '.join(fields)}"
    return f"SamplingParams has no field {name!r}{hint}"


# generation_config.json keys that are sampling defaults, and the SamplingParams field each sets.
_GENERATION_CONFIG_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


def checkpoint_sampling_defaults(model_dir: str | Path) -> dict[str, Any]:
    """The sampling defaults a checkpoint's generation_config.json sets, as SamplingParams fields.

    `do_sample: false` means greedy (temperature 0); `top_k: 0` means off, as in vLLM and
    transformers. Nothing else of the file is a sampling default (its eos ids are the
    tokenizer's, checkpoint_eos_token_ids).
    A missing file or directory gives {}: the SamplingParams field defaults then apply.
    """
    raw = _generation_config(model_dir)
    out = {name: raw[key] for key, name in _GENERATION_CONFIG_KEYS.items() if raw.get(key) is not None}
    if raw.get("do_sample") is False:
        out["temperature"] = 0.0
    return out


def _generation_config(model_dir: str | Path) -> dict[str, Any]:
    """generation_config.json as a dict ({} when absent); a file that is not a JSON object is a
    ValueError naming it."""
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{str(path)!r} is not valid JSON ({exc}): fix or remove it") from None
    if not isinstance(raw, dict):
        raise ValueError(
            f"{str(path)!r} holds {type(raw).__name__}, expected a JSON object: fix or remove it"
        )
    return raw


def checkpoint_eos_token_ids(model_dir: str | Path) -> tuple[int, ...]:
    """The end-of-sequence ids a checkpoint's generation_config.json names (() when none).

    Instruct checkpoints often list more ids there than config.json does (Qwen2.5's
    <|endoftext|> beside <|im_end|>, Llama 3's <|eot_id|>), and transformers' generate() and vLLM
    stop at each of them, so the engine must too.
    """
    eos = _generation_config(model_dir).get("eos_token_id")
    ids = eos if isinstance(eos, list) else [] if eos is None else [eos]
    for value in ids:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            path = str(Path(model_dir) / "generation_config.json")
            raise ValueError(
                f"{path!r}: eos_token_id holds {value!r}, expected a token id (an integer >= 0) or "
                "a list of them: fix or remove it"
            )
    return tuple(ids)


def default_sampling_params(model_dir: str | Path, **overrides: Any) -> SamplingParams:
    """The one place sampling defaults are resolved, for the Python API and for jobs alike:
    `overrides` (a job's [sampling], a caller's values), over the checkpoint's
    generation_config.json, over SamplingParams' own field defaults."""
    defaults = checkpoint_sampling_defaults(model_dir)
    try:
        return SamplingParams(**{**defaults, **overrides})
    except ValueError as exc:
        from_checkpoint = sorted(set(defaults) - set(overrides))
        if from_checkpoint:
            raise ValueError(
                f"{exc} (defaults {from_checkpoint} come from the checkpoint's generation_config.json; "
                "set them explicitly to override)"
            ) from None
        raise
