"""The sampler's core on GPU: filtered Gumbel-max sampling with counter-based noise.

For each row b (one program per row, so a row's choice never depends on the batch):

    x      = logits[b] / T                      (T == 0: greedy, argmax of logits)
    allow  = top_k(x) & top_p(x | top_k) & min_p(x)
    token  = argmax over allowed ids of (x + g(seed[b], position[b], id)), ties to the lowest id

Filters (the semantics of reference_sampling.sample, HF's warper order):
  top_k  keep ids whose x >= the k-th largest x (ties kept); off when k <= 0 or k >= V.
  top_p  over the top_k survivors, sorted by x descending, keep the shortest prefix whose
         softmax mass reaches top_p, plus every id tied with its last member; off when p >= 1.
  min_p  keep ids with exp(x - max x) >= min_p (probability >= min_p * the top probability); off
         when min_p <= 0 (so a row without filters keeps every id, as sampling_split assumes).

Thresholds are found without sorting: x is mapped to an order-preserving int32 key and a
16-way search over keys counts (top_k) or sums softmax mass (top_p) for 16 candidate
thresholds per pass over the row, 8 passes for a 32-bit key range.

The noise g is Gumbel(0, 1) from a murmur3-style hash of (seed, position, token id); the hash
is an exact transcription of engine/sampling_noise.py (integer ops, bit-identical on any
device). Only -log(-log(u)) goes through the device's log, which may round differently from
the CPU's in the last place.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from shardinfer.kernels._common import check_same_device, check_tensor, fail, interpreting

_BLOCK_V = 1024
_WAYS = 16


@triton.jit
def _fmix32(h):
    h = h ^ (h >> 16)
    h = h * 0x85EBCA6B
    h = h ^ (h >> 13)
    h = h * 0xC2B2AE35
    return h ^ (h >> 16)


@triton.jit
def _mix(h, word):
    return _fmix32((h ^ word) + 0x9E3779B9)


@triton.jit
def _row_hash(seed, position):
    """Hash state after (seed low word, seed high word, position); uint32."""
    h = _mix(tl.zeros_like(seed).to(tl.uint32), seed.to(tl.uint32))
    h = _mix(h, (seed >> 32).to(tl.uint32))
    return _mix(h, position.to(tl.uint32))


@triton.jit
def _gumbel(h_row, ids, USE_LIBDEVICE: tl.constexpr):
    h = _mix(h_row, ids.to(tl.uint32))
    u = ((h >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
    if USE_LIBDEVICE:
        return -libdevice.log(-libdevice.log(u))
    else:
        return -tl.log(-tl.log(u))


@triton.jit
def _gumbel_kernel(seed_ptr, pos_ptr, out_ptr, vocab, so, BLOCK: tl.constexpr, USE_LIBDEVICE: tl.constexpr):
    row = tl.program_id(0)
    ids = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    h_row = _row_hash(tl.load(seed_ptr + row), tl.load(pos_ptr + row))
    g = _gumbel(h_row, ids, USE_LIBDEVICE)
    tl.store(out_ptr + row.to(tl.int64) * so + ids, g, mask=ids < vocab)


@triton.jit
def _load_scaled(row_ptr, ids, vocab, temp):
    """x = logits / T with NaN as -inf and -0.0 as +0.0 (so key order equals float order)."""
    x = tl.load(row_ptr + ids, mask=ids < vocab, other=float("-inf"))
    x = tl.math.div_rn(x, tl.zeros_like(x) + temp)
    x = tl.where(x != x, float("-inf"), x)
    return tl.where(x == 0.0, 0.0, x)


@triton.jit
def _key(x):
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _stat_above(
    row_ptr, vocab, temp, m, cand, USE_MASS: tl.constexpr, BLOCK: tl.constexpr, WAYS: tl.constexpr
):
    """For each candidate key c: count (or softmax mass exp(x - m)) of ids whose key >= c."""
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([WAYS], tl.float32)
    for start in range(0, vocab, BLOCK):
        x = _load_scaled(row_ptr, start + offs, vocab, temp)
        above = _key(x)[None, :] >= cand[:, None]
        if USE_MASS:
            acc += tl.sum(tl.where(above, tl.exp(x - m)[None, :], 0.0), 1)
        else:
            acc += tl.sum(above.to(tl.float32), 1)  # exact: counts stay below 2**24
    return acc


@triton.jit
def _search(
    row_ptr, vocab, temp, m, lo, hi, goal, USE_MASS: tl.constexpr, BLOCK: tl.constexpr, WAYS: tl.constexpr
):
    """Largest key t in [lo, hi) with stat(t) >= goal, given stat(lo) >= goal and t < hi.

    stat falls as t grows, so each pass tests WAYS evenly spaced candidates at once and keeps
    the bracket between the last that passes and the first that fails: ~32 / log2(WAYS) passes
    over the row instead of 32 for plain bisection.
    """
    j = tl.arange(0, WAYS).to(tl.int64) + 1
    while hi - lo > 1:
        step = (hi - lo + WAYS - 1) // WAYS
        cand = lo + j * step
        valid = cand < hi
        stat = _stat_above(
            row_ptr, vocab, temp, m, tl.minimum(cand, hi - 1).to(tl.int32), USE_MASS, BLOCK, WAYS
        )
        ok = valid & (stat >= goal)
        lo = tl.max(tl.where(ok, cand, lo), 0)
        hi = tl.min(tl.where(valid & (stat < goal), cand, hi), 0)
    return lo


@triton.jit(do_not_specialize=["vocab"])
def _sample_kernel(
    logits_ptr,
    sl,
    temp_ptr,
    topk_ptr,
    topp_ptr,
    minp_ptr,
    seed_ptr,
    pos_ptr,
    out_ptr,
    vocab,
    BLOCK: tl.constexpr,
    USE_LIBDEVICE: tl.constexpr,
    WAYS: tl.constexpr,
):
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * sl
    temp = tl.load(temp_ptr + row)
    offs = tl.arange(0, BLOCK)
    best = tl.full([], float("-inf"), tl.float32)
    best_id = tl.zeros([], tl.int32)
    if temp <= 0.0:
        for start in range(0, vocab, BLOCK):
            ids = start + offs
            x = tl.load(row_ptr + ids, mask=ids < vocab, other=float("-inf"))
            x = tl.where(x != x, float("-inf"), x)
            bmax = tl.max(x, 0)
            bid = tl.min(tl.where(x == bmax, ids, vocab), 0)
            take = bmax > best  # strictly greater: an earlier (lower) id wins ties
            best_id = tl.where(take, bid, best_id)
            best = tl.where(take, bmax, best)
    else:
        top_k = tl.load(topk_ptr + row)
        top_p = tl.load(topp_ptr + row)
        min_p = tl.load(minp_ptr + row)
        m = tl.full([], float("-inf"), tl.float32)
        for start in range(0, vocab, BLOCK):
            m = tl.maximum(m, tl.max(_load_scaled(row_ptr, start + offs, vocab, temp), 0))
        key_hi = _key(m).to(tl.int64) + 1  # nothing is above the max's key
        # top_k: the largest key t with count(key >= t) >= k.
        t_k = tl.full([], -2147483648, tl.int64)
        if (top_k > 0) & (top_k < vocab):
            t_k = _search(row_ptr, vocab, temp, m, t_k, key_hi, top_k.to(tl.float32), False, BLOCK, WAYS)
        # top_p: the largest key t with mass(key >= t) >= top_p * mass(key >= t_k).
        t_p = t_k
        if top_p < 1.0:
            total = tl.zeros([], tl.float32)
            for start in range(0, vocab, BLOCK):
                x = _load_scaled(row_ptr, start + offs, vocab, temp)
                total += tl.sum(tl.where(_key(x).to(tl.int64) >= t_k, tl.exp(x - m), 0.0), 0)
            t_p = _search(row_ptr, vocab, temp, m, t_k, key_hi, top_p * total, True, BLOCK, WAYS)
        h_row = _row_hash(tl.load(seed_ptr + row), tl.load(pos_ptr + row))
        for start in range(0, vocab, BLOCK):
            ids = start + offs
            x = _load_scaled(row_ptr, ids, vocab, temp)
            min_p_off = (tl.zeros_like(x) + min_p) <= 0.0  # min_p 0 keeps even ids exp(x - m) cannot rank
            allowed = (_key(x).to(tl.int64) >= t_p) & (min_p_off | (tl.exp(x - m) >= min_p)) & (ids < vocab)
            score = tl.where(allowed, x + _gumbel(h_row, ids, USE_LIBDEVICE), float("-inf"))
            bmax = tl.max(score, 0)
            bid = tl.min(tl.where(score == bmax, ids, vocab), 0)
            take = bmax > best
            best_id = tl.where(take, bid, best_id)
            best = tl.where(take, bmax, best)
    # A row whose every logit is -inf/NaN falls back to id 0.
    tl.store(out_ptr + row, tl.where(best_id >= vocab, 0, best_id).to(tl.int64))


def _check_rows(b: int, device: torch.device, **vecs: tuple[torch.Tensor, torch.dtype]) -> None:
    for name, (t, dtype) in vecs.items():
        check_tensor(name, t, dtypes=(dtype,), ndim=1, contiguous=True)
        if t.shape[0] != b:
            raise fail(f"{name}.shape", tuple(t.shape), f"need ({b},), one entry per row")
        if t.device != device:
            raise fail(f"{name}.device", t.device, f"need the logits' device {device}")


def gumbel_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Gumbel noise [B, V] float32 equal (bit-for-bit in the integer hash) to the engine's.

    seeds, positions: [B] int64 on one device.
    """
    check_tensor("seeds", seeds, dtypes=(torch.int64,), ndim=1, contiguous=True)
    device = check_same_device(seeds=seeds, positions=positions)
    _check_rows(seeds.shape[0], device, positions=(positions, torch.int64))
    if vocab_size < 1:
        raise fail("vocab_size", vocab_size, "need >= 1")
    out = torch.empty(seeds.shape[0], vocab_size, dtype=torch.float32, device=device)
    if seeds.shape[0]:
        grid = (seeds.shape[0], triton.cdiv(vocab_size, _BLOCK_V))
        _gumbel_kernel[grid](
            seeds, positions, out, vocab_size, out.stride(0), BLOCK=_BLOCK_V, USE_LIBDEVICE=not interpreting()
        )
    return out


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
) -> torch.Tensor:
    """Sampled token id per row, int64 [B].

    logits: [B, V] float32 with contiguous rows (grammar / penalty masks already applied as
    -inf); temperature, top_p, min_p: [B] float32 (temperature 0 = greedy); top_k: [B] int32
    (<= 0 or >= V = off); seeds, positions: [B] int64 (position = absolute index of the token
    being sampled). All on the logits' device.
    """
    check_tensor("logits", logits, dtypes=(torch.float32,), ndim=2, last_dim_contiguous=True)
    device = check_same_device(logits=logits)
    b, vocab = logits.shape
    _check_rows(
        b,
        device,
        temperature=(temperature, torch.float32),
        top_k=(top_k, torch.int32),
        top_p=(top_p, torch.float32),
        min_p=(min_p, torch.float32),
        seeds=(seeds, torch.int64),
        positions=(positions, torch.int64),
    )
    if vocab < 1 or vocab >= 2**24:
        raise fail("logits.shape[1]", vocab, "need a vocabulary of 1 .. 2**24 - 1 ids")
    out = torch.empty(b, dtype=torch.int64, device=device)
    if b:
        _sample_kernel[(b,)](
            logits,
            logits.stride(0),
            temperature,
            top_k,
            top_p,
            min_p,
            seeds,
            positions,
            out,
            vocab,
            BLOCK=_BLOCK_V,
            USE_LIBDEVICE=not interpreting(),
            WAYS=_WAYS,
            num_warps=8,
        )
    return out
