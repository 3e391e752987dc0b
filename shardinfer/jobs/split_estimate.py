"""Estimated tokens of each split, for the scheduler's largest-first order.

A split's cost is its prompt tokens plus the tokens it will generate. Neither is known before the
rows are read, so both are estimated from what the driver already has: the generated side as
rows x samples x the job's `max_tokens` (per-row overrides are not read ahead), the prompt side
from the input's bytes — Parquet row groups' uncompressed sizes from the file footers (one footer
read per file), JSONL byte offsets — at a rough four bytes per token. Only the order matters, so
a file whose size cannot be read simply counts by its rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

BYTES_PER_TOKEN = 4.0


def split_estimator(
    splits: list[Any], input_spec: Any, max_tokens: int, samples: int
) -> Callable[[Any], float]:
    """A function split -> estimated tokens, for SplitScheduler."""
    prompt_bytes = _prompt_bytes(splits, input_spec)

    def estimate(split: Any) -> float:
        generated = float(split.num_rows * samples * max(1, max_tokens))
        return generated + prompt_bytes.get(split.index, 0.0) / BYTES_PER_TOKEN

    return estimate


def _prompt_bytes(splits: list[Any], input_spec: Any) -> dict[int, float]:
    if getattr(input_spec, "query", None):
        return {}  # rows of a query result do not map onto the files' bytes
    by_file: dict[str, list[Any]] = {}
    for s in splits:
        by_file.setdefault(s.path, []).append(s)
    out: dict[int, float] = {}
    for path, file_splits in by_file.items():
        try:
            if any(s.byte_offset is not None for s in file_splits):
                out.update(_jsonl_bytes(path, file_splits, input_spec))
            else:
                out.update(_parquet_bytes(path, file_splits, input_spec))
        except (OSError, ValueError):
            continue  # unreadable footer or size: this file's splits are ordered by rows alone
    return out


def _parquet_bytes(path: str, splits: list[Any], input_spec: Any) -> dict[int, float]:
    import pyarrow.parquet as pq

    from shardinfer.storage import filesystem

    fs, root = filesystem(path, dict(input_spec.storage_options))
    with fs.open(root, "rb") as f:
        meta = pq.ParquetFile(f).metadata
    groups = []  # (first row, last row + 1, bytes per row)
    start = 0
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        groups.append((start, start + rg.num_rows, rg.total_byte_size / max(1, rg.num_rows)))
        start += rg.num_rows
    out = {}
    for s in splits:
        total = 0.0
        for lo, hi, per_row in groups:
            overlap = min(hi, s.row_end) - max(lo, s.row_start)
            if overlap > 0:
                total += overlap * per_row
        out[s.index] = total
    return out


def _jsonl_bytes(path: str, splits: list[Any], input_spec: Any) -> dict[int, float]:
    from shardinfer.storage import filesystem

    fs, root = filesystem(path, dict(input_spec.storage_options))
    size = float(fs.size(root))
    ordered = sorted(splits, key=lambda s: s.row_start)
    out = {}
    for s, following in zip(ordered, [*ordered[1:], None], strict=True):
        end = following.byte_offset if following is not None and following.byte_offset is not None else size
        out[s.index] = max(0.0, float(end) - float(s.byte_offset or 0))
    return out
