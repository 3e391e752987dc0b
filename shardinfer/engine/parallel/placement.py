"""Which physical expert slot of which rank holds which logical expert.

With expert parallelism every rank holds `slots_per_rank` physical expert slots; global slot `p`
lives on rank `p // slots_per_rank` and holds logical expert `physical_to_logical[p]`. When there
are more slots than logical experts (redundant experts), the busiest experts get several
replicas, so that their tokens can be spread over more than one rank.

Replicas hold identical weights, so the replica a token is sent to changes no output bit, only
which rank does the work. That is why the placement is free to be chosen from measured load
(`balanced_placement`) and why `choose_slots` may spread tokens over replicas by a fixed
arithmetic rule instead of looking at the ranks' queues: the rule needs no host sync and gives
the same answer on every rank.

The policy of `balanced_placement` is DeepSeek's published "global" load-balancing policy,
written here from its description: first hand out the redundant replicas one at a time to the
expert with the most load per replica, then pack the replicas onto ranks heaviest first, each into
the least loaded rank with a free slot. Comparisons use exact fractions, so ties are real ties
and are broken by the stated order, and the same load always gives the same placement.

`moe_lb` is the balance metric: the busiest rank's load over the mean rank's load, summed over
rows (layers or steps) before dividing, so 1.0 means perfectly balanced.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from fractions import Fraction

import torch

# Multiplier of the token index in `choose_slots`. It is prime, so it shares no factor with any
# replica count smaller than itself: stepping the token index by one then steps through every
# replica of an expert before any is used twice.
_SPREAD = 7919


@dataclass(frozen=True)
class ExpertPlacement:
    """The slot layout of one MoE layer (or of all layers, when they share it).

    `physical_to_logical` has `num_ranks * slots_per_rank` entries, rank by rank. It is checked
    on construction (`validate`) because a bad layout fails far from its cause: a logical expert
    without a slot silently drops its tokens, and uneven ranks break the all-to-all shapes.
    """

    num_logical: int
    num_ranks: int
    physical_to_logical: tuple[int, ...]
    _replicas: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)
    # Per device: the replica table and counts already copied there, so that `choose_slots`
    # copies them once and not on every step (a copy inside a CUDA graph capture would fail).
    _device_tables: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        # Accept any integer-like values (a list, numpy or torch integers) but store plain ints in
        # a tuple, so that the placement is hashable and compares by value.
        object.__setattr__(self, "num_logical", operator.index(self.num_logical))
        object.__setattr__(self, "num_ranks", operator.index(self.num_ranks))
        object.__setattr__(
            self, "physical_to_logical", tuple(operator.index(e) for e in self.physical_to_logical)
        )
        self.validate()
        slots: list[list[int]] = [[] for _ in range(self.num_logical)]
        for p, e in enumerate(self.physical_to_logical):
            slots[e].append(p)
        object.__setattr__(self, "_replicas", tuple(tuple(s) for s in slots))

    def validate(self) -> None:
        """Raise ValueError naming the first problem found and how to fix it."""
        if self.num_logical < 1:
            raise ValueError(f"num_logical must be at least 1, got {self.num_logical}")
        if self.num_ranks < 1:
            raise ValueError(f"num_ranks must be at least 1, got {self.num_ranks}")
        n = len(self.physical_to_logical)
        if n == 0 or n % self.num_ranks:
            raise ValueError(
                f"physical_to_logical has {n} slots, which is not a positive multiple of "
                f"num_ranks={self.num_ranks}; give every rank the same number of slots"
            )
        for p, e in enumerate(self.physical_to_logical):
            if not 0 <= e < self.num_logical:
                raise ValueError(
                    f"physical_to_logical[{p}] = {e} is not a logical expert id (0..{self.num_logical - 1}); "
                    f"use ids below num_logical={self.num_logical}"
                )
        missing = sorted(set(range(self.num_logical)) - set(self.physical_to_logical))
        if missing:
            shown = ", ".join(str(e) for e in missing[:8]) + (", ..." if len(missing) > 8 else "")
            raise ValueError(
                f"logical expert(s) {shown} have no physical slot, so tokens routed to them could "
                f"not be served; place every logical expert in at least one slot"
            )

    @property
    def num_physical(self) -> int:
        """Physical slots over all ranks."""
        return len(self.physical_to_logical)

    @property
    def slots_per_rank(self) -> int:
        """Physical slots each rank holds (the same on every rank)."""
        return len(self.physical_to_logical) // self.num_ranks

    def rank_of_slot(self, slot: int) -> int:
        """The rank holding global physical slot `slot`."""
        if not 0 <= slot < self.num_physical:
            raise ValueError(f"slot {slot} is outside 0..{self.num_physical - 1}")
        return slot // self.slots_per_rank

    def local_logical(self, rank: int) -> tuple[int, ...]:
        """The logical expert held by each of `rank`'s slots, in slot order: what it loads."""
        if not 0 <= rank < self.num_ranks:
            raise ValueError(f"rank {rank} is outside 0..{self.num_ranks - 1}")
        s = self.slots_per_rank
        return self.physical_to_logical[rank * s : (rank + 1) * s]

    def replicas(self, expert: int) -> tuple[int, ...]:
        """The physical slots holding logical expert `expert`, in increasing order."""
        if not 0 <= expert < self.num_logical:
            raise ValueError(f"expert {expert} is outside 0..{self.num_logical - 1}")
        return self._replicas[expert]

    @property
    def max_replicas(self) -> int:
        """The most replicas any logical expert has (the replica table's width)."""
        return max(len(r) for r in self._replicas)

    def replica_table(self) -> torch.Tensor:
        """int64 [num_logical, max_replicas]: row e lists e's slots increasing, padded with -1.

        A dense table lets the device look up a replica with one gather instead of Python."""
        table = torch.full((self.num_logical, self.max_replicas), -1, dtype=torch.int64)
        for e, slots in enumerate(self._replicas):
            table[e, : len(slots)] = torch.tensor(slots, dtype=torch.int64)
        return table

    def replica_counts(self) -> torch.Tensor:
        """int64 [num_logical]: how many replicas each logical expert has."""
        return torch.tensor([len(r) for r in self._replicas], dtype=torch.int64)

    def choose_slots(self, topk_ids: torch.Tensor, token_index: torch.Tensor) -> torch.Tensor:
        """The physical slot serving each routed (token, expert) pair: int64 [T, k].

        `topk_ids` [T, k] holds logical expert ids; `token_index` [T] is an integer per token
        supplied by the caller (say, its position in the batch). Column j of token t goes to
        replica number `(t * _SPREAD + j) % count[e]` of its expert e, counting replicas in
        increasing slot order. The rule is pure arithmetic on the tensors' device, so nothing
        waits for the host and every rank computes the same choice; because `_SPREAD` is prime,
        any `count[e]` consecutive token indices use each replica of e exactly once in a given
        column. Ids outside 0..num_logical-1 are not checked here (that would need a host
        sync); indexing fails on them. The first call on a device copies the tables there, so
        make it before capturing a CUDA graph.
        """
        if topk_ids.dim() != 2:
            raise ValueError(f"topk_ids must be [tokens, k], got shape {tuple(topk_ids.shape)}")
        if token_index.shape != topk_ids.shape[:1]:
            raise ValueError(
                f"token_index must be [{topk_ids.shape[0]}] (one per row of topk_ids), "
                f"got shape {tuple(token_index.shape)}"
            )
        table, counts = self._tables_on(topk_ids.device)
        ids = topk_ids.long()
        if table.shape[1] == 1:
            return table[ids, 0]
        count = counts[ids]
        column = torch.arange(ids.shape[1], device=ids.device, dtype=torch.int64)
        # Reducing the token index first keeps the product far from int64 overflow; the result is
        # the same residue as (t * _SPREAD + j) % count.
        replica = ((token_index.long()[:, None] % count) * _SPREAD + column) % count
        return table[ids, replica]

    def _tables_on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        cached = self._device_tables.get(device)
        if cached is None:
            cached = (self.replica_table().to(device), self.replica_counts().to(device))
            self._device_tables[device] = cached
        return cached


