"""The dispatch layer: CPU tensors take the reference path, with the reference's signatures."""

from __future__ import annotations

import pytest
import torch

from shardinfer.engine.sampling_noise import gumbel_noise
from shardinfer.kernels import ops, reference, reference_sampling


def test_cpu_tensors_use_the_reference() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 8, generator=gen)
    w = torch.randn(8, generator=gen)
    assert torch.equal(ops.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6))
    assert torch.equal(ops.silu_and_mul(x), reference.silu_and_mul(x))
    out, summed = ops.fused_add_rms_norm(x, x, w, 1e-6)
    ref_out, ref_sum = reference.fused_add_rms_norm(x, x, w, 1e-6)
    assert torch.equal(out, ref_out) and torch.equal(summed, ref_sum)


def test_paged_attention_accepts_tensors_or_lists_on_cpu() -> None:
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(3, 2, 8, generator=gen)
    kc = torch.randn(2, 4, 1, 8, generator=gen)
    vc = torch.randn(2, 4, 1, 8, generator=gen)
    bt = torch.tensor([[1, 0]], dtype=torch.int32)
    from_lists = ops.paged_attention(q, kc, vc, [0, 3], [6], bt, 0.3)
    from_tensors = ops.paged_attention(q, kc, vc, torch.tensor([0, 3]), torch.tensor([6]), bt, 0.3)
    assert torch.equal(from_lists, from_tensors)
    assert torch.equal(from_lists, reference.paged_attention(q, kc, vc, [0, 3], [6], bt, 0.3))


def test_sample_on_cpu_needs_noise_and_then_matches_reference() -> None:
    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(2))
    args = (
        torch.tensor([1.0, 0.0]),
        torch.tensor([-1, -1], dtype=torch.int32),
        torch.tensor([0.9, 1.0]),
        torch.tensor([0.0, 0.0]),
        torch.tensor([5, 6]),
        torch.tensor([10, 11]),
    )
    with pytest.raises(ValueError, match="noise"):
        ops.sample(logits, *args)
    noise = gumbel_noise(args[4], args[5], 50)
    got = ops.sample(logits, *args, noise=noise)
    assert torch.equal(got, reference_sampling.sample(logits, *args[:4], noise))
