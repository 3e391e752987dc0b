"""Plain-PyTorch reference of DeepSeek-style mixture-of-experts: routing and the expert computation.

Two functions, each one a future GPU kernel:

* `grouped_topk` turns router logits into (weights, expert ids) the way DeepSeek-V3's official
  inference code does: sigmoid scores; `e_score_correction_bias` added only to choose experts;
  experts split into `n_group` groups, a group scored by the sum of its two best (biased) expert
  scores, all but the best `topk_group` groups masked to -inf; the top-k weights are the unbiased
  scores, renormalised and multiplied by `routed_scaling_factor`.
* `moe_experts` runs each token through its chosen experts (SwiGLU) and sums the weighted outputs.

Batch invariance: every matmul goes through `reference.linear`, whose fixed row tiles make a row's
result independent of the rows sharing the call, so a token's output does not depend on which
other tokens picked the same expert; the weighted sum runs over the token's k slots in slot order,
a function of the token alone.

Ties (equal scores) go to the lowest expert or group index, as in the Triton routing kernel
(kernels/moe_routing.py): torch.topk leaves the order of equal values unspecified, so choices
are made by a stable descending sort.

On CUDA the engine calls `ops.moe_experts` (the fused kernel of kernels/moe.py) and the routing
kernel instead; `moe_experts` here reads expert ids back to the host, so it refuses to run
inside a CUDA graph capture.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from shardinfer.kernels import reference as ops


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
    """Choose top_k experts per token.

    router_logits [T, E] (any float dtype; scored in float32), e_score_correction_bias [E] or None.
    Returns (topk_weights [T, top_k] float32, topk_ids [T, top_k] int64), slots ordered by
    descending biased score. With topk_group >= n_group every group is eligible, and the result is
    plain top-k over all experts.
    """
    logits = router_logits.float()
    if scoring_func == "sigmoid":
        scores = ops.sigmoid(logits)  # position-independent rounding (see reference.sigmoid)
    elif scoring_func == "softmax":
        scores = logits.softmax(dim=-1)
    else:
        raise ValueError(f"scoring_func={scoring_func!r} is not supported; use 'sigmoid' or 'softmax'")
    t, e = scores.shape
    choice = scores if e_score_correction_bias is None else scores + e_score_correction_bias.float()
    if n_group > 1 and topk_group < n_group:
        grouped = choice.view(t, n_group, e // n_group)
        if e_score_correction_bias is None:
            group_scores = grouped.amax(dim=-1)  # the official code's rule when there is no bias
        else:
            group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
        keep = _topk_indices(group_scores, topk_group)
        group_mask = torch.zeros(t, n_group, dtype=torch.bool, device=scores.device)
        group_mask.scatter_(1, keep, True)
        # -inf, not 0: with a negative bias a masked expert could otherwise outrank a kept one.
        choice = grouped.masked_fill(~group_mask.unsqueeze(-1), float("-inf")).view(t, e)
    topk_ids = _topk_indices(choice, top_k)
    weights = scores.gather(1, topk_ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights * routed_scaling_factor, topk_ids


def _topk_indices(values: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest values per row, in descending order, equal values lowest index first."""
    return values.sort(dim=-1, descending=True, stable=True).indices[:, :k]


def moe_experts(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    batch_invariant: bool = True,
) -> torch.Tensor:
    """Routed-expert output: sum_j topk_weights[t, j] * expert_{topk_ids[t, j]}(x[t]).

    x [T, H]; topk_ids [T, k] int; topk_weights [T, k] (float32); w_gate_up [E, 2I, H] holding each
    expert's [gate | up] rows; w_down [E, H, I]. An expert is down(silu(gate x) * up x).
    Returns [T, H] in x's dtype; the weighted sum is accumulated in float32.
    """
    if x.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "reference_moe.moe_experts reads expert ids back to the host and cannot run in a "
            "CUDA graph capture; call kernels.ops.moe_experts, which runs the fused kernel on CUDA"
        )
    return weighted_sum(
        _slots_gathered(x, topk_ids, w_gate_up, w_down, batch_invariant), topk_weights, x.dtype
    )


def moe_experts_fp8(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_gate_up_scale: torch.Tensor,
    w_down: torch.Tensor,
    w_down_scale: torch.Tensor,
    batch_invariant: bool = True,
) -> torch.Tensor:
    """moe_experts with FP8 experts (w_gate_up [E, 2I, H], w_down [E, H, I] float8_e4m3fn, scales
    [E, ceil(rows/128), ceil(cols/128)] or per channel [E, rows], float32), as kernels/fp8_moe.py computes it: the
    input and the gate/up output quantised per token and 128 channels, each product of the
    dequantised operands in float32, the gate/up and down outputs rounded to x's dtype."""
    if x.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "reference_moe.moe_experts_fp8 reads expert ids back to the host and cannot run in a "
            "CUDA graph capture; call kernels.ops.moe_experts, which runs the fused kernel on CUDA"
        )
    slot_out = expert_slots(x, topk_ids, w_gate_up, w_down, batch_invariant, w_gate_up_scale, w_down_scale)
    return weighted_sum(slot_out, topk_weights, x.dtype)


