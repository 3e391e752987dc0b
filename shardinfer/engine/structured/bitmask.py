"""Packed token bitmasks: the form in which grammar masks travel from the CPU to the logits.

A batch of masks is an int32 tensor of shape [B, ceil(V / 32)], where V is the model's
logits width. Bit `t % 32` of word `t // 32` of row `b` is 1 when token `t` is allowed for
row `b` — the layout llguidance writes directly into memory, so filling a batch costs no
Python work per token. One row is V / 8 bytes (19 KB for a 152k vocabulary), so copying the
batch to the GPU is cheap next to copying a bool or float mask.

    word w of a row:  bit 0 -> token 32*w + 0, ..., bit 31 -> token 32*w + 31

Rows that carry no grammar are left all-ones (-1) and pass through `apply_bitmask` unchanged.
"""

from __future__ import annotations

import torch

BITS_PER_WORD = 32


def bitmask_width(vocab_size: int) -> int:
    """Words per row for a vocabulary of `vocab_size` tokens."""
    return (vocab_size + BITS_PER_WORD - 1) // BITS_PER_WORD


def check_host_bitmask(bitmask: torch.Tensor, vocab_size: int) -> None:
    """Raise ValueError unless bitmask is what llguidance can fill: contiguous CPU int32 [B, width]."""
    width = bitmask_width(vocab_size)
    if bitmask.dtype != torch.int32 or bitmask.dim() != 2 or bitmask.shape[1] != width:
        raise ValueError(
            f"bitmask must be int32 [batch, {width}] for vocab_size={vocab_size}, got "
            f"{bitmask.dtype} {tuple(bitmask.shape)}; use allocate_bitmask(batch, vocab_size)"
        )
    if bitmask.device.type != "cpu" or not bitmask.is_contiguous():
        raise ValueError("bitmask must be a contiguous CPU tensor (llguidance writes it from the CPU)")


def allocate_bitmask(batch_size: int, vocab_size: int, pin_memory: bool = False) -> torch.Tensor:
    """A CPU int32 [batch_size, ceil(vocab_size / 32)] mask with every token allowed.

    pin_memory=True lets the engine copy it to the GPU without blocking the CPU (only when a
    GPU is present).
    """
    if batch_size < 0 or vocab_size < 1:
        raise ValueError(
            f"allocate_bitmask(batch_size={batch_size}, vocab_size={vocab_size}): "
            "batch_size must be >= 0 and vocab_size >= 1"
        )
    return torch.full((batch_size, bitmask_width(vocab_size)), -1, dtype=torch.int32, pin_memory=pin_memory)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool [B, vocab_size] from int32 [B, W] (True = allowed); works on any device."""
    if bitmask.dtype != torch.int32 or bitmask.dim() != 2:
        raise ValueError(
            f"bitmask must be a 2-D int32 tensor, got {bitmask.dtype} with shape {tuple(bitmask.shape)}"
        )
    if bitmask.shape[1] * BITS_PER_WORD < vocab_size:
        raise ValueError(
            f"bitmask has {bitmask.shape[1]} words per row, too few for {vocab_size} "
            f"tokens (needs {bitmask_width(vocab_size)}); allocate it with "
            "allocate_bitmask(batch, vocab_size)"
        )
    # One AND against the 32 single-bit words and a compare: two passes over [B, W, 32], about
    # half the work of shifting, masking and casting.
    bits = (bitmask.unsqueeze(-1) & _single_bits(bitmask.device)).ne(0)  # bool [B, W, 32]
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size]


def _single_bits(device: torch.device) -> torch.Tensor:
    """int32 [32] with word k = 1 << k (bit 31 is the sign bit, hence -2**31).

    Built on `device` (torch shifts int32 as unsigned, so 1 << 31 is -2**31 on CPU and CUDA alike):
    no host list, so no pageable host-to-device copy per call.
    """
    shifts = torch.arange(BITS_PER_WORD, dtype=torch.int32, device=device)
    return torch.ones(BITS_PER_WORD, dtype=torch.int32, device=device).bitwise_left_shift(shifts)


def apply_bitmask(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None = None
) -> torch.Tensor:
    """Set logits of disallowed tokens to -inf, in place, and return `logits`.

    logits:  float [B, V] on any device.
    bitmask: int32 [B, ceil(V / 32)] (CPU or the logits' device); moved to the logits' device.
    rows:    optional int64 [R] indices; then bitmask is [R, W] and masks logits[rows] only,
             which saves the unpacking work for the rows that carry no grammar.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [batch, vocab], got shape {tuple(logits.shape)}")
    vocab_size = logits.shape[1]
    expected_rows = logits.shape[0] if rows is None else rows.numel()
    if bitmask.shape[0] != expected_rows:
        raise ValueError(f"bitmask has {bitmask.shape[0]} rows but {expected_rows} logits rows are masked")
    allowed = unpack_bitmask(bitmask.to(logits.device, non_blocking=True), vocab_size)
    if rows is None:
        logits.masked_fill_(~allowed, float("-inf"))
    else:
        rows = rows.to(logits.device)
        logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))
    return logits
