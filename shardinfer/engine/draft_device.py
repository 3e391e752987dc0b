"""The device side of speculative decoding: after a step's sampling is queued, count each
request's accepted drafts and run the MTP layer for the next step's drafts, on the device, so that
the next step can be launched before this one is read back (input_fixup.py consumes both).

Acceptance: a request's rows sample the tokens after its last known token and after each of its
k drafts; draft j is accepted while every sampled token before it equals the draft at its place.
That count (0..k) moves the request's newest token to row first + accepted and its next step's
positions back by k - accepted.
"""

from __future__ import annotations

import numpy as np
import torch

from shardinfer.engine.device_copy import array_to_device, values_to_device
from shardinfer.engine.forward_context import SKIP_SLOT, AttentionMetadata, ForwardContext
from shardinfer.engine.model_runner import ModelRunner, StepLogits
from shardinfer.engine.request import Request
from shardinfer.engine.sampler import DeviceSample, SamplingRow, sample_on_device
from shardinfer.engine.scheduler import ScheduledBatch


def sampling_input_rows(step: StepLogits, batch: ScheduledBatch) -> list[int]:
    """Per sampling request of the step: the flat input row its first sampling row scores."""
    offsets: dict[int, int] = {}
    offset = 0
    for req, n in zip(batch.requests, batch.num_new_tokens, strict=True):
        offset += n
        offsets[id(req)] = offset  # one past the request's last row
    return [offsets[id(r)] - c for r, c in zip(step.sample_requests, step.sample_counts, strict=True)]


def acceptance_layout(starts: list[int], counts: list[int]) -> np.ndarray:
    """count_accepted's host-side index data as one int64 array (one copy to the device):
    [draft rows (P * W) | compared (P * W) | token rows (P * W, absent when every request has W
    rows) | first rows (P) | drafts (P)], W = the widest request's rows.

    Request i's cell j (j < W) pairs its sampling row first_i + j with the input row of its draft
    j, starts_i + 1 + j; `compared` is 1 where that draft exists (j < counts_i - 1). Cells past it
    point at rows that exist and are never compared, so the column after a request's last draft
    is always uncompared and ends its run of matches."""
    c = np.asarray(counts, dtype=np.int64)
    p, w = len(c), int(c.max())
    first = np.zeros(p, dtype=np.int64)
    np.cumsum(c[:-1], out=first[1:])
    col = np.arange(w, dtype=np.int64)
    compared = col < (c - 1)[:, None]  # [P, W]
    draft_rows = np.where(compared, np.asarray(starts, dtype=np.int64)[:, None] + 1 + col, 0)
    parts = [draft_rows.ravel(), compared.ravel().astype(np.int64)]
    if (c != w).any():
        parts.append((first[:, None] + np.minimum(col, (c - 1)[:, None])).ravel())
    parts += [first, c - 1]
    return np.concatenate(parts)


def count_accepted(step: StepLogits, batch: ScheduledBatch, sampled: DeviceSample) -> None:
    """Set sampled.accepted, .last_rows and .shifts (per request, on the device).

    A step of one width (every verify-graph step without padding) needs no index from the host.
    Otherwise the indexes come from the host in one copy (acceptance_layout); the device compares each
    request's sampled tokens with its drafts in a [requests, W] grid and counts the leading
    matches as the first uncompared-or-different cell (argmin of the match grid: the first of equal
    minima), a few launches whatever the batch."""
    assert step.input_ids is not None
    counts = step.sample_counts
    p, w = len(counts), max(counts)
    cells = p * w
    if _uniform(step, batch, w):
        # Every request computes and samples w rows (a verify graph's step): request i's rows are
        # i * w .. i * w + w - 1 of the inputs and of the sampled tokens, its draft j input row
        # i * w + 1 + j. Nothing comes from the host.
        match = sampled.tokens.view(p, w)[:, :-1] == step.input_ids[:cells].view(p, w)[:, 1:]
        accepted = match.cumprod(dim=1).sum(dim=1)  # the leading run of matches
        sampled.accepted = accepted
        sampled.last_rows = torch.arange(0, cells, w, device=accepted.device) + accepted
        sampled.shifts = (w - 1) - accepted
        return
    layout = acceptance_layout(sampling_input_rows(step, batch), counts)
    mixed = len(layout) > 2 * cells + 2 * p  # mixed widths: each request's rows gathered into its W cells
    sizes = [cells, cells, *([cells] if mixed else []), p, p]
    parts = array_to_device(layout, sampled.tokens.device).split(sizes)
    draft_rows, compared, first, drafted = parts[0], parts[1], parts[-2], parts[-1]
    tokens = sampled.tokens[parts[2]] if mixed else sampled.tokens
    match = (tokens.view(p, w) == step.input_ids[draft_rows].view(p, w)) * compared.view(p, w)
    accepted = match.argmin(dim=1)
    sampled.accepted = accepted
    sampled.last_rows = first + accepted
    sampled.shifts = drafted - accepted


