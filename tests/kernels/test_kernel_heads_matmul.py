"""Per-head batch-invariant matmul: accuracy against float64, bitwise row invariance across T,
strided inputs, launcher checks.

The unmarked tests run anywhere (Triton's CPU interpreter without a GPU) on tiny shapes, with a
small tiling so a few rows already span several row tiles, a ragged column tile and a K tail;
one compiles the kernel for Hopper (sm_90) without a GPU. The `gpu` tests run DeepSeek MLA's
real shapes (moe-16b: 16 heads, W_UK 128 -> 512, W_UV 512 -> 128) compiled on the device.
"""

from __future__ import annotations

import pytest
import torch
import triton
from kernel_checks import TOL, compile_in_child, rel_err

from shardinfer.kernels import _common
from shardinfer.kernels.heads_matmul import HeadsTiles, heads_matmul

SMALL = HeadsTiles(16, 32, 32, num_warps=4, num_stages=2)  # fixed for every T, as the real ones are


def _randn(
    *shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0, device: str | torch.device = "cpu"
) -> torch.Tensor:
    gen = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn(*shape, generator=gen, device=device) * scale).to(dtype)


def _ref(x: torch.Tensor, w_nk: torch.Tensor) -> torch.Tensor:
    return torch.einsum("thk,hnk->thn", x.double().cpu(), w_nk.double().cpu())


# 48 columns: a ragged column tile; K 40: a K tail
@pytest.mark.parametrize(
    "dtype,k,n", [(torch.float32, 64, 48), (torch.float16, 40, 32), (torch.bfloat16, 40, 48)]
)
def test_matches_float64_and_rows_are_bitwise_invariant(
    device: torch.device, dtype: torch.dtype, k: int, n: int
) -> None:
    x = _randn(37, 3, k, dtype=dtype, seed=k).to(device)
    w = _randn(3, n, k, dtype=dtype, seed=k + 1, scale=k**-0.5).to(device)
    full = heads_matmul(x, w, SMALL)
    assert full.shape == (37, 3, n) and full.dtype == dtype and full.is_contiguous()
    assert rel_err(full, _ref(x, w)) < TOL[dtype]
    # Each slice puts its rows at other positions inside other row tiles than the full batch does.
    for start, rows in [(5, 1), (36, 1), (17, 20)]:
        assert torch.equal(heads_matmul(x[start : start + rows], w, SMALL), full[start : start + rows]), (
            start,
            rows,
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_default_tiling_small_batches(device: torch.device, dtype: torch.dtype) -> None:
    x = _randn(37, 2, 32, dtype=dtype, seed=3).to(device)
    w = _randn(2, 48, 32, dtype=dtype, seed=4, scale=32**-0.5).to(device)
    full = heads_matmul(x, w)
    assert rel_err(full, _ref(x, w)) < TOL[dtype]
    for t in (1, 5):
        assert torch.equal(heads_matmul(x[30 : 30 + t], w), full[30 : 30 + t]), t


def test_strided_query_view_is_read_in_place(device: torch.device) -> None:
    """As in the model: x = q[..., :nope] of q [T, H, nope + rope], a view with head stride nope + rope."""
    q = _randn(20, 3, 64 + 16, dtype=torch.bfloat16, seed=5).to(device)
    x = q[..., :64]
    assert not x.is_contiguous()
    w = _randn(3, 32, 64, dtype=torch.bfloat16, seed=6, scale=0.125).to(device)
    out = heads_matmul(x, w, SMALL)
    assert rel_err(out, _ref(x, w)) < TOL[torch.bfloat16]
    assert torch.equal(out, heads_matmul(x.contiguous(), w, SMALL))  # strides do not change the bits
    assert torch.equal(heads_matmul(x[9:10], w, SMALL), out[9:10])
    # A view starting 8 bytes into a row is copied to an aligned buffer: values, and result, unchanged.
    shifted = q[..., 4:68]
    assert torch.equal(heads_matmul(shifted, w, SMALL), heads_matmul(shifted.contiguous(), w, SMALL))


def test_model_heads_matmul(device: torch.device) -> None:
    """ops.heads_matmul (the models' per-head products): the kernel when batch invariant, cuBLAS's bmm otherwise."""
    from shardinfer.kernels.ops import heads_matmul as model_heads_matmul

    x = _randn(5, 2, 32, dtype=torch.float32, seed=7).to(device)
    w = _randn(2, 32, 16, dtype=torch.float32, seed=8).to(device)  # [H, K, N]
    w_nk = w.transpose(1, 2).contiguous()
    invariant = model_heads_matmul(x, w, w_nk, batch_invariant=True)
    assert torch.equal(invariant, heads_matmul(x, w_nk))
    assert rel_err(model_heads_matmul(x, w, w_nk, batch_invariant=False), _ref(x, w_nk)) < TOL[torch.float32]


def test_empty_dims(device: torch.device) -> None:
    x = _randn(3, 2, 16, dtype=torch.float32, seed=9).to(device)
    w = _randn(2, 8, 16, dtype=torch.float32, seed=10).to(device)
    assert heads_matmul(x[:0], w).shape == (0, 2, 8)
    no_k = heads_matmul(x[..., :0], w[..., :0].contiguous())
    assert no_k.shape == (3, 2, 8) and not no_k.cpu().any()


def test_rejects_bad_inputs(device: torch.device) -> None:
    x = _randn(4, 2, 16, dtype=torch.float32, seed=11).to(device)
    w = _randn(2, 8, 16, dtype=torch.float32, seed=12).to(device)
    cases = [
        ((x.half(), w), r"w_nk\.dtype"),
        ((x.int(), w), r"x\.dtype"),
        ((x[0], w), r"x\.dim\(\)"),
        ((x, w[0]), r"w_nk\.dim\(\)"),
        ((x, w[:, :, :15].contiguous()), r"w_nk\.shape: got \(2, 8, 15\), need \[2, N, 16\]"),
        ((x, w[:1]), r"w_nk\.shape: got \(1, 8, 16\), need \[2, N, 16\]"),
        ((x, w.transpose(1, 2).contiguous().transpose(1, 2)), r"w_nk: got strides.*\.contiguous\(\)"),
        ((x.transpose(1, 2).contiguous().transpose(1, 2), w), r"x: got last-dim stride"),
        (([[[1.0]]], w), r"x: got list"),
    ]
    for args, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            heads_matmul(*args)


def test_rejects_bad_tilings() -> None:
    with pytest.raises(ValueError, match=r"HeadsTiles\.block_k: got 48"):
        HeadsTiles(64, 64, 48)
    with pytest.raises(ValueError, match=r"num_stages=0"):
        HeadsTiles(64, 64, 64, num_stages=0)


def test_rejects_cpu_tensors_when_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_common, "interpreting", lambda: False)
    with pytest.raises(ValueError, match="need CUDA tensors"):
        heads_matmul(torch.randn(2, 2, 8), torch.randn(2, 4, 8))


