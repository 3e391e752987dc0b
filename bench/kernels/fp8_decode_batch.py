"""The decode batch the FP8 attention prototypes share (proto_fp8_attention_*.py): a paged FP8
cache, its float64 reference and the engine's own kernel on it, so each prototype is timed and
checked against the same three.

Decode rows only (one token a sequence), head dim 128, 16-key pages, one scale per key.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from shardinfer.kernels import paged_attention

HEAD_DIM = 128
PAGE_SIZE = 16


def problem(
    batch: int, ctx: int, group: int, hk: int = 8, seed: int = 0, device: str = "cuda"
) -> dict[str, torch.Tensor]:
    """A decode batch over a paged FP8 cache (fp8_quant's per-key scales), pages shuffled."""
    from shardinfer.kernels.fp8_quant import quantize_groups

    g = torch.Generator(device=device).manual_seed(seed)
    pages_per_seq = -(-ctx // PAGE_SIZE)
    blocks = batch * pages_per_seq + 1
    shape = (blocks, PAGE_SIZE, hk, HEAD_DIM)
    k = torch.randn(shape, device=device, generator=g, dtype=torch.bfloat16)
    v = torch.randn(shape, device=device, generator=g, dtype=torch.bfloat16)
    kq, ks = quantize_groups(k.view(-1, HEAD_DIM))
    vq, vs = quantize_groups(v.view(-1, HEAD_DIM))
    order = torch.randperm(blocks - 1, device=device, generator=g).to(torch.int32) + 1
    q = torch.randn(batch, group * hk, HEAD_DIM, device=device, generator=g, dtype=torch.bfloat16)
    return {
        "q": q,
        "k": kq.view(shape),
        "v": vq.view(shape),
        "ks": ks.view(blocks, PAGE_SIZE, hk, 1).contiguous(),
        "vs": vs.view(blocks, PAGE_SIZE, hk, 1).contiguous(),
        "bt": order.view(batch, pages_per_seq).contiguous(),
        "sl": torch.full((batch,), ctx, device=device, dtype=torch.int32),
        "qsl": torch.arange(batch + 1, device=device, dtype=torch.int32),
    }


def reference(pr: dict[str, torch.Tensor], scale: float, rows: int | None = None) -> torch.Tensor:
    """The first `rows` decode rows (all by default) in float64 from the dequantised cache."""
    q = pr["q"][:rows].double()
    b, hq, _ = q.shape
    hk = pr["k"].shape[2]
    ctx = int(pr["sl"][0])
    k = (pr["k"].double() * pr["ks"].double())[pr["bt"][:rows].long()]  # [B, pages, 16, Hk, D]
    v = (pr["v"].double() * pr["vs"].double())[pr["bt"][:rows].long()]
    k = k.reshape(b, -1, hk, HEAD_DIM)[:, :ctx].repeat_interleave(hq // hk, dim=2)
    v = v.reshape(b, -1, hk, HEAD_DIM)[:, :ctx].repeat_interleave(hq // hk, dim=2)
    s = torch.einsum("bhd,bnhd->bhn", q, k) * scale
    return torch.einsum("bhn,bnhd->bhd", torch.softmax(s, -1), v)


def shipped_decode(pr: dict[str, torch.Tensor], scale: float) -> torch.Tensor:
    """The engine's kernel (paged_attention on the FP8 cache, its defaults) on a `problem` batch."""
    return paged_attention.paged_attention(
        pr["q"],
        pr["k"],
        pr["v"],
        pr["qsl"],
        pr["sl"],
        pr["bt"],
        scale,
        max_seq_len=int(pr["bt"].shape[1]) * PAGE_SIZE,
        k_scale=pr["ks"],
        v_scale=pr["vs"],
    )


def sweep_args(groups: Sequence[int]) -> argparse.Namespace:
    """The prototypes' command line: the decode batches, contexts and GQA groups to time."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[256, 512])
    ap.add_argument("--ctx", type=int, nargs="+", default=[640, 1024])
    ap.add_argument("--group", type=int, nargs="+", default=list(groups))
    ap.add_argument("--out", default=None, help="unused: the table is printed")
    return ap.parse_args()


@dataclass
class Timed:
    """The shipped kernel and each prototype variant on one `problem` batch: µs per call
    (CUDA-graph replays), the FP8 bytes' floor in µs, and each one's largest error against float64
    over the first rows (the shipped kernel's first)."""

    shipped_us: float
    variant_us: list[float]
    floor_us: float
    errors: list[float]


def time_against_shipped(
    pr: dict[str, torch.Tensor],
    scale: float,
    variants: Sequence[Callable[[], torch.Tensor]],
    bandwidth: float,
    checked_rows: int = 16,
) -> Timed:
    """Times the engine's kernel and each variant, and checks each against the float64 reference."""
    from bench.gpu_timing import graph_ms_per_call

    ref = reference(pr, scale, checked_rows)

    def shipped() -> torch.Tensor:
        return shipped_decode(pr, scale)

    errors = [(fn()[:checked_rows].double() - ref).abs().max().item() for fn in (shipped, *variants)]
    batch, ctx, hk = pr["q"].shape[0], int(pr["sl"][0]), pr["k"].shape[2]
    # The first timing after a shape's data is built runs slow on every replay (NOTES.md, "Eight
    # warps and split score products"): one is made and discarded, so the shipped kernel, timed
    # first, is not the one that pays it.
    graph_ms_per_call([shipped])
    return Timed(
        shipped_us=1e3 * graph_ms_per_call([shipped]),
        variant_us=[1e3 * graph_ms_per_call([fn]) for fn in variants],
        floor_us=2 * batch * ctx * hk * (HEAD_DIM + 4) / bandwidth * 1e6,
        errors=errors,
    )


# The operand-order caches of proto_fp8_attention_direct.py and proto_fp8_attention_ws.py: thread
# t's bytes of mma.m16n8k16's B operand (channels or keys 2(t%4) + {0, 1, 8, 9} of each 16-wide
# chunk) are contiguous, 32 bytes of a key row and 4 bytes of a value row.
#     K  [blocks, page, Hk, 128 bytes]  a key row's channel d = 16c + 8h + 2i + e at byte 32i + 4c + 2h + e
#     V  [blocks, Hk, Dv, page]         a page's values transposed; key 8h + 2i + e at 4i + 2h + e


def k_position(d: torch.Tensor) -> torch.Tensor:
    """The byte of a key row holding channel d."""
    c, h, i, e = d // 16, (d // 8) % 2, (d // 2) % 4, d % 2
    return 32 * i + 4 * c + 2 * h + e


def v_position(key: torch.Tensor) -> torch.Tensor:
    """The position in a page's value row of the page's key `key`."""
    h, i, e = key // 8, (key // 2) % 4, key % 2
    return 4 * i + 2 * h + e


def permuted_caches(k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The prototype's layouts of an FP8 paged cache [blocks, page, Hk, 128] (moved as bytes)."""
    dev = k_cache.device
    k_src = torch.argsort(k_position(torch.arange(HEAD_DIM, device=dev)))  # channel at each byte
    v_src = torch.argsort(v_position(torch.arange(PAGE_SIZE, device=dev)))  # key at each position
    k_p = k_cache.view(torch.uint8)[..., k_src].contiguous().view(k_cache.dtype)
    v_t = v_cache.view(torch.uint8).permute(0, 2, 3, 1)  # [blocks, Hk, Dv, page]
    v_p = v_t[..., v_src].contiguous().view(v_cache.dtype)
    return k_p, v_p
