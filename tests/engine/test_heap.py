"""The engine's garbage-collector settings: objects alive when an engine is built are frozen
(no full collection walks them), and the next engine's build collects the cycles among them
that were dropped meanwhile."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from shardinfer.engine.heap import collect_dropped, freeze_startup_heap


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cycle collector frees it


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()


def test_frozen_objects_leave_the_collectors_view() -> None:
    before = gc.get_freeze_count()
    keep = [_Node() for _ in range(100)]
    freeze_startup_heap()
    assert gc.get_freeze_count() >= before + len(keep)
    ids = {id(n) for n in keep}
    assert not any(id(o) in ids for g in range(3) for o in gc.get_objects(generation=g))


def test_a_dropped_frozen_cycle_is_freed_by_the_next_collect_dropped() -> None:
    node = _Node()
    gone = weakref.ref(node)
    freeze_startup_heap()
    del node
    gc.collect()
    assert gone() is not None  # frozen: a plain collection leaves the cycle alone
    collect_dropped()
    assert gone() is None
    assert gc.get_freeze_count() == 0


def test_startup_garbage_is_collected_before_freezing() -> None:
    node = _Node()
    gone = weakref.ref(node)
    del node  # garbage already, but a cycle: still there until a collection
    freeze_startup_heap()
    assert gone() is None
