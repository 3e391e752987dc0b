"""shardinfer: offline batch LLM inference shaped as a data-pipeline job.

`LLM`, `SamplingParams` and the output classes load lazily, so tools that only read or write
job outputs (`shardinfer status`, storage workers) start without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from shardinfer.engine.release import VERSION  # a constant's module: importing it loads no torch

if TYPE_CHECKING:
    from shardinfer.engine.llm import LLM
    from shardinfer.engine.outputs import CompletionOutput, RequestOutput
    from shardinfer.engine.sampling_params import SamplingParams

__all__ = ["LLM", "CompletionOutput", "RequestOutput", "SamplingParams"]
__version__ = VERSION

_LAZY = {
    "LLM": "shardinfer.engine.llm",
    "CompletionOutput": "shardinfer.engine.outputs",
    "RequestOutput": "shardinfer.engine.outputs",
    "SamplingParams": "shardinfer.engine.sampling_params",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'shardinfer' has no attribute {name!r}")
