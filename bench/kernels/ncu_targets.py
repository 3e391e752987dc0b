"""Kernels to put under Nsight Compute: each case builds its inputs once and launches the kernel a
few times (compiled by the first launch), so that `ncu --launch-skip 2 --launch-count 1` profiles a
warm launch. Nothing is timed here; ncu reads the hardware counters.

    ncu --clock-control none --kernel-name regex:_attn_chunk_kernel --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --section WarpStateStats ... python3 bench/kernels/ncu_targets.py fp8_attention

(the MLA cases' kernel is `_mla_chunk_kernel`; the GEMMs' are named in fp8_matmul and fp8_matmul_ws).

Cases (dense-8b, dense-small and moe-16b shapes, as bench_kernels.py and gpu_timing.fp8_gemm_rates
use):
  fp8_attention, bf16_attention   decode attention, batch 256 at 640 tokens of context, on an FP8
                                  cache (the shipped 128-key tiles) or a bf16 one
  fp8_mla, bf16_mla               moe-16b's MLA decode (16 heads, latent 512 + rope 64, 64-token
                                  pages), batch 256 at 1024 tokens of context, on an FP8 latent
                                  cache or a bf16 one holding the same dequantised values
  fp8_gemm_decode, fp8_gemm_prefill, fp8_gemm_small
                                  the FP8 linear of dense-8b's gate/up projection (N 24576, K 4096)
                                  at M 256 and 8192, and dense-small's (N 6144, K 1024) at M 8192
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.kernels.bench_kernels import DecodeBatch
from shardinfer.kernels import fp8_matmul, mla_decode
from shardinfer.kernels import paged_attention as pa
from shardinfer.kernels.reference_fp8 import dequantize_groups, quantize_blocks, quantize_groups


def _attention(fp8: bool) -> Callable[[], Any]:
    hq, hk, d = 32, 8, 128
    db = DecodeBatch(256, 640, hq, 16, (hk, d), (d,))
    if fp8:
        (kq, ks), (vq, vs) = quantize_groups(db.caches[0]), quantize_groups(db.caches[1])
        return lambda: pa.paged_attention(
            db.qs[0], kq, vq, db.qsl, db.sl, db.bt, d**-0.5, max_seq_len=4096, k_scale=ks, v_scale=vs
        )
    return lambda: pa.paged_attention(
        db.qs[0], db.caches[0], db.caches[1], db.qsl, db.sl, db.bt, d**-0.5, max_seq_len=4096
    )


def _mla(fp8: bool) -> Callable[[], Any]:
    db = DecodeBatch(256, 1024, 16, 64, (576,), (512, 64))
    cq, cs = quantize_groups(db.caches[0])
    cache, extra = (cq, {"cache_scale": cs}) if fp8 else (dequantize_groups(cq, cs).to(torch.bfloat16), {})
    return lambda: mla_decode.mla_paged_attention(
        db.qs[0], db.qs[1], cache, db.qsl, db.sl, db.bt, 0.1, max_seq_len=db.ctx, **extra
    )


def _gemm(m: int, n: int, k: int) -> Callable[[], Any]:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    wq, ws = quantize_blocks(torch.randn(n, k, device="cuda") * k**-0.5)
    return lambda: fp8_matmul.linear_fp8(x, wq, ws)


CASES: dict[str, Callable[[], Callable[[], Any]]] = {
    "fp8_attention": lambda: _attention(True),
    "bf16_attention": lambda: _attention(False),
    "fp8_mla": lambda: _mla(True),
    "bf16_mla": lambda: _mla(False),
    "fp8_gemm_decode": lambda: _gemm(256, 24576, 4096),
    "fp8_gemm_prefill": lambda: _gemm(8192, 24576, 4096),
    "fp8_gemm_small": lambda: _gemm(8192, 6144, 1024),
}


def main() -> None:
    if len(sys.argv) != 2 or sys.argv[1] not in CASES:
        raise SystemExit(f"usage: ncu_targets.py CASE, one of {', '.join(CASES)}")
    fn = CASES[sys.argv[1]]()
    for _ in range(4):
        fn()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