def _uniform(step: StepLogits, batch: ScheduledBatch, w: int) -> bool:
    """Whether every request of the batch computes exactly w tokens and samples all of them."""
    return (
        len(step.sample_requests) == len(batch.requests)
        and all(c == w for c in step.sample_counts)
        and all(n == w for n in batch.num_new_tokens)
    )


def _draft_row(req: Request, position: int) -> SamplingRow:
    """The row that chooses the MTP draft at `position`: the request's own rule and noise, so the
    draft is what the main model would pick were the MTP layer's logits its own; penalties,
    blocked ids and logprobs are left out (requests that need them do not draft)."""
    p = req.params
    if p.has_penalties or p.logprobs:
        p = p.replace(repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, logprobs=None)
    return SamplingRow(p, req.seed, position, req.prompt_token_ids, [], [])


def mtp_drafts(
    runner: ModelRunner,
    step: StepLogits,
    batch: ScheduledBatch,
    sampled: DeviceSample | None,
    newest: list[int],
    depth: int = 1,
) -> bool:
    """Run the MTP layer over the step's rows and draft each sampling request's next `depth`
    tokens into sampled.mtp_drafts [requests, depth] (device), and the head's probability of each
    into sampled.mtp_confidence. `newest`: per sampling request, the position of its newest slot
    in the host's layout when the step was planned. Returns whether the layer ran as a CUDA graph
    (after a graphed step: the graph of that step's width and bucket, cuda_graphs.py).

    Row p pairs the main model's hidden state at p with the token at p + 1, fills the MTP layer's
    cache at p, and predicts the token at p + 2. Inside a request's sampled rows the token at p + 1
    is the sampled one (on the device); rows past its accepted drafts get tokens that are never
    used, and their cache entries are rewritten when the positions are computed again. A request's
    draft comes from the row of its newest accepted token, chosen with the (seed, position) noise
    of the position it drafts for. A step that samples nothing only fills the MTP layer's cache.
    Further drafts apply the one MTP layer again to its own output (`_recurse`).
    """
    if runner.last_forward is None:
        return False
    _, positions, ctx, hidden = runner.last_forward
    runner.last_forward = None
    dev = hidden.device
    graphs = runner.graphs if runner.last_step_graphed else None
    draft_graphs = graphs if graphs is not None and graphs.draft_layer else None
    starts = sampling_input_rows(step, batch)
    next_ids: list[int] = []
    for req, n in zip(batch.requests, batch.num_new_tokens, strict=True):
        begin = req.num_computed_tokens - n  # after_step has advanced it past this step
        tokens = req.token_slice(begin + 1, begin + n + 1)
        next_ids.extend(t if t >= 0 else 0 for t in tokens)
        next_ids.extend([0] * (n - len(tokens)))
    counts = step.sample_counts
    # Where each sampled row's token goes among the next ids: request i's rows, in order, are
    # sampled rows firsts[i] .. firsts[i] + counts[i] - 1 (so all sampled rows, in order).
    targets = (
        [s + j for s, c in zip(starts, counts, strict=True) for j in range(c)] if sampled is not None else []
    )
    firsts = _firsts(counts)
    rows = graphs.last_rows if graphs is not None else None
    next_ids, targets, starts = in_replayed_layout(next_ids, targets, starts, hidden.shape[0], rows)
    # One copy for every index list.
    sizes = [len(next_ids), len(targets), len(firsts), len(starts)]
    with torch.inference_mode():
        nxt, target_rows, first_rows, pick = values_to_device(
            next_ids + targets + firsts + starts, torch.long, dev
        ).split(sizes)
        if targets and sampled is not None:
            nxt[target_rows] = sampled.tokens
        if draft_graphs is not None:
            draft_hidden = draft_graphs.run_draft_layer(nxt)
        else:
            draft_hidden = runner.model.mtp_forward(nxt, positions, hidden, ctx)
        if sampled is None or not step.sample_requests:
            return draft_graphs is not None
        if sampled.accepted is not None:
            pick = pick + sampled.accepted
        logits = runner.model.mtp_compute_logits(draft_hidden[pick])
        # The draft is for the position after the newest accepted token: the host's layout
        # counts every draft of this step (and, while it is in flight, of the previous one) as
        # accepted, so the rejected ones are subtracted on the device.
        shift = sampled.shifts
        if step.position_shift is not None:
            previous = step.position_shift[first_rows]
            shift = previous if shift is None else shift + previous
        draft_rows = [_draft_row(r, p + 1) for r, p in zip(step.sample_requests, newest, strict=True)]
        first = sample_on_device(logits, draft_rows, position_shift=shift)
        drafts, logprobs = [first.tokens], [first.logprobs]
        if depth > 1:
            more = _recurse(
                runner, step, batch, ctx, newest, draft_hidden[pick], first.tokens, shift, depth - 1
            )
            drafts += [d.tokens for d in more]
            logprobs += [d.logprobs for d in more]
    sampled.mtp_drafts = torch.stack(drafts, dim=1)
    # The head's softmax probability of each token it drafted (the sampler's logprob under the raw
    # logits): the confidence the draft budget weighs. Read back with the tokens, never waited for.
    sampled.mtp_confidence = torch.stack(logprobs, dim=1).exp()
    return draft_graphs is not None


