"""Expert placement against hand-written layouts, plain-Python recounts and brute force.

Expected layouts below are worked out by hand from the definitions (contiguous blocks; the
replicate-then-pack policy), and the reference policy at the top of the file is a separate
plain-Python reading of the same description, one replica at a time, kept independent of the
code under test.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest
import torch

from shardinfer.engine.parallel.placement import (
    ExpertPlacement,
    balanced_placement,
    expected_rank_loads,
    moe_lb,
    rank_loads,
    static_placement,
)


def reference_policy(load: list[int], num_ranks: int, redundant: int) -> tuple[int, ...]:
    """The published policy, read literally: replicate greedily, pack heaviest first, sort ranks."""
    n = len(load)
    counts = [1] * n
    for _ in range(redundant):
        best = 0
        for e in range(1, n):
            if Fraction(load[e], counts[e]) > Fraction(load[best], counts[best]):
                best = e
        counts[best] += 1
    replicas = [(Fraction(load[e], counts[e]), e, r) for e in range(n) for r in range(counts[e])]
    replicas.sort(key=lambda x: x[2])
    replicas.sort(key=lambda x: x[1])
    replicas.sort(key=lambda x: x[0], reverse=True)  # stable: equal weights keep (expert, replica) order
    per_rank = (n + redundant) // num_ranks
    ranks: list[list[int]] = [[] for _ in range(num_ranks)]
    weight = [Fraction(0) for _ in range(num_ranks)]
    for w, e, _ in replicas:
        target = -1
        for r in range(num_ranks):
            if len(ranks[r]) < per_rank and (target < 0 or weight[r] < weight[target]):
                target = r
        ranks[target].append(e)
        weight[target] += w
    return tuple(e for experts in ranks for e in sorted(experts))


def recount(physical_to_logical: tuple[int, ...], num_logical: int) -> list[list[int]]:
    slots: list[list[int]] = [[] for _ in range(num_logical)]
    for p, e in enumerate(physical_to_logical):
        slots[e].append(p)
    return slots


def check_consistent(placement: ExpertPlacement) -> None:
    """Every expert placed, equal ranks, and the derived tables agree with a plain recount."""
    p2l = placement.physical_to_logical
    assert len(p2l) % placement.num_ranks == 0
    per_rank = len(p2l) // placement.num_ranks
    assert placement.slots_per_rank == per_rank
    assert set(p2l) == set(range(placement.num_logical))
    slots = recount(p2l, placement.num_logical)
    width = max(len(s) for s in slots)
    table = placement.replica_table()
    assert table.dtype == torch.int64 and tuple(table.shape) == (placement.num_logical, width)
    assert table.tolist() == [s + [-1] * (width - len(s)) for s in slots]
    counts = placement.replica_counts()
    assert counts.dtype == torch.int64
    assert counts.tolist() == [len(s) for s in slots]
    for e in range(placement.num_logical):
        assert placement.replicas(e) == tuple(slots[e])
    for rank in range(placement.num_ranks):
        assert placement.local_logical(rank) == p2l[rank * per_rank : (rank + 1) * per_rank]
    for p in range(len(p2l)):
        assert placement.rank_of_slot(p) == p // per_rank


def test_static_layout_is_contiguous_blocks() -> None:
    two = static_placement(8, 2)
    assert two.physical_to_logical == (0, 1, 2, 3, 4, 5, 6, 7)
    assert two.local_logical(0) == (0, 1, 2, 3) and two.local_logical(1) == (4, 5, 6, 7)
    four = static_placement(8, 4)
    assert [four.local_logical(r) for r in range(4)] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert [four.rank_of_slot(p) for p in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert four.replica_counts().tolist() == [1] * 8
    check_consistent(two)
    check_consistent(four)


def test_static_layout_with_redundant_experts() -> None:
    # Experts 0 and 1 get a second replica (weight 1/2 each under uniform load); the six unit
    # replicas 2..7 alternate between the ranks, then the halves alternate: rank 0 holds
    # {2, 4, 6, 0, 1} and rank 1 {3, 5, 7, 0, 1}, each sorted.
    placement = static_placement(8, 2, redundant=2)
    assert placement.physical_to_logical == (0, 1, 2, 4, 6, 0, 1, 3, 5, 7)
    assert placement.replicas(0) == (0, 5) and placement.replicas(1) == (1, 6)
    check_consistent(placement)
    # More redundant slots than experts: the extra replicas wrap round.
    wrapped = static_placement(2, 2, redundant=4)
    assert wrapped.replica_counts().tolist() == [3, 3]
    check_consistent(wrapped)


@pytest.mark.parametrize(
    ("num_logical", "num_ranks", "redundant"),
    [(8, 2, 0), (8, 4, 0), (8, 2, 2), (6, 4, 2), (16, 4, 4), (3, 3, 6)],
)
def test_every_placement_is_consistent(num_logical: int, num_ranks: int, redundant: int) -> None:
    check_consistent(static_placement(num_logical, num_ranks, redundant))
    gen = torch.Generator().manual_seed(num_logical * 100 + num_ranks * 10 + redundant)
    load = torch.randint(0, 50, (num_logical,), generator=gen)
    placement = balanced_placement(load, num_ranks, redundant)
    check_consistent(placement)
    assert placement.num_physical == num_logical + redundant


def test_balanced_placement_matches_the_hand_worked_skewed_case() -> None:
    # Expert 0 carries ten times the others. Replication: 10/1 -> 10/2 -> 10/3, so expert 0 gets
    # three replicas of 10/3. Packing, heaviest first: 10/3 to rank 0, 10/3 to rank 1, the third
    # 10/3 to rank 0 (tie, lowest rank); ones for experts 1..4 to rank 1 (always lighter) until it
    # is full; experts 5..7 to rank 0. Rank loads 10/3 + 4 = 22/3 and 20/3 + 3 = 29/3.
    load = torch.tensor([10, 1, 1, 1, 1, 1, 1, 1])
    placement = balanced_placement(load, 2, redundant=2)
    assert placement.physical_to_logical == (0, 0, 5, 6, 7, 0, 1, 2, 3, 4)
    assert len(placement.replicas(0)) == 3
    check_consistent(placement)

    expected = expected_rank_loads(placement, load)
    assert expected.dtype == torch.float64
    assert expected.tolist() == pytest.approx([29 / 3, 22 / 3])
    balanced_lb = moe_lb(expected)
    # Any layout with three replicas puts two on one rank: that rank carries at least
    # 20/3 + 3 = 29/3 against a mean of 17/2, so 58/51 is the best possible and is reached.
    assert balanced_lb == pytest.approx(58 / 51)
    static_lb = moe_lb(expected_rank_loads(static_placement(8, 2), load))
    assert static_lb == pytest.approx(13 / 8.5)
    assert balanced_lb < static_lb


def brute_force_best_max(load: list[int], num_ranks: int) -> int:
    """The smallest possible busiest-rank load over all equal-size splits of the experts."""
    n = len(load)
    per_rank = n // num_ranks
    best = None
    for order in itertools.permutations(range(n)):
        groups = [order[r * per_rank : (r + 1) * per_rank] for r in range(num_ranks)]
        busiest = max(sum(load[e] for e in g) for g in groups)
        best = busiest if best is None else min(best, busiest)
    assert best is not None
    return best


@pytest.mark.parametrize(("load", "layout"), [([5, 4, 3, 2], (0, 3, 1, 2)), ([1, 1, 8, 6], (1, 2, 0, 3))])
def test_greedy_packing_reaches_the_brute_force_optimum(load: list[int], layout: tuple[int, ...]) -> None:
    # [5, 4, 3, 2]: 5 -> rank 0, 4 -> rank 1, 3 -> rank 1 (4 < 5), 2 -> rank 0: both ranks carry 7.
    # [1, 1, 8, 6]: 8 -> rank 0, 6 -> rank 1, 1 (expert 0) -> rank 1, then rank 1 is full and
    # expert 1 goes to rank 0: loads 9 and 7, and no split does better than 9.
    placement = balanced_placement(torch.tensor(load), 2)
    assert placement.physical_to_logical == layout
    loads = expected_rank_loads(placement, torch.tensor(load))
    assert max(loads.tolist()) == brute_force_best_max(load, 2)


def test_balanced_placement_matches_reference_policy_on_random_loads() -> None:
    gen = torch.Generator().manual_seed(7)
    for num_logical, num_ranks, redundant in [(8, 2, 2), (16, 4, 4), (12, 3, 0), (10, 4, 6), (32, 8, 8)]:
        for _ in range(10):
            # Few distinct values, so that ties in both steps are common.
            load = torch.randint(0, 6, (num_logical,), generator=gen)
            placement = balanced_placement(load, num_ranks, redundant)
            assert placement.physical_to_logical == reference_policy(load.tolist(), num_ranks, redundant)


def test_balanced_placement_is_deterministic_and_sums_layers() -> None:
    gen = torch.Generator().manual_seed(3)
    per_layer = torch.randint(0, 100, (5, 16), generator=gen)
    first = balanced_placement(per_layer, 4, redundant=4)
    second = balanced_placement(per_layer.clone(), 4, redundant=4)
    assert first == second and first.physical_to_logical == second.physical_to_logical
    assert first == balanced_placement(per_layer.sum(dim=0), 4, redundant=4)
    assert first.physical_to_logical == reference_policy(per_layer.sum(dim=0).tolist(), 4, 4)
    # Float loads with the same values give the same layout.
    assert first == balanced_placement(per_layer.to(torch.float32), 4, redundant=4)


def test_equal_loads_break_ties_by_lowest_rank() -> None:
    # All weights equal: experts go out in id order, each to the lighter rank, lowest on ties.
    placement = balanced_placement(torch.ones(6), 2)
    assert placement.physical_to_logical == (0, 2, 4, 1, 3, 5)
    # No load at all: every rank ties, so each expert fills the lowest rank with a free slot.
    assert balanced_placement(torch.zeros(6), 3).physical_to_logical == (0, 1, 2, 3, 4, 5)


def test_choose_slots_hits_a_replica_of_the_requested_expert() -> None:
    placement = balanced_placement(torch.tensor([40, 1, 1, 9, 2, 1, 1, 1]), 4, redundant=4)
    holder = placement.physical_to_logical
    gen = torch.Generator().manual_seed(1)
    topk_ids = torch.stack([torch.randperm(8, generator=gen)[:3] for _ in range(200)])
    for dtype in (torch.int64, torch.int32):
        slots = placement.choose_slots(topk_ids.to(dtype), torch.arange(200))
        assert slots.dtype == torch.int64 and tuple(slots.shape) == (200, 3)
        for t in range(200):
            for j in range(3):
                assert holder[int(slots[t, j])] == int(topk_ids[t, j])


def test_choose_slots_cycles_through_replicas() -> None:
    # Expert 0 has three replicas, on slots 0, 1 and 4 (written out from the definition).
    placement = ExpertPlacement(num_logical=4, num_ranks=2, physical_to_logical=(0, 0, 1, 2, 0, 3))
    assert placement.replicas(0) == (0, 1, 4)
    tokens, k = 300, 2
    topk_ids = torch.zeros(tokens, k, dtype=torch.int64)
    topk_ids[:, 1] = 3
    for start in (0, 1000, 12345):
        slots = placement.choose_slots(topk_ids, torch.arange(start, start + tokens))
        assert slots[:, 1].tolist() == [5] * tokens
        column = slots[:, 0].tolist()
        # Any three consecutive token indices use every replica once, so the spread is exact
        # over whole windows and never off by more than one; a fixed choice would fail both.
        for t in range(tokens - 2):
            assert sorted(column[t : t + 3]) == [0, 1, 4]
        uses = [column[: tokens - 1].count(s) for s in (0, 1, 4)]
        assert max(uses) - min(uses) <= 1
        assert [column.count(s) for s in (0, 1, 4)] == [100, 100, 100]
    # One token asking for expert 0 in three columns gets three different replicas.
    row = placement.choose_slots(torch.zeros(1, 3, dtype=torch.int64), torch.tensor([5]))
    assert sorted(row[0].tolist()) == [0, 1, 4]


def test_choose_slots_without_replicas_is_the_identity_layout() -> None:
    placement = static_placement(8, 4)
    topk_ids = torch.tensor([[7, 0], [3, 5]])
    assert placement.choose_slots(topk_ids, torch.tensor([0, 1])).tolist() == [[7, 0], [3, 5]]


def test_rank_loads_sums_each_ranks_slots() -> None:
    placement = ExpertPlacement(num_logical=4, num_ranks=2, physical_to_logical=(0, 0, 1, 2, 0, 3))
    assert rank_loads(placement, torch.tensor([1, 2, 3, 4, 5, 6])).tolist() == [6, 15]
    both = torch.tensor([[1, 2, 3, 4, 5, 6], [0, 0, 0, 1, 1, 1]])
    assert rank_loads(placement, both).tolist() == [[6, 15], [0, 3]]
    # Expert 0's load of 9 is split over its three replicas (two on rank 0, one on rank 1).
    expected = expected_rank_loads(placement, torch.tensor([9, 2, 4, 1]))
    assert expected.tolist() == pytest.approx([3 + 3 + 2, 4 + 3 + 1])
    layered = expected_rank_loads(placement, torch.tensor([[9, 2, 4, 1], [0, 0, 0, 5]]))
    assert layered.flatten().tolist() == pytest.approx([8, 8, 0, 5])


def test_moe_lb_hand_values() -> None:
    assert moe_lb(torch.tensor([[3, 1], [2, 2]])) == pytest.approx(1.25)
    assert moe_lb(torch.tensor([4.0, 4.0, 4.0])) == 1.0
    assert moe_lb(torch.tensor([6, 0, 0])) == pytest.approx(3.0)
    assert moe_lb(torch.zeros(4)) == 1.0
    assert moe_lb(torch.zeros(3, 4)) == 1.0


def test_bad_inputs_name_the_offending_value() -> None:
    with pytest.raises(ValueError, match=r"-3"):
        balanced_placement(torch.tensor([1, 2, -3, 4]), 2)
    with pytest.raises(ValueError, match=r"nan"):
        balanced_placement(torch.tensor([1.0, float("nan")]), 2)
    with pytest.raises(ValueError, match=r"\b8\b.*\b3\b"):
        static_placement(8, 3)
    with pytest.raises(ValueError, match=r"8 \+ 2 = 10.*num_ranks=4.*redundant=4"):
        balanced_placement(torch.ones(8), 4, redundant=2)
    with pytest.raises(ValueError, match=r"-1"):
        static_placement(8, 2, redundant=-1)
    with pytest.raises(ValueError, match=r"expert\(s\) 2 "):
        ExpertPlacement(num_logical=4, num_ranks=2, physical_to_logical=(0, 1, 3, 3))
    with pytest.raises(ValueError, match=r"= 4 "):
        ExpertPlacement(num_logical=4, num_ranks=2, physical_to_logical=(0, 1, 2, 4))
    with pytest.raises(ValueError, match=r"\b5 slots\b.*num_ranks=2"):
        ExpertPlacement(num_logical=4, num_ranks=2, physical_to_logical=(0, 1, 2, 3, 0))
    with pytest.raises(ValueError, match=r"\(2, 2, 2\)"):
        balanced_placement(torch.ones(2, 2, 2), 2)
    placement = static_placement(4, 2)
    with pytest.raises(ValueError, match=r"\(3,\)"):
        expected_rank_loads(placement, torch.ones(3))
    with pytest.raises(ValueError, match=r"\(5,\)"):
        rank_loads(placement, torch.ones(5))
    with pytest.raises(ValueError, match=r"\(4,\)"):
        placement.choose_slots(torch.zeros(4, dtype=torch.int64), torch.arange(4))
    with pytest.raises(ValueError, match=r"\(3,\)"):
        placement.choose_slots(torch.zeros(4, 2, dtype=torch.int64), torch.arange(3))
    with pytest.raises(ValueError, match=r"-2"):
        moe_lb(torch.tensor([1, -2]))


@pytest.mark.gpu
def test_choose_slots_on_cuda_matches_cpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    placement = balanced_placement(torch.tensor([40, 1, 1, 9, 2, 1, 1, 1]), 4, redundant=4)
    topk_ids = torch.randint(0, 8, (64, 4))
    token_index = torch.arange(64)
    on_device = placement.choose_slots(topk_ids.cuda(), token_index.cuda())
    assert on_device.device.type == "cuda"
    assert on_device.cpu().tolist() == placement.choose_slots(topk_ids, token_index).tolist()
