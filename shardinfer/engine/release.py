"""This release of shardinfer: its version, and which arithmetic its kernels compute a row with.

VERSION is the package's version (pyproject.toml names the same; a test checks they agree). It lives
here, below the layers that record it in outputs, rather than in the package's facade.

Batch invariance makes a row's bits a pure function of model, prompt, parameters and seed within
one version of shardinfer on one kind of device. A change to a kernel's arithmetic (another
reduction order, split-K, accumulation or quantisation rule; docs/performance.md names each) gives
other bits, so it raises NUMERICS_REVISION by one. Output parts and run records carry it, so a job
resumed by a version of another revision is warned that its remaining splits are computed
differently, and its summary counts the parts written under each revision.

The revision is one number for every device and configuration: a change that only touches, say,
the FP8 GEMM on Hopper raises it for all, and parts of two revisions *may* differ, not must.
"""

VERSION = "0.1.0"
NUMERICS_REVISION = 1
