"""FP8 decode attention with the products transposed: the raw e4m3 key tile straight into an e4m3
warpgroup MMA (prototype; the lead in bench/kernels/NOTES.md, "A lead: the keys straight into FP8
warpgroup MMAs, products transposed", where its run on an H100 is recorded: no faster than the
shipped kernel at the same error).

The shipped chunk kernel converts every key and value to bfloat16 before 16-row `mma.sync`
products, where a GQA group of four fills four rows. Here, per 128-key tile of one sequence and KV
head:
- scores^T [keys, heads] = K [keys, 128] x Q8^T: the keys are the MMA's rows and the group's heads
  its columns (padded to eight, the narrowest warpgroup MMA), and the key tile is never converted.
  The queries are rounded to e4m3 with one power-of-two scale a head (TERMS=1), or written as the
  sum of two such terms, the second holding what the first rounded away (TERMS=2: about bf16's
  precision for two products of the same key tile, the tensor cores having the room);
- the key's scale and the query's scales multiply the scores afterwards (all powers of two);
- out^T [128, heads] = V^T x P^T: the value tile is only converted to bfloat16 (exact), its
  per-key scale folded into the probabilities before they are rounded to bfloat16 (exact for a
  power of two, as the shipped kernel's `fp8_scale_scores`).

One program a sequence and KV head over the whole context (no KV chunks), decode rows only, head
dim 128, one scale per key: what bench/kernels/fp8_decode_batch.py builds. Other bits than the
shipped kernel's; each variant's largest error against float64 is reported beside its time. The
queries' terms are made before the timed calls (in the engine the attention prologue would write
them with the queries).
Compile-only evidence for the instruction choice: probe_fp8_transposed_attention.py.

    python bench/kernels/proto_fp8_attention_transposed.py [--batch 256 512] [--ctx 640 1024] [--group 4 2]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.kernels.fp8_decode_batch import HEAD_DIM, PAGE_SIZE, problem, sweep_args, time_against_shipped
from shardinfer.kernels._common import interpreting

_LOG2E = 1.4426950408889634
_E4M3_MAX = 448.0


def quantize_queries(q: torch.Tensor, terms: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, Hq, D] as the sum of `terms` e4m3 tensors times power-of-two scales, one a head:
    returns (values [terms, B, Hq, D] e4m3, scales [terms, B, Hq] float32). Each term rounds what the
    terms before it left."""
    rest = q.float()
    values, scales = [], []
    for _ in range(terms):
        amax = rest.abs().amax(-1).clamp_min(torch.finfo(torch.float32).tiny)
        scale = torch.exp2(torch.ceil(torch.log2(amax / _E4M3_MAX)))
        value = (rest / scale[..., None]).to(torch.float8_e4m3fn)
        rest = rest - value.float() * scale[..., None]
        values.append(value)
        scales.append(scale)
    return torch.stack(values).contiguous(), torch.stack(scales).contiguous()


