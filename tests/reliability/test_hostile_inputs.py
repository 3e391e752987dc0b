"""Hostile input rows: each becomes an error record naming its problem, and the job goes on.

Every test runs the real CLI and checks, against an independent run over the clean rows alone,
that nothing was lost (every input row has its records), nothing changed (the good rows are
bit-identical to the clean run's) and every bad row carries the expected `error_code`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))

from pipeline_kit import cli, committed_rows, standard_job, tiny_model

from shardinfer.testing.hostile_inputs import deeply_nested_json, raw_string_array

GOOD_IDS = [f"g{i}" for i in range(5)]
# id -> (prompt bytes, top_k, n, so_args, expected error_code)
HOSTILE: dict[str, tuple[bytes | None, int | None, int | None, str | None, str]] = {
    "huge-top-k": (b"fox engine", 10**12, None, None, "bad_override"),
    "huge-n": (b"fox engine", None, 10**9, None, "bad_override"),
    "bad-utf8": (b"fox \xff\xfe engine", None, None, None, "invalid_row"),
    "deep-so-args": (
        b"fox",
        None,
        None,
        '{"schema_type": "json", "schema": ' + deeply_nested_json(10**5) + "}",
        "invalid_schema",
    ),
    "null-prompt": (None, None, None, None, "empty_prompt"),
}
COUNTS = {"bad inputs handled": 0}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.getbasetemp())


def _good_rows() -> list[tuple[str, bytes | None, int | None, int | None, str | None]]:
    words = ["shard", "commit", "token", "split", "parquet"]
    return [
        (gid, f"{words[i]} {words[(i * 2) % 5]} {i}".encode(), None, None, None)
        for i, gid in enumerate(GOOD_IDS)
    ]


def _write(path: Path, rows: list[tuple[str, bytes | None, int | None, int | None, str | None]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table(
        {
            "id": [r[0] for r in rows],
            "prompt": raw_string_array([r[1] for r in rows]),
            "top_k": pa.array([r[2] for r in rows], type=pa.int64()),
            "n": pa.array([r[3] for r in rows], type=pa.int64()),
            "so_args": pa.array([r[4] for r in rows], type=pa.string()),
        }
    )
    pq.write_table(table, path, row_group_size=3)


def _job(tmp_path: Path, model: Path, input_path: Path, name: str) -> tuple[Path, Path]:
    base = tmp_path / name
    base.mkdir()
    return standard_job(
        base,
        model,
        str(input_path),
        job={"split_rows": 3, "max_error_fraction": 0.9},
        input={"passthrough_columns": [], "override_columns": ["top_k", "n", "so_args"]},
        sampling={"temperature": 0.8, "max_tokens": 4},
    )


def _without_run_fields(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in ("top_k", "n", "so_args")}


@pytest.fixture(scope="module")
def clean_reference(tmp_path_factory: pytest.TempPathFactory, model: Path) -> dict[str, dict[str, Any]]:
    """The good rows alone, run once: what every hostile run must reproduce for them."""
    base = tmp_path_factory.mktemp("clean")
    _write(base / "in" / "a.parquet", _good_rows())
    job, out = _job(base, model, base / "in", "run")
    result = cli("submit", str(job))
    assert result.returncode == 0, result.stderr
    return {r["row_id"]: _without_run_fields(r) for r in committed_rows(str(out))}


@pytest.mark.parametrize("master", ["local", "local[2]"])
def test_hostile_parquet_rows_become_error_records(
    tmp_path: Path, model: Path, clean_reference: dict[str, dict[str, Any]], master: str
) -> None:
    good = _good_rows()
    bad = [(row_id, *value[:4]) for row_id, value in HOSTILE.items()]
    rows = [good[0], good[1], *bad[:3], good[2], *bad[3:], *good[3:]]  # bad rows among good ones
    _write(tmp_path / "in" / "a.parquet", rows)
    job, out = _job(tmp_path, model, tmp_path / "in", "run")
    result = cli("submit", "--master", master, str(job), timeout=300)
    assert result.returncode == 0, result.stderr
    got = {r["row_id"]: r for r in committed_rows(str(out))}
    assert sorted(got) == sorted(GOOD_IDS + list(HOSTILE))  # nothing lost, one record each
    for row_id, (_, _, _, _, code) in HOSTILE.items():
        assert (got[row_id]["status"], got[row_id]["error_code"]) == ("error", code), got[row_id]
        COUNTS["bad inputs handled"] += 1
    for row_id in GOOD_IDS:
        assert _without_run_fields(got[row_id]) == clean_reference[row_id]  # nothing changed


def test_hostile_jsonl_lines_and_messages(tmp_path: Path, model: Path) -> None:
    def line(row_id: str, messages: Any) -> str:
        return json.dumps({"id": row_id, "messages": json.dumps(messages)})

    user = {"role": "user", "content": "fox engine\nshard"}
    parts = {"role": "user", "content": [{"type": "text", "text": "fox engine"}, "shard"]}
    lines = [
        line("plain", [user]),
        line("parts", [parts]),
        line("null-content", [{"role": "user", "content": None}]),
        line("image-part", [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
        '{"id": "deep-line", "messages": ' + deeply_nested_json(10**5) + "}",
        '{"id": "not-json", "messages": ',
        line("deep-messages", deeply_nested_json(10**4)),
        line("tail", [{"role": "user", "content": "token split"}]),
    ]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_bytes(
        ("\n".join(lines) + "\n").encode() + b'{"id": "bad-utf8", "messages": "\xff"}\n'
    )
    job, out = standard_job(
        tmp_path,
        model,
        str(tmp_path / "in"),
        job={"split_rows": 4, "max_error_fraction": 0.9},
        input={"prompt_column": "", "messages_column": "messages", "passthrough_columns": []},
        sampling={"temperature": 0.0, "max_tokens": 4},
    )
    result = cli("submit", str(job))
    assert result.returncode == 0, result.stderr
    got = {r["row_id"]: r for r in committed_rows(str(out))}
    # Lines that could not be parsed have no id: their row id is file:line.
    expected = {
        "null-content": "invalid_row",
        "image-part": "invalid_row",
        "0:4": "invalid_row",
        "0:5": "invalid_row",
        "deep-messages": "invalid_row",
        "0:8": "invalid_row",
    }
    assert sorted(got) == sorted(["plain", "parts", "tail", *expected])
    for row_id, code in expected.items():
        assert (got[row_id]["status"], got[row_id]["error_code"]) == ("error", code), got[row_id]
        COUNTS["bad inputs handled"] += 1
    assert "line 5: a value is nested too deeply" in got["0:4"]["error_message"]
    assert "has no content" in got["null-content"]["error_message"]
    # Text parts are joined with a newline: the same prompt, so (greedy) the same tokens.
    assert got["parts"]["status"] == got["plain"]["status"] == "ok"
    assert got["parts"]["prompt_tokens"] == got["plain"]["prompt_tokens"]
    assert got["parts"]["token_ids"] == got["plain"]["token_ids"]


def test_zz_report_counts() -> None:
    print(f"\nhostile inputs: {COUNTS['bad inputs handled']} bad rows handled without stopping a job")
