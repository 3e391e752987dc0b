"""Prototype (not used by the engine): FP8 decode attention whose K and V operands go from global
memory straight into MMA registers, no shared memory for them. bench/kernels/NOTES.md, "Next for
FP8 decode attention", has the plan; this measures it before the cache layout changes for real.

The prototype's cache layouts (the engine's FP8 cache is not permuted; `permuted_caches` builds
these from it):

    K  [blocks, page, Hk, 128 bytes]   key row's channel d = 16c + 8h + 2i + e at byte 32i + 4c + 2h + e
    V  [blocks, Hk, Dv, page]          a page's values transposed; key 8h + 2i + e at position 4i + 2h + e

so that thread t's bytes of mma.m16n8k16's B operand (channels or keys 2(t%4) + {0, 1, 8, 9} of
each 16-wide chunk) are contiguous: 32 bytes of a key row, 4 bytes of a value row. A blocked load
of those runs, viewed in logical order, is the dot-operand layout itself (the conversion is checked
trivial at compile time). The arithmetic is paged_attention's for a decode row whose keys fit one
KV chunk (its direct-store path): the same products on the same values in the same order, so the
output should equal paged_attention's bit for bit; `main` checks that and times both.

Decode rows only (one token a sequence), head dim 128, 16-key pages, context up to KV_CHUNK.

    python bench/kernels/proto_fp8_attention_direct.py [--batch 256] [--ctx 640] [--group 4]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.kernels.fp8_decode_batch import HEAD_DIM, PAGE_SIZE, permuted_caches, problem, shipped_decode
from shardinfer.kernels import paged_attention

D = gl.constexpr(HEAD_DIM)
PAGE = gl.constexpr(PAGE_SIZE)
BLOCK_N = gl.constexpr(128)
BLOCK_M = gl.constexpr(16)
NUM_WARPS = gl.constexpr(4)
_LOG2E = 1.4426950408889634


@gluon.jit
def _decode_direct_kernel(
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
    GROUP: gl.constexpr,
):
    seq = gl.program_id(0)
    kvh = gl.program_id(1)
    seq_len = gl.load(sl_ptr + seq)
    pos = seq_len - 1  # the decode token's position

    mma: gl.constexpr = gl.NVMMADistributedLayout(
        version=[2, 0], warps_per_cta=[1, NUM_WARPS], instr_shape=[16, 8]
    )
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    # K: a thread loads 32 bytes of one key row (keys over lanes / 4 and warps, i = lane % 4).
    k_load: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[1, 32], threads_per_warp=[8, 4], warps_per_cta=[NUM_WARPS, 1], order=[1, 0]
    )
    # V: [8 pages, Dv, page]: a thread loads 4 bytes of one value row of one page.
    v_load: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[1, 1, 4],
        threads_per_warp=[1, 8, 4],
        warps_per_cta=[1, NUM_WARPS, 1],
        order=[2, 1, 0],
    )

    # The tile's rows as paged_attention's decode tiles have them: row r is query head r of the
    # KV head's group (BQ tokens of GROUP heads, only the first token exists in decode).
    rows_a = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, a_l))
    d_a = gl.arange(0, D, layout=gl.SliceLayout(0, a_l))
    ok_a = rows_a < GROUP
    q_rows = seq.to(gl.int64) * sqt + (kvh * GROUP + rows_a) * sqh
    q = gl.load(q_ptr + q_rows[:, None] + d_a[None, :], mask=ok_a[:, None], other=0.0)

    rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma))
    row_ok = rows < GROUP
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, gl.SliceLayout(1, mma))
    l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, mma))
    acc = gl.zeros([BLOCK_M, D], gl.float32, mma)
    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma)

    keys_k = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, k_load))
    bytes_k = gl.arange(0, D, layout=gl.SliceLayout(0, k_load))
    pages_v = gl.arange(0, BLOCK_N // PAGE, layout=gl.SliceLayout(1, gl.SliceLayout(2, v_load)))
    dv_v = gl.arange(0, D, layout=gl.SliceLayout(0, gl.SliceLayout(2, v_load)))
    slot_v = gl.arange(0, PAGE, layout=gl.SliceLayout(0, gl.SliceLayout(1, v_load)))
    # The page key each value position holds (v_position's inverse), for the value scales.
    key_of_slot = 8 * ((slot_v // 2) % 2) + 2 * (slot_v // 4) + slot_v % 2
    pages_s = gl.arange(0, BLOCK_N // PAGE, layout=gl.SliceLayout(1, gl.SliceLayout(1, v_load)))
    n_s = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
    bt_row = bt_ptr + seq.to(gl.int64) * sbt
    for start in range(0, seq_len, BLOCK_N):
        # K tile, dequantised in registers: (fp8 -> float32) * the key's scale -> bf16, as paged_attention.
        n = start + keys_k
        n_ok = n < seq_len
        page = gl.load(bt_row + n // PAGE, mask=n_ok, other=0).to(gl.int64)
        k_off = page * skb + (n % PAGE) * sks + kvh * skh
        raw_k = gl.load(k_ptr + k_off[:, None] + bytes_k[None, :], mask=n_ok[:, None], other=0.0)
        ks = gl.load(ks_ptr + page * sksb + (n % PAGE) * skss + kvh * sksh, mask=n_ok, other=0.0)
        kf = (raw_k.to(gl.float32) * ks[:, None]).to(gl.bfloat16)
        kt = gl.reshape(gl.permute(gl.reshape(kf, [BLOCK_N, 4, 8, 2, 2]), [2, 3, 1, 4, 0]), [D, BLOCK_N])
        k_b = gl.convert_layout(kt, b_l, assert_trivial=True)
        s = mma_v2(q, k_b, zero)
        s = s * scale_log2
        n_m = start + n_s
        visible = (n_m < seq_len)[None, :] & (n_m[None, :] <= pos)
        s = gl.where(visible, s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_safe)
        p = gl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + gl.sum(p, 1)

        # V tile: 8 pages of [Dv, page], each page's scales by key.
        pg_n = start // PAGE + pages_v
        pg_ok = pg_n * PAGE < seq_len
        vpage = gl.load(bt_row + pg_n, mask=pg_ok, other=0).to(gl.int64)
        v_off = vpage * svb + kvh * svh
        key_in = (start + pages_v * PAGE)[:, None, None] + key_of_slot[None, None, :]
        v_ok = key_in < seq_len
        # Loaded by whole pages (a thread's 4 bytes share one mask, so the load is one 4-byte
        # access), then zeroed past the sequence: p is exactly 0 there, but 0 x NaN is not 0.
        raw_v = gl.load(
            v_ptr + v_off[:, None, None] + dv_v[None, :, None] * PAGE + slot_v[None, None, :],
            mask=pg_ok[:, None, None],
            other=0.0,
        )
        raw_v = gl.where(v_ok, raw_v, gl.zeros_like(raw_v))
        pg_s = start // PAGE + pages_s
        vpage_s = gl.load(bt_row + pg_s, mask=pg_s * PAGE < seq_len, other=0).to(gl.int64)
        vs_ok = ((start + pages_s * PAGE)[:, None] + key_of_slot[None, :]) < seq_len
        vs = gl.load(
            vs_ptr + vpage_s[:, None] * svsb + key_of_slot[None, :] * svss + kvh * svsh, mask=vs_ok, other=0.0
        )
        vf = (raw_v.to(gl.float32) * vs[:, None, :]).to(gl.bfloat16)
        vt = gl.reshape(
            gl.permute(gl.reshape(vf, [BLOCK_N // PAGE, D, 4, 2, 2]), [0, 3, 2, 4, 1]), [BLOCK_N, D]
        )
        v_b = gl.convert_layout(vt, b_l, assert_trivial=True)
        p_a = gl.convert_layout(p.to(gl.bfloat16), a_l)
        acc = mma_v2(p_a, v_b, acc * alpha[:, None])
        m_i = m_new

    out = acc / gl.where(row_ok, l_i, 1.0)[:, None]
    d_o = gl.arange(0, D, layout=gl.SliceLayout(0, mma))
    o_rows = seq.to(gl.int64) * sot + (kvh * GROUP + rows) * soh
    gl.store(out_ptr + o_rows[:, None] + d_o[None, :], out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def decode_direct(
    q: torch.Tensor,
    k_p: torch.Tensor,
    v_p: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_registers: int | None = None,
) -> torch.Tensor:
    """Decode attention on the prototype layouts: q [B, Hq, 128] bf16, one token a sequence.
    max_registers caps the registers per thread (a launch setting: the same arithmetic)."""
    b, hq, _ = q.shape
    hk = k_p.shape[2]
    out = torch.empty_like(q)
    _decode_direct_kernel[(b, hk)](
        q,
        k_p,
        v_p,
        k_scale,
        v_scale,
        block_tables,
        seq_lens,
        out,
        q.stride(0),
        q.stride(1),
        k_p.stride(0),
        k_p.stride(1),
        k_p.stride(2),
        v_p.stride(0),
        v_p.stride(1),
        *k_scale.stride()[:3],
        *v_scale.stride()[:3],
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        scale * _LOG2E,
        GROUP=hq // hk,
        num_warps=NUM_WARPS.value,
        **({"maxnreg": max_registers} if max_registers else {}),
    )
    return out


CAPS = (None, 168, 128)  # register caps per thread tried for the prototype


def compare(batch: int, ctx: int, group: int, bw: float) -> str:
    """One batch and context: the shipped kernel on a bf16 and on the FP8 cache, and the prototype
    at each register cap, as one table row (µs per call, CUDA-graph replays)."""
    from bench.gpu_timing import graph_ms_per_call

    pr = problem(batch, ctx, group)
    scale = HEAD_DIM**-0.5
    k_p, v_p = permuted_caches(pr["k"], pr["v"])

    def shipped() -> torch.Tensor:
        return shipped_decode(pr, scale)

    def direct(cap: int | None) -> torch.Tensor:
        return decode_direct(pr["q"], k_p, v_p, pr["ks"], pr["vs"], pr["bt"], pr["sl"], scale, cap)

    # The bf16 cache holding the same values, on the shipped kernel's bf16 tiling: the time a 16-bit
    # cache takes, twice the bytes (its bits are not compared: another tile, another rounding).
    k16 = (pr["k"].float() * pr["ks"]).to(torch.bfloat16)
    v16 = (pr["v"].float() * pr["vs"]).to(torch.bfloat16)

    def shipped_bf16() -> torch.Tensor:
        return paged_attention.paged_attention(
            pr["q"], k16, v16, pr["qsl"], pr["sl"], pr["bt"], scale, max_seq_len=ctx
        )

    want = shipped()
    outs = [direct(c) for c in CAPS]
    equal = all(torch.equal(want, o) for o in outs)
    t_bf16 = 1e3 * graph_ms_per_call([shipped_bf16])
    t_ship = 1e3 * graph_ms_per_call([shipped])
    t_direct = [1e3 * graph_ms_per_call([lambda c=c: direct(c)]) for c in CAPS]
    kv_bytes = 2 * batch * ctx * pr["k"].shape[2] * (HEAD_DIM + 4)
    floor = kv_bytes / bw * 1e6
    worst = max((want.float() - o.float()).abs().max().item() for o in outs)
    return (
        f"{batch:>5} {ctx:>5} {t_bf16:>9.1f} {t_ship:>10.1f} "
        + " ".join(f"{t:>12.1f}" for t in t_direct)
        + f" {floor:>9.1f} {equal!s:>13}"
        + ("" if equal else f"  max |diff| {worst:.3g}")
    )


def main() -> None:
    from bench.gpu_timing import copy_bandwidth

    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--ctx", type=int, nargs="+", default=[640, 1024])
    ap.add_argument("--group", type=int, default=4)
    args = ap.parse_args()
    bw = copy_bandwidth()
    print(
        f"{'batch':>5} {'ctx':>5} {'bf16 us':>9} {'shipped us':>10} "
        + " ".join(f"{'direct/' + str(c):>12}" for c in CAPS)
        + f" {'floor us':>9} {'bitwise equal':>13}"
    )
    for ctx in args.ctx:
        print(compare(args.batch, ctx, args.group, bw), flush=True)


if __name__ == "__main__":
    main()