def in_replayed_layout(
    next_ids: list[int], targets: list[int], starts: list[int], size: int, rows: np.ndarray | None
) -> tuple[list[int], list[int], list[int]]:
    """mtp_drafts' host-layout lists moved to the layout the step ran in: `size` rows (a CUDA
    graph's bucket, or the eager step's rows) with the real row i at rows[i] (a padded graph step,
    cuda_graphs.pad_to_width; None: at i). Padding rows get token 0; their KV store is skipped."""
    if rows is None:
        return next_ids + [0] * (size - len(next_ids)), targets, starts
    ids = np.zeros(size, dtype=np.int64)
    ids[rows] = next_ids
    return ids.tolist(), rows[targets].tolist(), rows[starts].tolist()


def _recurse(
    runner: ModelRunner,
    step: StepLogits,
    batch: ScheduledBatch,
    ctx: ForwardContext,
    newest_host: list[int],
    hidden: torch.Tensor,
    token: torch.Tensor,
    shift: torch.Tensor | None,
    more: int,
) -> list[DeviceSample]:
    """`more` further drafts per sampling request (one DeviceSample per pass), as DeepSeek-V3's
    serving chains its one MTP layer: the layer's output at position q stands in for the main
    model's hidden state at q + 1 and is paired with the draft just made (the token at q + 2).
    Pass i runs one row per request at position newest + i (its cache entry there is rewritten
    once the real token is known) and drafts the token at newest + i + 2, with the noise of that
    position.

    A position past the request's allocated blocks (a deep chain after rejections) gets no cache
    entry and attends only to the allocated keys: the draft gets worse, nothing else changes. So
    does a position at or past max_model_len (a chain started near the end of a sequence): its
    draft is for a token the request can never hold, and its rotary position is clamped to the
    last one the tables cover."""
    dev = hidden.device
    reqs = step.sample_requests
    index = {id(r): i for i, r in enumerate(batch.requests)}
    bs = ctx.attn.block_size
    count = len(reqs)
    batch_rows, capacity, newest = values_to_device(
        [index[id(r)] for r in reqs] + [len(r.block_table) * bs for r in reqs] + list(newest_host),
        torch.long,
        dev,
    ).split([count, count, count])
    tables = ctx.attn.block_tables[batch_rows]
    if shift is not None:
        newest = newest - shift
    qsl = torch.arange(count + 1, dtype=torch.int32, device=dev)
    out: list[DeviceSample] = []
    last = runner.max_model_len - 1
    for i in range(more):
        pos = newest + i
        inside = (pos < capacity) & (pos <= last)
        block = (
            tables.gather(1, (pos // bs).clamp(max=tables.shape[1] - 1).view(-1, 1)).view(-1).to(torch.int64)
        )
        slots = torch.where(inside, block * bs + pos % bs, torch.full_like(pos, SKIP_SLOT))
        pos = pos.clamp(max=last)
        lens = torch.minimum(pos + 1, capacity).to(torch.int32)
        meta = AttentionMetadata(
            query_start_loc=qsl,
            seq_lens=lens,
            block_tables=tables,
            slot_mapping=slots,
            block_size=bs,
            max_query_len=1,
            max_seq_len=ctx.attn.max_seq_len + more,
            query_start_loc_cpu=qsl.tolist() if not qsl.is_cuda else [],
            seq_lens_cpu=lens.tolist() if not lens.is_cuda else [],
        )
        chained = ForwardContext(meta, ctx.kv_caches, ctx.batch_invariant)
        hidden = runner.model.mtp_forward(token, pos, hidden, chained)
        logits = runner.model.mtp_compute_logits(hidden)
        rows = [_draft_row(r, p + i + 2) for r, p in zip(reqs, newest_host, strict=True)]
        drafted = sample_on_device(logits, rows, position_shift=shift)
        token = drafted.tokens
        out.append(drafted)
    return out


def _firsts(counts: list[int]) -> list[int]:
    out, row = [], 0
    for c in counts:
        out.append(row)
        row += c
    return out
