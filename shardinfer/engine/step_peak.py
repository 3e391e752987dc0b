"""The device memory a step takes beside the weights and the KV cache, measured before the cache
is sized from what is left.

The KV cache takes its share of the free memory once, at start-up; everything a step allocates
after that (activations, the LM head's rows, the sampler's copies, a chunk of prompt scores) must
fit in the rest. How much that is depends on the token budget, the batch, the model's widths and
its kernels, so it is measured, not estimated: one eager step of a full token budget of prefill
(in prompts as long as the engine allows, the longest a step can carry),
the LM head over as many sampling rows as a step can have, the sampler's filtered choice with a
processed copy of those logits, and one chunk of prompt scores, on a KV cache of one block
(the pass writes nothing to it: every slot is SKIP_SLOT, as in engine/precompile.py).
The cache's budget is then `gpu_memory_utilization` of the free memory, less this peak.

On a cold Triton cache the pass would compile its kernels one at a time; where kernels compile
ahead (engine/precompile.py), the same pass runs first without launching anything, so they
compile in parallel and the compile-ahead pass after the cache is allocated finds them built.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from shardinfer.engine.kv_cache import allocate_kv_caches
from shardinfer.engine.precompile import prefill_batch
from shardinfer.engine.prompt_scores import chunk_rows, score_rows
from shardinfer.engine.sampling_noise import gumbel_noise
from shardinfer.kernels import compile_ahead, ops
from shardinfer.kernels.top_logprob import TopLogprob

if TYPE_CHECKING:
    from shardinfer.engine.model_runner import ModelRunner

logger = logging.getLogger(__name__)


@torch.inference_mode()
def run_peak_step(runner: ModelRunner, num_tokens: int, sample_rows: int) -> None:
    """One step's worth of the allocations a real step makes (module docstring)."""
    length = min(num_tokens, runner.max_model_len)
    host = prefill_batch(num_tokens, length, runner.block_size)
    input_ids, positions, ctx = runner.device_inputs(host)
    hidden = runner.model(input_ids, positions, ctx)
    rows = max(1, min(sample_rows, num_tokens))
    logits = runner.model.compute_logits(hidden[:rows])
    processed = logits.clone()  # penalties and grammar masks write to a copy
    dev = logits.device
    ones = torch.ones(rows, device=dev)
    zeros = torch.zeros(rows, device=dev)
    top_k = torch.zeros(rows, dtype=torch.int32, device=dev)
    seeds = torch.zeros(rows, dtype=torch.int64, device=dev)
    top = TopLogprob.empty(rows, dev)
    noise = None if dev.type == "cuda" else gumbel_noise(seeds, seeds, logits.shape[-1])
    ops.sample_with_logprobs(logits, processed, ones, top_k, ones, zeros, seeds, seeds, True, noise, top=top)
    scored = list(range(min(num_tokens, chunk_rows(runner.vocab_size))))
    score_rows(runner.model.compute_logits, hidden, scored, [0] * len(scored), 1, runner.vocab_size)


def run_or_explain(runner: ModelRunner, num_tokens: int, sample_rows: int) -> None:
    """run_peak_step, where running out of memory is told as the settings that asked for it."""
    try:
        run_peak_step(runner, num_tokens, sample_rows)
    except torch.cuda.OutOfMemoryError as e:
        raise ValueError(
            f"one step of max_num_batched_tokens={num_tokens} tokens and {sample_rows} sampling rows "
            "does not fit in the device memory the weights leave: lower max_num_batched_tokens "
            "(and max_num_seqs), or use a device with more memory"
        ) from e


def measure_step_peak(runner: ModelRunner, num_tokens: int, sample_rows: int, compile_first: bool) -> int:
    """Bytes the step of run_peak_step allocated at its peak, on top of what was allocated before
    it; runner.kv_caches is replaced for the pass by one block and restored (to whatever it was)."""
    device = runner.device
    kept = getattr(runner, "kv_caches", None)
    runner.kv_caches = allocate_kv_caches(
        runner.kv_specs, 1, runner.block_size, runner.dtype, device, runner.kv_fp8
    )
    try:
        if compile_first and compile_ahead.available():
            try:
                with compile_ahead.compile_instead_of_launch():
                    run_peak_step(runner, num_tokens, sample_rows)
            except Exception as e:  # only an optimisation: what it did not build compiles as it launches
                logger.warning("compiling the memory-peak step ahead stopped (%s: %s)", type(e).__name__, e)
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        run_or_explain(runner, num_tokens, sample_rows)
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - before
    finally:
        runner.kv_caches = kept  # type: ignore[assignment]
        torch.cuda.empty_cache()
    logger.info(
        "a step of %d tokens and %d sampling rows peaks at %.2f GiB beside the weights and the KV cache",
        num_tokens,
        sample_rows,
        peak / 2**30,
    )
    return int(peak)