def _check_split(num_logical: int, num_ranks: int, redundant: int) -> None:
    if num_logical < 1:
        raise ValueError(f"num_logical must be at least 1, got {num_logical}")
    if num_ranks < 1:
        raise ValueError(f"num_ranks must be at least 1, got {num_ranks}")
    if redundant < 0:
        raise ValueError(f"redundant must be 0 or more (extra replicas to add), got {redundant}")
    total = num_logical + redundant
    if total % num_ranks:
        more = -total % num_ranks
        raise ValueError(
            f"num_logical + redundant = {num_logical} + {redundant} = {total} slots do not split "
            f"evenly over num_ranks={num_ranks}; make num_logical + redundant a multiple of "
            f"num_ranks (e.g. redundant={redundant + more})"
        )


def _pack(load: list[Fraction], counts: list[int], num_ranks: int) -> ExpertPlacement:
    """Place `counts[e]` replicas of each expert e, each carrying `load[e] / counts[e]`, onto
    `num_ranks` equal ranks: heaviest replica first (ties: lower expert, then lower replica
    number), each into the least loaded rank with a free slot (ties: lowest rank). Greedy
    heaviest-first keeps the busiest rank close to the mean without a search; sorting each
    rank's slots by expert id afterwards makes its local expert table ordered."""
    slots_per_rank = sum(counts) // num_ranks
    order = sorted(
        ((load[e] / counts[e], e, r) for e in range(len(counts)) for r in range(counts[e])),
        key=lambda item: (-item[0], item[1], item[2]),
    )
    totals = [Fraction(0)] * num_ranks
    held: list[list[int]] = [[] for _ in range(num_ranks)]
    for weight, e, _ in order:
        rank = min((r for r in range(num_ranks) if len(held[r]) < slots_per_rank), key=lambda r: totals[r])
        held[rank].append(e)
        totals[rank] += weight
    return ExpertPlacement(
        num_logical=len(counts),
        num_ranks=num_ranks,
        physical_to_logical=tuple(e for experts in held for e in sorted(experts)),
    )


