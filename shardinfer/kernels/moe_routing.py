"""Group-limited top-k routing of DeepSeek-style MoE layers, one Triton program per token.

Semantics are those of reference_moe.grouped_topk (the oracle of the tests):

1. scores = sigmoid(logits) computed as 1 / (1 + exp(-x)) (see reference.sigmoid), or softmax;
2. choice = scores + e_score_correction_bias (the bias only chooses, it never weights);
3. with n_group > 1 and topk_group < n_group: a group's score is the sum of its two best
   choice values (its best one when there is no bias, DeepSeek-V2's rule); all but the best
   topk_group groups are masked to -inf;
4. the top_k experts by choice, in descending order; weights = their unbiased scores,
   renormalised (when asked) and multiplied by routed_scaling_factor.

Equal values go to the lowest group / expert index, as in the reference's stable sort. The
layout is a [groups, experts per group] tile (both padded to powers of two), so group scores
are row reductions and expert e sits at (e // per_group, e % per_group).

Batch invariance: a program reads one token's logits and writes one token's result; nothing
is shared across tokens. Capturable: the grid is (T,), no host sync.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from shardinfer.kernels._common import FLOAT_DTYPES, check_same_device, check_tensor, fail, next_pow2


@triton.jit
def _first_argmax(values, index, BIG: tl.constexpr):
    """(max, lowest index holding it) over a 2-D tile."""
    best = tl.max(tl.max(values, axis=1), axis=0)
    where = tl.min(tl.min(tl.where(values == best, index, BIG), axis=1), axis=0)
    return best, where


@triton.jit
def _grouped_topk_kernel(
    logits_ptr,
    bias_ptr,
    weights_ptr,
    ids_ptr,
    stride_t,
    n_experts,
    per_group,
    n_group,
    scale,
    HAS_BIAS: tl.constexpr,
    SOFTMAX: tl.constexpr,
    LIMIT_GROUPS: tl.constexpr,
    TOPK_GROUP: tl.constexpr,
    TOP_K: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    TOP_K_PAD: tl.constexpr,
    GROUPS: tl.constexpr,
    PER_GROUP: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    g = tl.arange(0, GROUPS)
    j = tl.arange(0, PER_GROUP)
    valid = (g[:, None] < n_group) & (j[None, :] < per_group)
    big = GROUPS * PER_GROUP
    column = g[:, None] * per_group + j[None, :]
    expert = tl.where(valid, column, big)  # padding must not alias a real expert's index
    x = tl.load(logits_ptr + t * stride_t + column, mask=valid, other=0.0).to(tl.float32)
    neg_inf = float("-inf")
    if SOFTMAX:
        x = tl.where(valid, x, neg_inf)
        e = tl.exp(x - tl.max(tl.max(x, axis=1), axis=0))
        scores = e / tl.sum(tl.sum(e, axis=1), axis=0)
    else:
        scores = 1.0 / (1.0 + tl.exp(-x))
    choice = scores
    if HAS_BIAS:
        choice = choice + tl.load(bias_ptr + column, mask=valid, other=0.0).to(tl.float32)
    choice = tl.where(valid, choice, neg_inf)
    if LIMIT_GROUPS:
        best = tl.max(choice, axis=1)
        if HAS_BIAS:  # sum of the group's two best; which of two equal values is dropped does not matter
            first = tl.min(tl.where(choice == best[:, None], j[None, :], PER_GROUP), axis=1)
            second = tl.max(tl.where(j[None, :] == first[:, None], neg_inf, choice), axis=1)
            group_score = best + second
        else:
            group_score = best
        group_score = tl.where(g < n_group, group_score, neg_inf)
        keep = g < 0
        for _ in tl.static_range(TOPK_GROUP):
            top = tl.max(group_score, axis=0)
            pick = tl.min(tl.where(group_score == top, g, GROUPS), axis=0)
            keep = keep | (g == pick)
            group_score = tl.where(g == pick, neg_inf, group_score)
        choice = tl.where(keep[:, None], choice, neg_inf)
    # The k picks stay in registers and are stored once at the end.
    slots = tl.arange(0, TOP_K_PAD)
    picked_w = tl.zeros([TOP_K_PAD], tl.float32)
    picked_id = tl.zeros([TOP_K_PAD], tl.int32)
    for i in tl.static_range(TOP_K):
        _, pick = _first_argmax(choice, expert, big)
        w = tl.sum(tl.sum(tl.where(expert == pick, scores, 0.0), axis=1), axis=0)
        picked_w = tl.where(slots == i, w, picked_w)
        picked_id = tl.where(slots == i, pick, picked_id)
        choice = tl.where(expert == pick, neg_inf, choice)
    if RENORMALIZE:
        picked_w = picked_w / tl.sum(picked_w, axis=0)
    picked_w = picked_w * scale
    out = t * TOP_K + slots
    tl.store(weights_ptr + out, picked_w, mask=slots < TOP_K)
    tl.store(ids_ptr + out, picked_id.to(tl.int64), mask=slots < TOP_K)


def grouped_topk(
    router_logits: torch.Tensor,
    e_score_correction_bias: torch.Tensor | None,
    top_k: int,
    n_group: int = 1,
    topk_group: int = 1,
    renormalize: bool = True,
    routed_scaling_factor: float = 1.0,
    scoring_func: str = "sigmoid",
) -> tuple[torch.Tensor, torch.Tensor]:
    """reference_moe.grouped_topk on the GPU: (weights [T, top_k] float32, ids [T, top_k] int64).

    router_logits [T, E] float32/float16/bfloat16 with a contiguous last dim (scored in float32);
    e_score_correction_bias [E] or None. Raises ValueError naming a bad argument.
    """
    check_tensor("router_logits", router_logits, dtypes=FLOAT_DTYPES, ndim=2, last_dim_contiguous=True)
    t, n_experts = router_logits.shape
    if scoring_func not in ("sigmoid", "softmax"):
        raise fail("scoring_func", repr(scoring_func), "need 'sigmoid' or 'softmax'")
    if n_group < 1 or n_experts % n_group:
        raise fail("n_group", n_group, f"need a divisor of the {n_experts} experts")
    if not 0 < topk_group <= n_group:
        raise fail("topk_group", topk_group, f"need 1..n_group={n_group}")
    limit_groups = n_group > 1 and topk_group < n_group
    per_group = n_experts // n_group
    eligible = topk_group * per_group if limit_groups else n_experts
    if not 0 < top_k <= eligible:
        raise fail("top_k", top_k, f"need 1..{eligible} (the experts of the kept groups)")
    if limit_groups and e_score_correction_bias is not None and per_group < 2:
        raise fail(
            "n_group", n_group, f"scoring groups by their top-2 needs >= 2 experts per group, got {per_group}"
        )
    if e_score_correction_bias is not None:
        check_tensor(
            "e_score_correction_bias", e_score_correction_bias, dtypes=FLOAT_DTYPES, ndim=1, contiguous=True
        )
        if e_score_correction_bias.shape[0] != n_experts:
            raise fail(
                "e_score_correction_bias.shape", tuple(e_score_correction_bias.shape), f"need ({n_experts},)"
            )
    check_same_device(router_logits=router_logits, e_score_correction_bias=e_score_correction_bias)
    weights = torch.empty(t, top_k, dtype=torch.float32, device=router_logits.device)
    ids = torch.empty(t, top_k, dtype=torch.int64, device=router_logits.device)
    if t == 0:
        return weights, ids
    groups = n_group if limit_groups else 1
    bias = e_score_correction_bias if e_score_correction_bias is not None else weights
    _grouped_topk_kernel[(t,)](
        router_logits,
        bias,
        weights,
        ids,
        router_logits.stride(0),
        n_experts,
        n_experts // groups,
        groups,
        float(routed_scaling_factor),
        HAS_BIAS=e_score_correction_bias is not None,
        SOFTMAX=scoring_func == "softmax",
        LIMIT_GROUPS=limit_groups,
        TOPK_GROUP=topk_group,
        TOP_K=top_k,
        RENORMALIZE=renormalize,
        TOP_K_PAD=max(2, next_pow2(top_k)),
        GROUPS=max(2, next_pow2(groups)),
        PER_GROUP=max(2, next_pow2(n_experts // groups)),
        num_warps=1 if n_experts <= 128 else 2,
    )
    return weights, ids
