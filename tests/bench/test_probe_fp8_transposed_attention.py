"""The compile-only probe behind the NOTES.md lead "the keys straight into FP8 warpgroup MMAs"
(bench/kernels/probe_fp8_transposed_attention.py, which compiles the prototype's kernel): with the
products transposed, Triton puts the raw e4m3 key tile into an e4m3 warpgroup MMA and the converted
value tile, transposed, into a bf16 one read from shared memory, with no byte-wise gathers, in every
config the prototype times."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROBE = Path(__file__).resolve().parents[2] / "bench" / "kernels" / "probe_fp8_transposed_attention.py"


def test_transposed_decode_products_compile_to_fp8_and_bf16_warpgroup_mmas(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    done = subprocess.run([sys.executable, str(PROBE)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    cases = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert {c["group"] for c in cases} == {2, 4}, done.stdout
    for case in cases:
        mmas, columns = case["mma"], case["columns"]
        assert f"wgmma.mma_async.sync.aligned.m64n{columns}k32.f32.e4m3.e4m3" in mmas, case
        assert f"wgmma.mma_async.sync.aligned.m64n{columns}k16.f32.bf16.bf16" in mmas, case
        assert not any(m.startswith("mma.sync") for m in mmas), case
        assert case["ld_shared_b8"] == 0, case
