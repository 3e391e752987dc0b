"""shardinfer: offline batch LLM inference shaped as a data-pipeline job."""

from shardinfer.engine.llm import LLM
from shardinfer.engine.outputs import CompletionOutput, RequestOutput
from shardinfer.engine.sampling_params import SamplingParams

__all__ = ["LLM", "CompletionOutput", "RequestOutput", "SamplingParams"]
__version__ = "0.1.0"
