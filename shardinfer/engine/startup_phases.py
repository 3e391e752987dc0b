"""Where an engine's start-up goes: seconds per named phase, measured where each phase runs.

The engine and its model runner time their own set-up (device initialisation, tokenizer, model
load, KV-cache sizing, kernel warm-up, CUDA-graph capture) and expose the result as
`LLMEngine.startup_phases`, a dict in the order the phases ran; a job writes it to its timeline
(pipeline/timeline.py) and bench/job_throughput.py reads it from there.

Phases that queue device work (weight copies, zero-filling the KV cache) are closed with a
device synchronisation, so each is charged with its own device time, not the next phase.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch


class StartupPhases:
    """Accumulates monotonic-clock seconds per phase name; a name timed twice adds up."""

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self._sync = sync

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
            if self._sync is not None:
                self._sync()
        finally:
            self.add(name, time.monotonic() - start)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds


def device_sync(device: torch.device) -> Callable[[], None] | None:
    """What closes a phase on `device`: a CUDA synchronisation, or nothing on the host."""
    if device.type != "cuda":
        return None
    return lambda: torch.cuda.synchronize(device)


def init_device(device: torch.device) -> None:
    """Create the CUDA context now, so its cost is a phase of its own and not the first copy's."""
    torch.zeros(1, device=device)
