"""The fused attention prologue (kernels/qkv_prologue.py) against the unfused ops it replaces: head
norms, RoPE and the cache stores, run one by one through the same package's kernels. Bitwise: the
fused launch must change no bits, in q, in the cache and in the FP8 cache's scales. Under the CPU
interpreter here; the `gpu` test repeats the comparison at a real model's head layout compiled on
the device, where each kernel's own reduction layout is what is compared."""

from __future__ import annotations

import pytest
import torch

from shardinfer.kernels import kv_store, ops, qkv_prologue, rmsnorm, rope
from shardinfer.kernels.reference_fp8 import FP8_DTYPE

# The GPU when there is one, else the CPU interpreter (conftest.py).
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _tables(max_pos: int, half: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000.0 ** (torch.arange(half, dtype=torch.float32) / half))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv)
    return freqs.cos().to(DEVICE), freqs.sin().to(DEVICE)


def _caches(blocks: int, bs: int, n_kv: int, d: int, dtype: torch.dtype, fp8: bool) -> list[torch.Tensor]:
    cache_dtype = FP8_DTYPE if fp8 else dtype
    out = [torch.zeros(blocks, bs, n_kv, d, dtype=cache_dtype, device=DEVICE) for _ in range(2)]
    if fp8:
        out += [torch.zeros(blocks, bs, n_kv, 1, dtype=torch.float32, device=DEVICE) for _ in range(2)]
    return out


def _unfused(
    qkv: torch.Tensor,
    n_q: int,
    n_kv: int,
    d: int,
    norms: tuple[torch.Tensor, torch.Tensor] | None,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    caches: list[torch.Tensor],
    slots: torch.Tensor,
) -> torch.Tensor:
    """What DenseAttention did before the fusion, op by op."""
    t = qkv.shape[0]
    q = qkv[:, : n_q * d].reshape(t, n_q, d)
    k = qkv[:, n_q * d : (n_q + n_kv) * d].reshape(t, n_kv, d)
    v = qkv[:, (n_q + n_kv) * d :].reshape(t, n_kv, d)
    if norms is not None:
        q, k = rmsnorm.rms_norm(q, norms[0], eps), rmsnorm.rms_norm(k, norms[1], eps)
    c, s = cos[positions], sin[positions]
    q, k = rope.rope_neox(q, c, s), rope.rope_neox(k, c, s)
    if len(caches) == 4:
        kv_store.store_kv_fp8(caches[0], caches[2], k, slots)
        kv_store.store_kv_fp8(caches[1], caches[3], v, slots)
    else:
        kv_store.store_kv(caches[0], k, slots)
        kv_store.store_kv(caches[1], v, slots)
    return q


