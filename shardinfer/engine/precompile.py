"""Compile the kernels of an engine's start-up and first steps ahead, in parallel.

On a GPU whose Triton cache is cold, an engine's start-up is mostly compiling: the matmul
warm-up, the eager pass before each CUDA graph is captured, the first long prefill step and the
sampler each compile their kernel variants one at a time, as each is first launched. Here the
same passes run first inside `kernels.compile_ahead.compile_instead_of_launch`, which launches
nothing and compiles every variant the passes reach on a thread per CPU (up to 16); capture and
the first steps then find them in memory, and the matmul warm-up, which only compiles, is not run
again. The passes: the matmul warm-up, each decode graph's forward, prefill steps of a full and a
one-short token budget with short and long prompts, and the sampler's choice over two rows. A
variant they do not reach (a prefill shape of a later step) compiles at its first launch, as
before.

What runs inside is safe to run without its kernels: the passes take their control decisions
from shapes and host-side metadata, and their torch operations never index with a kernel's
output. The prefill passes would write nothing to the KV cache (every slot is SKIP_SLOT) and read
block 0 only; no kernel runs anyway.

SHARDINFER_PRECOMPILE=0 turns it off (every kernel then compiles at its first launch).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from shardinfer.engine.forward_context import SKIP_SLOT
from shardinfer.errors import ConfigError
from shardinfer.kernels import compile_ahead, ops
from shardinfer.kernels.top_logprob import TopLogprob

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from shardinfer.engine.model_runner import HostBatch, ModelRunner

# The prompt lengths of the prefill passes: one KV chunk of attention or less (kernels/split_kv.py
# merges nothing then), and more than one, as a step's longer prompts read.
PREFILL_SEQUENCE_TOKENS = (512, 2048)


_ON, _OFF = ("1", "true", "on", "yes"), ("0", "false", "off", "no")


def precompile_enabled() -> bool:
    """Whether engines compile ahead: SHARDINFER_PRECOMPILE unset or 1 (also true, on, yes), or 0
    (also false, off, no: every kernel compiles at its first launch, one at a time). Anything else
    is refused, naming the value (exit 78)."""
    value = os.environ.get("SHARDINFER_PRECOMPILE", "1")
    if value.strip().lower() in _ON:
        return True
    if value.strip().lower() in _OFF:
        return False
    raise ConfigError(
        f"SHARDINFER_PRECOMPILE={value!r}: set it to 1 to compile the engine's kernels ahead "
        "in parallel (the default, as when unset) or to 0 to compile each at its first launch"
    )


def prefill_batch(n_tokens: int, sequence_tokens: int, block_size: int) -> HostBatch:
    """n_tokens of prompt prefill from position 0, in sequences of `sequence_tokens` (the last
    one shorter where they do not divide); no KV is stored and every block-table entry is block 0."""
    from shardinfer.engine.model_runner import HostBatch

    per_seq = max(1, sequence_tokens)
    lens = [per_seq] * (n_tokens // per_seq) + ([n_tokens % per_seq] if n_tokens % per_seq else [])
    qsl = np.zeros(len(lens) + 1, dtype=np.int32)
    np.cumsum(lens, out=qsl[1:])
    positions = np.concatenate([np.arange(n, dtype=np.int64) for n in lens])
    blocks = -(-max(lens) // block_size)
    return HostBatch(
        input_ids=np.zeros(n_tokens, dtype=np.int64),
        positions=positions,
        slot_mapping=np.full(n_tokens, SKIP_SLOT, dtype=np.int64),
        query_start_loc=qsl,
        seq_lens=np.asarray(lens, dtype=np.int32),
        block_tables=np.zeros((len(lens), blocks), dtype=np.int32),
        prompt_lens=np.asarray(lens, dtype=np.int32),
    )


def prefill_shapes(max_num_batched_tokens: int, max_model_len: int) -> list[tuple[int, int]]:
    """(tokens, prompt length) of the prefill passes: a full step and one token fewer (Triton
    specialises integer arguments on divisibility by 16), each with prompts of every length of
    PREFILL_SEQUENCE_TOKENS that max_model_len allows."""
    sizes = sorted({max_num_batched_tokens, max(1, max_num_batched_tokens - 1)}, reverse=True)
    lengths = sorted({min(n, max_model_len, max_num_batched_tokens) for n in PREFILL_SEQUENCE_TOKENS})
    return [(n, length) for n in sizes for length in lengths]


@torch.inference_mode()
def run_prefill(runner: ModelRunner, host: HostBatch) -> torch.Tensor:
    """The model and its LM head over `host`, as a prefill step runs them (the last token of each
    sequence is sampled); returns the logits."""
    input_ids, positions, ctx = runner.device_inputs(host)
    hidden = runner.model(input_ids, positions, ctx)
    last = torch.as_tensor(host.query_start_loc[1:] - 1, dtype=torch.long, device=hidden.device)
    logits: torch.Tensor = runner.model.compute_logits(hidden[last])
    return logits


@torch.inference_mode()
def run_sampling(vocab: int, device: torch.device) -> None:
    """The sampler's choice over two rows, as engine/sampler.py makes it: without filters on the
    logits themselves and on a processed copy (penalties, masks), and with filters; each with and
    without the top-1 logprob."""
    raw = torch.zeros(2, vocab, dtype=torch.float32, device=device)
    ones, zeros = torch.ones(2, device=device), torch.zeros(2, device=device)
    top_k = torch.zeros(2, dtype=torch.int32, device=device)
    seeds = positions = torch.zeros(2, dtype=torch.int64, device=device)
    for x, filtered in ((raw, False), (raw.clone(), False), (raw, True)):
        for top in (None, TopLogprob.empty(2, device)):  # with and without logprobs=1
            ops.sample_with_logprobs(raw, x, ones, top_k, ones, zeros, seeds, positions, filtered, top=top)


def precompile(
    runner: ModelRunner, graphs: Any, max_num_batched_tokens: int, workers: int | None = None
) -> compile_ahead.CompileAhead | None:
    """Compile what the runner's warm-up, the capture of `graphs` (a DecodeGraphs, or None) and
    its first prefill steps and the sampler will launch. Returns what was compiled, or None where
    this Triton cannot compile asynchronously or a pass failed (logged); what was not compiled
    ahead compiles as it launches."""
    if not compile_ahead.available():
        return None
    try:
        with compile_ahead.compile_instead_of_launch(workers) as stats:
            if runner.batch_invariant:
                runner.warm_up()
            if graphs is not None:
                graphs.run_each_bucket()
            for n, length in prefill_shapes(max_num_batched_tokens, runner.max_model_len):
                logits = run_prefill(runner, prefill_batch(n, length, runner.block_size))
            run_sampling(logits.shape[-1], logits.device)
    except Exception as e:  # an optimisation only: what it did not compile compiles at its launch
        logger.warning(
            "compiling kernels ahead stopped (%s: %s); the rest compile as they first launch "
            "(SHARDINFER_PRECOMPILE=0 skips this step)",
            type(e).__name__,
            e,
        )
        return None
    return stats