def static_placement(num_logical: int, num_ranks: int, redundant: int = 0) -> ExpertPlacement:
    """The layout to use before any load has been measured.

    Without redundant experts, expert e goes to rank `e // (num_logical // num_ranks)`: contiguous
    blocks, the layout a checkpoint's expert numbering suggests. With `redundant` extra slots and
    no load to say which experts are hot, experts 0, 1, ... get one extra replica each, round
    robin, and the replicas are packed as `balanced_placement` packs them under uniform load.
    """
    _check_split(num_logical, num_ranks, redundant)
    if redundant == 0:
        return ExpertPlacement(num_logical, num_ranks, tuple(range(num_logical)))
    counts = [1 + redundant // num_logical + (e < redundant % num_logical) for e in range(num_logical)]
    return _pack([Fraction(1)] * num_logical, counts, num_ranks)


def _load_values(load: torch.Tensor, num_logical: int | None) -> torch.Tensor:
    """Check a load tensor ([experts] or [layers, experts], finite, non-negative) and return it on
    the CPU as float64 or int64, with the same shape."""
    if not isinstance(load, torch.Tensor):
        raise ValueError(f"load must be a torch.Tensor, got {type(load).__name__}")
    if load.dim() not in (1, 2) or load.shape[-1] == 0:
        raise ValueError(
            f"load must be [num_logical] or [layers, num_logical] with at least one expert, "
            f"got shape {tuple(load.shape)}"
        )
    if num_logical is not None and load.shape[-1] != num_logical:
        raise ValueError(
            f"load has {load.shape[-1]} experts in its last dimension (shape {tuple(load.shape)}), "
            f"but the placement has num_logical={num_logical}"
        )
    if load.is_complex():
        raise ValueError(f"load must be real token counts, got dtype {load.dtype}")
    values = load.detach().cpu()
    values = values.to(torch.float64) if values.is_floating_point() else values.to(torch.int64)
    bad = ~torch.isfinite(values) | (values < 0)
    if bool(bad.any()):
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"load{list(where)} = {values[where].item()}; loads are token counts and must be "
            f"finite and non-negative"
        )
    return values


