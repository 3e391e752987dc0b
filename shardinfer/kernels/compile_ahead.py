"""Compile Triton kernels ahead of their first launch, several at a time.

A fresh process (a new machine, a new container, a Ray worker on a new node) finds Triton's
on-disk cache empty and compiles every kernel variant at its first launch. A forward pass
launches its kernels one after another, so those compiles run one after another too, each
blocking the pass that needs it. Compiling spends most of its time in MLIR, LLVM and ptxas,
which release the GIL, so variants compile in parallel on threads; what stops that is knowing
which variants a pass will need before it runs.

`compile_instead_of_launch()` finds out by running the pass itself: inside it every Triton
launch in the process takes the JIT's warm-up road (bind the arguments, work out the
specialisation, compile) and stops before the launch, with the compile handed to a thread pool
through Triton's `AsyncCompileMode`. On leaving, the pool drains and every variant sits in its
kernel's in-memory cache, so the real pass that follows finds them all.

Nothing launches inside, so every tensor a kernel would have written keeps whatever its memory
held. The pass run inside must therefore be one whose host-side control does not depend on
kernel outputs, and whose torch operations do not index with them (a garbage index would be a
device-side assert): the engine runs its own forward passes there (engine/precompile.py), whose
launch decisions come from host-side shapes and metadata only.

The switch is process-wide (Triton's launch entry point is a class method), so nothing else in
the process may launch Triton kernels meanwhile; the engine calls it while it is being built,
before any other thread has a reason to.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

_lock = threading.Lock()  # one compile-ahead pass at a time: the switch is process-wide


@dataclass
class CompileAhead:
    """What one pass did: the variants it handed to the pool (a variant found in Triton's on-disk
    cache counts too: loading it is the whole of its compile), the pool's threads, and the seconds
    spent draining the pool after the pass."""

    variants: int = 0
    workers: int = 0
    drain_s: float = 0.0


# At most this many compiles at once per process: several engine processes on one machine (one
# per GPU) each compile the same kernels, and each compile holds its own LLVM context in memory.
MAX_WORKERS = 16


def default_workers() -> int:
    """Threads to compile on: the CPUs this process may run on, up to MAX_WORKERS."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, cpus))


def available() -> bool:
    """Whether kernels compile here and this Triton can compile them asynchronously
    (`AsyncCompileMode`, Triton 3.4 and later). Under the interpreter nothing compiles."""
    from shardinfer.kernels._common import interpreting

    if interpreting():
        return False
    try:
        from triton.runtime import _async_compile  # noqa: F401
        from triton.runtime.jit import JITFunction  # noqa: F401
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def compile_instead_of_launch(workers: int | None = None) -> Iterator[CompileAhead]:
    """Inside: every Triton launch compiles its kernel variant on a pool of `workers` threads
    (default: default_workers()) and launches nothing. On exit: waits for the compiles. A
    variant that fails to compile is left out; its first real launch compiles it again and raises
    where the failure belongs."""
    from triton import knobs
    from triton.runtime._async_compile import AsyncCompileMode
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction

    stats = CompileAhead(workers=workers or default_workers())
    with _lock:
        launch = JITFunction.run
        previous_hook = knobs.runtime.jit_cache_hook
        missed: list[tuple[Any, str]] = []  # (kernel, variant key) of the launch under way, if a miss
        pending: list[tuple[dict[str, Any], str, Any]] = []  # placeholders put into kernel caches

        def note_miss(*, key: str, fn: Any, **kwargs: Any) -> Any:
            missed.append((fn.jit_function, key))
            return previous_hook(key=key, fn=fn, **kwargs) if previous_hook is not None else None

        def warm_up_only(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
            missed.clear()
            kernel = launch(self, *args, grid=grid, warmup=True, **kwargs)
            # Triton 3.6 puts a variant in its kernel's cache only once the pool is drained; until
            # then each launch of it takes the whole miss path again (packing the arguments,
            # hashing the source), most of a pass's host time. Its pending compile stands in for
            # it in the cache meanwhile (later Triton does the same itself; setdefault keeps theirs).
            if kernel is not None and missed and missed[-1][0] is self:
                cache = self.device_caches[driver.active.get_current_device()][0]
                cache.setdefault(missed[-1][1], kernel)
                pending.append((cache, missed[-1][1], kernel))
            return kernel

        drain_start = time.monotonic()
        with ThreadPoolExecutor(stats.workers, thread_name_prefix="triton-compile") as pool:
            mode = AsyncCompileMode(pool, ignore_errors=True)
            JITFunction.run = warm_up_only  # type: ignore[method-assign]
            knobs.runtime.jit_cache_hook = note_miss
            try:
                with mode:  # its exit waits for every compile and puts each variant in its cache
                    try:
                        yield stats
                    finally:
                        JITFunction.run = launch  # type: ignore[method-assign]
                        knobs.runtime.jit_cache_hook = previous_hook
                        stats.variants = len(mode.future_kernels)
                        drain_start = time.monotonic()
            finally:
                JITFunction.run = launch  # type: ignore[method-assign]
                knobs.runtime.jit_cache_hook = previous_hook
                # A stand-in whose compile failed is still there: drop it, so that the variant's
                # first launch compiles it again.
                for cache, key, stand_in in pending:
                    if cache.get(key) is stand_in:
                        del cache[key]
        stats.drain_s = time.monotonic() - drain_start
