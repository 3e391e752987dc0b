"""Move expert weights between ranks for a new placement, without reading the checkpoint again.

A rebalance gives every physical slot a logical expert (placement.balanced_placement). Each new
slot is filled from a slot that already holds its expert under the old placement: a copy on the
same rank if there is one, else one of the expert's old replicas, chosen by the new slot's number
so that the senders of a replicated expert share the work. One all-to-all per expert tensor of
each MoE layer carries the rows between ranks, as raw bytes (FP8 weights and float32 scales move
alike), in the engine's own layout: quantised or not, nothing is converted or read from disk.

Every replica holds the same weights, so the new slots hold exactly what loading them would give,
and no output bit changes (tests/engine/parallel/test_expert_parallel.py compares a rebalanced
engine with the one-process engine).
"""

from __future__ import annotations

import torch
from torch import nn

from shardinfer.engine.models.deepseek_moe import RoutedExperts
from shardinfer.engine.models.expert_slots import SLOT_TENSORS
from shardinfer.engine.parallel.expert_exchange import all_to_all_rows
from shardinfer.engine.parallel.group import ExpertParallelGroup
from shardinfer.engine.parallel.placement import ExpertPlacement


def move_sources(old: ExpertPlacement, new: ExpertPlacement) -> list[int]:
    """For each new global slot, the old global slot it is filled from."""
    if (old.num_logical, old.num_ranks) != (new.num_logical, new.num_ranks):
        raise ValueError(
            f"a new placement must keep the experts and ranks ({old.num_logical} experts over "
            f"{old.num_ranks} ranks), got {new.num_logical} over {new.num_ranks}"
        )
    sources = []
    for p, expert in enumerate(new.physical_to_logical):
        rank = new.rank_of_slot(p)
        replicas = old.replicas(expert)
        same_rank = [q for q in replicas if old.rank_of_slot(q) == rank]
        sources.append(same_rank[0] if same_rank else replicas[p % len(replicas)])
    return sources


def move_experts(model: nn.Module, group: ExpertParallelGroup, new: ExpertPlacement) -> None:
    """Refill every RoutedExperts module of this rank's model split over the group (the main MoE
    layers; MTP layers hold all experts) for `new`, then make it the group's placement. Every rank
    must call it at the same point (it runs collectives)."""
    old = group.placement
    sources = move_sources(old, new)
    me, old_per, new_per = group.rank, old.slots_per_rank, new.slots_per_rank
    mine = range(me * new_per, (me + 1) * new_per)
    # Rows this rank sends, rank by rank, each rank's in the order of its new slots.
    send_rows: list[list[int]] = [[] for _ in range(group.size)]
    for p, q in enumerate(sources):
        dest, src = new.rank_of_slot(p), old.rank_of_slot(q)
        if src == me and dest != me:
            send_rows[dest].append(q - me * old_per)
    # Where each new local slot comes from: ("local", old local slot) or ("received", row).
    received_from = [[p for p in mine if old.rank_of_slot(sources[p]) == r] for r in range(group.size)]
    received_from[me] = []
    fill: list[tuple[str, int]] = []
    received_row = {p: i for i, p in enumerate(p for rows in received_from for p in rows)}
    for p in mine:
        q = sources[p]
        fill.append(
            ("local", q - me * old_per) if old.rank_of_slot(q) == me else ("received", received_row[p])
        )
    order = [row for rows in send_rows for row in rows]
    send_counts = [len(rows) for rows in send_rows]
    recv_counts = [len(rows) for rows in received_from]
    for module in (m for m in model.modules() if isinstance(m, RoutedExperts) and m.parallel is group):
        for name in SLOT_TENSORS:
            param = getattr(module, name, None)
            if param is None:
                continue
            held = param.data
            if held.shape[0] != old_per:
                raise ValueError(
                    f"rank {me}: {name} holds {held.shape[0]} expert slots, the placement "
                    f"{old_per}: the model was not loaded for this placement"
                )
            got = all_to_all_rows(group, f"{name} weight move", held[order], send_counts, recv_counts)
            rows = torch.stack([held[i] if kind == "local" else got[i] for kind, i in fill])
            module.register_parameter(name, nn.Parameter(rows, requires_grad=False))
    group.use_placement(new)
