"""The padded layout a decode CUDA graph runs a step of mixed widths with (cuda_graphs.pad_to_width),
checked on the CPU's eager forward: the graph replays the same layout, so what holds here for the
real rows holds for the replay."""

from __future__ import annotations

import numpy as np
import torch

from shardinfer import LLM
from shardinfer.engine.cuda_graphs import pad_to_width
from shardinfer.engine.forward_context import SKIP_SLOT, AttentionMetadata, ForwardContext
from shardinfer.engine.input_fixup import InputFixup, PreviousStep
from shardinfer.engine.model_runner import HostBatch
from tests.engine.speculative_helpers import DEMO

BLOCK = 16


def _host(tokens: list[list[int]], starts: list[int], blocks: list[int]) -> HostBatch:
    """Request i feeds tokens[i] at positions starts[i]..; its KV lives in block blocks[i]."""
    counts = np.array([len(t) for t in tokens])
    qsl = np.zeros(len(tokens) + 1, dtype=np.int32)
    np.cumsum(counts, out=qsl[1:])
    pos = np.concatenate([np.arange(s, s + len(t)) for s, t in zip(starts, tokens, strict=True)]).astype(
        np.int64
    )
    block_of = np.repeat(np.array(blocks, dtype=np.int64), counts)
    return HostBatch(
        input_ids=np.array([x for t in tokens for x in t], dtype=np.int64),
        positions=pos,
        slot_mapping=block_of * BLOCK + pos,
        query_start_loc=qsl,
        seq_lens=(np.array(starts) + counts).astype(np.int32),
        block_tables=np.array([[b] for b in blocks], dtype=np.int32),
    )


def _context(runner, host: HostBatch) -> ForwardContext:
    counts = np.diff(host.query_start_loc)
    meta = AttentionMetadata(
        query_start_loc=torch.from_numpy(host.query_start_loc),
        seq_lens=torch.from_numpy(host.seq_lens),
        block_tables=torch.from_numpy(host.block_tables),
        slot_mapping=torch.from_numpy(host.slot_mapping),
        block_size=BLOCK,
        max_query_len=int(counts.max()),
        max_seq_len=int(host.seq_lens.max()),
        query_start_loc_cpu=host.query_start_loc.tolist(),
        seq_lens_cpu=host.seq_lens.tolist(),
    )
    return ForwardContext(meta, runner.kv_caches, runner.batch_invariant)


def _hidden(runner, host: HostBatch) -> tuple[torch.Tensor, ForwardContext]:
    """The main model's hidden states over the host batch, and the context they ran in."""
    ctx = _context(runner, host)
    with torch.inference_mode():
        return runner.model(torch.from_numpy(host.input_ids), torch.from_numpy(host.positions), ctx), ctx


def _forward(runner, host: HostBatch) -> torch.Tensor:
    hidden, _ = _hidden(runner, host)
    with torch.inference_mode():
        return runner.model.compute_logits(hidden)


def test_padded_rows_give_the_real_rows_bits_and_store_nothing(qwen3_dir) -> None:
    llm = LLM(qwen3_dir, device="cpu", dtype="float32", block_size=BLOCK)
    runner = llm.llm_engine.runner
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 200, (n,), generator=g).tolist() for n in (7, 12, 4)]
    blocks = [1, 2, 3]
    _forward(runner, _host(prompts, [0, 0, 0], blocks))  # the prompts' KV
    # Next step: 1, 3 and 2 new tokens (a request that may not draft, one with two drafts, one with one).
    step = [[11], [12, 13, 14], [15, 16]]
    compact = _host(step, [7, 12, 4], blocks)
    want = _forward(runner, compact)
    kv_before = [t.clone() for layer in runner.kv_caches for t in layer]

    padded, rows = pad_to_width(compact, 3)
    assert rows.tolist() == [2, 3, 4, 5, 7, 8]
    assert padded.slot_mapping[[0, 1, 6]].tolist() == [SKIP_SLOT] * 3
    assert padded.seq_lens.tolist() == compact.seq_lens.tolist()
    got = _forward(runner, padded)[torch.from_numpy(rows)]
    assert torch.equal(got, want)
    # The real rows rewrote their own KV with the same values; the padding rows wrote nothing.
    kv_after = [t for layer in runner.kv_caches for t in layer]
    assert all(torch.equal(a, b) for a, b in zip(kv_before, kv_after, strict=True))


def _shifted_step() -> tuple[HostBatch, InputFixup]:
    """A step after one whose request 0 drafted 2 and had 1 rejected (request 1 had none
    rejected): its compact host batch and its input fixup."""
    prev = PreviousStep(
        sampled=torch.tensor([50, 51, 52, 60, 61]),
        first_rows=[0, 3],
        last_rows=torch.tensor([1, 3]),
        shifts=torch.tensor([1, 0]),
    )
    fix = InputFixup(
        prev,
        token_rows=[0, 1],
        token_prev=[0, 1],
        token_shift_of=[0, 1, 1, 1],
        request_shift_of=[0, 1],
        sample_shift_of=[0, 1, 1, 1],
        token_owner=[0, 1, 1, 1],
    )
    return _host([[0], [0, 70, 71]], [9, 5], [1, 2]), fix


