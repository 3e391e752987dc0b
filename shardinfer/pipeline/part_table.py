"""One split's results as an Arrow table in the output schema, built column by column.

Runs on the writer thread. Per record, only scalars (ids, status, text, counts) pass through
Python lists; the per-token columns are flattened by C iteration into numpy buffers and wrapped
as Arrow list arrays over offsets, so no Python object is made per token and the interpreter
lock is held for a few bulk copies rather than a walk over nested lists:

    token_ids       ListArray(offsets[records + 1], values int32[total tokens])
    top_token_ids   ListArray(offsets, ListArray(inner offsets[total tokens + 1], int32[total * k]))

Error records hold null in every generation column; `prompt_logprobs` is held by a row's first
sample only (sample_index 0), null in the others. The values equal what `pa.Table.from_pylist`
would make of one dict per record (the test checks it against exactly that).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from shardinfer.pipeline.assembly import Failed, Finished, OutputOptions, Slot
from shardinfer.pipeline.rows import PreparedRow

Entry = tuple[PreparedRow, int, Slot]
_chain = itertools.chain.from_iterable


def _offsets(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(lengths.size + 1, dtype=np.int32)
    np.cumsum(lengths, out=out[1:])
    return out


def _lists(lengths: np.ndarray, values: pa.Array, valid: np.ndarray, type_: pa.DataType) -> pa.Array:
    """A list column: record i holds values[offsets[i]:offsets[i+1]], or null where not valid."""
    mask = None if valid.all() else pa.array(~valid)
    return pa.ListArray.from_arrays(pa.array(_offsets(lengths)), values, type=type_, mask=mask)


def _flat(seqs: Sequence[Sequence[Any]], dtype: type[np.generic], count: int) -> np.ndarray:
    return np.fromiter(_chain(seqs), dtype=dtype, count=count)


def _top_columns(
    tops: list[list[Any]], valid: np.ndarray, outer_type: pa.DataType
) -> tuple[pa.Array, pa.Array]:
    """top_token_ids and top_logprobs from per-record lists of per-token [(id, logprob), ...]."""
    lengths = np.fromiter(map(len, tops), dtype=np.int32, count=len(tops))
    steps = list(_chain(tops))  # one list per generated token of every record
    inner = np.fromiter(map(len, steps), dtype=np.int32, count=len(steps))
    # (id, logprob) pairs flattened to id, lp, id, lp, ...: ids are exact in float64 (< 2**53).
    pairs = np.fromiter(_chain(_chain(steps)), dtype=np.float64, count=2 * int(inner.sum()))
    ids = pa.array(pairs[0::2].astype(np.int32))
    lps = pa.array(pairs[1::2].astype(np.float32))
    inner_offsets = pa.array(_offsets(inner))
    id_lists = pa.ListArray.from_arrays(inner_offsets, ids, type=outer_type.value_type)
    lp_lists = pa.ListArray.from_arrays(inner_offsets, lps, type=pa.list_(pa.float32()))
    return (
        _lists(lengths, id_lists, valid, outer_type),
        _lists(lengths, lp_lists, valid, pa.list_(pa.list_(pa.float32()))),
    )


def build_part_table(
    entries: Sequence[Entry], schema: pa.Schema, options: OutputOptions
) -> tuple[pa.Table, dict[str, int]]:
    """The part table of one split's records (in input order) and the counts stored with its commit."""
    if any(isinstance(res, dict) for _, _, res in entries):
        return records_table([res for _, _, res in entries], schema)
    n = len(entries)
    ok = np.fromiter((isinstance(res, Finished) for _, _, res in entries), dtype=bool, count=n)
    done: list[Finished] = [res for _, _, res in entries if isinstance(res, Finished)]
    comps = [f.completion for f in done]
    # Per record, the completion's lists; an error record contributes an empty list and a null.
    empty: list[Any] = []
    token_lists: list[Sequence[int]] = []
    logprob_lists: list[Sequence[float]] = []
    it = iter(comps)
    for flag in ok:
        if flag:
            comp = next(it)
            token_lists.append(comp.token_ids)
            logprob_lists.append(comp.logprobs)
        else:
            token_lists.append(empty)
            logprob_lists.append(empty)
    lengths = np.fromiter(map(len, token_lists), dtype=np.int32, count=n)
    total = int(lengths.sum())
    for i, lps in enumerate(logprob_lists):
        if len(lps) != lengths[i]:
            raise ValueError(
                f"record {i} has {lengths[i]} tokens but {len(lps)} logprobs: the engine's output is inconsistent"
            )
    prompt_tokens = [_prompt_tokens(row, res) for row, _, res in entries]
    completion_tokens = lengths.copy()
    columns: dict[str, pa.Array] = {
        "row_id": pa.array([row.row_id for row, _, _ in entries], pa.string()),
        "sample_index": pa.array(np.fromiter((j for _, j, _ in entries), dtype=np.int32, count=n)),
        "status": pa.array(["ok" if f else "error" for f in ok], pa.string()),
        "error_code": pa.array(
            [res.code if isinstance(res, Failed) else None for _, _, res in entries], pa.string()
        ),
        "error_message": pa.array(
            [res.message if isinstance(res, Failed) else None for _, _, res in entries], pa.string()
        ),
        "text": pa.array(_per_record(ok, (c.text for c in comps)), pa.string()),
        "token_ids": _lists(lengths, pa.array(_flat(token_lists, np.int32, total)), ok, pa.list_(pa.int32())),
        "token_logprobs": _lists(
            lengths, pa.array(_flat(logprob_lists, np.float32, total)), ok, pa.list_(pa.float32())
        ),
        "finish_reason": pa.array(_per_record(ok, (c.finish_reason for c in comps)), pa.string()),
        "prompt_tokens": pa.array(prompt_tokens, pa.int32()),
        "completion_tokens": pa.array(completion_tokens),
        "seed": pa.array([row.seeds[j] if j < len(row.seeds) else None for row, j, _ in entries], pa.int64()),
    }
    if options.top_logprobs:
        tops = [(c.top_logprobs or []) for c in comps]
        it_tops = iter(tops)
        per_record = [next(it_tops) if flag else empty for flag in ok]
        ids, lps = _top_columns(per_record, ok, schema.field("top_token_ids").type)
        columns["top_token_ids"], columns["top_logprobs"] = ids, lps
    if options.prompt_logprobs:
        # Once per input row, on its first sample: the n samples of a row share one prompt.
        values = _per_record(ok, (f.prompt_logprobs for f in done))
        first = [j == 0 for _, j, _ in entries]
        values = [v if is_first else None for v, is_first in zip(values, first, strict=True)]
        columns["prompt_logprobs"] = pa.array(values, schema.field("prompt_logprobs").type)
    for name in schema.names:
        if name not in columns:  # passthrough: the input's own values, in the input's type
            columns[name] = pa.array(
                [row.passthrough.get(name) for row, _, _ in entries], schema.field(name).type
            )
    table = pa.Table.from_arrays([columns[name] for name in schema.names], schema=schema)
    ok_count = int(ok.sum())
    stats = {
        "records": n,
        "rows_ok": ok_count,
        "rows_error": n - ok_count,
        "prompt_tokens": sum(p for p, flag in zip(prompt_tokens, ok, strict=True) if flag and p is not None),
        "completion_tokens": total,
        # Samples that ran out of room (max_tokens, or max_model_len) instead of finishing.
        "rows_cut_by_max_tokens": sum(1 for c in comps if c.finish_reason == "length"),
        # Samples that ended before any text: a chat model given raw prompt text often does.
        "rows_empty_text": sum(1 for c in comps if not c.text),
    }
    return table, stats


