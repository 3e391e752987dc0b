"""Routed experts across ranks: dispatch each token slot to the rank holding its expert, combine.

One MoE call on rank r, for its own tokens x [T, H] with routing (topk_ids, topk_weights) [T, k]:

1. Each slot (t, j) picks a physical replica of its logical expert (placement.choose_slots); the
   replica's rank is where the row goes. Slots are sent grouped by destination rank, in slot
   order within a rank.
2. Three all-to-alls: the row counts, the rows themselves (sent as raw bytes, so any dtype
   travels), and each row's local slot on the receiving rank.
3. Every rank computes its received rows with its local experts (`compute`: [n, H] float32, the
   same per-row function the single-process layer uses, reference_moe.expert_slots).
4. One all-to-all returns the float32 rows; the origin puts each back in its slot and sums the
   k slots in slot order (reference_moe.weighted_sum).

Why a token's output has the single-process bits: the expert computation of a row depends on the
row and the expert's weights alone (batch-invariant matmuls), every replica holds the same
weights, float32 rows travel unchanged, and the combine is the single-process combine over the
same [k, H] rows in the same order. So neither the rank count, nor which rank holds an expert,
nor which replica a slot picks changes any bit.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from shardinfer.engine.parallel.group import ExpertParallelGroup
from shardinfer.kernels.reference_moe import weighted_sum

Compute = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _all_to_all(
    group: ExpertParallelGroup, what: str, send: torch.Tensor, send_counts: list[int], recv_counts: list[int]
) -> torch.Tensor:
    """Rows of `send` split by send_counts to each rank; returns the rows received, by recv_counts."""
    recv = torch.empty((sum(recv_counts), *send.shape[1:]), dtype=send.dtype, device=send.device)
    group.collective(
        what, lambda: dist.all_to_all_single(recv, send, recv_counts, send_counts, group=group.process_group)
    )
    return recv


def all_to_all_rows(
    group: ExpertParallelGroup, what: str, rows: torch.Tensor, send_counts: list[int], recv_counts: list[int]
) -> torch.Tensor:
    """`_all_to_all` for rows [n, ...] of any dtype, moved as raw bytes (gloo moves every dtype's
    bytes alike, FP8 included): returns [sum(recv_counts), ...] in rows' dtype."""
    shape = rows.shape[1:]
    nbytes = shape.numel() * rows.element_size()
    if rows.numel():
        as_bytes = rows.contiguous().view(torch.uint8).reshape(rows.shape[0], nbytes)
    else:  # viewing an empty tensor's bytes is refused; there are none to move
        as_bytes = torch.empty(rows.shape[0], nbytes, dtype=torch.uint8, device=rows.device)
    got = _all_to_all(group, what, as_bytes, send_counts, recv_counts)
    return got.view(rows.dtype).reshape(-1, *shape)


def exchange_routed(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    group: ExpertParallelGroup,
    layer: int,
    compute: Compute,
) -> torch.Tensor:
    """The routed experts' weighted output for this rank's tokens, [T, H] in x's dtype.

    Every rank of the group must call this for the same layers in the same order (a rank with no
    tokens passes T = 0): it sends and receives in four collectives. compute(rows [n, H],
    local_slot [n] int64) -> [n, H] float32 runs this rank's experts on the rows it received."""
    placement = group.placement
    if layer == 0:  # the first MoE layer of a forward
        group.forwards += 1
    t, k = topk_ids.shape
    hidden = x.shape[-1]
    per_rank = placement.slots_per_rank
    token_index = torch.arange(t, device=topk_ids.device)
    slots = placement.choose_slots(topk_ids, token_index).reshape(-1).to(torch.int64)
    dest = torch.div(slots, per_rank, rounding_mode="floor")
    order = torch.sort(dest, stable=True).indices
    send_counts_t = torch.bincount(dest, minlength=group.size).to(torch.int64)
    recv_counts_t = _all_to_all(
        group, "row count", send_counts_t.view(-1, 1), [1] * group.size, [1] * group.size
    ).view(-1)
    send_counts, recv_counts = send_counts_t.tolist(), recv_counts_t.tolist()
    received = all_to_all_rows(
        group, "token row", x[torch.div(order, k, rounding_mode="floor")], send_counts, recv_counts
    )
    local_slot = _all_to_all(
        group, "slot index", (slots[order] % per_rank).view(-1, 1), send_counts, recv_counts
    ).view(-1)
    group.count(layer, local_slot, topk_ids)
    computed = compute(received, local_slot).to(torch.float32).contiguous()
    rows_back = _all_to_all(group, "expert output", computed, recv_counts, send_counts)
    slot_out = torch.empty(t * k, hidden, dtype=torch.float32, device=x.device)
    slot_out[order] = rows_back
    return weighted_sum(slot_out.view(t, k, hidden), topk_weights, x.dtype)
