"""Per-layer attention windows read from a config, against transformers' own reading."""

from __future__ import annotations

import pytest
import transformers

from shardinfer.engine.models.config import ModelConfig
from shardinfer.engine.models.dense import layer_windows


def _windows_from_layer_types(cfg: transformers.PretrainedConfig) -> list[int | None]:
    return [cfg.sliding_window if t == "sliding_attention" else None for t in cfg.layer_types]


@pytest.mark.parametrize("use_sliding,max_window_layers", [(True, 4), (True, 0), (True, 6), (False, 4)])
def test_qwen2_config_without_layer_types_matches_transformers(use_sliding: bool, max_window_layers: int) -> None:
    """Qwen2 configs written before `layer_types`: the first max_window_layers layers are full."""
    hf = transformers.Qwen2Config(num_hidden_layers=6, hidden_size=64, num_attention_heads=4, vocab_size=128,
                                  use_sliding_window=use_sliding, sliding_window=64,
                                  max_window_layers=max_window_layers)
    want = _windows_from_layer_types(hf) if use_sliding else [None] * 6
    raw = hf.to_dict()
    raw.pop("layer_types")
    assert layer_windows(ModelConfig.from_dict(raw)) == want
    assert layer_windows(ModelConfig.from_dict(hf.to_dict())) == want


def test_mistral_window_applies_to_every_layer() -> None:
    hf = transformers.MistralConfig(num_hidden_layers=3, hidden_size=64, num_attention_heads=4, vocab_size=128,
                                    sliding_window=32)
    assert layer_windows(ModelConfig.from_dict(hf.to_dict())) == [32, 32, 32]
