"""Keeping Python's cyclic garbage collector out of the step loop.

A full collection walks every object the collector tracks. Once torch and a model are loaded
that is a few hundred thousand objects, a pause that lands in whichever step happens to
allocate past the oldest generation's threshold: on a GPU one such pause costs as much as
several decode steps (measured: docs/engine.md, docs/structured-outputs.md). The objects an engine makes
at startup (modules, the Python side of its parameters and caches, captured graphs, and
everything the imports left behind) live as long as the engine, so once it is built they are
moved to the collector's permanent generation (`gc.freeze`) and later collections walk only
what the run allocates.

Frozen objects are still freed by reference counting; what freezing stops is collecting
cycles among them. So before an engine is built, everything frozen is handed back to the
collector and collected: an engine that was dropped while part of a reference cycle releases
its device memory before the next one measures how much is free. Both act on the whole
process: objects a program froze itself (say, before forking workers) are unfrozen too.
"""

from __future__ import annotations

import gc


def collect_dropped() -> None:
    """Unfreeze everything an earlier engine froze and run a full collection."""
    gc.unfreeze()
    gc.collect()


def freeze_startup_heap() -> None:
    """Collect the garbage startup left, then move every surviving object out of the
    collector's view (until the next `collect_dropped`)."""
    gc.collect()
    gc.freeze()
