"""Engine arguments (the `LLM(...)` keywords and the job spec's `engine.*` keys), validated once.

torch is imported only where a device or dtype object is asked for: a job validates its spec's
`engine.*` keys against these fields long before it builds the engine, and should not pay for
torch's import there. A torch.device or torch.dtype given as `device` / `dtype` is stored as its
name ("cuda:0", "float16"), the one form every reader of the config sees.

Each field's kind (integer, number, flag, string) is its annotation, checked by field_types.py
before any range check; a value of another kind is a ValueError that starts `name=value:`, as every
message here does, so a job names its spec key.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shardinfer.engine.field_types import check_field_types

if TYPE_CHECKING:
    import torch

# dtype name -> the torch dtype's attribute name
DTYPES = {
    "float32": "float32",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "fp32": "float32",
    "fp16": "float16",
    "bf16": "bfloat16",
    "half": "float16",
    "float": "float32",
}

INDEPENDENT_MATCHERS_MIN_CPUS = 4
KV_CACHE_DTYPES = ("auto", "fp8")
SPECULATIVE_MODES = ("off", "ngram", "mtp")
SPECULATIVE_BUDGETS = ("confidence", "fixed")
MAX_SPECULATIVE_DEPTH = 8
DEFAULT_NGRAM_DEPTH = 3
# (max_num_seqs, max_num_batched_tokens) when unset, by device type; on a GPU max_num_seqs is a
# ceiling (default_num_seqs). On a GPU the larger batch and step budget ran the standard workloads
# faster (docs/performance.md, "The step's token budget and a larger batch", "Decode graphs up to
# 1024 rows"); their activations are measured before the KV cache is sized (engine/step_peak.py).
# On the CPU a step is bound by its FLOPs, and the host's memory is shared.
DEVICE_STEP_DEFAULTS = {"cuda": (1024, 16384), "cpu": (256, 8192)}
# An unset max_num_seqs on a GPU is the ceiling above only where the KV cache holds this many tokens
# (or max_model_len, where shorter: no sequence grows past it) for each of that many sequences;
# else SMALL_CACHE_NUM_SEQS. A batch whose contexts outgrow the
# cache is preempted and recomputed, which cost more than the larger batch gained (docs/performance.md,
# "Decode graphs up to 1024 rows": dense-8b's job on an H100).
KV_TOKENS_PER_SEQ = 2048
SMALL_CACHE_NUM_SEQS = 512


def default_num_seqs(device_type: str, kv_cache_tokens: int, max_model_len: int) -> int:
    """max_num_seqs where unset, on a device of this type whose KV cache holds kv_cache_tokens,
    for sequences of at most max_model_len tokens."""
    seqs = DEVICE_STEP_DEFAULTS[device_type][0]
    if device_type == "cuda" and kv_cache_tokens < seqs * min(KV_TOKENS_PER_SEQ, max_model_len):
        return min(seqs, SMALL_CACHE_NUM_SEQS)
    return seqs


def usable_cpus() -> int:
    """CPUs this process may run on: the affinity mask where the OS has one (a container or
    taskset may allow fewer than os.cpu_count()), else os.cpu_count()."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@dataclass
