"""The FP8 GEMMs (linear, its warp-specialised Gluon kernel, and the fused MoE's grouped GEMM), block-scaled and per-channel scaled,
compile for Hopper on the CPU (tests/kernels/fp8_hopper_compile.py): their FP8 products lower to
wgmma and their launches fit an SM's shared memory. The interpreter runs neither of these paths."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from test_kernel_hopper_shared_memory import HOPPER_MAX_SHARED_BYTES


def test_fp8_gemms_compile_for_hopper_on_wgmma_in_both_scale_layouts(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    script = Path(__file__).with_name("fp8_hopper_compile.py")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    cases = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    got = {(c["kernel"], c["scales"]) for c in cases}
    kernels = (
        "fp8_linear",
        "fp8_linear_tma",
        "fp8_linear_tma_split",
        "fp8_linear_tma_ranges_in_program",
        "fp8_moe_gate_up",
    )
    want = {(k, s) for k in kernels for s in ("block", "channel")} | {
        ("fp8_linear_ws", "block"),
        ("fp8_linear_ws_persistent", "block"),
    }
    assert got == want, done.stdout
    for case in cases:
        assert case["shared"], f"nothing compiled for {case}"
        assert case["wgmma"], f"the FP8 product does not run on wgmma: {case}"
        assert max(case["shared"]) <= HOPPER_MAX_SHARED_BYTES, f"over Hopper's shared memory: {case}"
