"""Chat conversations as JSON text under input.prompt_column (chat data named as prompt text) would
reach the model as written, without the chat template: every record "ok", every text worthless. A
prompt column whose first values are all such conversations is refused (78) before the model loads
and before the output is written, naming the column, a value and the fix (messages_column), and
the way to send the JSON text on purpose. JSON among plain prompts, or JSON of another shape, is
prompt text as the user wrote it."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pipeline_kit import cli, job_toml

from shardinfer.jobs.cli import main
from shardinfer.pipeline.rows import is_conversation_text

CHAT = json.dumps([{"role": "user", "content": "What is 2+2?"}])
# Several turns, a system prompt and keys beyond role and content: still one conversation.
LONG_CHAT = json.dumps(
    [
        {"role": "system", "content": "You are terse. " * 20},
        {"role": "user", "content": "What is 2+2?", "name": "ann"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ]
)


def _job(tmp_path: Path, model: Path, input_path: Path, **inp: Any) -> Path:
    job = tmp_path / "job.toml"
    fields = {"passthrough_columns": [], "prompt_column": "q", **inp}
    job.write_text(job_toml(model, str(input_path), str(tmp_path / "out"), input=fields))
    return job


def _parquet(tmp_path: Path, values: list[Any], column: str = "q") -> Path:
    path = tmp_path / "in.parquet"
    table = pa.table({"id": [f"r{i}" for i in range(len(values))], column: pa.array(values, pa.string())})
    pq.write_table(table, path)
    return path


def _validate(job: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["validate", str(job)])
    return code, capsys.readouterr().err


def _shortened(value: str) -> str:
    """How the error shows a long value: its repr, cut with an ellipsis (written out here, not
    taken from the code under test)."""
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def test_conversations_in_a_prompt_column_are_refused_before_the_model_loads(
    tmp_path: Path, model_dir: Path
) -> None:
    job = _job(tmp_path, model_dir, _parquet(tmp_path, [CHAT] * 6))
    result = cli("submit", str(job))
    assert result.returncode == 78, result.stderr
    assert "input.prompt_column='q' holds chat conversations" in result.stderr
    assert "each of the first 4 value(s)" in result.stderr  # the first split's rows (job_toml's split_rows)
    assert f"(the first: {CHAT!r})" in result.stderr
    assert "set input.messages_column='q' in place of input.prompt_column" in result.stderr
    assert not (tmp_path / "out").exists()  # nothing planned, nothing to start over from


@pytest.mark.parametrize("form", ["parquet", "jsonl_mixed_shapes", "query"])
def test_the_check_reads_parquet_jsonl_and_the_query_result(
    form: str, tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if form == "parquet":
        job = _job(tmp_path, model_dir, _parquet(tmp_path, [LONG_CHAT, CHAT, None, LONG_CHAT]))
        column, first, count = "q", LONG_CHAT, 3  # nulls are not judged
    elif form == "jsonl_mixed_shapes":
        # Content as text in one line and as a list of parts in the other: the reader gives the
        # column as JSON text (one type could not hold both), which a prompt column would send as is.
        text = [{"role": "user", "content": "hi"}]
        parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
        path = tmp_path / "in.jsonl"
        path.write_text(
            "".join(json.dumps({"id": f"r{i}", "q": m}) + "\n" for i, m in enumerate([text, parts]))
        )
        job = _job(tmp_path, model_dir, path)
        column, first, count = "q", json.dumps(text), 2
    else:
        # The column the query makes is the one checked: conversations under a new name.
        path = _parquet(tmp_path, ["plain text"] * 3, column="text")
        query = """SELECT *, '[{"role": "user", "content": "' || text || '"}]' AS asked FROM input"""
        job = _job(tmp_path, model_dir, path, query=query, prompt_column="asked")
        column, first, count = "asked", '[{"role": "user", "content": "plain text"}]', 3
    code, err = _validate(job, capsys)
    assert code == 78, err
    assert f"input.prompt_column={column!r} holds chat conversations" in err
    assert f"each of the first {count} value(s)" in err
    assert f"(the first: {_shortened(first)})" in err
    assert f"set input.messages_column={column!r} in place of input.prompt_column" in err


@pytest.mark.parametrize(
    "values",
    [
        ["plain", CHAT, CHAT],  # one prompt of text: the JSON ones are prompts as written
        ["Summarise: " + CHAT] * 2,  # a conversation inside a prompt of one's own words
        [json.dumps({"role": "user", "content": "hi"})] * 2,  # one object, not a list of them
        ["[]", CHAT],  # an empty list is no conversation
        [json.dumps([{"role": "user"}])] * 2,  # messages without content
        [json.dumps(["role", "content"])] * 2,  # a list of strings
        ["[1, 2, 3]"] * 2,  # JSON of another shape
        ["[not json"] * 2,  # looks like a list, is text
        [None, None],  # nothing to judge by
    ],
)
def test_prompt_text_that_is_not_all_conversations_is_accepted(
    values: list[Any], tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _job(tmp_path, model_dir, _parquet(tmp_path, values))
    code, err = _validate(job, capsys)
    assert code == 0, err


@pytest.mark.parametrize("column", ["q", "chat log"])
def test_the_query_the_error_suggests_sends_the_json_text_on_purpose(
    column: str, tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _parquet(tmp_path, [CHAT] * 3, column=column)
    code, err = _validate(_job(tmp_path, model_dir, path, prompt_column=column), capsys)
    assert code == 78, err
    # The suggested setting is a TOML line: its value is a basic string, read here as TOML reads it.
    suggested = tomllib.loads(err.split("e.g. ", 1)[1].split(" (exit_code", 1)[0].strip())["input"]["query"]
    code, err = _validate(_job(tmp_path, model_dir, path, prompt_column=column, query=suggested), capsys)
    assert code == 0, err


def test_a_messages_column_of_conversations_is_not_judged_as_prompts(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = _job(tmp_path, model_dir, _parquet(tmp_path, [CHAT] * 3), prompt_column="", messages_column="q")
    code, err = _validate(job, capsys)
    assert code == 0, err


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (CHAT, True),
        (LONG_CHAT, True),
        ("  \n" + CHAT, True),  # JSON allows whitespace before the list
        ('[{"role": "user", "content": null, "tool_calls": []}]', True),
        ("What is 2+2?", False),
        ("[]", False),
        ('[{"role": "user", "content": "hi"}, "and more"]', False),
        ('{"role": "user", "content": "hi"}', False),
        ("[" * 100_000, False),  # nested too deeply to parse: not judged a conversation
        (None, False),
        ([{"role": "user", "content": "hi"}], False),  # not text: the column type check's to refuse
    ],
)
def test_what_counts_as_a_conversation(value: Any, expected: bool) -> None:
    assert is_conversation_text(value) is expected
