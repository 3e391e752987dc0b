"""Compute kernels. Each function family has a plain-PyTorch reference (`reference.py`, also the
CPU path) and, where it pays, a Triton kernel with the same signature; `ops.py` picks one."""
