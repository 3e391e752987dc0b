"""Sampling without filters, and every row's log-sum-exp, with each row split over fixed chunks.

The filtered kernel (kernels/sampling.py) gives a row one program, which must walk the whole
vocabulary computing a hash, two logs and an exp per id: at a large batch and vocabulary that
ALU work, not reading the logits, bounds its time (bench/kernels/NOTES.md, "Sampling"). Rows
that only ask for temperature (or greedy) need no threshold, so here a row is cut into chunks
of _CHUNK ids, one program each, and a second kernel combines the chunks of a row in chunk
order:

    phase 1, program (row, chunk):  best score and its lowest id in the chunk (x/T + g, or the
                                    raw logit when greedy), and max / sum exp of the raw logits
    phase 2, program (row):         token = lowest id of the best chunk score; lse over chunks;
                                    logprob = raw logit[token] - lse

With TOP both phases also find each row's largest raw logit and its lowest id (the top-1 logprob
a request asks for, TopLogprob), so no top-k pass over the vocabulary is needed for it.

The chunk length is a constant, so a row's programs and its combine are the same in any batch
(batch invariant). The choice is the filtered kernel's exactly: the same scaled logit, the same
noise, the same maximum (a max is exact), the lowest id among equal scores. So a row samples the
same token whichever kernel its batch runs, which lets the engine use this one whenever no row
of the step has top_k / top_p / min_p.

The log-sum-exp is over the RAW logits (the model's distribution, before grammar masks and
penalties), for the logprobs the engine returns; `sample` and `logsumexp` here serve both the
sampled rows and rows sampled by the filtered kernel (`tokens` given).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from shardinfer.kernels._common import check_tensor, fail, interpreting
from shardinfer.kernels.sampling import _check_rows, _gumbel, _load_scaled, _row_hash
from shardinfer.kernels.top_logprob import TopLogprob

_CHUNK = 2048  # ids per phase-1 program: fixed, never chosen from the batch
_BLOCK = 1024


@triton.jit(do_not_specialize=["vocab"])
def _sample_chunks_kernel(
    raw_ptr,
    sr,
    x_ptr,
    sx,
    temp_ptr,
    seed_ptr,
    pos_ptr,
    best_ptr,
    best_id_ptr,
    max_ptr,
    sum_ptr,
    top_ptr,
    top_id_ptr,
    vocab,
    n_chunks,
    SAMPLE: tl.constexpr,
    SAME: tl.constexpr,
    TOP: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
    USE_LIBDEVICE: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    raw_row = raw_ptr + row.to(tl.int64) * sr
    x_row = x_ptr + row.to(tl.int64) * sx
    offs = tl.arange(0, BLOCK)
    lo = chunk * CHUNK
    # Log-sum-exp of the raw logits, online over the chunk's blocks.
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.zeros([], tl.float32)
    best = tl.full([], float("-inf"), tl.float32)
    best_id = lo
    top = tl.full([], float("-inf"), tl.float32)
    top_id = lo
    if SAMPLE:
        temp = tl.load(temp_ptr + row)
        h_row = _row_hash(tl.load(seed_ptr + row), tl.load(pos_ptr + row))
    for start in range(lo, lo + CHUNK, BLOCK):
        ids = start + offs
        inside = ids < vocab
        raw = tl.load(raw_row + ids, mask=inside, other=float("-inf"))
        bm = tl.maximum(m, tl.max(raw, 0))
        # Shift by 0 while nothing is finite: exp(-inf - -inf) would be NaN, exp(-inf - 0) is 0.
        shift = tl.where(bm == float("-inf"), 0.0, bm)
        s = s * tl.exp(m - shift) + tl.sum(tl.exp(raw - shift), 0)
        m = bm
        if TOP:  # the largest raw logit (NaN counted as -inf) and its lowest id
            clean = tl.where(raw != raw, float("-inf"), raw)
            tmax = tl.max(clean, 0)
            tid = tl.min(tl.where(clean == tmax, ids, 2147483647), 0)
            higher = tmax > top  # strictly greater: an earlier (lower) id wins ties
            top_id = tl.where(higher, tid, top_id)
            top = tl.where(higher, tmax, top)
        if SAMPLE:
            if temp <= 0.0:
                if SAME:  # noqa: SIM108 (a constexpr branch: the load is not compiled when SAME)
                    score = raw
                else:
                    score = tl.load(x_row + ids, mask=inside, other=float("-inf"))
                score = tl.where(score != score, float("-inf"), score)
            else:
                score = _load_scaled(x_row, ids, vocab, temp) + _gumbel(h_row, ids, USE_LIBDEVICE)
            bmax = tl.max(score, 0)
            bid = tl.min(tl.where(score == bmax, ids, 2147483647), 0)
            take = bmax > best  # strictly greater: an earlier (lower) id wins ties
            best_id = tl.where(take, bid, best_id)
            best = tl.where(take, bmax, best)
    out = row.to(tl.int64) * n_chunks + chunk
    tl.store(max_ptr + out, m)
    tl.store(sum_ptr + out, s)
    if SAMPLE:
        tl.store(best_ptr + out, best)
        tl.store(best_id_ptr + out, best_id)
    if TOP:
        tl.store(top_ptr + out, top)
        tl.store(top_id_ptr + out, top_id)


@triton.jit(do_not_specialize=["vocab"])
def _sample_combine_kernel(
    raw_ptr,
    sr,
    best_ptr,
    best_id_ptr,
    max_ptr,
    sum_ptr,
    top_ptr,
    top_id_ptr,
    tokens_ptr,
    logprob_ptr,
    lse_ptr,
    top_token_ptr,
    top_logprob_ptr,
    vocab,
    n_chunks,
    SAMPLE: tl.constexpr,
    TOP: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    row = tl.program_id(0)
    c = tl.arange(0, BLOCK_C)
    inside = c < n_chunks
    base = row.to(tl.int64) * n_chunks
    m_c = tl.load(max_ptr + base + c, mask=inside, other=float("-inf"))
    s_c = tl.load(sum_ptr + base + c, mask=inside, other=0.0)
    m = tl.max(m_c, 0)
    shift = tl.where(m == float("-inf"), 0.0, m)
    lse = shift + tl.log(tl.sum(s_c * tl.exp(m_c - shift), 0))  # -inf for a row of -inf only
    if SAMPLE:
        b_c = tl.load(best_ptr + base + c, mask=inside, other=float("-inf"))
        id_c = tl.load(best_id_ptr + base + c, mask=inside, other=2147483647)
        best = tl.max(b_c, 0)
        token = tl.min(tl.where(b_c == best, id_c, 2147483647), 0)
        token = tl.where(token >= vocab, 0, token).to(tl.int64)  # nothing but -inf/NaN: id 0
        tl.store(tokens_ptr + row, token)
    else:
        token = tl.load(tokens_ptr + row)
    tl.store(logprob_ptr + row, tl.load(raw_ptr + row.to(tl.int64) * sr + token) - lse)
    tl.store(lse_ptr + row, lse)
    if TOP:
        t_c = tl.load(top_ptr + base + c, mask=inside, other=float("-inf"))
        tid_c = tl.load(top_id_ptr + base + c, mask=inside, other=2147483647)
        top = tl.max(t_c, 0)
        top_token = tl.min(tl.where(t_c == top, tid_c, 2147483647), 0)
        top_token = tl.where(top_token >= vocab, 0, top_token).to(tl.int64)
        tl.store(top_token_ptr + row, top_token)
        tl.store(top_logprob_ptr + row, tl.load(raw_ptr + row.to(tl.int64) * sr + top_token) - lse)


def _launch(
    raw: torch.Tensor,
    x: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    tokens: torch.Tensor,
    sample: bool,
    top: TopLogprob | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    b, vocab = raw.shape
    n_chunks = triton.cdiv(vocab, _CHUNK)
    dev = raw.device
    logprobs = torch.empty(b, dtype=torch.float32, device=dev)
    lse = torch.empty(b, dtype=torch.float32, device=dev)
    if b == 0:
        return logprobs, lse
    # Per (row, chunk): best score, max, sum of exp, the top logit. Separate tensors, not planes of
    # one: a plane at b * n_chunks floats from the last is 16-byte aligned only for some b, and
    # Triton compiles a variant per pointer alignment, which a run would then meet (and wait ~1 s
    # for) mid-way.
    stats = [torch.empty(b, n_chunks, dtype=torch.float32, device=dev) for _ in range(4 if top else 3)]
    ids = [torch.empty(b, n_chunks, dtype=torch.int32, device=dev) for _ in range(2 if top else 1)]
    top_stat, top_ids = (stats[3], ids[1]) if top else (stats[0], ids[0])  # unread without TOP
    top_token, top_logprob = (top.token_ids, top.logprobs) if top else (tokens, logprobs)
    same = x.data_ptr() == raw.data_ptr() and x.stride(0) == raw.stride(0)
    _sample_chunks_kernel[(b, n_chunks)](
        raw,
        raw.stride(0),
        x,
        x.stride(0),
        temperature,
        seeds,
        positions,
        stats[0],
        ids[0],
        stats[1],
        stats[2],
        top_stat,
        top_ids,
        vocab,
        n_chunks,
        SAMPLE=sample,
        SAME=same,
        TOP=top is not None,
        CHUNK=_CHUNK,
        BLOCK=_BLOCK,
        USE_LIBDEVICE=not interpreting(),
        num_warps=4,
    )
    _sample_combine_kernel[(b,)](
        raw,
        raw.stride(0),
        stats[0],
        ids[0],
        stats[1],
        stats[2],
        top_stat,
        top_ids,
        tokens,
        logprobs,
        lse,
        top_token,
        top_logprob,
        vocab,
        n_chunks,
        SAMPLE=sample,
        TOP=top is not None,
        BLOCK_C=triton.next_power_of_2(n_chunks),
        num_warps=4,
    )
    return logprobs, lse


def _check_logits(name: str, t: torch.Tensor) -> None:
    check_tensor(name, t, dtypes=(torch.float32,), ndim=2, last_dim_contiguous=True)
    if t.shape[1] < 1 or t.shape[1] >= 2**31 - _CHUNK:
        raise fail(f"{name}.shape[1]", t.shape[1], "need a vocabulary of 1 .. 2**31 - 1 - 2048 ids")


def sample(
    raw: torch.Tensor,
    x: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    top: TopLogprob | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token int64 [B], logprob float32 [B], lse float32 [B]) for rows without filters.

    raw: [B, V] float32 logits the logprobs are taken from; x: [B, V] float32 logits sampled from
    (raw itself, or raw with grammar masks / penalties applied); temperature [B] float32 (0 =
    greedy on x); seeds, positions [B] int64. logprob = raw[token] - logsumexp(raw). `top`, if
    given, receives each row's top-1 token and logprob (TopLogprob).
    """
    _check_logits("raw", raw)
    _check_logits("x", x)
    if x.shape != raw.shape or x.device != raw.device:
        raise fail(
            "x", f"{tuple(x.shape)} on {x.device}", f"need raw's shape {tuple(raw.shape)} on {raw.device}"
        )
    _check_rows(
        raw.shape[0],
        raw.device,
        temperature=(temperature, torch.float32),
        seeds=(seeds, torch.int64),
        positions=(positions, torch.int64),
    )
    _check_top(top, raw)
    tokens = torch.empty(raw.shape[0], dtype=torch.int64, device=raw.device)
    logprobs, lse = _launch(raw, x, temperature, seeds, positions, tokens, sample=True, top=top)
    return tokens, logprobs, lse


def logprobs_of(
    raw: torch.Tensor, tokens: torch.Tensor, top: TopLogprob | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(raw[token] - logsumexp(raw), logsumexp(raw)) per row, for tokens chosen elsewhere; `top`
    as in `sample`."""
    _check_logits("raw", raw)
    _check_rows(raw.shape[0], raw.device, tokens=(tokens, torch.int64))
    _check_top(top, raw)
    # Without SAMPLE the kernels read no temperature, seed or position: any tensor fills those slots.
    return _launch(raw, raw, tokens, tokens, tokens, tokens, sample=False, top=top)


def _check_top(top: TopLogprob | None, raw: torch.Tensor) -> None:
    if top is not None:
        _check_rows(
            raw.shape[0],
            raw.device,
            **{"top.token_ids": (top.token_ids, torch.int64), "top.logprobs": (top.logprobs, torch.float32)},
        )