@triton.jit
def _decode_transposed_kernel(
    q8_ptr,
    qs_ptr,
    k_ptr,
    v_ptr,
    ks_ptr,
    vs_ptr,
    bt_ptr,
    sl_ptr,
    out_ptr,
    sbt,
    q_terms_stride,
    qs_terms_stride,
    scale_log2,
    HQ: tl.constexpr,
    HK: tl.constexpr,
    GROUP: tl.constexpr,
    GPAD: tl.constexpr,
    D: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TERMS: tl.constexpr,
    F32_PRODUCT: tl.constexpr,
):
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    ctx = tl.load(sl_ptr + seq)
    g = tl.arange(0, GPAD)
    g_ok = g < GROUP
    d = tl.arange(0, D)
    heads = (seq * HQ + kvh * GROUP + g).to(tl.int64)  # rows of q, its scales and out
    bt_row = bt_ptr + seq.to(tl.int64) * sbt
    # The queries' e4m3 terms and their scales, loaded once for every key tile.
    q0 = tl.load(q8_ptr + heads[:, None] * D + d[None, :], mask=g_ok[:, None], other=0.0)
    qs0 = tl.load(qs_ptr + heads, mask=g_ok, other=0.0)
    if TERMS == 2:
        q1 = tl.load(q8_ptr + q_terms_stride + heads[:, None] * D + d[None, :], mask=g_ok[:, None], other=0.0)
        qs1 = tl.load(qs_ptr + qs_terms_stride + heads, mask=g_ok, other=0.0)
    m_i = tl.full([GPAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GPAD], tl.float32)
    acc = tl.zeros([D, GPAD], tl.float32)
    for start in range(0, ctx, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        n_ok = n < ctx
        page = tl.load(bt_row + n // PAGE, mask=n_ok, other=0).to(tl.int64)
        row = (page * PAGE + n % PAGE) * HK + kvh  # [BLOCK_N]: the key's cache row
        k = tl.load(k_ptr + row[:, None] * D + d[None, :], mask=n_ok[:, None], other=0.0)  # e4m3
        ks = tl.load(ks_ptr + row, mask=n_ok, other=0.0)
        s = tl.dot(k, tl.trans(q0)) * qs0[None, :]  # an e4m3 product of the raw key tile per term
        if TERMS == 2:
            s += tl.dot(k, tl.trans(q1)) * qs1[None, :]
        s = s * (ks * scale_log2)[:, None]
        s = tl.where(n_ok[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        # A head with no visible key yet keeps m = -inf; shift by 0 so exp2 gives exact zeros.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[None, :])
        l_i = l_i * alpha + tl.sum(p, 0)
        v = tl.load(v_ptr + row[:, None] * D + d[None, :], mask=n_ok[:, None], other=0.0).to(tl.bfloat16)
        vs = tl.load(vs_ptr + row, mask=n_ok, other=0.0)
        pv = (p * vs[:, None]).to(tl.bfloat16)  # the value's scale on its probabilities
        # Under the interpreter, whose bf16 dot is unreliable: the same bf16 values, multiplied in float32.
        if F32_PRODUCT:
            out_t = tl.dot(tl.trans(v.to(tl.float32)), pv.to(tl.float32), input_precision="ieee")
        else:
            out_t = tl.dot(tl.trans(v), pv)  # [D, GPAD]
        acc = acc * alpha[None, :] + out_t
        m_i = m_new
    o = acc / tl.where(l_i == 0.0, 1.0, l_i)[None, :]
    tl.store(out_ptr + heads[None, :] * D + d[:, None], o.to(out_ptr.dtype.element_ty), mask=g_ok[None, :])


def decode_transposed(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    terms: int = 2,
    block_n: int = 128,
    warps: int = 4,
    stages: int = 1,
    max_registers: int | None = None,
    query_terms: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Decode attention on the engine's FP8 cache layout: q [B, Hq, 128] bf16 (contiguous), k and v
    [blocks, page, Hk, 128] float8_e4m3fn, scales [blocks, page, Hk, 1] float32 (powers of two), one
    token a sequence. terms: e4m3 terms of the queries (1 or 2); the rest are launch settings and
    the key tile (block_n, which fixes the rounding). query_terms: quantize_queries(q, terms) made
    beforehand (the sweep times the kernel alone: in the engine the attention prologue, which
    already writes the queries, would write their terms)."""
    b, hq, dh = q.shape
    hk = k.shape[2]
    assert dh == HEAD_DIM and k.shape[1] == PAGE_SIZE and q.is_contiguous() and k.is_contiguous()
    assert hq % hk == 0 and terms in (1, 2)
    group = hq // hk
    q8, qs = quantize_queries(q, terms) if query_terms is None else query_terms
    assert q8.shape == (terms, *q.shape) and qs.shape == (terms, b, hq)
    out = torch.empty_like(q)
    limits = {"maxnreg": max_registers} if max_registers is not None and not interpreting() else {}
    _decode_transposed_kernel[(b, hk)](
        q8,
        qs,
        k,
        v,
        k_scale,
        v_scale,
        block_tables,
        seq_lens,
        out,
        block_tables.stride(0),
        q8.stride(0),
        qs.stride(0),
        float(scale) * _LOG2E,
        HQ=hq,
        HK=hk,
        GROUP=group,
        GPAD=max(8, triton.next_power_of_2(group)),
        D=dh,
        PAGE=PAGE_SIZE,
        BLOCK_N=block_n,
        TERMS=terms,
        F32_PRODUCT=interpreting(),
        num_warps=warps,
        num_stages=stages,
        **limits,
    )
    return out


# (query terms, keys a tile, stages, register cap): the first is the lead's design.
CONFIGS: list[tuple[int, int, int, int | None]] = [
    (2, 128, 1, None),
    (1, 128, 1, None),
    (2, 128, 2, None),
    (2, 64, 2, None),
    (2, 128, 1, 128),
]


def compare(batch: int, ctx: int, group: int, bw: float) -> str:
    """A markdown row: the shipped kernel, each config (µs, largest error against float64) and the floor."""
    pr = problem(batch, ctx, group)
    scale = HEAD_DIM**-0.5
    query_terms = {t: quantize_queries(pr["q"], t) for t in (1, 2)}  # outside the timed calls

    def variant(cfg: tuple[int, int, int, int | None]) -> torch.Tensor:
        terms, block_n, stages, cap = cfg
        return decode_transposed(
            pr["q"],
            pr["k"],
            pr["v"],
            pr["ks"],
            pr["vs"],
            pr["bt"],
            pr["sl"],
            scale,
            terms,
            block_n,
            4,
            stages,
            cap,
            query_terms[terms],
        )

    timed = time_against_shipped(pr, scale, [lambda cfg=cfg: variant(cfg) for cfg in CONFIGS], bw)
    cells = [f"{us:.1f} ({err:.1e})" for us, err in zip(timed.variant_us, timed.errors[1:], strict=True)]
    return (
        f"| {group} | {batch}, {ctx} | {timed.shipped_us:.1f} ({timed.errors[0]:.1e}) | "
        + " | ".join(cells)
        + f" | {timed.floor_us:.1f} |"
    )


def main() -> None:
    from bench.gpu_timing import copy_bandwidth

    args = sweep_args(groups=(4, 2))
    bw = copy_bandwidth()
    names = [f"terms {t}, {n} keys, {s} st, cap {c}" for t, n, s, c in CONFIGS]
    print(
        f"{torch.cuda.get_device_name()}, copy bandwidth {bw / 1e12:.2f} TB/s; µs (largest error against float64)"
    )
    print("| group | batch, ctx | shipped | " + " | ".join(names) + " | floor |")
    print("|---" * (len(CONFIGS) + 4) + "|")
    for group in args.group:
        for batch in args.batch:
            for ctx in args.ctx:
                print(compare(batch, ctx, group, bw), flush=True)


if __name__ == "__main__":
    main()
