"""Compile the paged-attention and MLA decode kernels for Hopper (sm_90) on a machine without a GPU and
print each launch's shared memory as JSON lines.

Run as a script in a fresh interpreter with TRITON_INTERPRET unset (under the interpreter
`triton.jit` never compiles). Triton's NVIDIA backend (LLVM and the bundled ptxas) compiles for
any target; only the driver is missing, so a stand-in answers the three questions the launch path
asks before compiling (device, stream, target). The launch itself then fails, after the compiled
kernel is in the JIT cache, which is where the sizes are read. Nothing here runs a kernel.

A kernel asking for more shared memory than an SM gives one block fails to launch on the GPU
(`OutOfResources`), so this is what the CPU suite can check of a GPU-only failure mode.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from collections.abc import Callable
from typing import Any

import torch
from triton.backends.compiler import GPUTarget
from triton.runtime import driver

HOPPER = GPUTarget("cuda", 90, 32)


class _HopperWithoutDevice:
    """The driver calls the JIT makes before compiling; nothing else is available."""

    def get_current_target(self) -> GPUTarget:
        return HOPPER

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"{name}: no GPU here (compile-only driver)")


def _compile_only() -> None:
    driver.set_active(_HopperWithoutDevice())  # type: ignore[arg-type]
    from shardinfer.kernels import _common, mla_decode, paged_attention  # noqa: F401 - patched below

    # The launchers refuse CPU tensors unless interpreting; here they only reach the compiler.
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("shardinfer.kernels") and hasattr(
            mod, "check_same_device"
        ):
            mod.check_same_device = lambda **tensors: torch.device("cpu")  # type: ignore[attr-defined]
    _common.check_same_device = lambda **tensors: torch.device("cpu")  # type: ignore[assignment]


def _shared_bytes(kernel: Any, launch: Callable[[], object]) -> list[int]:
    """Compile `kernel` through `launch` (which fails at the launch) and return its variants' sizes."""
    for caches in kernel.device_caches.values():
        caches[0].clear()
    with contextlib.suppress(AttributeError, RuntimeError):
        launch()  # the stand-in driver cannot launch: the compiled kernel is cached by then
    return [k.metadata.shared for caches in kernel.device_caches.values() for k in caches[0].values()]


def _dot_kwidths(kernel: Any) -> list[int]:
    """The MMA operand layouts' kWidths in the compiled variants' TTGIR (how many consecutive k values
    a thread holds; it decides how the MMAs group the products over k, so it decides the rounding)."""
    irs = [k.asm["ttgir"] for caches in kernel.device_caches.values() for k in caches[0].values()]
    return sorted(
        {int(w) for ir in irs for w in re.findall(r"dot_op<\{opIdx = \d, parent = #\w+, kWidth = (\d+)", ir)}
    )


def _mla_cases() -> list[dict[str, Any]]:
    from shardinfer.kernels import mla_decode
    from shardinfer.kernels.reference_fp8 import quantize_groups

    out = []
    rank, rope, heads, block = 512, 64, 16, 64
    for dtype, fp8 in (
        (torch.bfloat16, True),
        (torch.bfloat16, False),
        (torch.float32, True),
        (torch.float32, False),
    ):
        cache = torch.randn(4, block, rank + rope)
        extra: dict[str, torch.Tensor] = {}
        if fp8:
            cache, scale = quantize_groups(cache)
            extra["cache_scale"] = scale
        else:
            cache = cache.to(dtype)
        # The depth an H200 (132 SMs) picks for one decode token: the one-wave case, the deepest.
        stages = mla_decode.pipeline_stages(
            1, heads, 2048, mla_decode.MLA_KV_CHUNK, mla_decode.MLA_BLOCK_M, 132, dtype.itemsize, fp8
        )
        q_latent, q_pe = torch.randn(1, heads, rank, dtype=dtype), torch.randn(1, heads, rope, dtype=dtype)
        args = (
            q_latent,
            q_pe,
            cache,
            torch.tensor([0, 1], dtype=torch.int32),
            torch.tensor([100], dtype=torch.int32),
            torch.zeros(1, 2, dtype=torch.int32),
            0.1,
        )

        def launch(
            args: tuple[Any, ...] = args, stages: int = stages, extra: dict[str, Any] = extra
        ) -> object:
            return mla_decode.mla_paged_attention(*args, max_seq_len=100, num_stages=stages, **extra)

        sizes = _shared_bytes(mla_decode._mla_chunk_kernel, launch)
        out.append(
            {
                "kernel": "mla_decode",
                "dtype": str(dtype),
                "fp8_cache": fp8,
                "stages": stages,
                "shared": sizes,
                "dot_kwidths": _dot_kwidths(mla_decode._mla_chunk_kernel),
            }
        )
    return out


def _attention_cases() -> list[dict[str, Any]]:
    from shardinfer.kernels import paged_attention
    from shardinfer.kernels.reference_fp8 import quantize_groups

    out = []
    # The widest head, the most shared memory; and 128, where an FP8 cache reads 128-key tiles,
    # with its scales on the dequantised tiles (the default) or, for bf16, on the scores.
    cases = [
        (256, torch.bfloat16, True, None),
        (256, torch.float32, False, None),
        (256, torch.float32, True, None),
    ]
    cases += [(128, dtype, fp8, None) for dtype in (torch.bfloat16, torch.float32) for fp8 in (False, True)]
    cases.append((128, torch.bfloat16, True, True))
    for d, dtype, fp8, on_scores in cases:
        k, v = torch.randn(4, 16, 2, d), torch.randn(4, 16, 2, d)
        extra: dict[str, Any] = {}
        if fp8:
            (k, ks), (v, vs) = quantize_groups(k), quantize_groups(v)
            extra = {"k_scale": ks, "v_scale": vs, "fp8_scale_scores": on_scores}
        else:
            k, v = k.to(dtype), v.to(dtype)
        args = (
            torch.randn(1, 4, d, dtype=dtype),
            k,
            v,
            torch.tensor([0, 1], dtype=torch.int32),
            torch.tensor([40], dtype=torch.int32),
            torch.zeros(1, 4, dtype=torch.int32),
            0.1,
        )

        def launch(args: tuple[Any, ...] = args, extra: dict[str, Any] = extra) -> object:
            return paged_attention.paged_attention(*args, max_seq_len=40, **extra)

        sizes = _shared_bytes(paged_attention._attn_chunk_kernel, launch)
        out.append(
            {
                "kernel": "paged_attention",
                "head_dim": d,
                "dtype": str(dtype),
                "fp8_cache": fp8,
                "scales_on_scores": on_scores,
                "shared": sizes,
                "dot_kwidths": _dot_kwidths(paged_attention._attn_chunk_kernel),
            }
        )
    return out


def main() -> None:
    _compile_only()
    for case in (*_mla_cases(), *_attention_cases()):
        print(json.dumps(case), flush=True)


if __name__ == "__main__":
    main()
