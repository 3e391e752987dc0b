"""Small layers shared by model families. Every matmul goes through `ops.linear`, which picks
the kernel for the device and the numerics mode (batch invariance) in one place: the
fixed-tile Triton matmul on CUDA when batch invariant, cuBLAS (F.linear) on CUDA otherwise, the
row-tiled reference elsewhere. A Linear holding FP8 weights (a `weight_scale_inv` or
`weight_scale` beside its float8 `weight`, the checkpoints' names) goes through `ops.linear_fp8`
instead, or, handed an input its producer quantised already (an `Fp8Activation`), through
`ops.linear_fp8_prequantized`: PreNormDecoderLayer's norms quantise in their own kernel for an
attention or MLP module that opts in (`takes_fp8_input`), as SwiGLUMLP's activation does for its
down projection, which saves the FP8 linear its quantisation launch and gives the same bits."""

from __future__ import annotations

import torch
from torch import nn

from shardinfer.engine.forward_context import ForwardContext
from shardinfer.engine.models.base import Numerics
from shardinfer.errors import CheckpointError
from shardinfer.kernels import ops
from shardinfer.kernels.reference_fp8 import FP8_DTYPE, GROUP, Fp8Activation, quantize_blocks

# Producers quantise an FP8 linear's input in their own kernel (module docstring); False leaves it
# to the linear, which bench/throughput.py --compare-unfused times against it. The bits are the same.
FUSE_FP8_INPUT = True
# The LM head's matmul writes float32 logits itself (Linear.logits); False converts its 16-bit
# output in a second pass, which bench/throughput.py --variant-flags can time against it. The
# values are the same.
LOGITS_FROM_MATMUL = True


class Linear(nn.Module):
    """y = x W^T + b. With `numerics.quantization == "fp8"` and `quantizable`, W is stored as
    float8_e4m3fn `weight` [N, K] with float32 scales: `weight_scale_inv` [ceil(N/128), ceil(K/128)]
    (numerics.fp8_scales "block") or `weight_scale` [N] ("channel"); the other one is None.
    Layers whose weight is read elsewhere in float (MLA's absorbed kv_b_proj) or that decide the
    output distribution (lm_head) pass quantizable=False."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool, numerics: Numerics, quantizable: bool = True
    ) -> None:
        super().__init__()
        self.numerics = numerics
        self.quantizable = quantizable
        # Whether the model calls logits() on this layer (its LM head; see logits_head): the
        # matmul warm-up then compiles the float32 output's kernels too.
        self.writes_logits = False
        fp8 = quantizable and numerics.quantization == "fp8"
        self.weight = nn.Parameter(
            torch.empty(out_features, in_features, dtype=FP8_DTYPE if fp8 else numerics.dtype),
            requires_grad=False,
        )
        channel = numerics.fp8_scales == "channel"
        self.weight_scale_inv: nn.Parameter | None
        self.weight_scale: nn.Parameter | None
        self.register_parameter(
            "weight_scale_inv",
            nn.Parameter(
                torch.empty(-(-out_features // GROUP), -(-in_features // GROUP), dtype=torch.float32),
                requires_grad=False,
            )
            if fp8 and not channel
            else None,
        )
        self.register_parameter(
            "weight_scale",
            nn.Parameter(torch.empty(out_features, dtype=torch.float32), requires_grad=False)
            if fp8 and channel
            else None,
        )
        self.bias = (
            nn.Parameter(torch.empty(out_features, dtype=numerics.dtype), requires_grad=False)
            if bias
            else None
        )

    @property
    def fp8_scale(self) -> torch.Tensor | None:
        """The float32 scales beside an FP8 weight (either layout); None for a float weight."""
        return self.weight_scale_inv if self.weight_scale_inv is not None else self.weight_scale

    def takes_fp8_input(self) -> bool:
        """Whether forward takes its input quantised (an Fp8Activation): FP8 weights only."""
        return FUSE_FP8_INPUT and self.fp8_scale is not None

    def forward(self, x: torch.Tensor | Fp8Activation) -> torch.Tensor:
        """x [..., K] float, or quantised already (takes_fp8_input) -> [..., N] in x's dtype."""
        scale = self.fp8_scale
        if isinstance(x, Fp8Activation):
            if scale is None:
                raise TypeError(
                    "Linear: got an Fp8Activation, but this layer's weight is not FP8; "
                    "only a module whose consumer linear is FP8 may ask for a quantised input"
                )
            return ops.linear_fp8_prequantized(
                x, self.weight, scale, self.bias, self.numerics.batch_invariant
            )
        if scale is not None:
            return ops.linear_fp8(x, self.weight, scale, self.bias, self.numerics.batch_invariant)
        return ops.linear(x, self.weight, self.bias, self.numerics.batch_invariant)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """forward(x) converted to float32, as the sampler takes it (the LM head): a float weight's
        matmul writes the float32 values itself, saving a pass over the [rows, vocab] output."""
        if self.fp8_scale is not None or not LOGITS_FROM_MATMUL:
            return self.forward(x).float()
        return ops.linear(x, self.weight, self.bias, self.numerics.batch_invariant, out_dtype=torch.float32)

    def quantize_fp8(self) -> bool:
        """Replace a float weight by its block-scaled FP8 form, on the weight's device (quantising a
        float checkpoint at load: reference_fp8.quantize_blocks, deterministic everywhere); returns
        whether it did."""
        if not self.quantizable or self.weight_scale_inv is not None or self.weight_scale is not None:
            return False
        q, s = quantize_blocks(self.weight.data)
        self.weight = nn.Parameter(q, requires_grad=False)
        self.weight_scale_inv = nn.Parameter(s, requires_grad=False)
        return True


