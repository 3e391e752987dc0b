"""kernels/compile_ahead.py, through the compile-only driver (compile_ahead_compile_only.py): inside,
launches compile instead of launching, a variant launched several times compiles once, a variant
that fails to compile leaves nothing in the kernel's cache (its first real launch compiles it again
and raises there), and a jit_cache_hook set before is called and then restored."""

from __future__ import annotations

import json
from pathlib import Path

from kernel_checks import run_compile_script


def test_compile_ahead_compiles_each_variant_once_and_drops_the_failed_one(tmp_path: Path) -> None:
    lines = run_compile_script(
        Path(__file__).with_name("compile_ahead_compile_only.py"), tmp_path / "triton", timeout=300
    )
    got = json.loads(lines[-1])
    assert got == {
        "variants": 3,
        "cached": 2,
        "cached_are_compiled": True,
        "earlier_hook_calls": 3,
        "hook_restored": True,
    }, got
