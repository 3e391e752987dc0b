"""Prototype (not used by the engine): FP8 decode attention on the FMA units, no MMA, no shared
memory, each warp its own softmax over its own keys.

The shipped FP8 decode kernel (paged_attention's chunk kernel) runs the GQA group's query heads as
the rows of 16-row MMAs: a dense-small decode token fills 2 of the 16 rows, a dense-8b token 4, and
every key and value tile is dequantised, stored to shared memory and read back in the MMA operand
layout, under barriers shared by the program's four warps. Every faster-copy prototype so far lost
to that per-tile chain (bench/kernels/NOTES.md, "A producer warp streaming the raw FP8 tiles").

Here the products are plain multiply-adds on the tile as loaded. A program takes one sequence and
one KV head; a tile of keys is [REPS, WARPS, 4, 128]: each warp owns REPS x 4 keys of it, eight
lanes holding a key row's 128 bytes (16 a lane) and four lanes four keys. Then:

- scores: each lane multiplies its 16 key bytes (as float32) by the matching query values and
  adds them up; a shuffle across the eight lanes of a row finishes the dot, and the key's scale
  multiplies the score (scores-side: the tile is only converted, never scaled);
- softmax: each warp keeps its own running maximum and sum over its own keys, so no value crosses
  a warp inside the loop;
- output: each lane keeps float32 partial sums for its 16 channels over the keys it holds (the
  value's scale folded into its probability), summed across lanes and warps once, at the end.

The arithmetic is not the shipped kernel's (other products, other sums), so the bits differ; both
are compared with the float64 reference on the dequantised cache. A row's result depends on its
own keys only, so it is batch invariant by construction. Decode rows only (one token a sequence),
head dim 128, one scale per key, 16-key pages.

    python bench/kernels/proto_fp8_attention_fma.py [--batch 256 512] [--ctx 640 1024] [--group 2 4]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.kernels.fp8_decode_batch import HEAD_DIM, PAGE_SIZE, problem, time_against_shipped

_LOG2E = 1.4426950408889634
LANE_KEYS = 4  # keys a warp holds side by side: 32 lanes / (128 bytes a row / 16 bytes a lane)


@triton.jit
def _decode_fma_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    ks_ptr,
    vs_ptr,
    bt_ptr,
    sl_ptr,
    out_ptr,
    stride_bt,
    scale_log2,
    HK: tl.constexpr,
    GROUP: tl.constexpr,
    D: tl.constexpr,
    PAGE: tl.constexpr,
    REPS: tl.constexpr,
    WARPS: tl.constexpr,
    LKEYS: tl.constexpr,
):
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    ctx = tl.load(sl_ptr + seq)
    TILE: tl.constexpr = REPS * WARPS * LKEYS
    # [GROUP, REPS, WARPS, LKEYS, D]: with D's 128 bytes over eight lanes and LKEYS over four, the
    # default blocked layout puts the warps on the WARPS axis, so reductions over D, REPS and
    # LKEYS stay inside a warp.
    r = tl.arange(0, REPS)[:, None, None]
    w = tl.arange(0, WARPS)[None, :, None]
    i = tl.arange(0, LKEYS)[None, None, :]
    key_in_tile = (r * WARPS + w) * LKEYS + i  # [REPS, WARPS, LKEYS]
    d = tl.arange(0, D)[None, None, None, None, :]
    g = tl.arange(0, GROUP)
    q_rows = (seq * HK * GROUP + kvh * GROUP + g).to(tl.int64) * D
    # The query with the softmax's scale folded in, broadcast over the tile's keys.
    q = tl.load(q_ptr + q_rows[:, None, None, None, None] + d).to(tl.float32) * scale_log2
    m_i = tl.full([GROUP, WARPS], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP, WARPS, LKEYS], tl.float32)
    acc = tl.zeros([GROUP, WARPS, LKEYS, D], tl.float32)
    bt_row = bt_ptr + seq.to(tl.int64) * stride_bt
    for start in range(0, ctx, TILE):
        n = start + key_in_tile
        n_ok = n < ctx
        page = tl.load(bt_row + n // PAGE, mask=n_ok, other=0).to(tl.int64)
        row = (page * PAGE + n % PAGE) * HK + kvh  # [REPS, WARPS, LKEYS]: the key's cache row
        addr = row[None, :, :, :, None] * D + d
        ok5 = n_ok[None, :, :, :, None]
        k = tl.load(k_ptr + addr, mask=ok5, other=0.0).to(tl.float32)
        ks = tl.load(ks_ptr + row, mask=n_ok, other=0.0)
        s = tl.sum(q * k, axis=4) * ks[None, :, :, :]  # [GROUP, REPS, WARPS, LKEYS]
        s = tl.where(n_ok[None, :, :, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(tl.max(s, axis=3), axis=1))  # [GROUP, WARPS]
        # A warp with no visible key yet keeps m = -inf; shift by 0 so exp2 gives exact zeros.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None, :, None])
        l_i = l_i * alpha[:, :, None] + tl.sum(p, axis=1)
        v = tl.load(v_ptr + addr, mask=ok5, other=0.0).to(tl.float32)
        vs = tl.load(vs_ptr + row, mask=n_ok, other=0.0)
        pv = p * vs[None, :, :, :]
        acc = acc * alpha[:, :, None, None] + tl.sum(pv[:, :, :, :, None] * v, axis=1)
        m_i = m_new
    # The warps' states merged once: every partial rescaled to the program's maximum.
    m_all = tl.max(m_i, axis=1)  # [GROUP]
    f = tl.exp2(m_i - m_all[:, None])  # [GROUP, WARPS]
    l_all = tl.sum(tl.sum(l_i * f[:, :, None], axis=2), axis=1)
    o = tl.sum(tl.sum(acc * f[:, :, None, None], axis=2), axis=1) / l_all[:, None]  # [GROUP, D]
    dd = tl.arange(0, D)
    tl.store(out_ptr + q_rows[:, None] + dd[None, :], o.to(out_ptr.dtype.element_ty))


@gluon.jit
def _decode_fma_gluon_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    ks_ptr,
    vs_ptr,
    bt_ptr,
    sl_ptr,
    out_ptr,
    stride_bt,
    scale_log2,
    HK: gl.constexpr,
    GROUP: gl.constexpr,
    D: gl.constexpr,
    PAGE: gl.constexpr,
    REPS: gl.constexpr,
    WARPS: gl.constexpr,
    LKEYS: gl.constexpr,
):
    """The Triton kernel's arithmetic with every layout given: the per-key indices, scales and
    page ids are loaded straight into the layout the scores have, so nothing in the loop is
    exchanged through shared memory (the Triton kernel gathers them in a layout of their own and
    converts, under barriers)."""
    # [GROUP, REPS, WARPS, LKEYS, D]: sixteen bytes of a key row a lane, eight lanes a row, four
    # keys across the other lanes, the warps along WARPS, the reps and the group in registers.
    L5: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[1, 1, 1, 1, 16],
        threads_per_warp=[1, 1, 1, LKEYS, 32 // LKEYS],
        warps_per_cta=[1, 1, WARPS, 1, 1],
        order=[4, 3, 2, 1, 0],
    )
    S4: gl.constexpr = gl.SliceLayout(4, L5)  # [GROUP, REPS, WARPS, LKEYS]: scores, per-key values
    SM: gl.constexpr = gl.SliceLayout(2, gl.SliceLayout(1, S4))  # [GROUP, WARPS]: a warp's max
    SA: gl.constexpr = gl.SliceLayout(1, L5)  # [GROUP, WARPS, LKEYS, D]: a lane's partial output
    SO: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, SA))  # [GROUP, D]: the merged output
    seq = gl.program_id(0)
    kvh = gl.program_id(1)
    ctx = gl.load(sl_ptr + seq)
    TILE: gl.constexpr = REPS * WARPS * LKEYS
    r = gl.arange(0, REPS, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, S4))))
    w = gl.arange(0, WARPS, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, S4))))
    i = gl.arange(0, LKEYS, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, S4))))
    key_in_tile = (r[None, :, None, None] * WARPS + w[None, None, :, None]) * LKEYS + i[None, None, None, :]
    g = gl.arange(0, GROUP, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, S4))))
    d = gl.arange(0, D, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, L5)))))
    d5 = d[None, None, None, None, :]
    q_rows = (seq * HK * GROUP + kvh * GROUP + g).to(gl.int64) * D
    q = gl.load(q_ptr + q_rows[:, None, None, None, None] + d5).to(gl.float32) * scale_log2
    m_i = gl.full([GROUP, WARPS], float("-inf"), gl.float32, SM)
    l_i = gl.zeros([GROUP, WARPS, LKEYS], gl.float32, gl.SliceLayout(1, S4))
    acc = gl.zeros([GROUP, WARPS, LKEYS, D], gl.float32, SA)
    bt_row = bt_ptr + seq.to(gl.int64) * stride_bt
    for start in range(0, ctx, TILE):
        n = start + key_in_tile  # [1, REPS, WARPS, LKEYS]
        n_ok = n < ctx
        page = gl.load(bt_row + n // PAGE, mask=n_ok, other=0).to(gl.int64)
        row = (page * PAGE + n % PAGE) * HK + kvh
        addr = row[:, :, :, :, None] * D + d5
        ok5 = n_ok[:, :, :, :, None]
        k = gl.load(k_ptr + addr, mask=ok5, other=0.0).to(gl.float32)
        ks = gl.load(ks_ptr + row, mask=n_ok, other=0.0)
        s = gl.sum(q * k, axis=4) * ks
        s = gl.where(n_ok, s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(gl.max(s, axis=1), axis=2))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_safe)
        m_b = gl.convert_layout(m_safe, gl.SliceLayout(1, gl.SliceLayout(3, S4)), assert_trivial=True)
        p = gl.exp2(s - m_b[:, None, :, None])
        l_i = l_i * alpha[:, :, None] + gl.sum(p, axis=1)
        v = gl.load(v_ptr + addr, mask=ok5, other=0.0).to(gl.float32)
        vs = gl.load(vs_ptr + row, mask=n_ok, other=0.0)
        pv = (p * vs)[:, :, :, :, None]
        alpha_a = gl.convert_layout(alpha, gl.SliceLayout(2, gl.SliceLayout(3, SA)), assert_trivial=True)
        acc = acc * alpha_a[:, :, None, None] + gl.sum(pv * v, axis=1)
        m_i = m_new
    m_all = gl.max(m_i, axis=1)
    f = gl.exp2(m_i - m_all[:, None])
    l_all = gl.sum(gl.sum(l_i * f[:, :, None], axis=2), axis=1)
    f_a = gl.convert_layout(f, gl.SliceLayout(2, gl.SliceLayout(3, SA)), assert_trivial=True)
    o = gl.sum(gl.sum(acc * f_a[:, :, None, None], axis=2), axis=1)  # [GROUP, D] in SO
    o = o / gl.convert_layout(l_all, gl.SliceLayout(1, SO))[:, None]
    go = gl.arange(0, GROUP, layout=gl.SliceLayout(1, SO))
    do = gl.arange(0, D, layout=gl.SliceLayout(0, SO))
    o_rows = (seq * HK * GROUP + kvh * GROUP + go).to(gl.int64) * D
    gl.store(out_ptr + o_rows[:, None] + do[None, :], o.to(out_ptr.dtype.element_ty))


def decode_fma(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    reps: int = 8,
    warps: int = 4,
    explicit_layouts: bool = False,
    max_registers: int | None = None,
) -> torch.Tensor:
    """Decode attention on the engine's FP8 cache layout: q [B, Hq, 128] (contiguous), k and v
    [blocks, page, Hk, 128] float8_e4m3fn, scales [blocks, page, Hk, 1] float32, one token a
    sequence. A tile is reps x warps x 4 keys; explicit_layouts runs the Gluon kernel;
    max_registers caps the registers a thread (a launch setting: the same arithmetic)."""
    b, hq, dh = q.shape
    hk = k.shape[2]
    assert dh == HEAD_DIM and k.shape[1] == PAGE_SIZE and q.is_contiguous() and k.is_contiguous()
    out = torch.empty_like(q)
    kernel = _decode_fma_gluon_kernel if explicit_layouts else _decode_fma_kernel
    kernel[(b, hk)](
        q,
        k,
        v,
        k_scale,
        v_scale,
        block_tables,
        seq_lens,
        out,
        block_tables.stride(0),
        scale * _LOG2E,
        HK=hk,
        GROUP=hq // hk,
        D=dh,
        PAGE=PAGE_SIZE,
        REPS=reps,
        WARPS=warps,
        LKEYS=LANE_KEYS,
        num_warps=warps,
        **({"maxnreg": max_registers} if max_registers else {}),
    )
    return out


# (reps, warps, explicit layouts, register cap). The first run (bench/kernels/NOTES.md) timed the
# Triton kernel too and 32-key tiles; both lost far behind, so the list keeps the Triton kernel at
# 64-key tiles as the record and adds the fastest config under a 128-register cap (132 uncapped:
# three programs a SM; capped, four).
CONFIGS = (
    (4, 4, False, None),
    (8, 4, True, None),
    (4, 4, True, None),
    (4, 4, True, 128),
    (2, 4, True, None),
    (4, 8, True, None),
)


def compare(batch: int, ctx: int, group: int, bw: float) -> str:
    """One batch, context and group: the shipped kernel and each prototype config, µs per call
    (CUDA-graph replays), and each one's largest error against the float64 reference."""
    pr = problem(batch, ctx, group)
    scale = HEAD_DIM**-0.5

    def fma(reps: int, warps: int, explicit: bool, cap: int | None) -> torch.Tensor:
        return decode_fma(
            pr["q"],
            pr["k"],
            pr["v"],
            pr["ks"],
            pr["vs"],
            pr["bt"],
            pr["sl"],
            scale,
            reps,
            warps,
            explicit,
            cap,
        )

    t = time_against_shipped(pr, scale, [lambda c=c: fma(*c) for c in CONFIGS], bw, checked_rows=32)
    return (
        f"{batch:>5} {ctx:>5} {group:>5} {t.shipped_us:>10.1f} "
        + " ".join(f"{us:>10.1f}" for us in t.variant_us)
        + f" {t.floor_us:>9.1f}   "
        + " ".join(f"{e:.1e}" for e in t.errors)
    )


def main() -> None:
    from bench.gpu_timing import copy_bandwidth

    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[256, 512])
    ap.add_argument("--ctx", type=int, nargs="+", default=[640, 1024])
    ap.add_argument("--group", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--out", default=None, help="ignored (device_checks.sh passes it)")
    args = ap.parse_args()
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}, copy bandwidth {bw / 1e12:.2f} TB/s")
    print(
        f"{'batch':>5} {'ctx':>5} {'group':>5} {'shipped us':>10} "
        + " ".join(
            f"{('gl ' if e else 'tl ') + f'{r}x{w}' + (f'/{c}' if c else ''):>10}" for r, w, e, c in CONFIGS
        )
        + f" {'floor us':>9}   max |err| vs float64: shipped, then each fma"
    )
    for group in args.group:
        for batch in args.batch:
            for ctx in args.ctx:
                print(compare(batch, ctx, group, bw), flush=True)


if __name__ == "__main__":
    main()
