"""ModelConfig: the fields the engine needs, read once from a model directory's config.json.

Accepts both spellings of RoPE settings: transformers < 5 (`rope_theta` + `rope_scaling`) and
transformers >= 5 (`rope_parameters` with `rope_theta` and `rope_type` inside).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardinfer.engine.models.architectures import supported_architectures
from shardinfer.errors import ModelLoadError


def model_directory(model: str | Path) -> Path:
    """The model directory a caller named, or an error saying what the path is instead."""
    path = Path(model)
    if path.is_file():
        raise ModelLoadError(
            f"model path {str(model)!r} is a file, not a model directory: pass the directory holding "
            f"it ({str(path.parent)!r}), with its config.json, *.safetensors and tokenizer.json"
        )
    if not path.is_dir():
        raise FileNotFoundError(
            f"model directory {str(model)!r} does not exist: pass a local Hugging Face model "
            "directory (config.json, *.safetensors, tokenizer.json)"
        )
    return path


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    torch_dtype: str | None
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    hf: dict[str, Any] = field(repr=False, compare=False, hash=False, default_factory=dict)

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ModelLoadError(
                f"no config.json in model directory {str(model_dir)!r}: "
                "pass a local Hugging Face model directory (config.json, *.safetensors, tokenizer.json)"
            )
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ModelLoadError(f"{path} is not valid JSON: {exc}") from exc
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        archs = raw.get("architectures") or []
        model_type = raw.get("model_type", "")
        arch = archs[0] if archs else _ARCH_BY_MODEL_TYPE.get(model_type, "")
        if not arch:
            raise ModelLoadError(
                f"config.json names no architecture (architectures={archs!r}, model_type={model_type!r})"
            )
        if arch not in supported_architectures():
            raise ModelLoadError(
                f"architecture {arch!r} is not supported; supported: {', '.join(supported_architectures())}"
            )

        def need(key: str) -> Any:
            if key not in raw or raw[key] is None:
                raise ModelLoadError(f"config.json of {arch} lacks required key {key!r}")
            return raw[key]

        heads = int(need("num_attention_heads"))
        hidden = int(need("hidden_size"))
        rope_params = dict(raw.get("rope_parameters") or {})
        rope_scaling = raw.get("rope_scaling")
        if rope_scaling is None and rope_params.get("rope_type", "default") not in ("default", None):
            rope_scaling = {k: v for k, v in rope_params.items() if k != "rope_theta"}
        if rope_scaling is not None:
            rope_scaling = dict(rope_scaling)
            if "type" in rope_scaling and "rope_type" not in rope_scaling:
                rope_scaling["rope_type"] = rope_scaling.pop("type")
            if rope_scaling.get("rope_type") in ("default", None):
                rope_scaling = None
        max_positions = int(raw.get("max_position_embeddings", 2048))
        if rope_scaling is not None and rope_scaling.get("rope_type") in ("llama3", "yarn", "longrope"):
            # As transformers reads it: a top-level original_max_position_embeddings wins over the
            # scaling's own, and with neither the scaling starts from max_position_embeddings.
            top_level = raw.get("original_max_position_embeddings")
            if top_level is not None:
                rope_scaling["original_max_position_embeddings"] = top_level
            elif rope_scaling.get("original_max_position_embeddings") is None:
                rope_scaling["original_max_position_embeddings"] = max_positions
        theta = raw.get("rope_theta") or rope_params.get("rope_theta") or 10000.0
        eos = raw.get("eos_token_id")
        eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos] if eos is not None else []))
        head_dim = raw.get("head_dim") or hidden // heads
        return cls(
            architecture=arch,
            # The family flags (biases, q/k norms, windows) key on model_type; a config without one
            # still names its family through the architecture.
            model_type=model_type or {a: t for t, a in _ARCH_BY_MODEL_TYPE.items()}.get(arch, ""),
            vocab_size=int(need("vocab_size")),
            hidden_size=hidden,
            num_hidden_layers=int(need("num_hidden_layers")),
            num_attention_heads=heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(head_dim),
            intermediate_size=int(raw.get("intermediate_size") or 0),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            rope_scaling=rope_scaling,
            max_position_embeddings=max_positions,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            torch_dtype=raw.get("torch_dtype") or raw.get("dtype"),
            eos_token_ids=eos_ids,
            bos_token_id=raw.get("bos_token_id"),
            hf=raw,
        )


_ARCH_BY_MODEL_TYPE = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "MistralForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
}
