"""Point a loaded model's routed experts at an expert-parallel rank's group, and run a forward with
no rows.

The rank's model is loaded with only its own physical expert slots (`rank_expert_slots`, then
models/expert_slots.py in the load): a hot expert may sit in several slots, on several ranks, and
other ranks' experts are never read. `attach_experts` then points each MoE layer at the group, so
its forward exchanges rows with the other ranks (expert_exchange.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from shardinfer.engine.models.deepseek_moe import DeepseekMoE, RoutedExperts
from shardinfer.engine.models.expert_slots import ExpertSlots
from shardinfer.engine.parallel.group import ExpertParallelGroup


def main_moe_layers(model: nn.Module) -> list[DeepseekMoE]:
    """The MoE blocks a forward of the main layers runs, in their order (MTP layers excluded)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        return []
    return [layer.mlp for layer in layers if isinstance(layer.mlp, DeepseekMoE)]


def rank_expert_slots(group: ExpertParallelGroup, num_hidden_layers: int) -> ExpertSlots:
    """The logical expert of each slot this rank holds, for the model's load. The layers after the
    main ones (MTP) keep all their experts on every rank: drafting needs no other rank."""
    placement = group.placement
    return ExpertSlots(placement.local_logical(group.rank), placement.num_logical, num_hidden_layers)


def attach_experts(model: nn.Module, group: ExpertParallelGroup) -> list[RoutedExperts]:
    """Point the main MoE layers' experts, already loaded with this rank's slots, at the group;
    returns them in forward order (what `idle_forward` runs). MTP layers stay whole and local."""
    slots = len(group.placement.local_logical(group.rank))
    main = [moe.experts for moe in main_moe_layers(model)]
    if not main:
        raise ValueError(
            f"expert_parallel_size={group.size}: the model has no routed-expert (MoE) layers to "
            "split; run it with expert_parallel_size=1 (local[N] runs one engine per device)"
        )
    for layer, experts in enumerate(main):
        if experts.w_gate_up.shape[0] != slots:
            raise ValueError(
                f"rank {group.rank} holds {slots} expert slots but MoE layer {layer} was loaded with "
                f"{experts.w_gate_up.shape[0]}: load the model with rank_expert_slots(group)"
            )
        experts.parallel = group
        experts.parallel_layer = layer
    return main


def idle_forward(
    experts: list[RoutedExperts], top_k: int, hidden: int, dtype: torch.dtype, device: torch.device
) -> None:
    """A rank without tokens this step: run each MoE layer's exchange with no rows of its own, so
    the other ranks' rows routed to its experts are computed and returned."""
    x = torch.empty(0, hidden, dtype=dtype, device=device)
    ids = torch.empty(0, top_k, dtype=torch.int64, device=device)
    weights = torch.empty(0, top_k, dtype=torch.float32, device=device)
    for module in experts:
        module(x, ids, weights)


def moe_shape(model: Any) -> tuple[int, int]:
    """(top_k, hidden size) of the model's routed experts."""
    hf = model.config.hf
    return int(hf["num_experts_per_tok"]), int(model.config.hidden_size)
