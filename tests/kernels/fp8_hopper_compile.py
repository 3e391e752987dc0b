"""Compile the FP8 linear GEMM and the FP8 grouped MoE GEMM for Hopper (sm_90) on a machine without
a GPU, in both weight-scale layouts, and print each launch's shared memory as JSON lines.

The same compile-only driver as hopper_compile.py (whose module docstring says how it works): the
launch fails after the compiled kernel is in the JIT cache; its PTX shows whether the FP8 products run on wgmma. Run as a script in a fresh interpreter
with TRITON_INTERPRET unset. On sm_90 the FP8 `tl.dot` lowers to wgmma, which the interpreter never
exercises, so this is what the CPU suite can check of the GPU build of these kernels.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import torch
from hopper_compile import _compile_only, _shared_bytes

from shardinfer.kernels import fp8_matmul, fp8_moe  # imported before _compile_only patches the device checks
from shardinfer.kernels.reference_fp8 import GROUP, quantize_blocks, quantize_channels, quantize_groups


def _compiled(kernel: Any, launch: Any) -> dict[str, Any]:
    """Shared memory of each compiled variant, and whether all of them multiply on wgmma."""
    shared = _shared_bytes(kernel, launch)
    ptx = [k.asm.get("ptx", "") for caches in kernel.device_caches.values() for k in caches[0].values()]
    return {"shared": shared, "wgmma": bool(ptx) and all("wgmma" in p for p in ptx)}


def _linear_cases() -> list[dict[str, Any]]:
    out = []
    n, k, m = 512, 1024, 64
    xq, xs = quantize_groups(torch.randn(m, k))
    for layout in ("block", "channel"):
        quantize = quantize_blocks if layout == "block" else quantize_channels
        wq, ws = quantize(torch.randn(n, k))
        cfg = dataclasses.replace(fp8_matmul.tile_config(n, k, m), tma=False)  # the pointer-load kernel

        def launch(wq: torch.Tensor = wq, ws: torch.Tensor = ws, cfg: Any = cfg) -> object:
            return fp8_matmul.linear_fp8_quantized(xq, xs, wq, ws, None, torch.bfloat16, cfg)

        out.append(
            {"kernel": "fp8_linear", "scales": layout, **_compiled(fp8_matmul._fp8_linear_kernel, launch)}
        )
        tma = fp8_matmul.tile_config(n, k, m)  # the default: operands through TMA
        assert tma.tma

        def launch_tma(wq: torch.Tensor = wq, ws: torch.Tensor = ws, cfg: Any = tma) -> object:
            return fp8_matmul.linear_fp8_quantized(xq, xs, wq, ws, None, torch.bfloat16, cfg)

        compiled = _compiled(fp8_matmul._fp8_linear_tma_kernel, launch_tma)
        out.append({"kernel": "fp8_linear_tma", "scales": layout, **compiled})
        split = dataclasses.replace(tma, split_k=2)  # K ranges summed apart: another compiled variant

        def launch_split(wq: torch.Tensor = wq, ws: torch.Tensor = ws, cfg: Any = split) -> object:
            return fp8_matmul.linear_fp8_quantized(xq, xs, wq, ws, None, torch.bfloat16, cfg)

        compiled = _compiled(fp8_matmul._fp8_linear_tma_kernel, launch_split)
        out.append({"kernel": "fp8_linear_tma_split", "scales": layout, **compiled})
        # Both ranges in one program (block scales; per-channel ones take the workspace path above).
        in_program = dataclasses.replace(split, ranges_in_program=True)

        def launch_in_program(wq: torch.Tensor = wq, ws: torch.Tensor = ws, cfg: Any = in_program) -> object:
            return fp8_matmul.linear_fp8_quantized(xq, xs, wq, ws, None, torch.bfloat16, cfg)

        compiled = _compiled(fp8_matmul._fp8_linear_tma_kernel, launch_in_program)
        out.append({"kernel": "fp8_linear_tma_ranges_in_program", "scales": layout, **compiled})
    return out


def _moe_cases() -> list[dict[str, Any]]:
    out = []
    experts, hidden, inter, rows = 4, 512, 256, 64
    tiles = fp8_moe.DEFAULT_TILES
    aq, a_s = quantize_groups(torch.randn(rows, hidden))
    act = torch.empty(rows, inter, dtype=torch.bfloat16)
    sorted_slots = torch.arange(rows, dtype=torch.int32)
    block_expert = torch.zeros(rows // tiles.block_m, dtype=torch.int32)
    for layout in ("block", "channel"):
        w = torch.randn(experts, 2 * inter, hidden)
        if layout == "block":
            pairs = [quantize_blocks(w[e]) for e in range(experts)]
        else:
            pairs = [quantize_channels(w[e]) for e in range(experts)]
        wq, ws = torch.stack([q for q, _ in pairs]), torch.stack([s for _, s in pairs])
        grid = (block_expert.shape[0] * -(-inter // tiles.block_n),)

        def launch(wq: torch.Tensor = wq, ws: torch.Tensor = ws, grid: tuple[int] = grid) -> object:
            return fp8_moe._fp8_grouped_gemm_kernel[grid](
                aq,
                a_s,
                wq,
                ws,
                act,
                sorted_slots,
                block_expert,
                inter,
                hidden,
                1,
                aq.stride(0),
                a_s.stride(0),
                wq.stride(0),
                wq.stride(1),
                ws.stride(0),
                ws.stride(1),
                act.stride(0),
                experts,
                inter,
                block_expert.shape[0],
                GATED=True,
                A_SORTED=True,
                CHANNEL_SCALES=ws.dim() == 2,
                BLOCK_M=tiles.block_m,
                BLOCK_N=tiles.block_n,
                BLOCK_K=GROUP,
                INTERPRET=False,
                GROUP_M=tiles.group_m,
                num_warps=tiles.num_warps,
                num_stages=tiles.num_stages,
            )

        compiled = _compiled(fp8_moe._fp8_grouped_gemm_kernel, launch)
        out.append({"kernel": "fp8_moe_gate_up", "scales": layout, **compiled})
    return out


def _warp_specialized_case() -> dict[str, Any]:
    """fp8_matmul_ws's kernel (Gluon), which fp8_matmul runs at prefill sizes."""
    from shardinfer.kernels import fp8_matmul_ws

    n, k, m = 512, 1024, 300
    xq, xs = quantize_groups(torch.randn(m, k))
    wq, ws = quantize_blocks(torch.randn(n, k))
    y = torch.empty(m, n, dtype=torch.bfloat16)
    fp8_matmul_ws.PERSISTENT = False  # one program a tile (at this K the default is the persistent kernel)

    def launch() -> object:
        fp8_matmul_ws.linear_fp8_ws(xq, xs, wq, ws, None, y)
        return y

    return {
        "kernel": "fp8_linear_ws",
        "scales": "block",
        **_compiled(fp8_matmul_ws._fp8_linear_ws_kernel, launch),
    }


def _persistent_case() -> dict[str, Any]:
    """fp8_matmul_ws's persistent kernel (PERSISTENT), with a bias (stored inside its consumer partition)."""
    from shardinfer.kernels import fp8_matmul_ws

    n, k, m = 512, 1024, 300
    xq, xs = quantize_groups(torch.randn(m, k))
    wq, ws = quantize_blocks(torch.randn(n, k))
    bias = torch.randn(n, dtype=torch.bfloat16)
    y = torch.empty(m, n, dtype=torch.bfloat16)
    fp8_matmul_ws.PERSISTENT = True
    fp8_matmul_ws.sm_count = lambda device_index: 132  # type: ignore[assignment]  # an H200's; no device here

    def launch() -> object:
        fp8_matmul_ws.linear_fp8_ws(xq, xs, wq, ws, bias, y)
        return y

    compiled = _compiled(fp8_matmul_ws._fp8_linear_ws_persistent_kernel, launch)
    return {"kernel": "fp8_linear_ws_persistent", "scales": "block", **compiled}


def main() -> None:
    _compile_only()
    for case in (*_linear_cases(), *_moe_cases(), _warp_specialized_case(), _persistent_case()):
        print(json.dumps(case), flush=True)


if __name__ == "__main__":
    main()
