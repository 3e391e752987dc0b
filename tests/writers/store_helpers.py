"""Helpers shared by the OutputStore tests: a small split plan and rows in the output schema."""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa

from shardinfer.splits import Split
from shardinfer.writers import OutputStore, make_job_record, output_schema

PASSTHROUGH = pa.schema([("lang", pa.string())])
SCHEMA = output_schema(PASSTHROUGH, top_logprobs=True)


def plan(n: int, rows_per_split: int = 3) -> list[Split]:
    return [Split(i, 0, "in.parquet", i * rows_per_split, (i + 1) * rows_per_split) for i in range(n)]


def rows_for(split: Split) -> list[dict[str, Any]]:
    """Deterministic output rows of a split, one ok row and (for odd rows) an error row."""
    out: list[dict[str, Any]] = []
    for r in range(split.row_start, split.row_end):
        if r % 2:
            out.append(
                {
                    "row_id": f"0:{r}",
                    "sample_index": 0,
                    "status": "error",
                    "error_code": "prompt_too_long",
                    "error_message": f"row {r} is too long",
                    "lang": "en",
                }
            )
        else:
            out.append(
                {
                    "row_id": f"0:{r}",
                    "sample_index": 0,
                    "status": "ok",
                    "text": f"answer {r}",
                    "token_ids": [r, r + 1],
                    "token_logprobs": [-0.5, -0.25],
                    "finish_reason": "length",
                    "prompt_tokens": 4,
                    "completion_tokens": 2,
                    "seed": 2**62 + r,
                    "top_token_ids": [[r, 1], [r + 1, 2]],
                    "top_logprobs": [[-0.5, -1.5], [-0.25, -2.0]],
                    "lang": "fr",
                }
            )
    return out


def table_for(split: Split) -> pa.Table:
    return pa.Table.from_pylist(rows_for(split), schema=SCHEMA)


def new_store(url: str, splits: list[Split], **kwargs: Any) -> OutputStore:
    store = OutputStore(url, **kwargs)
    store.write_job(make_job_record("run-1", {"model": "tiny", "seed": 7}, splits))
    return store


def commit_all(store: OutputStore, splits: list[Split]) -> list[Any]:
    """Write and commit a part for every split (attempt "a1"); returns the parts in split order."""
    parts = [store.write_part(s, "a1", table_for(s), {}) for s in splits]
    for s, p in zip(splits, parts, strict=True):
        assert store.commit(s, p)
    return parts


def full_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows as read back from Parquet: every schema column present, absent ones null."""
    return [{name: row.get(name) for name in SCHEMA.names} for row in rows]


def race_commits(
    url: str, split: Split, writers: int, prefix: str, storage_options: dict[str, Any] | None = None
) -> dict[str, bool]:
    """`writers` threads named f"{prefix}{i}", each with its own store object (as separate processes
    would have), write a part of `split`, meet at a barrier, then commit it at once: name -> won."""
    barrier = threading.Barrier(writers)
    results: dict[str, bool] = {}

    def attempt(name: str) -> None:
        own = OutputStore(url, storage_options)
        part = own.write_part(split, name, table_for(split), {})
        barrier.wait()
        results[name] = own.commit(split, part)

    threads = [threading.Thread(target=attempt, args=(f"{prefix}{i}",)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results
