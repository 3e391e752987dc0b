"""Give a loaded model's routed experts to an expert-parallel rank, and run a forward with no rows.

`shard_experts` keeps, in each MoE layer, the weights of the physical expert slots the placement
gives this rank (a hot expert may sit in several slots, on several ranks) and points the layer at
the group, so its forward exchanges rows with the other ranks (expert_exchange.py). The model is
loaded whole first and then cut, so each rank reads every expert once at load; what it keeps on
its device afterwards is its own slots.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from shardinfer.engine.models.deepseek_moe import DeepseekMoE, RoutedExperts
from shardinfer.engine.parallel.group import ExpertParallelGroup

_EXPERT_TENSORS = ("w_gate_up", "w_down", "w_gate_up_scale_inv", "w_down_scale_inv", "w_gate_up_scale",
                   "w_down_scale")


def main_moe_layers(model: nn.Module) -> list[DeepseekMoE]:
    """The MoE blocks a forward of the main layers runs, in their order (MTP layers excluded)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        return []
    return [layer.mlp for layer in layers if isinstance(layer.mlp, DeepseekMoE)]


def shard_experts(model: nn.Module, group: ExpertParallelGroup) -> list[RoutedExperts]:
    """Cut every MoE layer's experts to this rank's slots; returns the main layers' routed experts
    in forward order (what `idle_forward` runs). Refuses a model without routed experts."""
    placement = group.placement
    local = torch.tensor(placement.local_logical(group.rank), dtype=torch.int64)
    main = [moe.experts for moe in main_moe_layers(model)]
    if not main:
        raise ValueError(f"expert_parallel_size={group.size}: the model has no routed-expert (MoE) layers to "
                         "split; run it with expert_parallel_size=1 (local[N] runs one engine per device)")
    for module in model.modules():
        if not isinstance(module, RoutedExperts):
            continue
        n_experts = module.w_gate_up.shape[0]
        if n_experts != placement.num_logical:
            raise ValueError(f"the expert placement has {placement.num_logical} logical experts, the model "
                             f"{n_experts}: build it from this model's n_routed_experts")
        for name in _EXPERT_TENSORS:
            param = getattr(module, name, None)
            if param is not None:
                kept = param.data.index_select(0, local.to(param.device)).contiguous()
                setattr(module, name, nn.Parameter(kept, requires_grad=False))
        module.parallel = group
    for layer, experts in enumerate(main):
        experts.parallel_layer = layer
    return main


def idle_forward(experts: list[RoutedExperts], top_k: int, hidden: int, dtype: torch.dtype,
                 device: torch.device) -> None:
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
