"""Compile-only probe (no GPU): the transposed FP8 decode attention prototype
(proto_fp8_attention_transposed.py) compiled for Hopper. Does Triton put its products on the
warpgroup MMAs, the raw FP8 key tile straight into an e4m3 product, with no byte-wise gathers?

Prints a JSON line for each of the prototype's configs at GQA group 4 and the first at group 2: the
MMA instructions in the PTX, the query columns they carry, the shared memory, the shared-memory
loads and stores, and the registers a thread (from the cubin).

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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.kernels import proto_fp8_attention_transposed as proto
from tests.kernels.hopper_compile import _compile_only


def _registers(cubin: bytes) -> str:
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True)
    found = re.search(r"REG:\d+ STACK:\d+", usage.stdout)
    return found.group(0) if found else "unknown"


def _inputs(group: int, hk: int = 8, blocks: int = 27) -> tuple[torch.Tensor, ...]:
    """CPU stand-ins with the engine cache's shapes and dtypes (only the compiler sees them)."""
    shape = (blocks, proto.PAGE_SIZE, hk, proto.HEAD_DIM)
    scales = torch.ones(blocks, proto.PAGE_SIZE, hk, 1)
    return (
        torch.randn(2, group * hk, proto.HEAD_DIM).to(torch.bfloat16),
        torch.randn(shape).to(torch.float8_e4m3fn),
        torch.randn(shape).to(torch.float8_e4m3fn),
        scales,
        scales,
        torch.arange(1, blocks, dtype=torch.int32).view(2, -1),
        torch.tensor([200, 150], dtype=torch.int32),
    )


def main() -> None:
    _compile_only()
    kernel = proto._decode_transposed_kernel
    for group, configs in ((4, proto.CONFIGS), (2, proto.CONFIGS[:1])):
        for terms, block_n, stages, cap in configs:
            for caches in kernel.device_caches.values():
                caches[0].clear()
            with contextlib.suppress(AttributeError, RuntimeError):  # the stand-in driver cannot launch
                proto.decode_transposed(*_inputs(group), 0.1, terms, block_n, 4, stages, cap)
            for caches in kernel.device_caches.values():
                for compiled in caches[0].values():
                    ptx = compiled.asm["ptx"]
                    case = {
                        "group": group,
                        "terms": terms,
                        "block_n": block_n,
                        "stages": stages,
                        "max_registers": cap,
                        "columns": max(8, triton.next_power_of_2(group)),
                        "mma": sorted(set(re.findall(r"(mma\.sync\S*|wgmma\.mma_async\S*)", ptx))),
                        "shared": compiled.metadata.shared,
                        "ld_shared": len(re.findall(r"ld\.shared", ptx)),
                        "ld_shared_b8": len(re.findall(r"ld\.shared\.b8", ptx)),
                        "st_shared": len(re.findall(r"st\.shared", ptx)),
                        "registers": _registers(compiled.asm["cubin"]),
                    }
                    print(json.dumps(case), flush=True)


if __name__ == "__main__":
    main()