def records_table(records: list[Any], schema: pa.Schema) -> tuple[pa.Table, dict[str, int]]:
    """A table of ready-made record dicts (score jobs' records: a handful of values per row)."""
    if not all(isinstance(r, dict) for r in records):
        raise TypeError("a split's slots mix output records and engine results; a worker files one kind")
    ok = [r for r in records if r["status"] == "ok"]
    stats = {
        "records": len(records),
        "rows_ok": len(ok),
        "rows_error": len(records) - len(ok),
        "prompt_tokens": sum(r.get("prompt_tokens") or 0 for r in ok),
        "completion_tokens": sum(r.get("completion_tokens") or 0 for r in records),
        "rows_cut_by_max_tokens": sum(1 for r in records if r.get("finish_reason") == "length"),
    }
    return pa.Table.from_pylist(records, schema=schema), stats


def _prompt_tokens(row: PreparedRow, res: Slot) -> int | None:
    if isinstance(res, Finished):
        return res.prompt_tokens
    if row.prompt_ids is not None:
        return len(row.prompt_ids)
    return row.error.prompt_tokens if row.error is not None else None


def _per_record(ok: np.ndarray, values: Iterable[Any]) -> list[Any]:
    """One value per record: the next of `values` for an ok record, None for an error record."""
    it = iter(values)
    return [next(it) if flag else None for flag in ok]