def logits_head(in_features: int, out_features: int, numerics: Numerics) -> Linear:
    """An LM head: a linear never quantised (it decides the output distribution), whose `logits`
    the sampler takes."""
    head = Linear(in_features, out_features, False, numerics, quantizable=False)
    head.writes_logits = True
    return head


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, numerics: Numerics) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=numerics.dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)

    def add_and_norm(
        self, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return ops.fused_add_rms_norm(x, residual, self.weight, self.eps)

    def add_and_norm_fp8(
        self, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[Fp8Activation, torch.Tensor]:
        """add_and_norm with the normalised output quantised for an FP8 linear, in the same launch."""
        return ops.fused_add_rms_norm_fp8(x, residual, self.weight, self.eps)

    def norm_for(self, x: torch.Tensor, consumer: Linear) -> torch.Tensor | Fp8Activation:
        """forward(x), quantised in the same launch when it feeds `consumer` alone and that linear
        takes its input quantised (the same bits as the linear quantising it)."""
        if consumer.takes_fp8_input():
            return ops.rms_norm_fp8(x, self.weight, self.eps)
        return self.forward(x)


class SwiGLUMLP(nn.Module):
    """down(silu(gate x) * up x), gate and up fused into one matmul (checkpoints: gate_proj,
    up_proj). With FP8 weights the activation kernel quantises down_proj's input, and the module
    takes its own input quantised (takes_fp8_input) where gate_up_proj is its only reader."""

    def __init__(self, hidden: int, intermediate: int, numerics: Numerics, bias: bool = False) -> None:
        super().__init__()
        self.intermediate = intermediate
        self.gate_up_proj = Linear(hidden, 2 * intermediate, bias, numerics)
        self.down_proj = Linear(intermediate, hidden, bias, numerics)

    def takes_fp8_input(self) -> bool:
        return self.gate_up_proj.takes_fp8_input()

    def forward(self, x: torch.Tensor | Fp8Activation) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if self.down_proj.takes_fp8_input():
            return self.down_proj(ops.silu_and_mul_fp8(gate_up))
        return self.down_proj(ops.silu_and_mul(gate_up))


def embedding(num_embeddings: int, dim: int, dtype: torch.dtype) -> nn.Embedding:
    """A frozen embedding table left uninitialised, for the checkpoint to fill: nn.Embedding's own
    initialisation would draw num_embeddings * dim random values only to overwrite them (and on the
    meta device, where models are built, it would pull in torch's compiler stack to do so)."""
    return nn.Embedding(
        num_embeddings, dim, _weight=torch.empty(num_embeddings, dim, dtype=dtype), _freeze=True
    )


def copy_param(
    param: torch.Tensor, value: torch.Tensor, name: str, index: slice | tuple[int | slice, ...] | None = None
) -> None:
    """Copy a checkpoint tensor into a parameter, or into `param[index]` (a row slice, an expert's
    rows of a stacked weight), checking the shape. No index (None or ()) means the whole tensor."""
    target = param.data[index] if index else param.data
    if tuple(target.shape) != tuple(value.shape):
        raise CheckpointError(
            f"checkpoint tensor {name!r} has shape {tuple(value.shape)}, "
            f"the model expects {tuple(target.shape)}: is config.json the checkpoint's own?"
        )
    target.copy_(value.to(target.dtype))


def takes_fp8_input(module: nn.Module) -> bool:
    """Whether `module` wants its input as an Fp8Activation: a module opts in by defining a
    `takes_fp8_input()` method that says so (the dense family's attention and MLP, whose first
    linear is FP8); every other module gets its input in float."""
    opt_in = getattr(module, "takes_fp8_input", None)
    return opt_in is not None and bool(opt_in())


class PreNormDecoderLayer(nn.Module):
    """The pre-norm block every supported family uses, with the residual stream carried apart:

        h, r = norm1(x + r);  h = attn(h);  h, r = norm2(h + r);  return mlp(h), r

    Subclasses set self_attn, mlp, input_layernorm and post_attention_layernorm. A norm hands its
    module the output quantised (RMSNorm.add_and_norm_fp8) where the module opts in
    (takes_fp8_input).
    """

    self_attn: nn.Module
    mlp: nn.Module
    input_layernorm: RMSNorm
    post_attention_layernorm: RMSNorm

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor, ctx: ForwardContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (block output, residual stream); their sum is the block's hidden state."""
        h, residual = _add_and_norm(self.input_layernorm, x, residual, self.self_attn)
        h = self.self_attn(h, positions, ctx)
        h, residual = _add_and_norm(self.post_attention_layernorm, h, residual, self.mlp)
        return self.mlp(h), residual


def _add_and_norm(
    norm: RMSNorm, x: torch.Tensor, residual: torch.Tensor | None, consumer: nn.Module
) -> tuple[torch.Tensor | Fp8Activation, torch.Tensor]:
    if takes_fp8_input(consumer):
        return norm.add_and_norm_fp8(x, residual)
    return norm.add_and_norm(x, residual)
