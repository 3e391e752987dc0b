"""kernels/compile_ahead.py on a machine without a GPU, through hopper_compile.py's compile-only
driver (which raises on any launch). Prints one JSON line of findings. Run as a script in a fresh
interpreter with TRITON_INTERPRET unset."""

from __future__ import annotations

import json
from typing import Any

import torch
import triton
import triton.language as tl
from hopper_compile import _compile_only
from triton import knobs

from shardinfer.kernels.compile_ahead import compile_instead_of_launch


@triton.jit
def _scale_kernel(x_ptr, out_ptr, n, factor, BLOCK: tl.constexpr, BROKEN: tl.constexpr):
    tl.static_assert(not BROKEN, "this variant does not compile")
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * factor, mask=offs < n)


def _variants() -> list[Any]:
    return [k for caches in _scale_kernel.device_caches.values() for k in caches[0].values()]


def main() -> None:
    _compile_only()
    x, out = torch.zeros(256), torch.empty(256)
    seen: list[str] = []

    def earlier_hook(**kwargs: Any) -> None:
        seen.append(kwargs["fn"].name)

    knobs.runtime.jit_cache_hook = earlier_hook
    with compile_instead_of_launch(workers=2) as stats:
        for _ in range(3):  # repeats of one variant compile it once
            _scale_kernel[(1,)](x, out, 256, 2.0, BLOCK=128, BROKEN=False)
        _scale_kernel[(1,)](x, out, 256, 2.0, BLOCK=64, BROKEN=False)
        _scale_kernel[(1,)](x, out, 256, 2.0, BLOCK=128, BROKEN=True)
    compiled = _variants()
    print(
        json.dumps(
            {
                "variants": stats.variants,
                "cached": len(compiled),
                "cached_are_compiled": all(hasattr(k, "asm") and "ptx" in k.asm for k in compiled),
                "earlier_hook_calls": len(seen),
                "hook_restored": knobs.runtime.jit_cache_hook is earlier_hook,
            }
        )
    )


if __name__ == "__main__":
    main()
