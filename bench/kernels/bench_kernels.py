"""Kernel benchmarks on one GPU, each against its floor, with a tile-config sweep for attention.

Decode attention is memory-bound: a step must read every running sequence's K and V once, plus
q and out; floor = those bytes / the measured device-to-device copy bandwidth (bytes read +
written). We print achieved GB/s and its fraction of that bandwidth. Prefill attention and MoE
GEMMs are reported in TFLOP/s against a measured bf16 matmul rate. MLA's per-head products
(heads_matmul) are timed in µs against torch.bmm and the per-head launch loop they replace, in
GB/s of the bytes they must move (weights + x + out). Every timing is the median
of CUDA-event timings after warm-up, on random data, with block tables scattered over the pool.
Each attention config is also checked: close to the baseline config, and a row computed alone
bit-identical to the same row in the batch.

    python bench/kernels/bench_kernels.py [--out DIR]    (DIR defaults to $OUT, else .)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu_timing import capture_graph, ceilings, graph_ms, graph_ms_per_call, median_ms
from bench.workloads import bench_commit
from shardinfer.kernels import heads_matmul, matmul, mla_decode, moe, reference_moe, rmsnorm, sampling
from shardinfer.kernels import paged_attention as pa

BF16 = torch.bfloat16


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


class DecodeBatch:
    """B decode rows at one context length over a paged cache (dense GQA or MLA latent)."""

    def __init__(
        self, batch: int, ctx: int, hq: int, page: int, entry: tuple[int, ...], q_dims: tuple[int, ...]
    ):
        gen = torch.Generator(device="cuda").manual_seed(batch * 7 + ctx)
        per_seq = -(-ctx // page)
        n_blocks = batch * per_seq
        self.caches = [
            torch.randn(n_blocks, page, *entry, device="cuda", dtype=BF16, generator=gen)
            for _ in range(2 if len(entry) == 2 else 1)
        ]
        self.bt = torch.randperm(n_blocks, device="cuda", generator=gen).view(batch, per_seq).int()
        self.qs = [torch.randn(batch, hq, d, device="cuda", dtype=BF16, generator=gen) for d in q_dims]
        self.qsl = torch.arange(batch + 1, device="cuda", dtype=torch.int32)
        self.sl = torch.full((batch,), ctx, device="cuda", dtype=torch.int32)
        self.batch, self.ctx = batch, ctx


def sweep_dense(bw: float, flops: float) -> list[dict[str, Any]]:
    """Qwen3-8B attention (32 q / 8 kv heads, d 128, bf16, 16-token pages) over tile configs."""
    hq, hk, d = 32, 8, 128
    configs = [
        (64, 64, 4, 2),
        (64, 128, 4, 2),
        (64, 64, 8, 2),
        (64, 128, 8, 3),
        (16, 64, 4, 2),
        (16, 128, 4, 2),
        (32, 64, 4, 2),
    ]
    batches = {b: DecodeBatch(b, 2048, hq, 16, (hk, d), (d,)) for b in (64, 256)}
    # Prefill: 4 prompts of 2048 tokens, causal.
    pre_t, pre_b = 2048, 4
    gen = torch.Generator(device="cuda").manual_seed(5)
    pkc = torch.randn(pre_b * 128, 16, hk, d, device="cuda", dtype=BF16, generator=gen)
    pvc = torch.randn_like(pkc)
    pbt = torch.randperm(pre_b * 128, device="cuda", generator=gen).view(pre_b, 128).int()
    pq = torch.randn(pre_b * pre_t, hq, d, device="cuda", dtype=BF16, generator=gen)
    pqsl = torch.arange(0, pre_b * pre_t + 1, pre_t, device="cuda", dtype=torch.int32)
    psl = torch.full((pre_b,), pre_t, device="cuda", dtype=torch.int32)
    pre_flops = pre_b * 2 * 2 * hq * d * pre_t * (pre_t + 1) / 2
    results = []
    baseline: dict[int, torch.Tensor] = {}
    for chunk in (512, 1024):
        for bm, bn, warps, stages in configs:
            cfg = {"block_m": bm, "block_n": bn, "num_warps": warps, "num_stages": stages, "kv_chunk": chunk}

            def run(
                q: torch.Tensor,
                kc: torch.Tensor,
                vc: torch.Tensor,
                qsl: torch.Tensor,
                sl: torch.Tensor,
                bt: torch.Tensor,
                max_len: int,
                cfg: dict[str, int] = cfg,
            ) -> torch.Tensor:
                return pa.launch(
                    q,
                    kc,
                    vc,
                    kc.stride()[:3],
                    vc.stride()[:3],
                    hk,
                    d,
                    d,
                    qsl,
                    sl,
                    bt,
                    d**-0.5,
                    None,
                    max_len,
                    cfg["kv_chunk"],
                    cfg["block_m"],
                    cfg["block_n"],
                    cfg["num_warps"],
                    cfg["num_stages"],
                )

            row: dict[str, Any] = dict(cfg)
            try:
                for b, db in batches.items():
                    args = (db.qs[0], db.caches[0], db.caches[1], db.qsl, db.sl, db.bt, db.ctx)
                    out = run(*args)
                    baseline.setdefault(b, out)
                    alone = run(
                        db.qs[0][5:6], db.caches[0], db.caches[1], db.qsl[:2], db.sl[5:6], db.bt[5:6], db.ctx
                    )
                    ms = median_ms(lambda args=args: run(*args))
                    nbytes = 2 * b * db.ctx * hk * d * 2 + 2 * b * hq * d * 2
                    row[f"decode_b{b}_ms"] = ms
                    row[f"decode_b{b}_GBs"] = nbytes / (ms * 1e-3) / 1e9
                    row[f"decode_b{b}_of_copy_bw"] = nbytes / (ms * 1e-3) / bw
                    row[f"decode_b{b}_rel_err_vs_baseline"] = rel_err(out, baseline[b])
                    row[f"decode_b{b}_row_alone_bitwise"] = bool(torch.equal(alone, out[5:6]))
                pargs = (pq, pkc, pvc, pqsl, psl, pbt, pre_t)
                ms = median_ms(lambda pargs=pargs: run(*pargs), reps=10)
                row["prefill_4x2048_ms"] = ms
                row["prefill_TFLOPs"] = pre_flops / (ms * 1e-3) / 1e12
                row["prefill_of_matmul_rate"] = pre_flops / (ms * 1e-3) / flops
            except Exception as exc:  # a config that fails to compile or run is reported, not fatal
                row["error"] = repr(exc)[:300]
            results.append(row)
            print(json.dumps(row), flush=True)
    return results


def fp8_attention(bw: float) -> list[dict[str, Any]]:
    """dense-8b decode attention on an FP8 cache (32 q / 8 kv heads, d 128, 16-token pages)
    against the bf16 cache: the scales on the tiles or on the scores, over tile configs, stage
    counts, register caps (`max_registers`: None lets the compiler choose; a cap lets more
    programs share an SM, the compiler spilling what does not fit) and the dequantised tiles'
    operand layout (`paged_attention.OPAQUE_FP8_TILES`). One stage: no cp.async buffer
    for the raw FP8 tile. Timed as CUDA-graph replays (device time, as the engine's graphed decode
    steps see it). Each FP8 variant's output is compared bitwise with the shipped default's
    (`bitwise_equal_to_default`: stages, caps and where the scales go change no bits; the warp
    count can) and with the same config on a bf16 cache holding the dequantised values
    (`bitwise_equal_to_dequantised`)."""
    from shardinfer.kernels.reference_fp8 import quantize_groups

    hq, hk, d = 32, 8, 128
    results = []
    shipped_layout = pa.OPAQUE_FP8_TILES
    # (name, scales on scores (None: the bf16 cache), block_n, warps, stages, register cap, the
    # 16-bit cache's operand layout for the dequantised tiles); the first FP8 row is the shipped
    # default (paged_attention.FP8_NUM_STAGES, MAX_REGISTERS, OPAQUE_FP8_TILES). Earlier runs swept
    # caps, stages and 1, 2, 4 and 8 warps with that layout (NOTES.md). These rows try the tiles
    # without it: the compiler then copies the raw FP8 tile into shared memory (cp.async from two
    # stages on, the next tile's K and V in flight during this one's products) and dequantises each
    # MMA operand in registers, with no 16-bit copy of the tile (other bits than the 16-bit cache's).
    variants = [("bf16", None, 64, 4, 2, 128, True)] + [
        ("fp8_scores" if on_scores else "fp8_tiles", on_scores, bn, 4, stages, regs, layout)
        for on_scores, bn, stages, regs, layout in (
            (False, 128, 1, 128, True),
            (False, 128, 1, 128, False),
            (False, 128, 2, 128, False),
            (False, 128, 2, 168, False),
            (False, 128, 2, None, False),
            (False, 128, 3, 128, False),
            (False, 64, 2, 128, False),
            (False, 64, 3, 128, False),
        )
    ]
    for batch, ctx in ((256, 640), (512, 1024), (32, 2048)):
        db = DecodeBatch(batch, ctx, hq, 16, (hk, d), (d,))
        (kq, ks), (vq, vs) = quantize_groups(db.caches[0]), quantize_groups(db.caches[1])
        dequantised = ((kq.float() * ks).to(BF16), (vq.float() * vs).to(BF16))
        fp8_bytes = 2 * batch * ctx * hk * (d + 4) + 2 * batch * hq * d * 2
        bf16_bytes = 2 * batch * ctx * hk * d * 2 + 2 * batch * hq * d * 2
        default = None
        for name, on_scores, bn, warps, stages, regs, layout in variants:
            fp8 = on_scores is not None
            pa.OPAQUE_FP8_TILES = layout
            caches = (kq, vq) if fp8 else tuple(db.caches)
            scales = {"k_scale": ks, "v_scale": vs, "fp8_scale_scores": on_scores} if fp8 else {}

            def run(
                caches: tuple[torch.Tensor, ...] = caches,
                scales: dict[str, Any] = scales,
                bn: int = bn,
                warps: int = warps,
                stages: int = stages,
                regs: int | None = regs,
                db: DecodeBatch = db,
                ctx: int = ctx,
            ) -> torch.Tensor:
                return pa.paged_attention(
                    db.qs[0],
                    caches[0],
                    caches[1],
                    db.qsl,
                    db.sl,
                    db.bt,
                    d**-0.5,
                    max_seq_len=ctx,
                    block_n=bn,
                    num_warps=warps,
                    num_stages=stages,
                    max_registers=regs,
                    **scales,
                )

            row: dict[str, Any] = {
                "batch": batch,
                "ctx": ctx,
                "variant": name,
                "block_n": bn,
                "num_warps": warps,
                "num_stages": stages,
                "max_registers": regs,
                "sixteen_bit_operand_layout": layout,
            }
            try:
                out = run()
                if fp8:
                    default = out if default is None else default
                    row["bitwise_equal_to_default"] = bool(torch.equal(out, default))
                    row["bitwise_equal_to_dequantised"] = bool(
                        torch.equal(out, run(caches=dequantised, scales={}))
                    )
                ms = graph_ms(run)
                nbytes = fp8_bytes if fp8 else bf16_bytes
                row.update(us=ms * 1e3, of_copy_bw=nbytes / (ms * 1e-3) / bw)
            except Exception as exc:  # a config that fails to compile is reported, not fatal
                row["error"] = repr(exc)[:300]
            results.append(row)
            print(json.dumps(row), flush=True)
    pa.OPAQUE_FP8_TILES = shipped_layout
    return results


def qkv_prologue_warps(bw: float) -> list[dict[str, Any]]:
    """The fused attention prologue (head norms, RoPE, the FP8 cache's stores; kernels/qkv_prologue.py)
    at decode batch sizes, over the warps a head's program runs (`rmsnorm.HEAD_ROW_WARPS`, which the
    unfused head norm shares) and the heads a program does (`qkv_prologue.HEADS_PER_PROGRAM`),
    graph-timed against its bytes' time. Each setting's output is compared
    bitwise with the unfused ops at the same setting (`bitwise_equal_to_unfused`); other settings sum
    a head's squares in another order, so other bits."""
    from shardinfer.kernels import kv_store, qkv_prologue, rope
    from shardinfer.kernels.reference_fp8 import FP8_DTYPE

    d, results = 128, []
    shipped = rmsnorm.HEAD_ROW_WARPS, qkv_prologue.HEADS_PER_PROGRAM
    for name, n_q, n_kv in (("dense-8b", 32, 8), ("dense-small", 16, 8)):
        for t in (256, 512, 1024):
            g = torch.Generator(device="cuda").manual_seed(t)
            qkv = torch.randn(t, (n_q + 2 * n_kv) * d, device="cuda", generator=g).to(BF16)
            qn = torch.rand(d, device="cuda", generator=g).to(BF16) + 0.5
            kn = torch.rand(d, device="cuda", generator=g).to(BF16) + 0.5
            inv = 1.0 / (1e6 ** (torch.arange(d // 2, device="cuda", dtype=torch.float32) / (d // 2)))
            freqs = torch.outer(torch.arange(4096, device="cuda", dtype=torch.float32), inv)
            cos, sin = freqs.cos().contiguous(), freqs.sin().contiguous()
            pos = torch.randint(0, 4096, (t,), device="cuda", generator=g)
            blocks = -(-2 * t // 16)
            slots = torch.randperm(blocks * 16, device="cuda", generator=g)[:t]

            def caches(blocks: int = blocks, n_kv: int = n_kv) -> list[torch.Tensor]:
                kv = [torch.zeros(blocks, 16, n_kv, d, dtype=FP8_DTYPE, device="cuda") for _ in range(2)]
                return kv + [torch.zeros(blocks, 16, n_kv, 1, device="cuda") for _ in range(2)]

            nbytes = t * (n_q + 2 * n_kv) * d * 2 + t * n_q * d * 2 + t * 2 * n_kv * (d + 4)
            for warps, heads in ((1, 1), (1, 2), (1, 4), (1, 8), (4, 1)):
                rmsnorm.HEAD_ROW_WARPS = warps
                qkv_prologue.HEADS_PER_PROGRAM = heads
                try:
                    got_c, want_c = caches(), caches()

                    def fused(
                        c: list[torch.Tensor] = got_c,
                        qkv: torch.Tensor = qkv,
                        n_q: int = n_q,
                        n_kv: int = n_kv,
                        qn: torch.Tensor = qn,
                        kn: torch.Tensor = kn,
                        cos: torch.Tensor = cos,
                        sin: torch.Tensor = sin,
                        pos: torch.Tensor = pos,
                        slots: torch.Tensor = slots,
                    ) -> torch.Tensor:
                        return qkv_prologue.qkv_prologue(
                            qkv, n_q, n_kv, d, qn, kn, 1e-6, cos, sin, pos, c[0], c[1], slots, c[2], c[3]
                        )

                    q = fused()
                    qh = rmsnorm.rms_norm(qkv[:, : n_q * d].reshape(t, n_q, d), qn, 1e-6)
                    kh = rmsnorm.rms_norm(qkv[:, n_q * d : (n_q + n_kv) * d].reshape(t, n_kv, d), kn, 1e-6)
                    c, s_ = cos[pos], sin[pos]
                    want_q, kh = rope.rope_neox(qh, c, s_), rope.rope_neox(kh, c, s_)
                    kv_store.store_kv_fp8(want_c[0], want_c[2], kh, slots)
                    kv_store.store_kv_fp8(
                        want_c[1], want_c[3], qkv[:, (n_q + n_kv) * d :].reshape(t, n_kv, d), slots
                    )
                    equal = torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and all(
                        torch.equal(a.view(torch.uint8), b.view(torch.uint8))
                        for a, b in zip(got_c, want_c, strict=True)
                    )
                    ms = graph_ms(fused)
                    row = {
                        "heads": name,
                        "tokens": t,
                        "head_row_warps": warps,
                        "heads_per_program": heads,
                        "us": ms * 1e3,
                        "floor_us": nbytes / bw * 1e6,
                        "bitwise_equal_to_unfused": bool(equal),
                    }
                except Exception as exc:
                    row = {
                        "heads": name,
                        "tokens": t,
                        "head_row_warps": warps,
                        "heads_per_program": heads,
                        "error": repr(exc)[:300],
                    }
                finally:
                    rmsnorm.HEAD_ROW_WARPS, qkv_prologue.HEADS_PER_PROGRAM = shipped
                results.append(row)
                print(json.dumps(row), flush=True)
    return results


def single_chunk(bw: float) -> list[dict[str, Any]]:
    """dense-8b decode attention on an FP8 cache with the one-chunk tiles written by the chunk
    kernel (shipped) against all of them through the merge (`paged_attention.SINGLE_CHUNK_DIRECT`;
    a bf16 cache always merges), graph-timed; the outputs compared bitwise (the setting changes no
    bits)."""
    from shardinfer.kernels.reference_fp8 import quantize_groups

    hq, hk, d = 32, 8, 128
    results = []
    for batch, ctx in ((256, 640), (256, 2048), (32, 2048)):
        db = DecodeBatch(batch, ctx, hq, 16, (hk, d), (d,))
        (kq, ks), (vq, vs) = quantize_groups(db.caches[0]), quantize_groups(db.caches[1])
        nbytes = 2 * batch * ctx * hk * (d + 4) + 2 * batch * hq * d * 2
        outs = {}
        for direct in (True, False):
            pa.SINGLE_CHUNK_DIRECT = direct
            try:

                def run(
                    db: DecodeBatch = db, caches: tuple[torch.Tensor, ...] = (kq, vq, ks, vs)
                ) -> torch.Tensor:
                    # the graph bound, as the engine's graphed decode passes max_model_len
                    return pa.paged_attention(
                        db.qs[0],
                        caches[0],
                        caches[1],
                        db.qsl,
                        db.sl,
                        db.bt,
                        d**-0.5,
                        max_seq_len=4096,
                        k_scale=caches[2],
                        v_scale=caches[3],
                    )

                outs[direct] = run()
                ms = graph_ms(run)
            finally:
                pa.SINGLE_CHUNK_DIRECT = True
            row = {
                "batch": batch,
                "ctx": ctx,
                "cache": "fp8",
                "direct": direct,
                "us": ms * 1e3,
                "of_copy_bw": nbytes / (ms * 1e-3) / bw,
            }
            if not direct:
                row["bitwise_equal"] = bool(torch.equal(outs[True], outs[False]))
            results.append(row)
            print(json.dumps(row), flush=True)
    return results


def _mla_bytes(batch: int, ctx: int) -> int:
    """HBM bytes of one moe-16b MLA decode call: the latent + rope cache of every key, and per
    token 16 heads' queries (576 wide) and outputs (512 wide), bf16."""
    return batch * ctx * 576 * 2 + batch * 16 * (576 + 512) * 2


def sweep_mla(bw: float) -> list[dict[str, Any]]:
    """moe-16b MLA decode (16 heads, latent 512 + rope 64 per token, 64-token pages) over tile
    configs (block_m, block_n, warps, stages, kv_chunk; pointer key tiles, page ids per chunk), at batch 64 /
    128 / 256 and context 2048 / 8192, timed as CUDA-graph replays (the engine's decode steps are
    graphed). Each config's rows are checked against the first config's (bf16 rounding; configs
    differing only in stages give its bits) and for a row computed alone being bit-identical to
    the same row in the batch. TMA key tiles lost everywhere in earlier sweeps (NOTES.md)."""
    rows = []
    batches = {
        (b, ctx): DecodeBatch(b, ctx, 16, 64, (576,), (512, 64))
        for b in (64, 128, 256)
        for ctx in (2048, 8192)
    }
    # The shipped default first (stages None: the launcher's choice, mla_decode.pipeline_stages),
    # then its neighbours: shorter chunks (more programs, two per SM at two stages), smaller tiles,
    # other depths and warp counts. (64-row tiles, a token's 16 heads padded to a Hopper wgmma's rows, read
    # 18-31% of copy bandwidth: NOTES.md.)
    configs: list[tuple[int, int, int, int | None, int]] = [
        (16, 64, 4, None, 1024),
        (16, 64, 4, 2, 1024),
        (16, 64, 4, 2, 512),
        (16, 64, 4, 3, 512),
        (16, 64, 8, 2, 512),
        (16, 32, 4, 3, 512),
        (16, 32, 4, 4, 512),
        (16, 32, 4, 2, 1024),
    ]
    baseline: dict[tuple[int, int], torch.Tensor] = {}
    for bm, bn, warps, stages, chunk in configs:
        row: dict[str, Any] = {
            "block_m": bm,
            "block_n": bn,
            "num_warps": warps,
            "num_stages": stages,
            "kv_chunk": chunk,
        }
        try:
            for (b, ctx), db in batches.items():

                def run(
                    db: DecodeBatch = db,
                    lo: int = 0,
                    hi: int = b,
                    bm: int = bm,
                    bn: int = bn,
                    warps: int = warps,
                    stages: int | None = stages,
                    chunk: int = chunk,
                ) -> torch.Tensor:
                    return mla_decode.mla_paged_attention(
                        db.qs[0][lo:hi],
                        db.qs[1][lo:hi],
                        db.caches[0],
                        db.qsl[: hi - lo + 1],
                        db.sl[lo:hi],
                        db.bt[lo:hi],
                        0.1,
                        max_seq_len=db.ctx,
                        kv_chunk=chunk,
                        block_m=bm,
                        block_n=bn,
                        num_warps=warps,
                        num_stages=stages,
                    )

                out = run()
                baseline.setdefault((b, ctx), out)
                ms = graph_ms(run)
                key = f"b{b}_ctx{ctx}"
                row[f"{key}_ms"] = ms
                row[f"{key}_of_copy_bw"] = _mla_bytes(b, ctx) / (ms * 1e-3) / bw
                row[f"{key}_rel_err_vs_first"] = rel_err(out, baseline[(b, ctx)])
                row[f"{key}_bitwise_vs_first"] = bool(torch.equal(out, baseline[(b, ctx)]))
                row[f"{key}_row_alone_bitwise"] = bool(torch.equal(run(lo=5, hi=6), out[5:6]))
        except Exception as exc:
            row["error"] = repr(exc)[:300]
        rows.append(row)
        print(
            json.dumps(
                {
                    k: round(v, 3) if isinstance(v, float) else v
                    for k, v in row.items()
                    if "of_copy_bw" in k
                    or k in ("block_m", "block_n", "num_warps", "num_stages", "kv_chunk", "error")
                }
            ),
            flush=True,
        )
    return rows


def mla_fp8(bw: float) -> list[dict[str, Any]]:
    """moe-16b MLA decode on an FP8 latent cache against the bf16 cache holding the same
    (dequantised) values, over key tiles and pipeline depths, timed as CUDA-graph replays. Each FP8
    row must give the bits of the bf16 cache at its own key tile (4 warps; the depth changes no
    bits): the dequantisation is exact. One stage at 64-key tiles is the default since the
    2026-12-03 run in NOTES.md: the raw FP8 tile skips the cp.async buffer (92 KB of shared memory
    in the sm_90a build against 130 KB with two stages), so two programs share an SM. 32- and
    16-key tiles (block_n, a numerics setting) keep two programs an SM with two or three stages
    (74-93 KB and 56 KB at 32 and 16 keys, 243 and 224 registers); on an H100 they were slower
    (NOTES.md, "Smaller MLA key tiles on the FP8 cache"). (Eight warps, capped or not, the scores
    as three independent products, and two other ways of dequantising were timed and lost:
    NOTES.md.)"""
    from shardinfer.kernels.reference_fp8 import dequantize_groups, quantize_groups

    rows = []
    for b, ctx in ((256, 1024), (256, 2048), (64, 4096), (1024, 640)):
        db = DecodeBatch(b, ctx, 16, 64, (576,), (512, 64))
        cq, cs = quantize_groups(db.caches[0])
        on_bf16 = dequantize_groups(cq, cs).to(BF16)
        db.caches[0] = on_bf16
        groups = cs.shape[-1]
        fp8_bytes = b * ctx * (576 + 4 * groups) + b * 16 * (576 + 512) * 2
        # (cache, key tile, stages): the bf16 cache at each tile first, as each FP8 row's reference.
        variants: list[tuple[str, int, int | None]] = [
            ("bf16_cache", 64, None),
            ("bf16_cache", 32, None),
            ("bf16_cache", 16, None),
            ("fp8", 64, None),
            ("fp8", 64, 2),
            ("fp8", 32, 1),
            ("fp8", 32, 2),
            ("fp8", 32, 3),
            ("fp8", 16, 2),
            ("fp8", 16, 3),
        ]
        bf16_out: dict[int, torch.Tensor] = {}
        settled = False
        for variant, block_n, stages in variants:
            fp8 = variant != "bf16_cache"
            extra: dict[str, Any] = {"cache_scale": cs} if fp8 else {}

            def run(
                fp8: bool = fp8,
                extra: dict[str, Any] = extra,
                block_n: int = block_n,
                stages: int | None = stages,
                db: DecodeBatch = db,
                cq: torch.Tensor = cq,
                lo: int = 0,
                hi: int = b,
            ) -> torch.Tensor:
                return mla_decode.mla_paged_attention(
                    db.qs[0][lo:hi],
                    db.qs[1][lo:hi],
                    cq if fp8 else db.caches[0],
                    db.qsl[: hi - lo + 1],
                    db.sl[lo:hi],
                    db.bt[lo:hi],
                    0.1,
                    max_seq_len=db.ctx,
                    block_n=block_n,
                    num_stages=stages,
                    **extra,
                )

            row: dict[str, Any] = {
                "batch": b,
                "ctx": ctx,
                "variant": variant,
                "block_n": block_n,
                "num_stages": stages,
            }
            try:
                out = run()
                base = bf16_out.setdefault(block_n, out)
                row["bitwise_equal_to_bf16_cache"] = bool(torch.equal(out, base))
                row["max_abs_diff_to_bf16_cache"] = float((out.float() - base.float()).abs().max())
                row["max_abs_diff_to_64_key_bf16"] = float((out.float() - bf16_out[64].float()).abs().max())
                row["row_alone_bitwise"] = bool(torch.equal(run(lo=5, hi=6), out[5:6]))
                if not settled:
                    # The first timing after a shape's data is built ran slow on an H100, every
                    # replay of it (NOTES.md, "Eight warps and split score products"): discarded.
                    graph_ms(run)
                    settled = True
                ms = graph_ms(run)
                nbytes = fp8_bytes if fp8 else _mla_bytes(b, ctx)
                row.update(us=ms * 1e3, of_copy_bw=nbytes / (ms * 1e-3) / bw)
            except Exception as exc:  # a config that fails to compile or launch is reported, not fatal
                row["error"] = repr(exc)[:300]
            rows.append(row)
            print(json.dumps(row), flush=True)
        del db, cq, cs, on_bf16
    return rows


def mla_scaling(bw: float, calls_per_graph: int = 4) -> list[dict[str, Any]]:
    """The shipped MLA decode configuration over batch and context (CUDA-graph replays): the time
    per call against the latent bytes read, so a fixed per-call cost (launches, the pipeline's
    fill and drain, the chunk merge) shows apart from the streaming rate. Also at each pipeline
    depth (stages change no bits, only how far loads run ahead): stages None is the launcher's
    choice. Each point is timed twice: one call per graph replay ("ms"; the replay's own launch is
    inside) and `calls_per_graph` calls in one graph on as many caches ("ms_per_call_in_graph"; a
    decode step graphs all its layers' calls together)."""
    rows = []
    for b in (64, 128, 256):
        for ctx in (512, 2048, 8192):
            dbs = [DecodeBatch(b, ctx, 16, 64, (576,), (512, 64)) for _ in range(calls_per_graph)]
            nbytes = _mla_bytes(b, ctx)
            for stages in (None, 2, 3):

                def run(db: DecodeBatch = dbs[0], stages: int | None = stages) -> torch.Tensor:
                    return mla_decode.mla_paged_attention(
                        db.qs[0],
                        db.qs[1],
                        db.caches[0],
                        db.qsl,
                        db.sl,
                        db.bt,
                        0.1,
                        max_seq_len=db.ctx,
                        num_stages=stages,
                    )

                ms = graph_ms(run)
                in_graph = graph_ms_per_call([lambda db=db, run=run: run(db) for db in dbs])
                rows.append(
                    {
                        "batch": b,
                        "ctx": ctx,
                        "num_stages": stages,
                        "ms": ms,
                        "GBs": nbytes / (ms * 1e-3) / 1e9,
                        "of_copy_bw": nbytes / (ms * 1e-3) / bw,
                        "calls_per_graph": calls_per_graph,
                        "ms_per_call_in_graph": in_graph,
                        "of_copy_bw_in_graph": nbytes / (in_graph * 1e-3) / bw,
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
            del dbs
    return rows


def _kernel_us(fn: Callable[[], Any], replays: int = 20) -> dict[str, float]:
    """Median device time per kernel name over `replays` CUDA-graph replays of fn (torch profiler)."""
    graph = capture_graph([fn])
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    times: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            times.setdefault(e.name, []).append(e.device_time)
    return {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}


def mla_merge(bw: float, calls_per_graph: int = 4) -> list[dict[str, Any]]:
    """The shipped MLA decode with the chunks merged by the last chunk program of each tile
    (merge=True, shipped) against the separate merge kernel (merge=False): time per call with
    `calls_per_graph` calls in one graph (each on its own cache), and each kernel's device time."""
    rows = []
    for b, ctx in ((64, 2048), (64, 8192), (128, 2048), (256, 512), (256, 2048)):
        dbs = [DecodeBatch(b, ctx, 16, 64, (576,), (512, 64)) for _ in range(calls_per_graph)]
        nbytes = _mla_bytes(b, ctx)
        for merge in (True, False):

            def run(db: DecodeBatch, merge: bool = merge) -> torch.Tensor:
                return mla_decode.mla_paged_attention(
                    db.qs[0],
                    db.qs[1],
                    db.caches[0],
                    db.qsl,
                    db.sl,
                    db.bt,
                    0.1,
                    max_seq_len=db.ctx,
                    merge=merge,
                )

            ms = graph_ms_per_call([lambda db=db, run=run: run(db) for db in dbs])
            rows.append(
                {
                    "batch": b,
                    "ctx": ctx,
                    "merge_in_kernel": merge,
                    "ms_per_call_in_graph": ms,
                    "of_copy_bw_in_graph": nbytes / (ms * 1e-3) / bw,
                    "kernel_us": _kernel_us(lambda run=run, db=dbs[0]: run(db)),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
        dbs.clear()
    return rows


def bench_moe(bw: float, flops: float) -> list[dict[str, Any]]:
    """moe-16b routed experts: hidden 2048, intermediate 1408, 64 experts, top-6, bf16."""
    hidden, inter, experts, top_k = 2048, 1408, 64, 6
    gen = torch.Generator(device="cuda").manual_seed(9)
    wgu = torch.randn(experts, 2 * inter, hidden, device="cuda", dtype=BF16, generator=gen) * 0.02
    wd = torch.randn(experts, hidden, inter, device="cuda", dtype=BF16, generator=gen) * 0.02
    rows = []
    for t in (64, 256, 2048):
        x = torch.randn(t, hidden, device="cuda", dtype=BF16, generator=gen)
        w, ids = reference_moe.grouped_topk(
            torch.randn(t, experts, device="cuda", generator=gen), None, top_k
        )
        ms = median_ms(lambda x=x, ids=ids, w=w: moe.fused_moe(x, ids, w, wgu, wd))
        touched = int(torch.unique(ids).numel())
        wbytes = touched * 3 * hidden * inter * 2
        fl = 2 * t * top_k * 3 * hidden * inter
        rows.append(
            {
                "tokens": t,
                "ms": ms,
                "experts_touched": touched,
                "weight_GBs": wbytes / (ms * 1e-3) / 1e9,
                "weight_of_copy_bw": wbytes / (ms * 1e-3) / bw,
                "TFLOPs": fl / (ms * 1e-3) / 1e12,
                "of_matmul_rate": fl / (ms * 1e-3) / flops,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def bench_heads_matmul(bw: float) -> list[dict[str, Any]]:
    """moe-16b MLA per-head products (16 heads, bf16): W_UK 128 -> 512 on the strided q[..., :128]
    view, W_UV 512 -> 128 on the contiguous attention output. One kernel launch for all heads
    vs torch.bmm (not batch invariant) and the per-head linear_batch_invariant loop it replaced."""
    heads = 16
    gen = torch.Generator(device="cuda").manual_seed(13)
    rows = []
    for k, n in ((128, 512), (512, 128)):
        w_nk = torch.randn(heads, n, k, device="cuda", dtype=BF16, generator=gen) * k**-0.5
        w = w_nk.transpose(1, 2).contiguous()  # [H, K, N], the bmm layout
        for t in (64, 256):
            q = torch.randn(t, heads, k + 64, device="cuda", dtype=BF16, generator=gen)
            x = q[..., :k] if k == 128 else q[..., :k].contiguous()

            def loop(x: torch.Tensor = x, w_nk: torch.Tensor = w_nk) -> torch.Tensor:
                out = x.new_empty(x.shape[0], heads, w_nk.shape[1])
                for h in range(heads):
                    out[:, h] = matmul.linear_batch_invariant(x[:, h], w_nk[h])
                return out

            runs = {
                "kernel": lambda x=x, w_nk=w_nk: heads_matmul.heads_matmul(x, w_nk),
                "bmm": lambda x=x, w=w: torch.bmm(x.transpose(0, 1), w).transpose(0, 1),
                "per_head_loop": loop,
            }
            out = runs["kernel"]()
            nbytes = heads * (n * k + t * k + t * n) * 2
            row: dict[str, Any] = {
                "k": k,
                "n": n,
                "tokens": t,
                "bytes": nbytes,
                "rel_err_vs_bmm": rel_err(out, runs["bmm"]().float()),
                "row_alone_bitwise": bool(torch.equal(heads_matmul.heads_matmul(x[5:6], w_nk), out[5:6])),
            }
            for name, fn in runs.items():
                ms = median_ms(fn, reps=50)
                row[f"{name}_us"] = ms * 1e3
                row[f"{name}_GBs"] = nbytes / (ms * 1e-3) / 1e9
                row[f"{name}_of_copy_bw"] = nbytes / (ms * 1e-3) / bw
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def bench_small() -> dict[str, float]:
    res: dict[str, float] = {}
    x = torch.randn(256, 4096, device="cuda", dtype=BF16)
    r = torch.randn_like(x)
    w = torch.randn(4096, device="cuda", dtype=BF16)
    res["fused_add_rms_norm_256x4096_ms"] = median_ms(lambda: rmsnorm.fused_add_rms_norm(x, r, w, 1e-6))
    b, vocab = 256, 151936
    logits = torch.randn(b, vocab, device="cuda") * 4
    seeds = torch.randint(0, 2**62, (b,), device="cuda")
    pos = torch.randint(0, 10**6, (b,), device="cuda")
    for name, temp, k, p in [
        ("greedy", 0.0, -1, 1.0),
        ("T1", 1.0, -1, 1.0),
        ("top_k50", 1.0, 50, 1.0),
        ("top_p0.9", 1.0, -1, 0.9),
        ("top_k50_top_p0.9", 1.0, 50, 0.9),
    ]:
        args = (
            logits,
            torch.full((b,), temp, device="cuda"),
            torch.full((b,), k, device="cuda", dtype=torch.int32),
            torch.full((b,), p, device="cuda"),
            torch.zeros(b, device="cuda"),
            seeds,
            pos,
        )
        res[f"sample_{name}_256x151936_ms"] = median_ms(lambda a=args: sampling.sample(*a), reps=10)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--only", default="", help="comma-separated sections to run (default: all)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    commit = bench_commit()
    bw, flops = ceilings()
    print(
        f"GPU {torch.cuda.get_device_name()}: copy {bw / 1e12:.2f} TB/s (read + write), "
        f"bf16 matmul {flops / 1e12:.0f} TFLOP/s",
        flush=True,
    )
    record: dict[str, Any] = {
        "workload": "kernels",
        "gpu": torch.cuda.get_device_name(),
        "commit": commit,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "batch_invariant": True,
        "torch": torch.__version__,
        "copy_bandwidth_Bps": bw,
        "bf16_matmul_flops": flops,
    }
    path = out / f"kernels-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json"
    for name, fn in [
        ("small", bench_small),
        ("moe", lambda: bench_moe(bw, flops)),
        ("heads_matmul", lambda: bench_heads_matmul(bw)),
        ("mla_decode", lambda: sweep_mla(bw)),
        ("mla_scaling", lambda: mla_scaling(bw)),
        ("mla_merge", lambda: mla_merge(bw)),
        ("paged_attention", lambda: sweep_dense(bw, flops)),
        ("fp8_attention", lambda: fp8_attention(bw)),
        ("single_chunk", lambda: single_chunk(bw)),
        ("qkv_prologue", lambda: qkv_prologue_warps(bw)),
        ("mla_fp8", lambda: mla_fp8(bw)),
    ]:
        if args.only and name not in args.only.split(","):
            continue
        try:
            record[name] = fn()
        except Exception:
            record[name] = {"error": traceback.format_exc()[-1500:]}
            print(record[name]["error"], flush=True)
        path.write_text(json.dumps(record, indent=2))
    print("\nsummary (fraction of copy bandwidth; dense: decode ctx 2048)")
    for r in record.get("paged_attention", []):
        if isinstance(r, dict):
            print(
                "dense "
                + " ".join(
                    f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in r.items()
                    if not k.endswith("_ms")
                )
            )
    for r in record.get("mla_decode", []):
        if isinstance(r, dict):
            keys = (
                "block_m",
                "block_n",
                "num_warps",
                "num_stages",
                "kv_chunk",
                *(f"b{b}_ctx{c}_of_copy_bw" for b in (64, 128, 256) for c in (2048, 8192)),
                "error",
            )
            print(
                "mla "
                + " ".join(
                    f"{k.removesuffix('_of_copy_bw')}={r[k]:.3g}"
                    if isinstance(r[k], float)
                    else f"{k}={r[k]}"
                    for k in keys
                    if k in r
                )
            )
            bits = [k for k in r if k.endswith("_row_alone_bitwise") and not r[k]]
            if bits:
                print(f"    a row alone differs from the batch: {bits}")
    for r in record.get("mla_scaling", []):
        if isinstance(r, dict):
            print(
                f"mla stages={r['num_stages'] or 'shipped'} batch={r['batch']} ctx={r['ctx']} {r['ms'] * 1e3:.1f} us "
                f"{r['GBs']:.0f} GB/s ({100 * r['of_copy_bw']:.0f}%); {r['calls_per_graph']} calls per graph: "
                f"{r['ms_per_call_in_graph'] * 1e3:.1f} us ({100 * r['of_copy_bw_in_graph']:.0f}%)"
            )
    for r in record.get("mla_merge", []):
        if isinstance(r, dict):
            print(
                f"mla merge_in_kernel={r['merge_in_kernel']} batch={r['batch']} ctx={r['ctx']}: "
                f"{r['ms_per_call_in_graph'] * 1e3:.1f} us per call in a graph ({100 * r['of_copy_bw_in_graph']:.0f}%); "
                + ", ".join(f"{k[:24]} {v:.1f} us" for k, v in r["kernel_us"].items())
            )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
