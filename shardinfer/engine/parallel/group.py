"""The ranks of one expert-parallel engine: a torch.distributed process group and its placement.

Each rank is a process holding one engine: its own requests and KV cache (data-parallel
attention) and a share of the routed experts (expert parallelism). The ranks meet only inside
the MoE layers, where every rank's forward exchanges token rows with every other rank, so all
ranks must run the same number of forwards: a rank without requests runs `idle_forward` (the
MoE layers' exchanges with no rows of its own) while the others step.

The CPU build runs the ranks over gloo. A collective whose peer has died raises here as an
`ExpertParallelError` naming the rank and the collective, instead of gloo's bare message.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from shardinfer.engine.parallel.placement import ExpertPlacement
from shardinfer.errors import Retryable

T = TypeVar("T")

# How long a rank waits in a collective for the others before giving up. Every rank runs the same
# forwards, so a long wait means a peer died or hangs; a step on a slow CPU stays far below it.
DEFAULT_TIMEOUT_S = 300.0


class ExpertParallelError(Retryable, RuntimeError):
    """A collective between expert-parallel ranks failed: a peer stopped, or the ranks diverged.
    Like a lost worker, it ends a job as retryable (exit 75): a rerun resumes from its commits."""


@dataclass
class ExpertParallelGroup:
    """This rank's place in the group and what its MoE layers count.

    `expert_rows[layer]` counts the rows this rank's expert slots computed (any rank's tokens),
    `expert_tokens[layer]` the tokens of this rank's own batch routed to each logical expert;
    both feed the load-balance metric and placement (placement.py). Both count from the start,
    across placements."""

    rank: int
    size: int
    placement: ExpertPlacement
    process_group: Any = None  # None: the default group
    forwards: int = 0  # MoE forwards run, real or idle; every rank counts the same
    expert_rows: dict[int, int] = field(default_factory=dict)
    forward_rows: list[int] = field(default_factory=list)  # rows per MoE layer of the latest forward
    expert_tokens: dict[int, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank={self.rank} is outside the group of {self.size} ranks")
        if self.placement.num_ranks != self.size:
            raise ValueError(
                f"the expert placement spans {self.placement.num_ranks} ranks, the group has "
                f"{self.size}: build the placement for expert_parallel_size={self.size}"
            )

    def collective(self, what: str, fn: Callable[[], T]) -> T:
        """Run one collective, turning a transport failure into an ExpertParallelError."""
        try:
            return fn()
        except (RuntimeError, ValueError) as exc:  # gloo reports a dead peer as a RuntimeError
            raise ExpertParallelError(
                f"expert-parallel rank {self.rank} of {self.size}: the {what} exchange failed ({exc}); another "
                "rank stopped or timed out. The engine cannot continue; a job resumes from its last commit."
            ) from exc

    def count(self, layer: int, local_slots: torch.Tensor, topk_ids: torch.Tensor) -> None:
        """Add one MoE call's rows computed here and its own tokens per logical expert."""
        experts = torch.bincount(topk_ids.reshape(-1).cpu(), minlength=self.placement.num_logical)
        rows = int(local_slots.numel())
        self.expert_rows[layer] = self.expert_rows.get(layer, 0) + rows
        if layer >= 0:  # the main layers, in forward order (layer 0 starts a forward)
            if layer == 0:
                self.forward_rows = []
            self.forward_rows.append(rows)
        self.expert_tokens[layer] = self.expert_tokens.get(layer, torch.zeros_like(experts)) + experts

    def use_placement(self, placement: ExpertPlacement) -> None:
        """Switch to a new placement (its weights moved already: expert_moves.py)."""
        if (placement.num_ranks, placement.num_logical) != (self.size, self.placement.num_logical):
            raise ValueError(
                f"a placement over {placement.num_ranks} ranks and {placement.num_logical} experts "
                f"cannot replace one over {self.size} ranks and {self.placement.num_logical}"
            )
        self.placement = placement


def init_process_group(
    rank: int, size: int, address: str, port: int, timeout_s: float = DEFAULT_TIMEOUT_S, backend: str = "gloo"
) -> None:
    """Join the ranks' default process group (TCP rendezvous at address:port, rank 0 listening)."""
    dist.init_process_group(
        backend,
        init_method=f"tcp://{address}:{port}",
        rank=rank,
        world_size=size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


_CURRENT: ExpertParallelGroup | None = None


def set_current_group(group: ExpertParallelGroup | None) -> None:
    """The group this process's engine joins (set by the rank process before it builds its engine)."""
    global _CURRENT
    _CURRENT = group


def current_group(size: int) -> ExpertParallelGroup:
    """This process's group, which must span `size` ranks; a clear error outside a rank process."""
    if _CURRENT is None:
        raise ValueError(
            f"expert_parallel_size={size}: an expert-parallel engine is built by its rank processes; "
            "use LLM(..., expert_parallel_size=N) or a job's engine.expert_parallel_size, which start them"
        )
    if _CURRENT.size != size:
        raise ValueError(f"expert_parallel_size={size}, but this rank's group has {_CURRENT.size} ranks")
    return _CURRENT