_COMPILE = r"""
import json, torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from shardinfer.kernels import heads_matmul as hm

cfg = hm.heads_tiles(16, 128, 512, torch.bfloat16)
args = {"x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", **{name: "i32" for name in (
    "T", "N", "K", "stride_xt", "stride_xh", "stride_wh", "stride_wn", "stride_yt", "stride_yh")}}
constexprs = dict(EVEN_K=True, PRECISION="tf32", BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                  INTERPRET=False)
# What a launch at the model's shapes specialises on: 16-byte aligned pointers, 16-divisible
# sizes and strides; never T (do_not_specialize).
attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(args) if name != "T"}
k = triton.compile(ASTSource(fn=hm._heads_matmul_kernel, signature={**args, **{c: "constexpr" for c in constexprs}},
                             constexprs=constexprs, attrs=attrs),
                   target=GPUTarget("cuda", 90, 32), options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))
ptx = k.asm["ptx"]
print(json.dumps({"cp_async": "cp.async" in ptx, "wgmma": "wgmma.mma_async" in ptx, "spills": "ld.local" in ptx,
                  "shared": k.metadata.shared}))
"""


@pytest.mark.skipif(
    "nvidia" not in triton.backends.backends, reason="Triton's NVIDIA backend is not installed"
)
def test_compiles_for_hopper_pipelined() -> None:
    """The interpreter accepts programs the GPU compiler rejects: compile to sm_90 PTX (in a child
    process, since this one runs the interpreter) at the bf16 W_UK shape and check the K loop is
    pipelined (cp.async), runs on wgmma, and nothing spills."""
    facts = compile_in_child(_COMPILE)
    assert facts["cp_async"] and facts["wgmma"] and not facts["spills"], facts
    assert facts["shared"] <= 232448, facts  # an H100/H200's shared memory per block


# ---- real shapes on the GPU -------------------------------------------------------------------

MLA_SHAPES = {"w_uk_128_to_512": (128, 512), "w_uv_512_to_128": (512, 128)}  # (K, N) per head
HEADS = 16  # moe-16b
FULL_T = 1000
BATCH_SIZES = (1, 64, 256)  # each compared with the same rows inside T=1000


def _check_invariant_and_accurate(x: torch.Tensor, w: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> None:
    full = heads_matmul(x, w)
    assert torch.equal(heads_matmul(x, w), full)  # run to run
    assert torch.equal(heads_matmul(x.contiguous(), w), full)  # strides do not change the bits
    t = x.shape[0]
    for rows in BATCH_SIZES:
        # Offsets that place the rows at the start, in the middle and across row-tile boundaries.
        for start in (0, 129, t - rows):
            part = heads_matmul(x[start : start + rows], w)
            assert torch.equal(part, full[start : start + rows]), (rows, start)
    # torch.bmm in float32 without TF32 for half types; float64 for float32.
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    wide = torch.float64 if x.dtype == torch.float32 else torch.float32
    ref = torch.bmm(x.to(wide).transpose(0, 1), w.to(wide).transpose(1, 2)).transpose(0, 1)
    assert rel_err(full, ref) < TOL[x.dtype]
    assert rel_err(full[:1], ref[:1]) < TOL[x.dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", list(MLA_SHAPES))
def test_mla_shapes_bf16(shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    k, n = MLA_SHAPES[shape]
    # The query absorption reads q[..., :128] of q [T, 16, 128 + 64]; the value projection reads
    # the attention output as it comes (contiguous).
    q = _randn(FULL_T, HEADS, k + 64, dtype=torch.bfloat16, seed=k, device="cuda")
    x = q[..., :k] if k == 128 else q[..., :k].contiguous()
    w = _randn(HEADS, n, k, dtype=torch.bfloat16, seed=n, scale=k**-0.5, device="cuda")
    _check_invariant_and_accurate(x, w, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_mla_shapes_other_dtypes(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    x = _randn(FULL_T, HEADS, 128 + 64, dtype=dtype, seed=1, device="cuda")[..., :128]
    w = _randn(HEADS, 512, 128, dtype=dtype, seed=2, scale=128**-0.5, device="cuda")
    _check_invariant_and_accurate(x, w, monkeypatch)