def balanced_placement(load: torch.Tensor, num_ranks: int, redundant: int = 0) -> ExpertPlacement:
    """A layout chosen from measured per-expert load (token counts).

    `load` is [num_logical], or [layers, num_logical] summed over layers: the placement is shared,
    so it balances the total. First the `redundant` extra replicas go, one at a time, to the expert
    with the largest load per replica so far (ties: lowest expert id), which splits the hottest
    experts; then the replicas are packed heaviest first, each into the least loaded rank that
    has a free slot (ties: lowest rank); finally each rank's slots are ordered by expert id.
    """
    values = _load_values(load, None)
    if values.dim() == 2:
        values = values.sum(dim=0)
    num_logical = values.shape[0]
    _check_split(num_logical, num_ranks, redundant)
    exact = [Fraction(v) for v in values.tolist()]
    counts = [1] * num_logical
    for _ in range(redundant):
        # max() keeps the first of equal keys, so ties go to the lowest expert id.
        hottest = max(range(num_logical), key=lambda e: exact[e] / counts[e])
        counts[hottest] += 1
    return _pack(exact, counts, num_ranks)


def rank_loads(placement: ExpertPlacement, slot_counts: torch.Tensor) -> torch.Tensor:
    """Tokens each rank served, from tokens per physical slot: [num_physical] -> [num_ranks], or
    [layers, num_physical] -> [layers, num_ranks]. Stays on the input's device and dtype."""
    if slot_counts.dim() not in (1, 2) or slot_counts.shape[-1] != placement.num_physical:
        raise ValueError(
            f"slot_counts must be [{placement.num_physical}] or [layers, {placement.num_physical}] "
            f"(one count per physical slot), got shape {tuple(slot_counts.shape)}"
        )
    grouped = slot_counts.reshape(*slot_counts.shape[:-1], placement.num_ranks, placement.slots_per_rank)
    return grouped.sum(dim=-1)


def expected_rank_loads(placement: ExpertPlacement, load: torch.Tensor) -> torch.Tensor:
    """Per-rank load (float64) if each expert's load is split evenly over its replicas, which is
    what `choose_slots` does over many tokens: [num_logical] -> [num_ranks], or
    [layers, num_logical] -> [layers, num_ranks]. Used to judge a placement before running it."""
    values = _load_values(load, placement.num_logical).to(torch.float64)
    logical = torch.tensor(placement.physical_to_logical, dtype=torch.int64)
    per_slot = values[..., logical] / placement.replica_counts().to(torch.float64)[logical]
    return rank_loads(placement, per_slot)


def moe_lb(rank_load: torch.Tensor) -> float:
    """Load balance: sum over rows of the busiest rank's load / sum over rows of the mean rank's.

    `rank_load` is [num_ranks] or [rows, num_ranks] (rows are layers or steps). Summing before
    dividing weights each row by its load, so near-empty rows do not dominate. 1.0 means every
    rank did the same work; larger means ranks waited on the busiest. No load at all counts as
    balanced (1.0).
    """
    if rank_load.dim() not in (1, 2) or rank_load.shape[-1] == 0:
        raise ValueError(
            f"rank_load must be [num_ranks] or [rows, num_ranks] with at least one rank, "
            f"got shape {tuple(rank_load.shape)}"
        )
    rows = rank_load.detach().to(torch.float64).reshape(-1, rank_load.shape[-1])
    bad = ~torch.isfinite(rows) | (rows < 0)
    if bool(bad.any()):
        row, rank = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"rank_load has {rows[row, rank].item()} at row {row}, rank {rank}; loads must be "
            f"finite and non-negative"
        )
    peak, mean = peak_and_mean(rows)
    return peak / mean if mean else 1.0


def peak_and_mean(rows: torch.Tensor) -> tuple[float, float]:
    """moe_lb's two sums over the rows of a [rows, num_ranks] load: the busiest rank's load and the
    mean rank's (callers that accumulate rows, such as a window of steps, keep the sums)."""
    if rows.shape[0] == 0:
        return 0.0, 0.0
    rows = rows.to(torch.float64)
    return float(rows.max(dim=1).values.sum()), float(rows.mean(dim=1).sum())
