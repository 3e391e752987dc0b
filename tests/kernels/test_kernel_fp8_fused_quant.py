"""RMSNorm and SiLU-and-mul kernels that quantise their output for an FP8 linear (rmsnorm.*_fp8,
activation.silu_and_mul_fp8), and the GEMM that consumes it (ops.linear_fp8_prequantized).

The claim is bit identity with the two launches they replace: the plain kernel's output (rounded
to x's dtype) quantised by fp8_quant.quantize_groups. Each fused result is checked against that
composition, codes compared as bytes, and against reference_fp8.quantize_groups of the same plain
output (the quantiser test_kernel_fp8.py checks against float64), codes compared as values.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from shardinfer.kernels import activation, fp8_matmul, fp8_quant, ops, rmsnorm
from shardinfer.kernels import reference_fp8 as ref
from shardinfer.kernels.reference_fp8 import Fp8Activation

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
EPS = 1e-6


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.cpu().view(torch.uint8)


def _rows(m: int, n: int, seed: int, lo: int = -12, hi: int = 6) -> torch.Tensor:
    """m rows of n channels, each row scaled by its own power of two in [2^lo, 2^hi), row m // 2
    all zeros (float32; callers cast)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, n, generator=g) * 2.0 ** torch.randint(lo, hi, (m, 1), generator=g).float()
    x[m // 2] = 0.0
    return x


def _norm_weight(n: int, seed: int) -> torch.Tensor:
    """Channel groups of 128 at magnitudes 2^-8 .. 2^8, so that neighbouring groups get very
    different scales (and small values inside a group land on e4m3 subnormals)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g) * 2.0 ** ((torch.arange(n) // 128 % 5) * 4 - 8).float()


def _assert_quantised_as(q: torch.Tensor, s: torch.Tensor, out: torch.Tensor) -> None:
    """(q, s) are the bits both quantisers make of `out` (the plain kernel's output)."""
    flat = out.reshape(-1, out.shape[-1])
    groups = -(-out.shape[-1] // 128)
    assert q.dtype == ref.FP8_DTYPE and q.shape == out.shape and q.is_contiguous()
    assert s.dtype == torch.float32 and s.shape == (*out.shape[:-1], groups) and s.is_contiguous()
    want_q, want_s = fp8_quant.quantize_groups(flat)
    assert torch.equal(_bits(q).view(flat.shape), _bits(want_q))
    assert torch.equal(s.view(-1, groups), want_s)
    # The reference by value: it keeps a -0.0 that the kernels' rounding makes +0.0.
    ref_q, ref_s = ref.quantize_groups(flat.cpu())
    assert torch.equal(q.cpu().float().view(flat.shape), ref_q.float())
    assert torch.equal(s.cpu().view(-1, groups), ref_s)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [48, 128, 200, 640, 1100])
@pytest.mark.parametrize("with_residual", [False, True])
def test_norm_fp8_is_norm_then_quantise(
    device: torch.device, dtype: torch.dtype, n: int, with_residual: bool
) -> None:
    """Widths below one group, whole groups and tails (200 = 128 + 72, 1100 = 8 * 128 + 76)."""
    x = _rows(7, n, seed=n).to(dtype).to(device)
    w = _norm_weight(n, seed=n + 1).to(dtype).to(device)
    residual = _rows(7, n, seed=n + 2, lo=-4, hi=2).to(dtype).to(device) if with_residual else None
    if residual is not None:
        residual[1] = -x[1]  # a sum of zeros that is not a zero input
    q, s, summed = rmsnorm.fused_add_rms_norm_fp8(x, residual, w, EPS)
    out, want_sum = rmsnorm.fused_add_rms_norm(x, residual, w, EPS)
    _assert_quantised_as(q, s, out)
    assert torch.equal(summed, want_sum)
    if residual is None:
        q1, s1 = rmsnorm.rms_norm_fp8(x, w, EPS)
        assert torch.equal(_bits(q1), _bits(q)) and torch.equal(s1, s)
    else:
        assert not _bits(q)[1].any() and _bits(q)[0].any()


def test_norm_fp8_of_a_large_and_a_tiny_row(device: torch.device) -> None:
    """Rows far above and below eps's reach (bfloat16 keeps float32's range)."""
    x = (
        torch.stack(
            [
                _rows(1, 300, seed=3)[0] * 2.0**40,
                _rows(1, 300, seed=4)[0] * 2.0**-40,
                torch.full((300,), 2.0**-60),
            ]
        )
        .to(torch.bfloat16)
        .to(device)
    )
    w = _norm_weight(300, seed=5).to(torch.bfloat16).to(device)
    q, s = rmsnorm.rms_norm_fp8(x, w, EPS)
    _assert_quantised_as(q, s, rmsnorm.rms_norm(x, w, EPS))


def test_norm_fp8_on_strided_3d_views(device: torch.device) -> None:
    """[T, H, D] slices of a wider row (strides (S, D, 1)), as the plain kernel accepts them; the
    outputs are contiguous [T, H, D] and [T, H, ceil(D / 128)]."""
    buf = _rows(5, 4 * 200 + 24, seed=6).to(torch.bfloat16).to(device)
    rbuf = _rows(5, 3 * 200, seed=7).to(torch.bfloat16).to(device)
    x, residual = buf[:, : 3 * 200].view(5, 3, 200), rbuf.view(5, 3, 200)
    w = _norm_weight(200, seed=8).to(torch.bfloat16).to(device)
    q, s, summed = rmsnorm.fused_add_rms_norm_fp8(x, residual, w, EPS)
    out, want_sum = rmsnorm.fused_add_rms_norm(x, residual, w, EPS)
    assert q.shape == (5, 3, 200) and s.shape == (5, 3, 2)
    _assert_quantised_as(q, s, out)
    assert torch.equal(summed, want_sum)


def test_norm_fp8_rows_do_not_depend_on_the_batch(device: torch.device) -> None:
    x = _rows(33, 1100, seed=9).to(torch.bfloat16).to(device)
    r = _rows(33, 1100, seed=10).to(torch.bfloat16).to(device)
    w = _norm_weight(1100, seed=11).to(torch.bfloat16).to(device)
    q, s, _ = rmsnorm.fused_add_rms_norm_fp8(x, r, w, EPS)
    for start, rows in [(0, 1), (16, 1), (32, 1), (3, 7), (10, 20)]:
        part_q, part_s, _ = rmsnorm.fused_add_rms_norm_fp8(
            x[start : start + rows], r[start : start + rows], w, EPS
        )
        assert torch.equal(_bits(part_q), _bits(q[start : start + rows])), (start, rows)
        assert torch.equal(part_s, s[start : start + rows]), (start, rows)


def test_norm_fp8_sums_squares_in_the_plain_kernels_layout_on_hopper(tmp_path: Path) -> None:
    """The interpreter has no layouts, so the bit identity above says nothing of the compiled order
    of the row's float32 sum; compiled for sm_90 (norm_fp8_compile.py), both kernels reduce the
    same layout, at widths below one group, with tails, at 4 and 8 warps."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "triton"), TRITON_DEFAULT_FP_FUSION="1")
    script = Path(__file__).with_name("norm_fp8_compile.py")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    cases = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(cases) == 12, done.stdout
    layouts: dict[tuple[int, bool], dict[str, list[str]]] = {}
    for c in cases:
        layouts.setdefault((c["n"], c["residual"]), {})[c["kernel"]] = c["sum_layouts"]
    for key, both in layouts.items():
        assert len(both["plain"]) == 1 and both["fp8"] == both["plain"], (key, both)


def test_norm_fp8_rejects_what_the_norm_rejects(device: torch.device) -> None:
    x = torch.randn(2, 8, device=device)
    with pytest.raises(ValueError, match=r"weight.shape"):
        rmsnorm.rms_norm_fp8(x, torch.ones(7, device=device), EPS)
    with pytest.raises(ValueError, match=r"residual.shape"):
        rmsnorm.fused_add_rms_norm_fp8(x, torch.randn(3, 8, device=device), torch.ones(8, device=device), EPS)
    with pytest.raises(ValueError, match=r"residual.dtype"):
        rmsnorm.fused_add_rms_norm_fp8(x, x.half(), torch.ones(8, device=device), EPS)
    four_d = torch.randn(2, 3, 4, 16, device=device).transpose(1, 2)
    with pytest.raises(ValueError, match=r"more than 3 dims"):
        rmsnorm.rms_norm_fp8(four_d, torch.ones(16, device=device), EPS)


def _gate_up(m: int, inter: int, seed: int) -> torch.Tensor:
    """[m, 2 * inter]: gates of both signs over many magnitudes (silu's flat negative side
    included), ups scaled per channel group, a zero row."""
    x = _rows(m, 2 * inter, seed=seed, lo=-8, hi=4)
    x[:, inter:] *= 2.0 ** ((torch.arange(inter) // 128 % 4) * 3 - 6).float()
    return x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inter", [40, 128, 300, 1100])
def test_silu_and_mul_fp8_is_silu_and_mul_then_quantise(
    device: torch.device, dtype: torch.dtype, inter: int
) -> None:
    """1100 channels are 9 groups: two programs of 8 groups, the second past the row's end."""
    x = _gate_up(6, inter, seed=inter).to(dtype).to(device)
    q, s = activation.silu_and_mul_fp8(x)
    _assert_quantised_as(q, s, activation.silu_and_mul(x))


def test_silu_and_mul_fp8_on_views(device: torch.device) -> None:
    """A 2-D view with a row stride (a column slice) and a contiguous 3-D tensor."""
    wide = _gate_up(5, 300 + 20, seed=12).to(torch.bfloat16).to(device)
    view = wide[:, : 2 * 300]
    q, s = activation.silu_and_mul_fp8(view)
    _assert_quantised_as(q, s, activation.silu_and_mul(view))
    three = _gate_up(6, 200, seed=13).to(torch.bfloat16).to(device).view(2, 3, 400)
    q, s = activation.silu_and_mul_fp8(three)
    assert q.shape == (2, 3, 200) and s.shape == (2, 3, 2)
    _assert_quantised_as(q, s, activation.silu_and_mul(three))


def test_silu_and_mul_fp8_rows_do_not_depend_on_the_batch(device: torch.device) -> None:
    x = _gate_up(33, 1100, seed=14).to(torch.bfloat16).to(device)
    q, s = activation.silu_and_mul_fp8(x)
    for start, rows in [(0, 1), (16, 1), (32, 1), (3, 7)]:
        part_q, part_s = activation.silu_and_mul_fp8(x[start : start + rows])
        assert torch.equal(_bits(part_q), _bits(q[start : start + rows])), (start, rows)
        assert torch.equal(part_s, s[start : start + rows]), (start, rows)


def test_silu_and_mul_fp8_rejects_bad_inputs(device: torch.device) -> None:
    with pytest.raises(ValueError, match=r"even last dim"):
        activation.silu_and_mul_fp8(torch.randn(2, 7, device=device))
    with pytest.raises(ValueError, match=r"a 3-D view"):
        activation.silu_and_mul_fp8(torch.randn(2, 3, 8, device=device).transpose(0, 1))


@pytest.fixture
def triton_ops(monkeypatch: pytest.MonkeyPatch, device: torch.device) -> None:
    """ops' CUDA branch, on the CPU through the interpreter."""
    monkeypatch.setattr(ops, "_use_triton", lambda t: True)


@pytest.mark.parametrize("scales", ["block", "channel"])
def test_prequantized_linear_gives_linear_fp8s_bits(
    device: torch.device, triton_ops: None, scales: str
) -> None:
    """The fused norm and activation feeding the GEMM through ops: equal to ops.linear_fp8 on the
    plain kernels' outputs (which quantises inside), at the tiling linear_fp8 picks."""
    hidden, inter = 200, 300
    x = _rows(5, hidden, seed=15).to(torch.bfloat16).to(device)
    r = _rows(5, hidden, seed=16).to(torch.bfloat16).to(device)
    w = _norm_weight(hidden, seed=17).to(torch.bfloat16).to(device)
    g = torch.Generator().manual_seed(18)
    up_w = torch.randn(2 * inter, hidden, generator=g) * hidden**-0.5
    down_w = torch.randn(hidden, inter, generator=g) * inter**-0.5
    if scales == "block":
        (up_q, up_s), (down_q, down_s) = ref.quantize_blocks(up_w), ref.quantize_blocks(down_w)
    else:
        (up_q, up_s), (down_q, down_s) = ref.quantize_channels(up_w), ref.quantize_channels(down_w)
    up_q, up_s, down_q, down_s = (t.to(device) for t in (up_q, up_s, down_q, down_s))
    bias = torch.randn(2 * inter, generator=g).to(torch.bfloat16).to(device)

    xq, summed = ops.fused_add_rms_norm_fp8(x, r, w, EPS)
    gate_up = ops.linear_fp8_prequantized(xq, up_q, up_s, bias)
    out = ops.linear_fp8_prequantized(ops.silu_and_mul_fp8(gate_up), down_q, down_s)

    normed, want_sum = ops.fused_add_rms_norm(x, r, w, EPS)
    want_gate_up = ops.linear_fp8(normed, up_q, up_s, bias)
    want = ops.linear_fp8(ops.silu_and_mul(want_gate_up), down_q, down_s)
    assert torch.equal(summed, want_sum)
    assert torch.equal(gate_up, want_gate_up) and gate_up.dtype == torch.bfloat16
    assert torch.equal(out, want) and out.shape == (5, hidden)
    # and the same bits as fp8_matmul's own entry point
    assert torch.equal(want_gate_up, fp8_matmul.linear_fp8(normed, up_q, up_s, bias))


def test_prequantized_linear_checks_its_operands(device: torch.device, triton_ops: None) -> None:
    xq = Fp8Activation(*ref.quantize_groups(torch.randn(3, 256)), torch.bfloat16)
    xq = Fp8Activation(xq.q.to(device), xq.scale.to(device), xq.dtype)
    wq, ws = (t.to(device) for t in ref.quantize_blocks(torch.randn(64, 256)))
    with pytest.raises(ValueError, match=r"weight.shape.*K must equal"):
        ops.linear_fp8_prequantized(xq, wq[:, :128].contiguous(), ws[:, :1].contiguous())
    with pytest.raises(ValueError, match=r"weight_scale.shape"):
        ops.linear_fp8_prequantized(xq, wq, ws[:, :1].contiguous())
    with pytest.raises(ValueError, match=r"bias.dtype"):
        ops.linear_fp8_prequantized(xq, wq, ws, torch.zeros(64, device=device))
    with pytest.raises(ValueError, match=r"Fp8Activation.scale"):
        Fp8Activation(xq.q, xq.scale[:, :1].contiguous(), torch.bfloat16)
    with pytest.raises(ValueError, match=r"Fp8Activation.q"):
        Fp8Activation(xq.q.float(), xq.scale, torch.bfloat16)
