"""Load a MoE checkpoint keeping only some routed-expert slots: what an expert-parallel rank holds.

An expert-parallel rank holds a few physical expert slots of every MoE layer, each slot a copy of
one logical expert (a hot expert may fill several slots; engine/parallel/placement.py). Loading
the whole model and cutting it afterwards would make every rank read, and briefly hold, all the
experts. Instead:

- `shrink` gives each RoutedExperts module, while it is still on the meta device, one row per
  slot, so only the slots get storage;
- `wanted` tells the checkpoint stream which tensors to read at all: a per-expert tensor
  (`...mlp.experts.<e>.<proj>.weight` and its FP8 scale) only when expert e fills a slot here;
- `remap` renames each per-expert tensor to the slot(s) it fills, so the model's own loader puts
  it there, and cuts stacked expert tensors (`...mlp.experts.gate_up_proj` [E, ...]) to the slots.

Every other tensor passes through unchanged. The result equals loading everything and keeping
the slots' rows (tests/engine/models/test_expert_slots.py compares the two).

Layers from `first_whole_layer` on (a DeepSeek checkpoint's MTP layers, numbered after the main
ones) keep all their experts: a draft forward through them then needs no other rank, and ranks
may draft different numbers of tokens.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence

import torch
from torch import nn

from shardinfer.engine.models.deepseek_moe import RoutedExperts

_PER_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(.+)$")
_STACKED = re.compile(r"^.*\.mlp\.experts\.(gate_up_proj|down_proj)$")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
# The tensors of a RoutedExperts module with one row per expert slot (float, or FP8 with its scales).
SLOT_TENSORS = (
    "w_gate_up",
    "w_down",
    "w_gate_up_scale_inv",
    "w_down_scale_inv",
    "w_gate_up_scale",
    "w_down_scale",
)


class ExpertSlots:
    """The logical expert of each routed-expert slot a process keeps, in slot order."""

    def __init__(self, slots: Sequence[int], num_experts: int, first_whole_layer: int | None = None) -> None:
        bad = [e for e in slots if not 0 <= e < num_experts]
        if not slots or bad:
            raise ValueError(
                f"expert slots {list(slots)} must be a non-empty list of experts in [0, {num_experts})"
            )
        self.slots = tuple(int(e) for e in slots)
        self.num_experts = num_experts
        self.first_whole_layer = first_whole_layer
        self._slots_of: dict[int, list[int]] = {}
        for slot, expert in enumerate(self.slots):
            self._slots_of.setdefault(expert, []).append(slot)

    def _whole(self, name: str) -> bool:
        """Whether the tensor belongs to a layer kept whole (first_whole_layer on)."""
        layer = _LAYER.match(name)
        return (
            self.first_whole_layer is not None
            and layer is not None
            and int(layer.group(1)) >= self.first_whole_layer
        )

    def wanted(self, name: str) -> bool:
        """Whether a checkpoint tensor must be read: every tensor but other experts' own."""
        m = _PER_EXPERT.match(name)
        return m is None or int(m.group(2)) in self._slots_of or self._whole(name)

    def remap(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """The checkpoint's tensors addressed to slots: a per-expert tensor once per slot its expert
        fills (none if it fills none), a stacked one cut to the slots' rows."""
        index: torch.Tensor | None = None
        for name, tensor in weights:
            if self._whole(name):
                yield name, tensor
                continue
            m = _PER_EXPERT.match(name)
            if m is not None:
                for slot in self._slots_of.get(int(m.group(2)), ()):
                    yield f"{m.group(1)}.{slot}.{m.group(3)}", tensor
            elif _STACKED.match(name) is not None:
                if tensor.shape[0] != self.num_experts:
                    raise ValueError(
                        f"stacked expert tensor {name!r} has {tensor.shape[0]} experts, the "
                        f"model {self.num_experts}"
                    )
                if index is None or index.device != tensor.device:
                    index = torch.tensor(self.slots, dtype=torch.int64, device=tensor.device)
                yield name, tensor.index_select(0, index)
            else:
                yield name, tensor

    def shrink(self, model: nn.Module) -> int:
        """Give every RoutedExperts module of a model still on the meta device one row per slot, but
        those of the layers kept whole (a DeepSeek model's `mtp.*` layers); returns how many modules
        it changed (0: the model has no routed experts to split)."""
        changed = 0
        for qualified, module in model.named_modules():
            if not isinstance(module, RoutedExperts) or (
                self.first_whole_layer is not None and qualified.startswith("mtp.")
            ):
                continue
            if module.w_gate_up.shape[0] != self.num_experts:
                raise ValueError(
                    f"the model's MoE layers have {module.w_gate_up.shape[0]} experts, the slots "
                    f"were chosen from {self.num_experts}"
                )
            for name in SLOT_TENSORS:
                param = getattr(module, name, None)
                if param is None:
                    continue
                if param.device.type != "meta":
                    raise ValueError(
                        "ExpertSlots.shrink needs the model on the meta device, before its "
                        "parameters get storage"
                    )
                cut = torch.empty((len(self.slots), *param.shape[1:]), dtype=param.dtype, device="meta")
                setattr(module, name, nn.Parameter(cut, requires_grad=False))
            changed += 1
        return changed
