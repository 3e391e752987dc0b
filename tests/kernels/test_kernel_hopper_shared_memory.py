"""The attention launches fit a Hopper SM's shared memory, checked on the CPU by
compiling them for sm_90 (tests/kernels/hopper_compile.py). Two GPU-only failures of this kind
(MLA in float32 with three pipeline stages; a gathered FP8 scale tile in paged attention) only
showed on the H200 before this check existed. The same compile shows the MMA operand layouts of
MLA and paged attention on an FP8 cache (a third kind: an FP8 cache rounding apart from the
16-bit cache)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Shared memory one block may use on H100/H200 (227 KiB, the opt-in maximum).
HOPPER_MAX_SHARED_BYTES = 232_448


@pytest.mark.slow
def test_attention_launches_fit_hopper_shared_memory(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")
    script = Path(__file__).with_name("hopper_compile.py")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    cases = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    kernels = {c["kernel"] for c in cases}
    assert kernels == {"mla_decode", "paged_attention"}, done.stdout
    for case in cases:
        assert case["shared"], f"nothing compiled for {case}"
        assert max(case["shared"]) <= HOPPER_MAX_SHARED_BYTES, f"over Hopper's shared memory: {case}"
    # Every case compiled: both query dtypes of MLA with and without an FP8 cache, and the widest
    # head of paged attention in float32 (both caches) and bfloat16 (FP8 cache), and a head of 128
    # in both query dtypes on both caches, its bf16 FP8 case both ways (scales on the dequantised
    # tiles, the default, or on the scores).
    assert len(cases) == 12, done.stdout
    # Dequantised FP8 tiles take the same MMA operand layout as the 16-bit cache's
    # (kernels/_opaque.py), so the products over k are grouped alike and an FP8 cache gives the
    # dequantised cache's bits.
    mla = {(c["dtype"], c["fp8_cache"]): c["dot_kwidths"] for c in cases if c["kernel"] == "mla_decode"}
    assert mla[("torch.bfloat16", True)] == mla[("torch.bfloat16", False)] != [], mla
    attention = {
        (c["head_dim"], c["fp8_cache"], c.get("scales_on_scores")): c["dot_kwidths"]
        for c in cases
        if c["kernel"] == "paged_attention" and c["dtype"] == "torch.bfloat16"
    }
    assert attention[(128, True, None)] == attention[(128, False, None)] != [], attention
    assert attention[(128, True, True)] == attention[(128, False, None)], attention
    assert attention[(256, True, None)] == attention[(128, False, None)], attention
