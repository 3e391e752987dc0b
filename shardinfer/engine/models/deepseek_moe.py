"""DeepSeek-V3 feed-forward blocks: the dense SwiGLU MLP and the routed mixture of experts.

The MoE layer is `shared_experts(x) + sum over the token's top-k routed experts`. Routing
(sigmoid, bias for selection only, group-limited) is `kernels.ops.grouped_topk`: the routing
kernel (kernels/moe_routing.py) on CUDA, the reference elsewhere; the experts are `kernels.ops.moe_experts`:
the fused grouped-GEMM kernel (kernels/moe.py) on CUDA, the reference elsewhere. On CUDA the
layer syncs nothing with the host and has no data-dependent shapes, so a decode step that
contains it can be captured in a CUDA graph; every piece is batch invariant by construction.
Expert weights are stacked: w_gate_up [E, 2I, H] ([gate | up] rows) and w_down [E, H, I].
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from shardinfer.engine.models.base import Numerics
from shardinfer.engine.models.config import ModelConfig
from shardinfer.engine.models.layers import SwiGLUMLP
from shardinfer.errors import ModelLoadError
from shardinfer.kernels import ops
from shardinfer.kernels.reference_fp8 import FP8_DTYPE, GROUP, quantize_blocks

if TYPE_CHECKING:
    from shardinfer.engine.parallel.group import ExpertParallelGroup


# (scoring_func, topk_method) pairs and what they mean:
#   sigmoid + noaux_tc              DeepSeek-V3: correction bias for choosing, groups scored by top-2 sum
#   softmax + greedy                DeepSeek-V2(-Lite): plain top-k
#   softmax + group_limited_greedy  DeepSeek-V2: groups scored by their best expert
_ROUTERS = {("sigmoid", "noaux_tc"), ("softmax", "greedy"), ("softmax", "group_limited_greedy")}
_DEFAULTS = {"deepseek_v3": ("sigmoid", "noaux_tc"), "deepseek_v2": ("softmax", "greedy")}


# transformers' DeepseekV3Config / DeepseekV2Config values for MoE keys a config.json leaves out.
_KEY_DEFAULTS: dict[str, dict[str, Any]] = {
    "deepseek_v3": {
        "routed_scaling_factor": 2.5,
        "n_group": 8,
        "topk_group": 4,
        "n_shared_experts": 1,
        "first_k_dense_replace": 3,
    },
    "deepseek_v2": {
        "routed_scaling_factor": 1.0,
        "n_group": None,
        "topk_group": None,
        "n_shared_experts": 2,
        "first_k_dense_replace": 0,
    },
}


def moe_setting(hf: dict[str, Any], key: str) -> Any:
    """config.json's `key`, or, when the key is absent, the value transformers gives it for this
    model_type: reading a missing key as 0 or 1 instead would run another network than the checkpoint's."""
    if key in hf:
        return hf[key]
    return _KEY_DEFAULTS.get(hf.get("model_type", ""), _KEY_DEFAULTS["deepseek_v3"])[key]


class RoutingConfig:
    """The router settings of config.json, validated once."""

    def __init__(self, hf: dict[str, Any]) -> None:
        default_scoring, default_method = _DEFAULTS.get(hf.get("model_type", ""), _DEFAULTS["deepseek_v3"])
        self.n_routed_experts = int(hf["n_routed_experts"])
        self.top_k = int(hf["num_experts_per_tok"])
        self.scoring_func = str(hf.get("scoring_func") or default_scoring)
        self.topk_method = str(hf.get("topk_method") or default_method)
        if (self.scoring_func, self.topk_method) not in _ROUTERS:
            raise ModelLoadError(
                f"router scoring_func={self.scoring_func!r} with topk_method={self.topk_method!r} "
                f"is not supported; supported pairs: {sorted(_ROUTERS)}"
            )
        self.uses_bias = self.topk_method == "noaux_tc"
        grouped = self.topk_method != "greedy"
        self.n_group = int(moe_setting(hf, "n_group") or 1) if grouped else 1
        self.topk_group = int(moe_setting(hf, "topk_group") or self.n_group) if grouped else 1
        # The official V2 code renormalises only for k > 1; V3's (sigmoid) always does when asked.
        self.renormalize = bool(hf.get("norm_topk_prob", self.uses_bias)) and (
            self.uses_bias or self.top_k > 1
        )
        self.routed_scaling_factor = float(moe_setting(hf, "routed_scaling_factor"))
        if self.n_routed_experts % self.n_group:
            raise ModelLoadError(
                f"n_routed_experts={self.n_routed_experts} is not divisible by "
                f"n_group={self.n_group}: fix config.json"
            )
        per_group = self.n_routed_experts // self.n_group
        if self.uses_bias and self.n_group > 1 and self.topk_group < self.n_group and per_group < 2:
            raise ModelLoadError(
                f"group-limited routing scores a group by its top-2 experts, but "
                f"n_group={self.n_group} leaves {per_group} expert per group"
            )
        if not 0 < self.topk_group <= self.n_group or self.top_k > self.topk_group * per_group:
            raise ModelLoadError(
                f"num_experts_per_tok={self.top_k} cannot be chosen from topk_group="
                f"{self.topk_group} of n_group={self.n_group} groups of {per_group} experts"
            )


