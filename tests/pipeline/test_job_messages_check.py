"""A messages column that holds no chat messages (plain prompt text, most often) is the spec's
mistake: refused (78) before the model loads and before the output is written, naming the column,
a value and the fix, whatever the input's form. A few bad rows among messages stay rows' errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pipeline_kit import cli, job_toml

from shardinfer.jobs.cli import main

CHAT = json.dumps([{"role": "user", "content": "What is 2+2?"}])


def _job(tmp_path: Path, model: Path, input_path: Path, **inp: Any) -> Path:
    job = tmp_path / "job.toml"
    fields = {"passthrough_columns": [], "prompt_column": "", "messages_column": "q", **inp}
    job.write_text(job_toml(model, str(input_path), str(tmp_path / "out"), input=fields))
    return job


def _parquet(tmp_path: Path, values: list[Any]) -> Path:
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(len(values))], "q": values}), path)
    return path


def _validate(job: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["validate", str(job)])
    return code, capsys.readouterr().err


def test_plain_text_in_a_messages_column_is_refused_before_the_model_loads(
    tmp_path: Path, model_dir: Path
) -> None:
    job = _job(tmp_path, model_dir, _parquet(tmp_path, ["What is 2+2?"] * 6))
    result = cli("submit", str(job))
    assert result.returncode == 78, result.stderr
    assert "input.messages_column='q' holds no chat messages" in result.stderr
    assert "'What is 2+2?', text that is not JSON" in result.stderr
    assert "set input.prompt_column='q' in place of input.messages_column" in result.stderr
    assert not (tmp_path / "out").exists()  # nothing planned, nothing to start over from


@pytest.mark.parametrize("form", ["jsonl", "query"])
def test_the_check_reads_jsonl_and_the_query_result(
    form: str, tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if form == "jsonl":
        path = tmp_path / "in.jsonl"
        path.write_text("".join(json.dumps({"id": f"r{i}", "q": "What is 2+2?"}) + "\n" for i in range(4)))
        job = _job(tmp_path, model_dir, path)
        column, first = "q", "What is 2+2?"
    else:
        # The column the query makes is the one checked: here plain text under a new name.
        path = _parquet(tmp_path, [CHAT] * 4)
        query = "SELECT *, 'hi ' || id AS asked FROM input"
        job = _job(tmp_path, model_dir, path, query=query, messages_column="asked")
        column, first = "asked", "hi r0"
    code, err = _validate(job, capsys)
    assert code == 78, err
    assert f"input.messages_column={column!r} holds no chat messages" in err
    assert f"(the first: {first!r}, text that is not JSON)" in err


def test_values_of_another_shape_are_named_without_the_plain_text_fix(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # JSON, but one message object instead of a list of them.
    job = _job(tmp_path, model_dir, _parquet(tmp_path, [json.dumps({"role": "user", "content": "hi"})] * 3))
    code, err = _validate(job, capsys)
    assert code == 78, err
    assert "messages must be a non-empty list of {role, content} objects" in err
    assert "input.prompt_column" not in err


@pytest.mark.parametrize(
    "values",
    [
        ["plain", None, CHAT, "plain"],  # one real value: the others are bad rows, not a bad spec
        [None, None, None],  # nothing to judge by
        [[{"role": "user", "content": "hi"}]] * 2,  # lists of structs
        ["[]", CHAT],  # an empty list is a row with no turn (an error record), not plain text
    ],
)
def test_messages_and_a_few_bad_rows_are_accepted(
    values: list[Any], tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _job(tmp_path, model_dir, _parquet(tmp_path, values))
    code, err = _validate(job, capsys)
    assert code == 0, err


def test_chat_messages_under_prompt_column_name_messages_column_as_the_fix(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _parquet(tmp_path, [[{"role": "user", "content": "hi"}]] * 2)
    job = _job(tmp_path, model_dir, path, prompt_column="q", messages_column="")
    code, err = _validate(job, capsys)
    assert code == 78, err
    assert "set input.messages_column='q' in place of input.prompt_column" in err
