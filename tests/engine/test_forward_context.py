"""ForwardContext.rope_rows: one gather of a rotary table's rows per forward, shared by the layers
that ask with the same positions; another positions tensor gets its own rows."""

from __future__ import annotations

import torch

from shardinfer.engine.forward_context import AttentionMetadata, ForwardContext
from shardinfer.engine.models.rope import RopeTable


class CountingTable:
    def __init__(self, table: RopeTable) -> None:
        self.table = table
        self.calls = 0

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls += 1
        return self.table.lookup(positions)


def _ctx() -> ForwardContext:
    empty = torch.zeros(0, dtype=torch.int32)
    meta = AttentionMetadata(empty, empty, empty.view(0, 0), empty.long(), 16, 0, 0, [0], [])
    return ForwardContext(meta, [])


def test_rows_are_gathered_once_per_forward_and_positions_tensor() -> None:
    rope = RopeTable(16, 10000.0, None, 64, 64)
    table = CountingTable(rope)
    ctx = _ctx()
    positions = torch.tensor([3, 0, 17, 5])
    first = ctx.rope_rows(table, positions)
    for _ in range(5):  # every later layer of the forward
        again = ctx.rope_rows(table, positions)
        assert again[0] is first[0] and again[1] is first[1]
    assert table.calls == 1
    assert torch.equal(first[0], rope.cos[positions]) and torch.equal(first[1], rope.sin[positions])

    # Another positions tensor (the MTP layer's, say): its own rows.
    shifted = positions + 1
    rows = ctx.rope_rows(table, shifted)
    assert table.calls == 2 and torch.equal(rows[0], rope.cos[shifted])
    # A new forward starts with nothing gathered.
    _ctx().rope_rows(table, positions)
    assert table.calls == 3
