"""The engine for a set of engine arguments: one process (LLMEngine), or expert-parallel ranks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardinfer.engine.config import EngineConfig


def make_engine(model: str | Path, **kwargs: Any) -> Any:
    """LLMEngine, or with expert_parallel_size / data_parallel_size > 1 an ExpertParallelEngine
    (engine/parallel/ranks.py), which offers the same step interface over its rank processes."""
    if EngineConfig.from_kwargs(str(model), **kwargs).parallel_size > 1:
        from shardinfer.engine.parallel.ranks import ExpertParallelEngine

        return ExpertParallelEngine(model, **kwargs)
    from shardinfer.engine.llm_engine import LLMEngine

    return LLMEngine(model, **kwargs)
