"""Routing kernel (kernels/moe_routing.py) against reference_moe.grouped_topk: the same experts in
the same order, weights within float32 rounding (exp and the sum's order differ between numpy,
torch and the GPU), equal scores resolved lowest index first, and each token's result bitwise
independent of the other tokens of the call."""

from __future__ import annotations

import pytest
import torch

from shardinfer.kernels import reference_moe
from shardinfer.kernels.moe_routing import grouped_topk

# (experts, n_group, topk_group, top_k, bias, scoring, renormalize)
CASES = {
    "v3_one_group": (64, 1, 1, 6, True, "sigmoid", True),  # moe-16b's router
    "v3_group_limited": (16, 4, 2, 3, True, "sigmoid", True),
    "v3_groups_not_pow2": (20, 4, 3, 4, True, "sigmoid", True),  # 5 experts per group: padded tile
    "v3_all_groups_kept": (12, 3, 3, 4, True, "sigmoid", False),
    "v2_group_limited": (16, 4, 2, 3, False, "softmax", False),  # groups scored by their best expert
    "v2_greedy": (10, 1, 1, 2, False, "softmax", True),
}


def _logits(t: int, e: int, bias: bool, seed: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(t, e, generator=gen) * 2
    # A negative bias makes biased scores negative, which tells a -inf group mask from a 0 mask.
    b = -1.0 + 0.5 * torch.randn(e, generator=gen) if bias else None
    return logits, b


@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(device: torch.device, case: str) -> None:
    e, n_group, topk_group, top_k, has_bias, scoring, renorm = CASES[case]
    logits, bias = _logits(12, e, has_bias, seed=len(case))
    want_w, want_ids = reference_moe.grouped_topk(
        logits, bias, top_k, n_group, topk_group, renorm, 2.5, scoring
    )
    w, ids = grouped_topk(
        logits.to(device),
        None if bias is None else bias.to(device),
        top_k,
        n_group,
        topk_group,
        renorm,
        2.5,
        scoring,
    )
    assert ids.dtype == torch.int64 and w.dtype == torch.float32
    assert torch.equal(ids.cpu(), want_ids)
    torch.testing.assert_close(w.cpu(), want_w, rtol=1e-6, atol=0)


def test_bfloat16_logits_are_scored_in_float32(device: torch.device) -> None:
    logits, bias = _logits(6, 16, True, seed=7)
    logits = logits.bfloat16()
    want_w, want_ids = reference_moe.grouped_topk(logits, bias, 3, 4, 2, True, 1.0)
    w, ids = grouped_topk(logits.to(device), bias.to(device), 3, 4, 2, True, 1.0)
    assert torch.equal(ids.cpu(), want_ids)
    torch.testing.assert_close(w.cpu(), want_w, rtol=1e-6, atol=0)


def test_ties_go_to_the_lowest_index(device: torch.device) -> None:
    # 8 experts in 4 groups of 2, keep 2 groups, pick 3 experts, no bias (sigmoid scores).
    # Token 0: groups 0, 1, 2 tie (all scores equal), group 3 is worse -> groups 0 and 1 kept,
    #   then four equal experts 0..3 -> experts 0, 1, 2.
    # Token 1: groups 1 and 3 tie at the top, group 2 is worse, group 0 worst -> groups 1, 3;
    #   experts 2, 3, 6, 7 all equal -> 2, 3, 6.
    # Token 2: groups 2 (logits 1, 3) and 0 (1, 1) kept; expert 5 (logit 3) leads, then experts
    #   0, 1 and 4 tie -> 0, 1.
    bias = torch.zeros(8)
    logits = torch.tensor(
        [
            [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0],
            [-2.0, -2.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0],
            [1.0, 1.0, -3.0, -3.0, 1.0, 3.0, -1.0, -1.0],
        ]
    )
    want_ids = torch.tensor([[0, 1, 2], [2, 3, 6], [5, 0, 1]])
    ref_w, ref_ids = reference_moe.grouped_topk(logits, bias, 3, 4, 2, True, 1.0)
    assert torch.equal(ref_ids, want_ids)
    w, ids = grouped_topk(logits.to(device), bias.to(device), 3, 4, 2, True, 1.0)
    assert torch.equal(ids.cpu(), want_ids)
    torch.testing.assert_close(w.cpu(), ref_w, rtol=1e-6, atol=0)
    # Plain top-k with repeated values, one group.
    flat = torch.tensor([[0.5, 2.0, 2.0, 0.1, 2.0, 2.0]])
    _, ids = grouped_topk(flat.to(device), None, 3, scoring_func="softmax")
    assert ids.cpu().tolist() == [[1, 2, 4]]
    assert reference_moe.grouped_topk(flat, None, 3, scoring_func="softmax")[1].tolist() == [[1, 2, 4]]


def test_token_alone_equals_token_in_batch(device: torch.device) -> None:
    logits, bias = _logits(10, 16, True, seed=3)
    args = (bias.to(device), 3, 4, 2, True, 2.5)
    full_w, full_ids = grouped_topk(logits.to(device), *args)
    for i in (0, 4, 9):
        w, ids = grouped_topk(logits[i : i + 1].to(device), *args)
        assert torch.equal(ids, full_ids[i : i + 1]) and torch.equal(w, full_w[i : i + 1])
    perm = torch.randperm(10, generator=torch.Generator().manual_seed(0))
    w, ids = grouped_topk(logits[perm].to(device), *args)
    assert torch.equal(ids, full_ids[perm.to(device)]) and torch.equal(w, full_w[perm.to(device)])


def test_empty_batch_and_bad_arguments(device: torch.device) -> None:
    w, ids = grouped_topk(torch.empty(0, 8, device=device), None, 2)
    assert w.shape == (0, 2) and ids.shape == (0, 2)
    logits = torch.randn(2, 8, device=device)
    with pytest.raises(ValueError, match="n_group"):
        grouped_topk(logits, None, 2, n_group=3, topk_group=1)
    with pytest.raises(ValueError, match="top_k"):
        grouped_topk(logits, None, 5, n_group=4, topk_group=2)
    with pytest.raises(ValueError, match=r"e_score_correction_bias\.shape"):
        grouped_topk(logits, torch.zeros(7, device=device), 2)
    with pytest.raises(ValueError, match="scoring_func"):
        grouped_topk(logits, None, 2, scoring_func="relu")