class EngineConfig:
    model: str
    device: str = "auto"  # "auto" = cuda when available, else cpu
    dtype: str = "auto"  # "auto" = bfloat16 on cuda, float32 on cpu
    batch_invariant: bool = True
    enable_prefix_caching: bool = True
    # Weights: None follows the checkpoint (FP8 checkpoints stay FP8), "fp8" quantises a float
    # checkpoint at load, "none" dequantises FP8 ones (engine/models/fp8.py).
    quantization: str | None = None
    kv_cache_dtype: str = "auto"  # "auto": the model's dtype; "fp8": e4m3 with scales (engine/kv_cache.py)
    # Unset: the device's default (DEVICE_STEP_DEFAULTS; read them as num_seqs / token_budget).
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    block_size: int = 16
    kv_cache_memory_bytes: int | None = None
    num_kv_blocks: int | None = None
    gpu_memory_utilization: float = 0.85
    admission_batch: int | None = (
        None  # free slots needed to admit while decoding (None: max_num_seqs/8 on cuda)
    )
    enforce_eager: bool = False  # True: no CUDA graphs for decode steps
    async_scheduling: bool | None = None  # overlap host work with the device (None: on for cuda)
    # Speculative decoding (docs/engine.md): "ngram" (prompt lookup), "mtp" (the checkpoint's MTP
    # layer) or "off"; speculative_depth draft tokens per step (0: the drafter's default). The
    # output is token-identical either way, so none of these keys is part of a job's fingerprint.
    speculative: str = "off"
    speculative_depth: int = 0
    # "confidence": each step drafts 0 .. speculative_depth tokens, the depth with the most
    # expected tokens per second (draft_budget.py); "fixed": always speculative_depth.
    speculative_budget: str = "confidence"
    speculative_ngram_tokens: int = 0  # shorthand for speculative="ngram", speculative_depth=N
    speculative_mtp: bool = False  # shorthand for speculative="mtp"
    seed: int = 0  # seed for requests that give none (0 = draw one at random per request)
    # Grammar matchers built per sample instead of copied from the compiled grammar (None: when
    # the process may use >= 4 CPUs; see independent_matchers below and docs/structured-outputs.md).
    structured_independent_matchers: bool | None = None
    # Ranks of one engine (engine/parallel/): each rank its own requests and KV cache (data-parallel
    # attention) and a share of the routed experts (expert parallelism). The two sizes are one
    # layout, as in DeepSeek's serving: give either, or both equal. 1: one process, all experts.
    expert_parallel_size: int = 1
    data_parallel_size: int = 1
    # Redundant expert replicas over the ranks (placed by measured load at a rebalance, placement.py).
    expert_redundancy: int = 0
    # Every N engine steps, place the experts again from the load measured so far (ranks.py,
    # rebalance); 0: only when asked. The placement changes no output bit, only the ranks' balance.
    expert_rebalance_steps: int = 0

    def __post_init__(self) -> None:
        torch = sys.modules.get("torch")  # a torch object can only come from a process that imported torch
        if torch is not None and isinstance(self.device, torch.device):
            self.device = str(self.device)  # "cpu", "cuda", "cuda:1"
        if torch is not None and isinstance(self.dtype, torch.dtype):
            self.dtype = str(self.dtype).removeprefix(
                "torch."
            )  # "float16"; an unsupported one is refused below
        check_field_types(self)
        if self.device not in ("auto", "cpu", "cuda") and not re.fullmatch(r"cuda:\d+", self.device):
            raise ValueError(f"device={self.device!r}: use 'cpu', 'cuda', 'cuda:N' or 'auto'")
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r} is not supported; use one of {sorted(DTYPES)} or 'auto'")
        if self.quantization not in (None, "fp8", "none"):
            raise ValueError(
                f"quantization={self.quantization!r} is not supported; use 'fp8' (block-scaled FP8 "
                "weights), 'none' (dequantise FP8 checkpoints) or leave it unset (follow the checkpoint)"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"kv_cache_dtype={self.kv_cache_dtype!r} is not supported; use one of {list(KV_CACHE_DTYPES)}"
            )
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size={self.block_size}: must be a power of two")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len={self.max_model_len}: must be >= 2")
        if self.speculative not in SPECULATIVE_MODES:
            raise ValueError(
                f"speculative={self.speculative!r}: use one of {', '.join(map(repr, SPECULATIVE_MODES))}"
            )
        if self.speculative_budget not in SPECULATIVE_BUDGETS:
            raise ValueError(
                f"speculative_budget={self.speculative_budget!r}: use one of "
                f"{', '.join(map(repr, SPECULATIVE_BUDGETS))}"
            )
        if self.speculative_ngram_tokens < 0:
            raise ValueError(
                f"speculative_ngram_tokens={self.speculative_ngram_tokens}: must be >= 0 (0 = off)"
            )
        if not 0 <= self.speculative_depth <= MAX_SPECULATIVE_DEPTH:
            raise ValueError(
                f"speculative_depth={self.speculative_depth}: must be in [0, {MAX_SPECULATIVE_DEPTH}] "
                "(0 = the drafter's default)"
            )
        chosen = {
            m
            for m, on in (
                ("ngram", self.speculative_ngram_tokens),
                ("mtp", self.speculative_mtp),
                (self.speculative, self.speculative != "off"),
            )
            if on
        }
        if len(chosen) > 1:
            raise ValueError(
                f"choose one drafter, got {sorted(chosen)}: set speculative to 'ngram' or 'mtp' only"
            )
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks={self.num_kv_blocks}: must be >= 1")
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(
                    f"{name}={getattr(self, name)}: must be >= 1, or unset for the device's default"
                )
        if self.admission_batch is not None and self.admission_batch < 1:
            raise ValueError(
                f"admission_batch={self.admission_batch}: must be >= 1, or unset for the default"
            )
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization={self.gpu_memory_utilization}: must be in (0, 1], the share "
                "of the device's memory the engine may fill"
            )
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes < 1:
            raise ValueError(
                f"kv_cache_memory_bytes={self.kv_cache_memory_bytes}: must be >= 1, or unset to size "
                "the cache from gpu_memory_utilization"
            )
        for name in ("expert_parallel_size", "data_parallel_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be an integer >= 1 (1: one process)")
        if (
            min(self.expert_parallel_size, self.data_parallel_size) > 1
            and self.expert_parallel_size != self.data_parallel_size
        ):
            raise ValueError(
                f"expert_parallel_size={self.expert_parallel_size} and data_parallel_size="
                f"{self.data_parallel_size}: each rank runs attention for its own requests and holds a "
                "share of the experts, so the two are one size; give one of them, or both equal"
            )
        if self.expert_rebalance_steps < 0:
            raise ValueError(
                f"expert_rebalance_steps={self.expert_rebalance_steps}: must be >= 0 (0: never "
                "rebalance on its own)"
            )
        if self.expert_redundancy < 0:
            raise ValueError(
                f"expert_redundancy={self.expert_redundancy}: must be >= 0 (extra expert replicas)"
            )
        if self.parallel_size > 1:
            # Speculation composes with the ranks: a step is still one main forward on every rank,
            # and MTP layers keep their experts whole on each rank, so drafts need no exchange.
            if self.device not in ("auto", "cpu"):
                raise ValueError(
                    f"device={self.device!r} with expert_parallel_size={self.parallel_size}: "
                    "expert-parallel ranks run on the CPU (gloo) in this version; use device='cpu', "
                    "or expert_parallel_size=1 and local[N] for one engine per GPU"
                )
        elif self.expert_redundancy:
            raise ValueError(
                f"expert_redundancy={self.expert_redundancy} needs expert_parallel_size > 1: replicas "
                "spread hot experts over ranks"
            )
        elif self.expert_rebalance_steps:
            raise ValueError(
                f"expert_rebalance_steps={self.expert_rebalance_steps} needs expert_parallel_size > 1: "
                "a rebalance moves experts between ranks"
            )

    @property
    def num_seqs(self) -> int:
        """max_num_seqs, or where unset the device's ceiling (DEVICE_STEP_DEFAULTS): what a step may
        hold at most. Where unset, the engine runs default_num_seqs of its KV cache
        (ModelRunner.num_seqs)."""
        if self.max_num_seqs is not None:
            return self.max_num_seqs
        return DEVICE_STEP_DEFAULTS[self.torch_device.type][0]

    @property
    def token_budget(self) -> int:
        """max_num_batched_tokens, or where unset the default of the device the engine runs on."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return DEVICE_STEP_DEFAULTS[self.torch_device.type][1]

    @property
    def parallel_size(self) -> int:
        """Ranks of the engine: expert_parallel_size or data_parallel_size, whichever is given."""
        return max(self.expert_parallel_size, self.data_parallel_size)

    @property
    def speculative_mode(self) -> str:
        """The drafter in use ("ngram", "mtp" or "off"), shorthands resolved."""
        if self.speculative_ngram_tokens:
            return "ngram"
        if self.speculative_mtp:
            return "mtp"
        return self.speculative

    @property
    def draft_depth(self) -> int:
        """Draft tokens per request and step (the MTP layer drafts one unless a depth is set)."""
        if self.speculative_ngram_tokens:
            return self.speculative_ngram_tokens
        if self.speculative_depth:
            return self.speculative_depth
        return {"ngram": DEFAULT_NGRAM_DEPTH, "mtp": 1}.get(self.speculative_mode, 0)

    @property
    def independent_matchers(self) -> bool:
        """Whether grammar matchers are built per sample (structured_independent_matchers resolved).

        Independent matchers share no lexer cache, so llguidance fills their masks in parallel, but
        each recomputes what copies share. Measured per decode step in the engine, independent
        matchers filled the masks fastest on a many-core GPU host and copies of one template on 2
        cores; hence independent from INDEPENDENT_MATCHERS_MIN_CPUS CPUs (the measurements:
        docs/structured-outputs.md).
        """
        if self.structured_independent_matchers is not None:
            return self.structured_independent_matchers
        return usable_cpus() >= INDEPENDENT_MATCHERS_MIN_CPUS

    @property
    def device_type(self) -> str:
        """ "cpu" or "cuda", "auto" resolved on this machine; torch is imported only to ask it about CUDA."""
        if self.device == "cpu":
            return "cpu"
        return self.torch_device.type

    @property
    def dtype_name(self) -> str:
        """The name of `torch_dtype` (e.g. "bfloat16"), without importing torch on a CPU engine."""
        if self.dtype == "auto":
            return "bfloat16" if self.device_type == "cuda" else "float32"
        return DTYPES[self.dtype]

    @property
    def torch_device(self) -> torch.device:
        import torch

        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if str(self.device).startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device={self.device!r} but no CUDA device is available: use device='cpu'")
        return torch.device(self.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        dtype: torch.dtype = getattr(torch, self.dtype_name)
        return dtype

    @classmethod
    def from_kwargs(cls, model: str, **kwargs: Any) -> EngineConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            import difflib

            hints = [
                f"{u!r} (did you mean {difflib.get_close_matches(u, names, 1)[0]!r}?)"
                if difflib.get_close_matches(u, names, 1)
                else repr(u)
                for u in unknown
            ]
            raise ValueError(
                f"unknown engine argument(s) {', '.join(hints)}; valid: {sorted(names - {'model'})}"
            )
        return cls(model=model, **kwargs)
