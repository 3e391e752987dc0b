"""The MoE kernels compile for Hopper (sm_90) on a machine without a GPU.

The interpreter runs kernels as numpy code and accepts programs the GPU compiler rejects, and it
says nothing about speed. Here Triton compiles the routing kernel and both grouped GEMMs down to
PTX for sm_90 with the specialisations a real launch at the moe-16b shapes gets (16-divisible
sizes, 16-byte aligned pointers), and we check what decides the GEMMs' speed: the K loop is
software-pipelined (cp.async loads into shared memory) and runs on wgmma, without register
spills, in the shared memory an H100/H200 has. The compiler runs in a child process because
this process has Triton's interpreter switched on, which replaces every kernel by a Python one.
"""

from __future__ import annotations

import pytest
import triton
from kernel_checks import compile_in_child

if "nvidia" not in triton.backends.backends:
    pytest.skip("Triton's NVIDIA backend is not installed", allow_module_level=True)

HOPPER_SHARED_BYTES = 232448

_COMPILE = r"""
import json, torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from shardinfer.kernels import moe, moe_routing

def build(fn, args, divisible, constexprs, **options):
    signature = {**args, **{name: "constexpr" for name in constexprs}}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(args) if name in divisible}
    k = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options=options)
    ptx = k.asm["ptx"]
    return {"cp_async": "cp.async.cg" in ptx or "cp.async.ca" in ptx, "tma": "cp.async.bulk.tensor" in ptx,
            "wgmma": "wgmma.mma_async" in ptx, "spills": "ld.local" in ptx, "shared": k.metadata.shared}

out = {}
for size, tiles in (("", moe.DEFAULT_TILES), ("hopper_small_", moe.HOPPER_SMALL_TILES),
                    ("hopper_large_", moe.HOPPER_LARGE_TILES)):
    for gated in (True, False):
        block_n, warps, stages = (tiles.block_n, tiles.num_warps, tiles.num_stages) if gated else tiles.down()
        a_tma = tiles.tma_rows and not gated
        a_desc = f"tensordesc<bf16[{tiles.block_m}, {tiles.block_k}]>" if a_tma else "*bf16"
        w_desc = f"tensordesc<bf16[{block_n}, {tiles.block_k}]>" if tiles.tma else "*bf16"
        gemm = {"a_ptr": "*bf16", "a_desc": a_desc, "w_ptr": "*bf16", "w_desc": w_desc, "out_ptr": "*bf16",
                "sorted_ptr": "*i32", "block_expert_ptr": "*i32", "n_cols": "i32", "k_dim": "i32", "a_row_div": "i32",
                "sa": "i32", "swe": "i32", "swn": "i32", "so": "i32", "n_experts": "i32", "up_offset": "i32",
                "rows_per_expert": "i32", "n_tiles": "i32"}
        # top-k (6) is not divisible by 16; descriptors carry no divisibility hint
        divisible = set(gemm) - {"a_row_div", "n_tiles", "a_desc", "w_desc"}
        out[size + ("gate_up" if gated else "down")] = build(
            moe._grouped_gemm_kernel, gemm, divisible,
            dict(GATED=gated, A_SORTED=not gated, A_TMA=a_tma, W_TMA=tiles.tma, BLOCK_M=tiles.block_m,
                 BLOCK_N=block_n, BLOCK_K=tiles.block_k, PRECISION="tf32", INTERPRET=False, GROUP_M=tiles.group_m),
            num_warps=warps, num_stages=stages)
route = {"logits_ptr": "*fp32", "bias_ptr": "*fp32", "weights_ptr": "*fp32", "ids_ptr": "*i64", "stride_t": "i32",
         "n_experts": "i32", "per_group": "i32", "n_group": "i32", "scale": "fp32"}
# DeepSeek-V3's own router: 256 experts in 8 groups, 4 kept, top-8.
out["routing"] = build(moe_routing._grouped_topk_kernel, route, {"logits_ptr", "bias_ptr", "weights_ptr", "ids_ptr"},
                       dict(HAS_BIAS=True, SOFTMAX=False, LIMIT_GROUPS=True, TOPK_GROUP=4, TOP_K=8, RENORMALIZE=True,
                            TOP_K_PAD=8, GROUPS=8, PER_GROUP=32), num_warps=2)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def compiled() -> dict[str, dict[str, object]]:
    result: dict[str, dict[str, object]] = compile_in_child(_COMPILE)
    return result


@pytest.mark.parametrize(
    "kernel",
    [
        "gate_up",
        "down",
        "hopper_small_gate_up",
        "hopper_small_down",
        "hopper_large_gate_up",
        "hopper_large_down",
    ],
)
def test_grouped_gemm_is_pipelined_on_hopper(compiled: dict[str, dict[str, object]], kernel: str) -> None:
    facts = compiled[kernel]
    # Pointer loads pipeline through cp.async, TMA tiles through bulk tensor copies: the gate/up
    # GEMM's gathered token rows always take the first, every operand of a TMA tiling's down GEMM
    # the second.
    tma_only = kernel.startswith("hopper") and kernel.endswith("down")
    assert facts["cp_async"] != tma_only, "the K loop's pointer loads are not pipelined"
    assert facts["tma"] == kernel.startswith("hopper"), "TMA operands are not loaded by the copy engine"
    assert facts["wgmma"] and not facts["spills"]
    assert int(str(facts["shared"])) <= HOPPER_SHARED_BYTES


def test_routing_kernel_compiles_for_hopper(compiled: dict[str, dict[str, object]]) -> None:
    assert not compiled["routing"]["spills"]