def _applied(host: HostBatch, f: InputFixup) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """Copies of the host batch's inputs with the fixup applied to them, and the sampling rows'
    position shift the fixup returned."""
    t = [
        torch.from_numpy(a.copy())
        for a in (host.input_ids, host.positions, host.seq_lens, host.slot_mapping, host.block_tables)
    ]
    return t, f.apply(t[0], t[1], t[2], t[3], t[4], BLOCK)


def test_spread_fixup_shifts_the_real_rows_as_the_compact_one_does() -> None:
    compact, fix = _shifted_step()
    (ids_c, pos_c, lens_c, slots_c, _), _ = _applied(compact, fix)
    padded, rows = pad_to_width(compact, 3)
    (ids_p, pos_p, lens_p, slots_p, _), _ = _applied(padded, fix.spread(rows.tolist(), 6, 3))
    r = torch.from_numpy(rows)
    assert torch.equal(ids_p[r], ids_c) and torch.equal(pos_p[r], pos_c) and torch.equal(slots_p[r], slots_c)
    assert pos_c.tolist() == [8, 5, 6, 7]  # request 0 moved back by its one rejected draft
    assert ids_c.tolist()[:2] == [51, 60]  # newest tokens from the previous step's last accepted rows
    assert torch.equal(lens_p, lens_c)
    assert slots_p[[0, 1]].tolist() == [SKIP_SLOT, SKIP_SLOT]


def test_a_spread_fixup_returns_the_sampling_rows_position_shift() -> None:
    """A padded step applies a spread copy of the step's fixup; what sampling draws its noise at is
    what that apply returns. Without the shift the rows after a rejected draft draw their noise at
    the host's planned positions, and sampled tokens differ from plain decoding."""
    host, fix = _shifted_step()
    padded, rows = pad_to_width(host, 3)
    _, shift = _applied(padded, fix.spread(rows.tolist(), 6, 3))
    assert shift is not None and shift.tolist() == [1, 0, 0, 0]


def _mtp(runner, host: HostBatch, next_ids: list[int]) -> torch.Tensor:
    """The MTP layer after the main model over the host batch, row i paired with next_ids[i]."""
    hidden, ctx = _hidden(runner, host)
    with torch.inference_mode():
        return runner.model.mtp_forward(torch.tensor(next_ids), torch.from_numpy(host.positions), hidden, ctx)


def test_the_mtp_layer_in_the_padded_layout_gives_the_real_rows_bits_and_stores_nothing() -> None:
    """A graphed MTP step runs the draft layer in the padded layout of its main step, with the
    host's next tokens moved there by draft_device.in_replayed_layout: the real rows' draft hidden
    states are the compact step's bits, and the padding rows write nothing to either cache."""
    from shardinfer.engine.draft_device import in_replayed_layout

    llm = LLM(DEMO, device="cpu", dtype="float32", block_size=BLOCK, speculative="mtp")
    runner = llm.llm_engine.runner
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 4000, (n,), generator=g).tolist() for n in (7, 12, 4)]
    blocks = [1, 2, 3]
    _mtp(runner, _host(prompts, [0, 0, 0], blocks), [t for p in prompts for t in [*p[1:], 5]])
    step = [[11], [12, 13, 14], [15, 16]]
    after = [[21], [22, 23, 24], [25, 26]]  # the token after each row (sampled ones, in a real step)
    compact = _host(step, [7, 12, 4], blocks)
    flat_after = [t for a in after for t in a]
    want = _mtp(runner, compact, flat_after)
    kv_before = [t.clone() for layer in runner.kv_caches for t in layer]

    padded, rows = pad_to_width(compact, 3)
    starts = [0, 1, 4]  # each request's first sampled row in the compact layout
    targets = list(range(6))
    ids, moved_targets, moved_starts = in_replayed_layout(
        flat_after, targets, starts, 12, rows
    )  # bucket of 4
    assert moved_starts == [2, 3, 7] and moved_targets == rows.tolist()
    assert len(ids) == 12 and [ids[r] for r in rows] == flat_after
    padded = _pad_requests(padded, 4, 3)
    got = _mtp(runner, padded, ids)
    assert torch.equal(got[torch.from_numpy(rows)], want)
    kv_after = [t for layer in runner.kv_caches for t in layer]
    assert all(torch.equal(a, b) for a, b in zip(kv_before, kv_after, strict=True))


def _pad_requests(host: HostBatch, b: int, w: int) -> HostBatch:
    """The padded host batch grown to a bucket of b requests, as DecodeGraphs.run fills its static
    buffers: each padding request holds w tokens at position 0 in block 0, KV store skipped."""
    n = len(host.seq_lens)
    extra = (b - n) * w
    return HostBatch(
        input_ids=np.concatenate([host.input_ids, np.zeros(extra, dtype=np.int64)]),
        positions=np.concatenate([host.positions, np.zeros(extra, dtype=np.int64)]),
        slot_mapping=np.concatenate([host.slot_mapping, np.full(extra, SKIP_SLOT, dtype=np.int64)]),
        query_start_loc=np.arange(0, (b + 1) * w, w, dtype=np.int32),
        seq_lens=np.concatenate([host.seq_lens, np.full(b - n, w, dtype=np.int32)]),
        block_tables=np.concatenate(
            [host.block_tables, np.zeros((b - n, host.block_tables.shape[1]), np.int32)]
        ),
    )
