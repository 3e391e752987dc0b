"""Kernel tests run the Triton kernels in Triton's CPU interpreter when no GPU is present.

TRITON_INTERPRET is read when a kernel is decorated, i.e. when its module is imported, so it is
set here, before any test module of this folder imports a kernel. Kernel modules imported
earlier (by another folder's tests) are re-imported so that they pick the interpreter up.
On a CUDA machine nothing is changed: the same tests run compiled on the GPU.
"""

import importlib
import os
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
    for name in [m for m in sys.modules if m.startswith("shardinfer.kernels.")]:
        if name.rsplit(".", 1)[-1] in ("rmsnorm", "rope", "activation", "kv_store", "paged_attention",
                                       "sampling"):
            importlib.reload(sys.modules[name])


@pytest.fixture
def device() -> torch.device:
    """Where the kernels run: the GPU if there is one, else the CPU through the interpreter."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