class RoutedExperts(nn.Module):
    """Stacked expert weights; with numerics.quantization "fp8", float8_e4m3fn with scales in the
    numerics' layout: 128x128 blocks (`w_gate_up_scale_inv` [E, ceil(2I/128), ceil(H/128)],
    `w_down_scale_inv` [E, ceil(H/128), ceil(I/128)]) or per channel (`w_gate_up_scale` [E, 2I],
    `w_down_scale` [E, H]); engine/models/fp8.py loads each expert's checkpoint scales into them."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int, numerics: Numerics) -> None:
        super().__init__()
        self.numerics = numerics
        fp8 = numerics.quantization == "fp8"
        dtype = FP8_DTYPE if fp8 else numerics.dtype
        self.w_gate_up = nn.Parameter(
            torch.empty(num_experts, 2 * intermediate, hidden, dtype=dtype), requires_grad=False
        )
        self.w_down = nn.Parameter(
            torch.empty(num_experts, hidden, intermediate, dtype=dtype), requires_grad=False
        )
        channel = numerics.fp8_scales == "channel"
        for name, (rows, cols) in (
            ("w_gate_up", (2 * intermediate, hidden)),
            ("w_down", (hidden, intermediate)),
        ):
            blocks = torch.empty(num_experts, -(-rows // GROUP), -(-cols // GROUP), dtype=torch.float32)
            self.register_parameter(
                name + "_scale_inv",
                nn.Parameter(blocks, requires_grad=False) if fp8 and not channel else None,
            )
            self.register_parameter(
                name + "_scale",
                nn.Parameter(torch.empty(num_experts, rows, dtype=torch.float32), requires_grad=False)
                if fp8 and channel
                else None,
            )

    def _scales(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(gate/up scales, down scales) in whichever layout the experts hold, (None, None) if float."""
        scales: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)
        for suffix in ("_scale_inv", "_scale"):
            gate_up = cast(torch.Tensor | None, getattr(self, "w_gate_up" + suffix))
            if gate_up is not None:
                scales = gate_up, cast(torch.Tensor | None, getattr(self, "w_down" + suffix))
        return scales

    # Set by parallel.sharding.attach_experts on an expert-parallel rank: the weights then hold this
    # rank's physical expert slots only, and forward exchanges rows with the other ranks.
    parallel: ExpertParallelGroup | None = None
    parallel_layer: int = -1

    def forward(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        if self.parallel is not None:
            from shardinfer.engine.parallel.expert_exchange import exchange_routed

            return exchange_routed(
                x, topk_ids, topk_weights, self.parallel, self.parallel_layer, self.local_slots
            )
        gate_up_scale, down_scale = self._scales()
        return ops.moe_experts(
            x,
            topk_ids,
            topk_weights,
            self.w_gate_up,
            self.w_down,
            self.numerics.batch_invariant,
            gate_up_scale,
            down_scale,
        )

    def local_slots(self, rows: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        """Rows [n, H] through the expert held in this module's slot slot[i], [n, H] float32 before
        routing weights (reference_moe.expert_slots: the single-process layer's per-row function)."""
        from shardinfer.kernels.reference_moe import expert_slots

        gate_up_scale, down_scale = self._scales()
        return expert_slots(
            rows,
            slot.view(-1, 1),
            self.w_gate_up,
            self.w_down,
            self.numerics.batch_invariant,
            gate_up_scale,
            down_scale,
        )[:, 0]

    def quantize_fp8(self) -> bool:
        """Quantise float expert weights to block-scaled FP8, expert by expert, on their device."""
        if self._scales()[0] is not None:
            return False
        for name in ("w_gate_up", "w_down"):
            w = getattr(self, name).data
            pairs = [quantize_blocks(w[e]) for e in range(w.shape[0])]
            setattr(self, name, nn.Parameter(torch.stack([q for q, _ in pairs]), requires_grad=False))
            setattr(
                self,
                name + "_scale_inv",
                nn.Parameter(torch.stack([s for _, s in pairs]), requires_grad=False),
            )
        return True


class Router(nn.Module):
    """Router logits in float32 (its weight and correction bias are float32 in the checkpoints).
    The correction bias exists only for bias-corrected (noaux_tc) routing."""

    def __init__(self, routing: RoutingConfig, hidden: int, numerics: Numerics) -> None:
        super().__init__()
        self.routing = routing
        self.numerics = numerics
        e = routing.n_routed_experts
        self.weight = nn.Parameter(torch.empty(e, hidden, dtype=torch.float32), requires_grad=False)
        self.e_score_correction_bias = (
            nn.Parameter(torch.zeros(e, dtype=torch.float32), requires_grad=False)
            if routing.uses_bias
            else None
        )

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """[T, E] float32. On CUDA one batch-invariant GEMM (see ops.linear), or cuBLAS when batch
        invariance is off."""
        return ops.linear(x.float(), self.weight, None, self.numerics.batch_invariant)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(topk_weights [T, k] float32, topk_ids [T, k] int64)."""
        r = self.routing
        logits = self.logits(x)
        return ops.grouped_topk(
            logits,
            self.e_score_correction_bias,
            r.top_k,
            r.n_group,
            r.topk_group,
            r.renormalize,
            r.routed_scaling_factor,
            r.scoring_func,
        )


class DeepseekMoE(nn.Module):
    def __init__(self, config: ModelConfig, numerics: Numerics) -> None:
        super().__init__()
        hf = config.hf
        routing = RoutingConfig(hf)
        inter = int(hf["moe_intermediate_size"])
        self.gate = Router(routing, config.hidden_size, numerics)
        self.experts = RoutedExperts(routing.n_routed_experts, config.hidden_size, inter, numerics)
        n_shared = int(moe_setting(hf, "n_shared_experts") or 0)
        self.shared_experts = SwiGLUMLP(config.hidden_size, inter * n_shared, numerics) if n_shared else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        topk_weights, topk_ids = self.gate(x)
        out = self.experts(x, topk_ids, topk_weights)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out
