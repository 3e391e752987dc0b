"""Where each slot of a new placement is filled from (expert_moves.move_sources)."""

from __future__ import annotations

import pytest

from shardinfer.engine.parallel.expert_moves import move_sources
from shardinfer.engine.parallel.placement import ExpertPlacement, static_placement


def test_every_new_slot_is_filled_from_an_old_replica_of_its_expert() -> None:
    old = static_placement(8, 4, 4)
    new = ExpertPlacement(8, 4, (0, 0, 5, 7, 1, 2, 3, 0, 4, 5, 6, 7))
    sources = move_sources(old, new)
    assert len(sources) == new.num_physical
    for p, q in enumerate(sources):
        assert old.physical_to_logical[q] == new.physical_to_logical[p]


def test_a_copy_on_the_same_rank_is_preferred() -> None:
    old = ExpertPlacement(4, 2, (0, 1, 2, 3))
    new = ExpertPlacement(4, 2, (1, 0, 3, 2))  # each rank keeps its experts, in another order
    assert move_sources(old, new) == [1, 0, 3, 2]
    swapped = ExpertPlacement(4, 2, (2, 3, 0, 1))  # everything crosses over
    assert move_sources(old, swapped) == [2, 3, 0, 1]


def test_senders_of_a_replicated_expert_share_the_work() -> None:
    old = ExpertPlacement(2, 4, (0, 0, 0, 1))  # expert 0 on ranks 0, 1, 2
    new = ExpertPlacement(2, 4, (1, 1, 1, 0))  # every rank needs the other expert
    sources = move_sources(old, new)
    assert sources[3] in (0, 1, 2)
    assert sources[:3] == [3, 3, 3]  # expert 1 has one replica: rank 3 sends it to all


def test_a_placement_over_other_ranks_is_refused() -> None:
    with pytest.raises(ValueError, match="must keep the experts and ranks"):
        move_sources(static_placement(8, 2), static_placement(8, 4))
