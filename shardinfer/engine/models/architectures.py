"""The supported architectures (config.json's `architectures[0]`) and where each one's model class
lives. A table with no imports of its own: config.py checks names against it without importing the
model families, and registry.py imports a family only when a model of it is loaded."""

from __future__ import annotations

MODEL_CLASSES: dict[str, tuple[str, str]] = {  # architecture -> (module, class name)
    "LlamaForCausalLM": ("shardinfer.engine.models.dense", "DenseForCausalLM"),
    "Qwen2ForCausalLM": ("shardinfer.engine.models.dense", "DenseForCausalLM"),
    "Qwen3ForCausalLM": ("shardinfer.engine.models.dense", "DenseForCausalLM"),
    "MistralForCausalLM": ("shardinfer.engine.models.dense", "DenseForCausalLM"),
    "DeepseekV3ForCausalLM": ("shardinfer.engine.models.deepseek_v3", "DeepseekV3ForCausalLM"),
    "DeepseekV2ForCausalLM": ("shardinfer.engine.models.deepseek_v3", "DeepseekV2ForCausalLM"),
}


def supported_architectures() -> list[str]:
    return sorted(MODEL_CLASSES)
