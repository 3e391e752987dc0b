"""Kernel tests run the Triton kernels in Triton's CPU interpreter when no GPU is present.

TRITON_INTERPRET is read when a function is decorated with @triton.jit, and Triton decorates
its own library functions (tl.sum, tl.zeros_like, ...) when triton is first imported. So it
must be set before anything imports triton; this conftest sets it before any test module of
this folder is imported. If something imported triton earlier in the same process (another
folder's test collecting first), the interpreter cannot be switched on any more: we stop with
a message rather than let every kernel test fail obscurely. Setting TRITON_INTERPRET=1 in the
environment (or in the top-level conftest) avoids that. On a CUDA machine nothing is changed:
the same tests run compiled on the GPU.
"""

import os
import sys

import pytest
import torch

if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    if "triton" in sys.modules:
        raise pytest.UsageError(
            "tests/kernels: triton was imported before the kernel tests could enable its CPU interpreter; "
            "run with TRITON_INTERPRET=1 in the environment, or set it in tests/conftest.py"
        )
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture
def device() -> torch.device:
    """Where the kernels run: the GPU if there is one, else the CPU through the interpreter."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
