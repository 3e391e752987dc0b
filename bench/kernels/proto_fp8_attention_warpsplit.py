"""Prototype (not used by the engine): FP8 decode attention whose warps split each key tile and keep
their own online softmax, so a tile's loop has no exchange between warps.

The shipped kernel (paged_attention's chunk kernel) spreads a tile's 128 keys over its four warps
for the scores (each warp 32 keys) and its value columns over them for the output (each warp 32 of
128), so every tile crosses warps three times: the row maximum and the row sum of the scores are
reduced across warps, and the probabilities move through shared memory to become the second
product's operand. Nsight Compute found barriers among the stalls of that loop
(bench/kernels/NOTES.md, "Nsight Compute on the FP8 attention and GEMM kernels").

Here a tile is [SPLIT, BLOCK_M, BLOCK_N / SPLIT] by a batched product whose batch runs over the
warps: warp w takes keys w * BLOCK_N / SPLIT .. of every tile, reduces its rows' maximum and sum
with shuffles, and multiplies its own probabilities by its own value rows into its own
accumulator. The SPLIT running states are merged once at the end, in warp order. Another
arithmetic than the shipped kernel's (each warp sums its own keys first), so other bits; the
result is still a fixed function of the row.

Decode rows only (one token a sequence, every key of the sequence in one program), head dim 128,
one scale per key (fp8_quant's groups).

    python bench/kernels/proto_fp8_attention_warpsplit.py [--batch 256] [--ctx 640 1024] [--group 4]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.kernels.fp8_decode_batch import HEAD_DIM, problem, time_against_shipped

_LOG2E = 1.4426950408889634


@triton.jit(do_not_specialize=["sbt"])
def _warpsplit_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    ks_ptr,
    vs_ptr,
    bt_ptr,
    sl_ptr,
    out_ptr,
    sqt,
    sqh,
    skb,
    sks,
    skh,
    svb,
    svs,
    svh,
    sksb,
    skss,
    sksh,
    svsb,
    svss,
    svsh,
    sbt,
    sot,
    soh,
    scale_log2,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    D: tl.constexpr,
    PAGE: tl.constexpr,
):
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    seq_len = tl.load(sl_ptr + seq)
    SUB: tl.constexpr = BLOCK_N // SPLIT
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < GROUP
    head = kvh * GROUP + rows
    d = tl.arange(0, D)
    q = tl.load(
        q_ptr + seq.to(tl.int64) * sqt + head[:, None] * sqh + d[None, :], mask=row_ok[:, None], other=0.0
    )
    q3 = tl.broadcast_to(q[None, :, :], (SPLIT, BLOCK_M, D))
    w = tl.arange(0, SPLIT)
    j = tl.arange(0, SUB)
    m_i = tl.full([SPLIT, BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([SPLIT, BLOCK_M], tl.float32)
    acc = tl.zeros([SPLIT, BLOCK_M, D], tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        n = start + w[:, None] * SUB + j[None, :]  # [SPLIT, SUB]: warp w's keys of this tile
        n_ok = n < seq_len
        page = tl.load(bt_ptr + seq.to(tl.int64) * sbt + n // PAGE, mask=n_ok, other=0).to(tl.int64)
        k_off = page * skb + (n % PAGE) * sks + kvh * skh
        k = tl.load(k_ptr + k_off[:, None, :] + d[None, :, None], mask=n_ok[:, None, :], other=0.0)
        ks = tl.load(ks_ptr + page * sksb + (n % PAGE) * skss + kvh * sksh, mask=n_ok, other=0.0)
        k = (k.to(tl.float32) * ks[:, None, :]).to(q.dtype)  # [SPLIT, D, SUB]
        s = tl.dot(q3, k) * scale_log2  # [SPLIT, BLOCK_M, SUB]
        s = tl.where(n_ok[:, None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 2))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, :, None])
        l_i = l_i * alpha + tl.sum(p, 2)
        v_off = page * svb + (n % PAGE) * svs + kvh * svh
        v = tl.load(v_ptr + v_off[:, :, None] + d[None, None, :], mask=n_ok[:, :, None], other=0.0)
        vs = tl.load(vs_ptr + page * svsb + (n % PAGE) * svss + kvh * svsh, mask=n_ok, other=0.0)
        v = (v.to(tl.float32) * vs[:, :, None]).to(q.dtype)  # [SPLIT, SUB, D]
        acc = acc * alpha[:, :, None] + tl.dot(p.to(q.dtype), v)
        m_i = m_new
    # The warps' states merged once: a warp that saw no key (m = -inf, l = 0) adds exact zeros.
    m = tl.max(m_i, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    beta = tl.exp2(m_i - m_safe[None, :])
    l_sum = tl.sum(l_i * beta, 0)
    o = tl.sum(acc * beta[:, :, None], 0) / l_sum[:, None]
    o_ptrs = out_ptr + seq.to(tl.int64) * sot + head[:, None] * soh + d[None, :]
    tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def decode_warpsplit(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    block_n: int = 128,
    max_registers: int | None = None,
    num_stages: int = 1,
) -> torch.Tensor:
    """One decode token a sequence: q [B, Hq, 128]; k/v [blocks, 16, Hk, 128] float8_e4m3fn with
    k_scale/v_scale [blocks, 16, Hk, 1] float32. Returns [B, Hq, 128] in q's dtype."""
    b, hq, _ = q.shape
    hk = k.shape[2]
    out = torch.empty_like(q)
    limits = {"maxnreg": max_registers} if max_registers else {}
    _warpsplit_kernel[(b, hk)](
        q,
        k,
        v,
        k_scale,
        v_scale,
        block_tables,
        seq_lens,
        out,
        q.stride(0),
        q.stride(1),
        *k.stride()[:3],
        *v.stride()[:3],
        *k_scale.stride()[:3],
        *v_scale.stride()[:3],
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        scale * _LOG2E,
        GROUP=hq // hk,
        BLOCK_M=16,
        BLOCK_N=block_n,
        SPLIT=4,
        D=HEAD_DIM,
        PAGE=k.shape[1],
        num_warps=4,
        num_stages=num_stages,
        **limits,
    )
    return out