def expert_slots(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    batch_invariant: bool = True,
    w_gate_up_scale: torch.Tensor | None = None,
    w_down_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Each slot's expert output before the weighting, [T, k, H] float32: expert topk_ids[t, j] of
    the stacked weights applied to x[t] (FP8 experts when their scales are given, computed as
    moe_experts_fp8 describes). A row's result depends on that row and its expert alone, so the
    slots may be computed anywhere (another rank of an expert-parallel group) and combined later
    by `weighted_sum` with the same bits."""
    if w_gate_up_scale is None or w_down_scale is None:
        return _slots_gathered(x, topk_ids, w_gate_up, w_down, batch_invariant)
    from shardinfer.kernels.reference_fp8 import dequantize_groups, dequantize_weight, quantize_groups

    gate_up_scale, down_scale = w_gate_up_scale, w_down_scale

    def expert(rows: torch.Tensor, e: int) -> torch.Tensor:
        wgu = dequantize_weight(w_gate_up[e], gate_up_scale[e])
        wd = dequantize_weight(w_down[e], down_scale[e])
        h = ops.linear(dequantize_groups(*quantize_groups(rows)), wgu, None, batch_invariant).to(x.dtype)
        act = ops.silu_and_mul(h)
        return (
            ops.linear(dequantize_groups(*quantize_groups(act)), wd, None, batch_invariant)
            .to(x.dtype)
            .float()
        )

    return _gather_slots(x, topk_ids, expert)


def _expert(
    x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, batch_invariant: bool
) -> torch.Tensor:
    return ops.linear(
        ops.silu_and_mul(ops.linear(x, w_gate_up, None, batch_invariant)), w_down, None, batch_invariant
    ).float()


def _slots_gathered(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    batch_invariant: bool,
) -> torch.Tensor:
    """Each chosen expert runs on exactly the tokens that chose it: [T, k, H] float32."""
    return _gather_slots(x, topk_ids, lambda rows, e: _expert(rows, w_gate_up[e], w_down[e], batch_invariant))


def _gather_slots(
    x: torch.Tensor, topk_ids: torch.Tensor, run_expert: Callable[[torch.Tensor, int], torch.Tensor]
) -> torch.Tensor:
    """[T, k, H] float32: run_expert(rows, e) on exactly the tokens whose slots chose expert e."""
    t, k = topk_ids.shape
    flat_ids = topk_ids.reshape(-1)
    token_of_slot = torch.arange(t, device=x.device).repeat_interleave(k)
    slot_out = torch.zeros(t * k, x.shape[-1], dtype=torch.float32, device=x.device)
    for expert in torch.unique(flat_ids).tolist():
        slots = (flat_ids == expert).nonzero(as_tuple=True)[0]
        slot_out[slots] = run_expert(x[token_of_slot[slots]], expert)
    return slot_out.view(t, k, x.shape[-1])


def weighted_sum(slot_out: torch.Tensor, topk_weights: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """sum_j topk_weights[:, j] * slot_out[:, j] in float32, in x's dtype."""
    weights = topk_weights.float()
    out = torch.zeros(slot_out.shape[0], slot_out.shape[-1], dtype=torch.float32, device=slot_out.device)
    for j in range(slot_out.shape[1]):  # fixed slot order: the sum's rounding depends on the token alone
        out = out + slot_out[:, j] * weights[:, j : j + 1]
    return out.to(dtype)


def _slots_capturable(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    batch_invariant: bool,
) -> torch.Tensor:
    """The same [T, k, H] without data-dependent shapes or host syncs: every expert runs on every
    token and each slot keeps its own expert's rows. With batch-invariant row tiles a row's result
    is the one the gathered path computes. No engine path uses it (CUDA runs the fused kernel);
    it stays as a cross-check of the gathered path."""
    t, k = topk_ids.shape
    slot_out = torch.zeros(t, k, x.shape[-1], dtype=torch.float32, device=x.device)
    for expert in range(w_gate_up.shape[0]):
        y = _expert(x, w_gate_up[expert], w_down[expert], batch_invariant)
        slot_out = torch.where((topk_ids == expert).unsqueeze(-1), y.unsqueeze(1), slot_out)
    return slot_out


def align_to_experts(
    topk_ids: torch.Tensor, n_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reference of moe.align_to_experts: (sorted_slots [P] int32, -1 padded; block_expert [P / block_m];
    slot_positions [T * k] int32, each slot's index in sorted_slots).

    Slots t * k + j grouped by expert in increasing slot order, each expert's run padded to a
    multiple of block_m; tiles past the last run belong to expert n_experts (none).
    P = ceil((T * k + n_experts * (block_m - 1)) / block_m) * block_m.
    """
    flat = topk_ids.reshape(-1).long()
    n_slots = flat.numel()
    counts = torch.bincount(flat, minlength=n_experts)[:n_experts]
    padded = (counts + block_m - 1) // block_m * block_m
    starts = torch.cumsum(padded, 0) - padded
    total = -(-(n_slots + n_experts * (block_m - 1)) // block_m) * block_m
    sorted_slots = torch.full((total,), -1, dtype=torch.int32)
    block_expert = torch.full((total // block_m,), n_experts, dtype=torch.int32)
    slot_positions = torch.full((n_slots,), -1, dtype=torch.int32)
    for e in range(n_experts):
        slots = (flat == e).nonzero().flatten()
        first = int(starts[e])
        sorted_slots[first : first + slots.numel()] = slots.to(torch.int32)
        slot_positions[slots] = torch.arange(first, first + slots.numel(), dtype=torch.int32)
        block_expert[first // block_m : (first + int(padded[e])) // block_m] = e
    return sorted_slots, block_expert, slot_positions
