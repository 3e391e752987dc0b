"""The engine's own MTP draft step on the trained demo model reproduces the recorded MTP agreement.

One varlen prefill over all recorded chat sequences (prompt + greedy answer + EOS): the main model
gives h_i and its greedy token at every position; the MTP layer drafts t_{i+2} from (t_{i+1}, h_i).
Agreement = how often the draft's top-1 equals the main model's top-1 for the same token, the number
recorded at training time with transformers and an independent MTP implementation.
"""

from __future__ import annotations

from typing import Any

import torch

from shardinfer.engine.forward_context import AttentionMetadata, ForwardContext

BLOCK = 16


def _prefill_context(model: Any, seqs: list[list[int]]) -> ForwardContext:
    """Fresh caches (main + MTP layers) with each sequence in its own contiguous run of blocks."""
    blocks = [-(-len(s) // BLOCK) for s in seqs]
    specs = model.kv_cache_specs() + model.mtp_kv_cache_specs()
    caches = [
        tuple(torch.zeros(sum(blocks), BLOCK, *shape, dtype=model.numerics.dtype) for shape in spec.entries)
        for spec in specs
    ]
    tables = torch.full((len(seqs), max(blocks)), -1, dtype=torch.int32)
    slots: list[int] = []
    qsl, first = [0], 0
    for i, (s, nb) in enumerate(zip(seqs, blocks, strict=True)):
        tables[i, :nb] = torch.arange(first, first + nb, dtype=torch.int32)
        slots.extend(range(first * BLOCK, first * BLOCK + len(s)))
        qsl.append(qsl[-1] + len(s))
        first += nb
    lens = [len(s) for s in seqs]
    attn = AttentionMetadata(
        query_start_loc=torch.tensor(qsl, dtype=torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32),
        block_tables=tables,
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        block_size=BLOCK,
        max_query_len=max(lens),
        max_seq_len=max(lens),
        query_start_loc_cpu=qsl,
        seq_lens_cpu=lens,
    )
    return ForwardContext(attn=attn, kv_caches=caches, batch_invariant=True)


@torch.no_grad()
def test_engine_mtp_agreement_matches_record(engine: Any, metrics: dict[str, Any]) -> None:
    model = engine.llm_engine.model
    assert model.num_mtp_layers == 1
    seqs: list[list[int]] = metrics["ci"]["mtp_sequences"]
    ctx = _prefill_context(model, seqs)
    ids = torch.tensor([t for s in seqs for t in s])
    positions = torch.tensor([p for s in seqs for p in range(len(s))])
    hidden = model(ids, positions, ctx)
    main_top = model.compute_logits(hidden).argmax(-1)
    # Row i drafts from the next token; a sequence's last row takes the main model's greedy token.
    nxt = torch.cat(
        [
            torch.tensor([*s[1:], int(main_top[end - 1])])
            for s, end in zip(seqs, ctx.attn.query_start_loc_cpu[1:], strict=True)
        ]
    )
    draft_top = model.mtp_compute_logits(model.mtp_forward(nxt, positions, hidden, ctx)).argmax(-1)
    agree = n = 0
    for start, end in zip(ctx.attn.query_start_loc_cpu[:-1], ctx.attn.query_start_loc_cpu[1:], strict=True):
        # draft at row j predicts t_{j+2}; the main model predicts it at row j + 1 (j = 0 .. L-3).
        agree += int((draft_top[start : end - 2] == main_top[start + 1 : end - 1]).sum())
        n += end - start - 2
    recorded = metrics["eval"]["mtp_chat_tasks"]
    assert n == recorded["positions"]
    assert abs(agree / n - recorded["mtp_top1_agreement"]) <= 0.01, (agree / n, recorded)