CHECKED_ROWS = 16  # rows compared against float64 (the reference holds every key of a row per head)
CONFIGS = (
    (128, None, 1),
    (128, 168, 1),
    (64, None, 1),
    (128, None, 2),
    (256, None, 1),
)  # (keys a tile, register cap, stages)


def compare(batch: int, ctx: int, group: int, bw: float) -> str:
    """One batch and context: the shipped kernel and the prototype at each config, as one table
    row (µs per call, CUDA-graph replays), with each one's largest error against float64."""
    pr = problem(batch, ctx, group)
    scale = HEAD_DIM**-0.5

    def split(cfg: tuple[int, int | None, int]) -> torch.Tensor:
        return decode_warpsplit(
            pr["q"], pr["k"], pr["v"], pr["ks"], pr["vs"], pr["bt"], pr["sl"], scale, cfg[0], cfg[1], cfg[2]
        )

    t = time_against_shipped(pr, scale, [lambda c=c: split(c) for c in CONFIGS], bw, CHECKED_ROWS)
    return (
        f"{batch:>5} {ctx:>5} {t.shipped_us:>10.1f} "
        + " ".join(f"{us:>12.1f}" for us in t.variant_us)
        + f" {t.floor_us:>9.1f}   max err: "
        + " ".join(f"{e:.2e}" for e in t.errors)
    )


def main() -> None:
    from bench.gpu_timing import copy_bandwidth

    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[256, 512])
    ap.add_argument("--ctx", type=int, nargs="+", default=[640, 1024])
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--out", default=None, help="ignored (device_checks.sh passes it)")
    args = ap.parse_args()
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}, copy bandwidth {bw / 1e12:.2f} TB/s, group {args.group}")
    print(
        f"{'batch':>5} {'ctx':>5} {'shipped us':>10} "
        + " ".join(f"{'/'.join(map(str, cfg)):>12}" for cfg in CONFIGS)
        + f" {'floor us':>9}"
    )
    for batch in args.batch:
        for ctx in args.ctx:
            print(compare(batch, ctx, args.group, bw), flush=True)


if __name__ == "__main__":
    main()
