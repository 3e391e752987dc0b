"""The engine process's CPU threads on a GPU.

On a GPU the host's torch operations are small (a step's inputs staged in pinned memory), but one
above torch's parallel grain wakes its whole OpenMP pool, whose threads then spin waiting for the
next one, most of a core each, beside the engine thread that builds every step; with one thread
they are gone (docs/performance.md, "The host's threads"). A GPU engine therefore leaves torch
one intra-op thread, as other GPU inference engines do for their workers, unless OMP_NUM_THREADS
says otherwise. CPU engines compute with those threads and keep them.
"""

from __future__ import annotations

import logging
import os

import torch

log = logging.getLogger(__name__)


def limit_host_threads(device: torch.device) -> bool:
    """On CUDA, one torch intra-op thread unless OMP_NUM_THREADS is set; returns whether it changed
    the count."""
    if device.type != "cuda" or os.environ.get("OMP_NUM_THREADS") or torch.get_num_threads() == 1:
        return False
    log.info(
        "torch's CPU threads: %d -> 1 for the GPU engine's host work (set OMP_NUM_THREADS to choose)",
        torch.get_num_threads(),
    )
    torch.set_num_threads(1)
    return True
