"""Preparing a read batch at once (batched tokenising, cached overrides) gives exactly the rows
that preparing them one by one gives, error records included."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from shardinfer.engine.tokenizer import Tokenizer
from shardinfer.pipeline.config import InputSection
from shardinfer.pipeline.rows import RowPreparer


def _rows() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = [
        {"prompt": f"hello fox {i} " * (1 + i % 3), "max_tokens": [None, 3, 7, 3][i % 4], "temperature": None}
        for i in range(12)
    ]
    rows[2]["prompt"] = None  # empty_prompt
    rows[4]["prompt"] = 17  # not a string: invalid_row
    rows[5]["prompt"] = "parquet shard " * 80  # prompt_too_long
    rows[6]["max_tokens"] = 0  # bad_override
    rows[7]["temperature"] = 1  # an int and a float of one value: both valid, both kept apart
    rows[8]["temperature"] = 1.0
    rows[9]["prompt"] = ""
    for i, row in enumerate(rows):
        row["__row_index"] = 100 + i
    return rows


def _as_dict(row: Any) -> dict[str, Any]:
    out = {f.name: getattr(row, f.name) for f in dataclasses.fields(row)}
    out["error"] = (row.error.code, row.error.message) if row.error is not None else None
    out["params"] = [(type(p.temperature).__name__, dataclasses.asdict(p)) for p in row.params]
    return out


def test_batch_equals_row_by_row(model_dir: Path) -> None:
    section = InputSection(path="x", prompt_column="prompt", override_columns=["max_tokens", "temperature"])
    tokenizer = Tokenizer(model_dir)
    one = RowPreparer(tokenizer, 64, {"max_tokens": 4, "n": 2}, section, job_seed=9)
    many = RowPreparer(tokenizer, 64, {"max_tokens": 4, "n": 2}, section, job_seed=9)
    rows = _rows()
    expected = [_as_dict(one.prepare(3, 1, 50 + k, row)) for k, row in enumerate(rows)]
    for _ in range(2):  # the second pass is served from the override cache
        got = [_as_dict(r) for r in many.prepare_batch(3, 1, 50, rows)]
        assert got == expected
    codes = [e["error"][0] if e["error"] else None for e in expected]
    assert codes[2] == "empty_prompt" and codes[4] == "invalid_row" and codes[5] == "prompt_too_long"
    assert codes[6] == "bad_override" and codes[9] == "empty_prompt"


def test_encode_batch_equals_encode(model_dir: Path) -> None:
    tokenizer = Tokenizer(model_dir)
    texts = ["hello world", "a", "parquet shard fox " * 30, "ünïcödé ✓ text", " leading space"]
    assert tokenizer.encode_batch(texts) == [tokenizer.encode(t) for t in texts]
    assert tokenizer.encode_batch(texts, add_special_tokens=False) == [
        tokenizer.encode(t, add_special_tokens=False) for t in texts
    ]
