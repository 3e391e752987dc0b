"""The FP8 attention prototypes' operand-order cache layouts (bench/kernels/fp8_decode_batch.py): each
thread's bytes of the mma.m16n8k16 B operand are contiguous, and the permuted caches hold the
same bytes as the engine's. The kernel itself is Gluon and runs on the GPU only."""

from __future__ import annotations

import torch

from bench.kernels.fp8_decode_batch import HEAD_DIM, PAGE_SIZE, k_position, permuted_caches, v_position


def _operand_indices(i: int, chunk: int) -> list[int]:
    """The k indices a lane with lane % 4 == i holds in one 16-wide chunk, in register order
    (the PTX ISA's fragment layout for 16-bit B operands: 2i, 2i + 1, then 8 further)."""
    return [16 * chunk + 2 * i, 16 * chunk + 2 * i + 1, 16 * chunk + 2 * i + 8, 16 * chunk + 2 * i + 9]


def test_a_threads_key_bytes_are_one_run_of_32() -> None:
    pos = k_position(torch.arange(HEAD_DIM))
    assert sorted(pos.tolist()) == list(range(HEAD_DIM))
    for i in range(4):
        got = [int(pos[d]) for chunk in range(HEAD_DIM // 16) for d in _operand_indices(i, chunk)]
        assert got == list(range(32 * i, 32 * i + 32))


def test_a_threads_value_bytes_are_one_run_of_4_per_page() -> None:
    pos = v_position(torch.arange(PAGE_SIZE))
    assert sorted(pos.tolist()) == list(range(PAGE_SIZE))
    for i in range(4):
        assert [int(pos[key]) for key in _operand_indices(i, 0)] == list(range(4 * i, 4 * i + 4))


def test_permuted_caches_hold_the_same_bytes() -> None:
    g = torch.Generator().manual_seed(0)
    k = torch.randn(3, PAGE_SIZE, 2, HEAD_DIM, generator=g).to(torch.float8_e4m3fn)
    v = torch.randn(3, PAGE_SIZE, 2, HEAD_DIM, generator=g).to(torch.float8_e4m3fn)
    k_p, v_p = permuted_caches(k, v)
    kb, vb, kpb, vpb = (t.view(torch.uint8) for t in (k, v, k_p, v_p))
    for d in range(HEAD_DIM):
        assert torch.equal(kpb[..., int(k_position(torch.tensor(d)))], kb[..., d])
    for key in range(PAGE_SIZE):  # v_p [blocks, Hk, Dv, page] against v [blocks, page, Hk, Dv]
        assert torch.equal(vpb[..., int(v_position(torch.tensor(key)))], vb[:, key])
