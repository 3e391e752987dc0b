"""Per-layer attention windows read from a config, against transformers' own reading."""

from __future__ import annotations

from typing import Any

import pytest
import transformers

from shardinfer.engine.models.config import ModelConfig
from shardinfer.engine.models.dense import layer_windows
from shardinfer.errors import ModelLoadError


def _windows_from_layer_types(cfg: transformers.PretrainedConfig) -> list[int | None]:
    return [cfg.sliding_window if t == "sliding_attention" else None for t in cfg.layer_types]


@pytest.mark.parametrize("use_sliding,max_window_layers", [(True, 4), (True, 0), (True, 6), (False, 4)])
def test_qwen2_config_without_layer_types_matches_transformers(
    use_sliding: bool, max_window_layers: int
) -> None:
    """Qwen2 configs written before `layer_types`: the first max_window_layers layers are full."""
    hf = transformers.Qwen2Config(
        num_hidden_layers=6,
        hidden_size=64,
        num_attention_heads=4,
        vocab_size=128,
        use_sliding_window=use_sliding,
        sliding_window=64,
        max_window_layers=max_window_layers,
    )
    want = _windows_from_layer_types(hf) if use_sliding else [None] * 6
    raw = hf.to_dict()
    raw.pop("layer_types")
    assert layer_windows(ModelConfig.from_dict(raw)) == want
    assert layer_windows(ModelConfig.from_dict(hf.to_dict())) == want


def test_mistral_window_applies_to_every_layer() -> None:
    hf = transformers.MistralConfig(
        num_hidden_layers=3, hidden_size=64, num_attention_heads=4, vocab_size=128, sliding_window=32
    )
    assert layer_windows(ModelConfig.from_dict(hf.to_dict())) == [32, 32, 32]


def _transformers_windows(raw: dict[str, Any]) -> list[int | None]:
    """What transformers' attention layers use for this config.json: Qwen2/Qwen3 per `layer_types`
    (which their configs derive when absent), Mistral one window everywhere, Llama none at all."""
    model_type = raw["model_type"]
    cfg = transformers.AutoConfig.for_model(**raw)
    if model_type in ("qwen2", "qwen3"):
        return _windows_from_layer_types(cfg)
    if model_type == "mistral":
        return [cfg.sliding_window] * cfg.num_hidden_layers
    return [None] * cfg.num_hidden_layers  # LlamaAttention has no window


_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
_BASE = dict(num_hidden_layers=4, hidden_size=64, num_attention_heads=4, vocab_size=128)
# config.json files as checkpoints ship them: keys left out fall back to transformers' defaults.
WINDOW_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen2-window-without-use-flag": dict(model_type="qwen2", sliding_window=16, max_window_layers=1),
    "qwen2-use-flag-without-max-window-layers": dict(
        model_type="qwen2", use_sliding_window=True, sliding_window=16
    ),
    "qwen2-use-flag-default-window": dict(model_type="qwen2", use_sliding_window=True, max_window_layers=2),
    "qwen3-max-window-layers": dict(
        model_type="qwen3", use_sliding_window=True, sliding_window=16, max_window_layers=1
    ),
    "qwen3-window-without-use-flag": dict(model_type="qwen3", sliding_window=16, max_window_layers=0),
    "llama-stray-window": dict(model_type="llama", sliding_window=16),
    "mistral-without-window-key": dict(model_type="mistral"),
    "mistral-null-window": dict(model_type="mistral", sliding_window=None),
}


@pytest.mark.parametrize("case", sorted(WINDOW_CONFIGS))
def test_windows_of_configs_with_keys_left_out_match_transformers(case: str) -> None:
    raw = {**_BASE, **WINDOW_CONFIGS[case]}
    raw["architectures"] = [_ARCHITECTURES[raw["model_type"]]]
    assert layer_windows(ModelConfig.from_dict(dict(raw))) == _transformers_windows(dict(raw))


def test_layer_types_of_the_wrong_length_are_refused() -> None:
    raw = {
        **_BASE,
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "use_sliding_window": True,
        "sliding_window": 16,
        "layer_types": ["sliding_attention"] * 3,
    }
    with pytest.raises(ModelLoadError, match=r"layer_types has 3 entries but num_hidden_layers=4"):
        layer_windows(ModelConfig.from_dict(raw))
