"""Comparison helpers and a paged-batch builder shared by the kernel tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; NaN anywhere fails the comparison (returns inf)."""
    o, r = out.detach().double().cpu(), ref.detach().double().cpu()
    if torch.isnan(o).any() or torch.isnan(r).any():
        return float("inf")
    return float((o - r).norm() / r.norm().clamp_min(1e-30))


def compile_in_child(script: str) -> Any:
    """Run a kernel-compiling script in a child process with Triton's interpreter off (this test
    process has it on, which replaces every kernel by a Python one); return the JSON it prints
    last."""
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "TRITON_INTERPRET": "0",
        "TRITON_DEFAULT_FP_FUSION": "1",
        "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=root, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_compile_script(script: Path, cache_dir: Path, *args: str, timeout: int = 600) -> list[str]:
    """Run a compile-only script (hopper_compile.py's driver stands in for the GPU and raises on any
    launch) in a child with Triton's interpreter off and its cache in `cache_dir`; it must exit 0.
    Returns its stdout lines."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(cache_dir), TRITON_DEFAULT_FP_FUSION="1")
    done = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


# Relative-error bounds: one rounding of the output dtype plus float32 reduction-order noise.
TOL = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


class PagedBatch:
    """A random varlen batch over a paged cache whose blocks are scattered across the pool.

    Blocks no request owns are filled with NaN, so a kernel that reads outside a request's
    block table poisons its output.
    """

    def __init__(
        self,
        q_lens: list[int],
        ctx_lens: list[int],
        hq: int,
        hk: int,
        d: int,
        dv: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        seed: int,
        spare_blocks: int = 3,
    ) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.seq_lens = [c + q for c, q in zip(ctx_lens, q_lens, strict=True)]
        self.qsl = [0]
        for q in q_lens:
            self.qsl.append(self.qsl[-1] + q)
        n_blocks = [-(-s // block_size) for s in self.seq_lens]
        total = sum(n_blocks) + spare_blocks
        perm = torch.randperm(total, generator=gen)
        width = max([*n_blocks, 1]) + 1
        self.block_tables = torch.full((len(q_lens), width), -1, dtype=torch.int32)
        used = 0
        for i, n in enumerate(n_blocks):
            self.block_tables[i, :n] = perm[used : used + n].int()
            used += n
        self.k_cache = torch.randn(total, block_size, hk, d, generator=gen).to(dtype)
        self.v_cache = torch.randn(total, block_size, hk, dv, generator=gen).to(dtype)
        for b in perm[used:].tolist():
            self.k_cache[b] = float("nan")
            self.v_cache[b] = float("nan")
        self.q = torch.randn(self.qsl[-1], hq, d, generator=gen).to(dtype)
        self.device = device

    def args(self) -> tuple[torch.Tensor, ...]:
        """(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables) on the test device."""
        dev = self.device
        return (
            self.q.to(dev),
            self.k_cache.to(dev),
            self.v_cache.to(dev),
            torch.tensor(self.qsl, dtype=torch.int32, device=dev),
            torch.tensor(self.seq_lens, dtype=torch.int32, device=dev),
            self.block_tables.to(dev),
        )


def compiled_variants(*kernels: object) -> list[int]:
    """How many compiled variants each Triton kernel holds (all devices): a count that grows
    between two calls means the second call compiled, i.e. a run would stall there."""
    return [sum(len(caches[0]) for caches in k.device_caches.values()) for k in kernels]  # type: ignore[attr-defined]


def pow2_scales64(amax: torch.Tensor) -> torch.Tensor:
    """The power-of-two FP8 scales of reference_fp8.pow2_scale, computed independently in float64:
    2^ceil(log2(amax / 448)) per element (amax 0 takes the smallest scale the code allows)."""
    import math

    a = amax.double().clamp_min(2.0**-100)
    return torch.tensor(
        [2.0 ** math.ceil(math.log2(v / 448.0)) for v in a.flatten().tolist()], dtype=torch.float64
    ).view(a.shape)


def e4m3_round(v: torch.Tensor) -> torch.Tensor:
    """v (|v| <= 448) rounded to the nearest float8_e4m3fn value, ties to even, in float64
    arithmetic: 3 mantissa bits above 2^-6, steps of 2^-9 below (the subnormals)."""
    a = v.double().abs()
    _, exp = torch.frexp(a)  # a = m * 2^exp with m in [0.5, 1): its unit in the last place is 2^(exp - 4)
    ulp = torch.where(a >= 2.0**-6, torch.ldexp(torch.ones_like(a), exp - 4), torch.full_like(a, 2.0**-9))
    return torch.copysign(torch.round(a / ulp) * ulp, v.double())  # torch.round: ties to even


def mixed_width_step() -> tuple[Any, list[int]]:
    """A decode step of mixed widths for the padded-layout tests (engine/cuda_graphs.pad_to_width):
    three requests with 7, 12 and 4 cached tokens add 1, 3 and 2 (one that does not draft, one
    with two drafts, one with one); request i's KV lives in block i + 1 of 16 slots. Returns the
    host batch and the sequence lengths."""
    import numpy as np

    from shardinfer.engine.model_runner import HostBatch

    ctx, new = [7, 12, 4], [1, 3, 2]
    seq_lens = [c + n for c, n in zip(ctx, new, strict=True)]
    zeros = np.zeros(sum(new), dtype=np.int64)
    qsl = np.concatenate([[0], np.cumsum(new)]).astype(np.int32)
    host = HostBatch(
        zeros,
        zeros,
        zeros,
        qsl,
        np.array(seq_lens, dtype=np.int32),
        np.array([[1], [2], [3]], dtype=np.int32),
    )
    return host, seq_lens


def poison_past_sequences(cache: torch.Tensor, seq_lens: list[int]) -> None:
    """NaN in every slot of `cache` ([blocks, 16, ...], mixed_width_step's layout) past a sequence
    and in block 0: what an earlier request may have left there."""
    for i, s in enumerate(seq_lens):
        cache[i + 1, s:] = float("nan")
    cache[0] = float("nan")


def spread_rows(x: torch.Tensor, rows: Any, padded_len: int) -> torch.Tensor:
    """x's rows placed at `rows` of a zero tensor of `padded_len` rows (the padded layout)."""
    out = x.new_zeros(padded_len, *x.shape[1:])
    out[torch.from_numpy(rows)] = x
    return out


def assert_padded_rows_match(got: torch.Tensor, want: torch.Tensor, device: torch.device) -> None:
    """Compiled, a row's bits do not depend on where it sits in its tile; the interpreter's numpy
    matmul rounds a row by its position in the block, so there the check is to float32 rounding."""
    assert torch.isfinite(want).all() and torch.isfinite(got).all()
    assert torch.equal(got, want) if device.type == "cuda" else rel_err(got, want) < 1e-5
