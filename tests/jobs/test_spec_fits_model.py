"""What a spec asks of every row, which the input or model cannot give, ends the job once (78)
before any split, instead of making every row an error record."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pipeline_kit import cli, job_toml

from shardinfer.jobs.cli import main


def _job(tmp_path: Path, model: Path, **sections: dict[str, object]) -> Path:
    rows = [{"id": f"r{i}", "prompt": f"hello {i}", "n": i,
             "messages": [{"role": "user", "content": f"hi {i}"}]} for i in range(4)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet")
    job = tmp_path / "job.toml"
    job.write_text(job_toml(model, str(tmp_path / "in.parquet"), str(tmp_path / "out"),
                            **{"input": {"passthrough_columns": []}, **sections}))
    return job


def _refused(job: Path, out: Path, *expected: str) -> None:
    result = cli("submit", str(job))
    assert result.returncode == 78, result.stderr
    for text in expected:
        assert text in result.stderr, result.stderr
    assert not list(out.glob("part-*"))


def test_a_prompt_column_of_numbers_is_refused(tmp_path: Path, model_dir: Path) -> None:
    job = _job(tmp_path, model_dir, input={"passthrough_columns": [], "prompt_column": "n"})
    _refused(job, tmp_path / "out", "input.prompt_column='n' is a column of int64; it must hold strings")


def test_a_messages_column_needs_a_chat_template(tmp_path: Path, model_dir: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    (model / "chat_template.jinja").unlink(missing_ok=True)
    job = _job(tmp_path, model, input={"passthrough_columns": [], "prompt_column": "",
                                       "messages_column": "messages"})
    _refused(job, tmp_path / "out", "input.messages_column='messages' is rendered by the model's chat template",
             "has no default one")


def test_a_sampling_schema_that_does_not_compile_is_refused(tmp_path: Path, model_dir: Path) -> None:
    bad = {"schema_type": "json", "schema": json.dumps({"type": "object", "properties": {"a": {"type": "nope"}}})}
    job = _job(tmp_path, model_dir, sampling={"structured_output": bad})
    _refused(job, tmp_path / "out", "sampling.structured_output: invalid json schema")


def test_sampling_max_tokens_past_max_model_len_is_refused(tmp_path: Path, model_dir: Path) -> None:
    job = _job(tmp_path, model_dir, sampling={"max_tokens": 5000}, engine={"max_model_len": 256})
    _refused(job, tmp_path / "out", "sampling.max_tokens=5000 is above max_model_len=256",
             "lower it to 256 or less (max_tokens = 256 generates until prompt and output fill it)")


def test_validate_refuses_what_submit_would(tmp_path: Path, model_dir: Path) -> None:
    """`validate` reads a local model's config, so it refuses the lengths submit refuses, without
    loading the model."""
    job = _job(tmp_path, model_dir, sampling={"max_tokens": 5000}, engine={"max_model_len": 256})
    result = cli("validate", str(job))
    assert result.returncode == 78, result.stdout + result.stderr
    assert "sampling.max_tokens=5000 is above max_model_len=256" in result.stderr
    fits = _job(tmp_path, model_dir, sampling={"max_tokens": 200}, engine={"max_model_len": 256})
    assert cli("validate", str(fits)).returncode == 0


def _model_without(tmp_path: Path, model_dir: Path, *names: str) -> Path:
    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    for name in names:
        (model / name).unlink(missing_ok=True)
    return model


def test_validate_and_submit_refuse_a_model_without_a_tokenizer_before_writing(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # validate said ok, and a local[N] submit wrote its plan before every worker failed to load.
    model = _model_without(tmp_path, model_dir, "tokenizer.json")
    job = _job(tmp_path, model)
    for argv in (
        ["validate", str(job)],
        ["submit", "--dry-run", str(job)],
        ["submit", "--master", "local[2]", str(job)],
    ):
        assert main(argv) == 78, argv
        err = capsys.readouterr().err
        assert f"cannot load the model at model.path={str(model)!r}: no tokenizer.json in {str(model)!r}" in err
    assert not (tmp_path / "out").exists()


def test_validate_refuses_a_messages_column_without_a_chat_template(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _model_without(tmp_path, model_dir, "chat_template.jinja")
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    chat = _job(
        tmp_path, model, input={"passthrough_columns": [], "prompt_column": "", "messages_column": "messages"}
    )
    assert main(["validate", str(chat)]) == 78
    assert "input.messages_column='messages' is rendered by the model's chat template" in capsys.readouterr().err
    # A named template alone (tool_use) is no default: a job, which passes no tools, never renders it.
    (model / "additional_chat_templates").mkdir()
    (model / "additional_chat_templates" / "tool_use.jinja").write_text("{{ tools }}{{ messages }}")
    assert main(["validate", str(chat)]) == 78
    assert "never a named one such as tool_use" in capsys.readouterr().err
    plain = _job(tmp_path, model)
    assert main(["validate", str(plain)]) == 0
