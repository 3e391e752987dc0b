"""The warp-specialised prototype's shared views of its ring stages (bench/kernels/
proto_fp8_attention_ws.py): read through them, the bytes TMA puts in a stage from the operand-order
caches (fp8_decode_batch.permuted_caches) are the engine cache's keys and values in logical order.
The kernel itself is Gluon and runs on the GPU only; this checks the views' arithmetic."""

from __future__ import annotations

import pytest
import torch

from bench.kernels.fp8_decode_batch import HEAD_DIM, PAGE_SIZE, permuted_caches
from bench.kernels.proto_fp8_attention_ws import ordered_key_view, ordered_value_view


def _logical(bases: list[list[int]], offset: int) -> tuple[int, int]:
    """The (row, column) a linear layout maps a byte offset to: the XOR of its set bits' bases."""
    a = b = 0
    for bit, (x, y) in enumerate(bases):
        if offset >> bit & 1:
            a, b = a ^ x, b ^ y
    return a, b


def _caches(block_n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(block_n)
    shape = (block_n // PAGE_SIZE, PAGE_SIZE, 2, HEAD_DIM)  # one tile of pages, two heads
    k = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    v = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    k_p, v_p = permuted_caches(k.view(torch.float8_e4m3fn), v.view(torch.float8_e4m3fn))
    return k, v, k_p.view(torch.uint8), v_p.view(torch.uint8)


@pytest.mark.parametrize("block_n", [64, 128])
def test_the_key_view_reads_the_swizzled_stage_as_k_transposed(block_n: int) -> None:
    k, _, k_p, _ = _caches(block_n)
    head = 1
    rows = k_p[:, :, head].reshape(block_n, HEAD_DIM)  # the tile's key rows, pages in order
    # TMA's 128-byte swizzle: a row's 16-byte chunk c lands at chunk c XOR (row mod 8).
    stage = torch.empty(block_n * HEAD_DIM, dtype=torch.uint8)
    for r in range(block_n):
        for c in range(HEAD_DIM):
            stage[r * HEAD_DIM + ((c >> 4) ^ (r & 7)) * 16 + (c & 15)] = rows[r, c]
    bases = ordered_key_view(block_n).offset_bases
    for offset in range(block_n * HEAD_DIM):
        channel, key = _logical(bases, offset)
        assert stage[offset] == k[key // PAGE_SIZE, key % PAGE_SIZE, head, channel]


@pytest.mark.parametrize("block_n", [64, 128])
def test_the_value_view_reads_the_stage_as_v(block_n: int) -> None:
    _, v, _, v_p = _caches(block_n)
    head = 1
    stage = v_p[:, head].reshape(-1)  # [pages x 128 dims, 16 positions], one box a page, unswizzled
    bases = ordered_value_view(block_n).offset_bases
    for offset in range(block_n * HEAD_DIM):
        key, dim = _logical(bases, offset)
        assert stage[offset] == v[key // PAGE_SIZE, key % PAGE_SIZE, head, dim]