def _case(
    dtype: torch.dtype,
    d: int,
    norm: bool,
    fp8: bool,
    t: int = 7,
    n_q: int = 4,
    n_kv: int = 2,
    seed: int = 0,
    exact: bool = True,
) -> None:
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(t, (n_q + 2 * n_kv) * d, generator=g) * torch.logspace(-3, 2, (n_q + 2 * n_kv) * d)
    qkv[0, : 2 * d] = 0.0  # an all-zero q head: the norm's eps, the FP8 scale's floor
    qkv = qkv.to(dtype).to(DEVICE)
    norms = None
    if norm:
        norms = (
            torch.rand(d, generator=g).to(dtype).to(DEVICE) + 0.5,
            torch.rand(d, generator=g).to(dtype).to(DEVICE),
        )
    cos, sin = _tables(64, d // 2)
    positions = torch.randint(0, 64, (t,), generator=g).to(DEVICE)
    blocks = -(-2 * t // 8)  # room for twice the tokens, so the slots scatter
    slots = torch.randperm(blocks * 8, generator=g)[:t].to(DEVICE)
    slots[1] = -1  # padding row: q still computed, nothing stored
    want_caches, got_caches = _caches(blocks, 8, n_kv, d, dtype, fp8), _caches(blocks, 8, n_kv, d, dtype, fp8)
    want = _unfused(qkv, n_q, n_kv, d, norms, 1e-6, cos, sin, positions, want_caches, slots)
    scales = (got_caches[2], got_caches[3]) if fp8 else (None, None)
    got = qkv_prologue.qkv_prologue(
        qkv,
        n_q,
        n_kv,
        d,
        norms[0] if norms else None,
        norms[1] if norms else None,
        1e-6,
        cos,
        sin,
        positions,
        got_caches[0],
        got_caches[1],
        slots,
        *scales,
    )
    assert got.shape == (t, n_q, d) and got.dtype == dtype
    if not exact:  # within float32 rounding of the unfused ops (the norm's sum in another order)
        assert float((got - want).abs().max()) <= 2**-20 * float(want.abs().max())
        return
    assert torch.equal(
        got.view(torch.uint8) if dtype != torch.float32 else got,
        want.view(torch.uint8) if dtype != torch.float32 else want,
    )
    for w, c in zip(want_caches, got_caches, strict=True):
        assert torch.equal(w.view(torch.uint8), c.view(torch.uint8))
    assert bool(got_caches[0].view(torch.uint8).any())  # something was stored


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16_cache", "fp8_cache"])
@pytest.mark.parametrize("norm", [True, False], ids=["head_norms", "no_norms"])
def test_fused_prologue_gives_the_unfused_ops_bits(norm: bool, fp8: bool) -> None:
    _case(torch.bfloat16, 128, norm, fp8)


@pytest.mark.parametrize("dtype,d", [(torch.float16, 64), (torch.float32, 32), (torch.float32, 128)])
def test_fused_prologue_other_dtypes_and_head_dims(dtype: torch.dtype, d: int) -> None:
    # Compiled, a norm narrower than the fused sizes may sum in another order than rms_norm's
    # launch (the engine runs those heads op by op, qkv_prologue.FUSED_HEAD_DIMS): bits are
    # required where the engine fuses, and everywhere under the interpreter.
    exact = DEVICE.type != "cuda" or qkv_prologue.fusable(d)
    _case(dtype, d, True, dtype != torch.float32, seed=d, exact=exact)


@pytest.mark.parametrize("heads", [3, 8])
def test_several_heads_a_program_give_the_unfused_ops_bits(
    heads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 8 heads (4 q, 2 k, 2 v): 3 a program leaves the last program two heads and a guard to pass.
    monkeypatch.setattr(qkv_prologue, "HEADS_PER_PROGRAM", heads)
    _case(torch.bfloat16, 128, True, True)
    _case(torch.bfloat16, 64, False, False, seed=2)


def test_the_engine_fuses_only_checked_head_dims() -> None:
    assert qkv_prologue.fusable(128)
    assert not qkv_prologue.fusable(64) and qkv_prologue.takes(64)
    assert not qkv_prologue.takes(96) and not qkv_prologue.takes(256)


def test_a_tokens_bits_do_not_depend_on_the_batch() -> None:
    d, n_q, n_kv = 64, 4, 2
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(9, (n_q + 2 * n_kv) * d, generator=g).to(torch.bfloat16).to(DEVICE)
    cos, sin = _tables(32, d // 2)
    positions = torch.arange(9).to(DEVICE)
    slots = torch.arange(9).to(DEVICE)
    norms = (
        torch.ones(d, dtype=torch.bfloat16, device=DEVICE),
        torch.ones(d, dtype=torch.bfloat16, device=DEVICE),
    )
    full_caches = _caches(2, 8, n_kv, d, torch.bfloat16, True)
    full = qkv_prologue.qkv_prologue(
        qkv,
        n_q,
        n_kv,
        d,
        *norms,
        1e-6,
        cos,
        sin,
        positions,
        full_caches[0],
        full_caches[1],
        slots,
        full_caches[2],
        full_caches[3],
    )
    alone_caches = _caches(2, 8, n_kv, d, torch.bfloat16, True)
    alone = qkv_prologue.qkv_prologue(
        qkv[4:5],
        n_q,
        n_kv,
        d,
        *norms,
        1e-6,
        cos,
        sin,
        positions[4:5],
        alone_caches[0],
        alone_caches[1],
        slots[4:5],
        alone_caches[2],
        alone_caches[3],
    )
    assert torch.equal(alone, full[4:5])
    for a, f in zip(alone_caches, full_caches, strict=True):
        assert torch.equal(
            a.view(-1, *a.shape[2:])[4].view(torch.uint8), f.view(-1, *f.shape[2:])[4].view(torch.uint8)
        )


def test_checks_name_the_bad_argument() -> None:
    cos, sin = _tables(8, 32)
    qkv = torch.zeros(2, 8 * 64, dtype=torch.bfloat16, device=DEVICE)
    caches = _caches(1, 4, 2, 64, torch.bfloat16, False)
    pos = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="head_dim"):
        qkv_prologue.qkv_prologue(qkv, 4, 2, 48, None, None, 1e-6, cos, sin, pos, *caches, pos)
    with pytest.raises(ValueError, match=r"qkv\.shape"):
        qkv_prologue.qkv_prologue(qkv, 6, 2, 64, None, None, 1e-6, cos, sin, pos, *caches, pos)
    with pytest.raises(ValueError, match="q_norm / k_norm"):
        qkv_prologue.qkv_prologue(
            qkv, 4, 2, 64, qkv[0, :64].contiguous(), None, 1e-6, cos, sin, pos, *caches, pos
        )
    with pytest.raises(ValueError, match=r"slot_mapping\.shape"):
        qkv_prologue.qkv_prologue(qkv, 4, 2, 64, None, None, 1e-6, cos, sin, pos, *caches, pos[:1])
    fp8 = _caches(1, 4, 2, 64, torch.bfloat16, True)
    with pytest.raises(ValueError, match="k_scale"):
        qkv_prologue.qkv_prologue(qkv, 4, 2, 64, None, None, 1e-6, cos, sin, pos, fp8[0], fp8[1], pos)


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16_cache", "fp8_cache"])
@pytest.mark.parametrize("heads", [1, 4, 8])
def test_gpu_dense_8b_heads_give_the_unfused_bits(
    fp8: bool, heads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Qwen3-8B's attention: 32 q heads, 8 kv heads of 128, head norms; 300 tokens.
    monkeypatch.setattr(qkv_prologue, "HEADS_PER_PROGRAM", heads)
    _case(torch.bfloat16, 128, True, fp8, t=300, n_q=32, n_kv=8, seed=5)


def test_ops_falls_back_to_the_unfused_ops_off_triton() -> None:
    # CPU tensors without the interpreter take ops' reference path: same contract, reference bits.
    d, n_q, n_kv, t = 64, 2, 1, 3
    qkv = torch.randn(t, (n_q + 2 * n_kv) * d).to(torch.bfloat16)
    cos, sin = (x.cpu() for x in _tables(16, d // 2))
    pos = torch.tensor([0, 5, 9])
    slots = torch.tensor([0, 1, 2])
    caches = [torch.zeros(1, 4, n_kv, d, dtype=torch.bfloat16) for _ in range(2)]
    want_caches = [torch.zeros(1, 4, n_kv, d, dtype=torch.bfloat16) for _ in range(2)]
    got = ops.qkv_prologue(qkv, n_q, n_kv, d, None, None, 1e-6, cos, sin, pos, caches[0], caches[1], slots)
    q = ops.rope_neox(qkv[:, : n_q * d].reshape(t, n_q, d), cos[pos], sin[pos])
    k = ops.rope_neox(qkv[:, n_q * d : (n_q + n_kv) * d].reshape(t, n_kv, d), cos[pos], sin[pos])
    ops.store_kv(want_caches[0], k, slots)
    ops.store_kv(want_caches[1], qkv[:, (n_q + n_kv) * d :].reshape(t, n_kv, d), slots)
    assert torch.equal(got, q)
    assert all(torch.equal(a, b) for a, b in zip(caches, want_caches, strict=True))
