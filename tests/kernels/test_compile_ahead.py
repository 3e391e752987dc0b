"""kernels/compile_ahead.py, through the compile-only driver (compile_ahead_compile_only.py): inside,
launches compile instead of launching, a variant launched several times compiles once, a variant
that fails to compile leaves nothing in the kernel's cache (its first real launch compiles it again
and raises there), and a jit_cache_hook set before is called and then restored."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def test_compile_ahead_compiles_each_variant_once_and_drops_the_failed_one(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    script = Path(__file__).with_name("compile_ahead_compile_only.py")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]  # the stand-in driver raises on any launch
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {"variants": 3, "cached": 2, "cached_are_compiled": True, "earlier_hook_calls": 3,
                   "hook_restored": True}, got
