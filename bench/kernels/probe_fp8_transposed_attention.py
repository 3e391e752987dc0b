"""Compile-only probe (no GPU): does Triton put a decode attention loop with the products transposed
on Hopper's warpgroup MMAs, the raw FP8 key tile straight into an e4m3 product?

A toy of the lead in NOTES.md ("A lead: the keys straight into FP8 warpgroup MMAs"): one program,
four 128-key tiles, no pages, masks, scales or rescaling. The scores are keys x queries (the keys
as the MMA's rows, the heads as its columns), the output value-tile-transposed x probabilities.
Prints a JSON line for 8 and for 16 query columns: the MMA instructions in the PTX, the shared
memory, the shared-memory loads and stores, and the registers a thread (from the cubin).

    python bench/kernels/probe_fp8_transposed_attention.py   (TRITON_INTERPRET unset)
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.kernels.hopper_compile import _compile_only


@triton.jit
def _toy_decode(q_ptr, k_ptr, v_ptr, o_ptr, KEYS: tl.constexpr, HEADS: tl.constexpr, D: tl.constexpr):
    keys = tl.arange(0, KEYS)
    heads = tl.arange(0, HEADS)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + heads[:, None] * D + d[None, :])  # e4m3 [heads, d]
    acc = tl.zeros([D, HEADS], tl.float32)
    for tile in range(4):
        rows = tile * KEYS + keys
        k = tl.load(k_ptr + rows[:, None] * D + d[None, :])  # raw e4m3 [keys, d]
        s = tl.dot(k, tl.trans(q))  # [keys, heads]: an e4m3 product, the keys never converted
        p = tl.exp2(s - tl.max(s, 0)[None, :])
        v = tl.load(v_ptr + rows[:, None] * D + d[None, :]).to(tl.float32).to(tl.bfloat16)  # [keys, d]
        acc += tl.dot(tl.trans(v), p.to(tl.bfloat16))  # [d, heads]
    tl.store(o_ptr + d[:, None] * HEADS + heads[None, :], acc)


def _registers(cubin: bytes) -> str:
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True)
    found = re.search(r"REG:\d+ STACK:\d+", usage.stdout)
    return found.group(0) if found else "unknown"


def main() -> None:
    _compile_only()
    fp8 = torch.float8_e4m3fn
    for heads in (8, 16):
        for caches in _toy_decode.device_caches.values():
            caches[0].clear()
        args = (
            torch.empty(heads, 128, dtype=fp8),
            torch.empty(4 * 128, 128, dtype=fp8),
            torch.empty(4 * 128, 128, dtype=fp8),
            torch.empty(128, heads, dtype=torch.float32),
        )
        with contextlib.suppress(AttributeError, RuntimeError):  # the stand-in driver cannot launch
            _toy_decode[(1,)](*args, KEYS=128, HEADS=heads, D=128, num_warps=4, num_stages=1)
        for caches in _toy_decode.device_caches.values():
            for kernel in caches[0].values():
                ptx = kernel.asm["ptx"]
                case = {
                    "heads": heads,
                    "mma": sorted(set(re.findall(r"(mma\.sync\S*|wgmma\.mma_async\S*)", ptx))),
                    "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
                    "shared": kernel.metadata.shared,
                    "ld_shared": len(re.findall(r"ld\.shared", ptx)),
                    "ld_shared_b8": len(re.findall(r"ld\.shared\.b8", ptx)),
                    "st_shared": len(re.findall(r"st\.shared", ptx)),
                    "registers": _registers(kernel.asm["cubin"]),
                }
                print(json.dumps(case), flush=True)


if __name__ == "__main__":
    main()
