"""What a spec asks of every row, which the input or model cannot give, ends the job once (78)
before any split, instead of making every row an error record."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pipeline_kit import _toml, cli, job_toml

from shardinfer.jobs.cli import main


def _job(tmp_path: Path, model: Path, **sections: dict[str, object]) -> Path:
    rows = [
        {"id": f"r{i}", "prompt": f"hello {i}", "n": i, "messages": [{"role": "user", "content": f"hi {i}"}]}
        for i in range(4)
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet")
    job = tmp_path / "job.toml"
    job.write_text(
        job_toml(
            model,
            str(tmp_path / "in.parquet"),
            str(tmp_path / "out"),
            **{"input": {"passthrough_columns": []}, **sections},
        )
    )
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
    job = _job(
        tmp_path, model, input={"passthrough_columns": [], "prompt_column": "", "messages_column": "messages"}
    )
    _refused(
        job,
        tmp_path / "out",
        "input.messages_column='messages' is rendered by the model's chat template",
        "has no default one",
    )


def test_a_sampling_schema_that_does_not_compile_is_refused(tmp_path: Path, model_dir: Path) -> None:
    bad = {
        "schema_type": "json",
        "schema": json.dumps({"type": "object", "properties": {"a": {"type": "nope"}}}),
    }
    job = _job(tmp_path, model_dir, sampling={"structured_output": bad})
    _refused(job, tmp_path / "out", "sampling.structured_output: invalid json schema")


def test_sampling_max_tokens_past_max_model_len_is_refused(tmp_path: Path, model_dir: Path) -> None:
    job = _job(tmp_path, model_dir, sampling={"max_tokens": 5000}, engine={"max_model_len": 256})
    _refused(
        job,
        tmp_path / "out",
        "sampling.max_tokens=5000 is above max_model_len=256",
        "lower it to 256 or less (max_tokens = 256 generates until prompt and output fill it)",
    )


def test_validate_refuses_what_submit_would(tmp_path: Path, model_dir: Path) -> None:
    """`validate` reads a local model's config, so it refuses the lengths submit refuses, without
    loading the model."""
    job = _job(tmp_path, model_dir, sampling={"max_tokens": 5000}, engine={"max_model_len": 256})
    result = cli("validate", str(job))
    assert result.returncode == 78, result.stdout + result.stderr
    assert "sampling.max_tokens=5000 is above max_model_len=256" in result.stderr
    fits = _job(tmp_path, model_dir, sampling={"max_tokens": 200}, engine={"max_model_len": 256})
    assert cli("validate", str(fits)).returncode == 0


def test_dry_run_refuses_sampling_max_tokens_past_max_model_len(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dry run says what submit would (78), not ok: the same plan-time check as validate."""
    job = _job(tmp_path, model_dir, sampling={"max_tokens": 257}, engine={"max_model_len": 256})
    assert main(["submit", "--dry-run", str(job)]) == 78
    captured = capsys.readouterr()
    assert (
        "# dry run: submitting would exit 78 and write nothing: sampling.max_tokens=257 is above "
        "max_model_len=256" in captured.out
    )
    assert not (tmp_path / "out").exists()
    fits = _job(tmp_path, model_dir, sampling={"max_tokens": 256}, engine={"max_model_len": 256})
    assert main(["submit", "--dry-run", str(fits)]) == 0


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
        assert (
            f"cannot load the model at model.path={str(model)!r}: no tokenizer.json in {str(model)!r}" in err
        )
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
    assert (
        "input.messages_column='messages' is rendered by the model's chat template" in capsys.readouterr().err
    )
    # A named template alone (tool_use) is no default: a job, which passes no tools, never renders it.
    (model / "additional_chat_templates").mkdir()
    (model / "additional_chat_templates" / "tool_use.jinja").write_text("{{ tools }}{{ messages }}")
    assert main(["validate", str(chat)]) == 78
    assert "never a named one such as tool_use" in capsys.readouterr().err
    plain = _job(tmp_path, model)
    assert main(["validate", str(plain)]) == 0


def _document_job(tmp_path: Path, model: Path, window: int, **engine: int) -> Path:
    """A score job over one document column with job.rolling_window_tokens = window."""
    pq.write_table(
        pa.Table.from_pylist([{"id": "d0", "doc": "Hello world, the quick brown fox jumps."}]),
        tmp_path / "docs.parquet",
    )
    spec: dict[str, dict[str, object]] = {
        "job": {
            "task": "score",
            "split_rows": 4,
            "max_inflight_requests": 8,
            "rolling_window_tokens": window,
        },
        "input": {"path": str(tmp_path / "docs.parquet"), "id_column": "id", "document_column": "doc"},
        "model": {"path": str(model), "device": "cpu", "dtype": "float32"},
        "engine": {"num_kv_blocks": 128, "max_num_seqs": 8, **engine},
        "output": {"path": str(tmp_path / "out")},
    }
    job = tmp_path / "docs.toml"
    job.write_text(
        "\n".join(f"[{k}]\n" + "".join(f"{n} = {_toml(v)}\n" for n, v in b.items()) for k, b in spec.items())
    )
    return job


def test_a_rolling_window_past_max_model_len_is_refused_before_anything_is_written(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """validate and --dry-run said ok, and submit wrote _job.json before its engine refused the
    window (status then said `failed`): all three refuse it now, from the model's config.json and
    engine.max_model_len, with nothing written. max_model_len=64: windows of up to 64 positions."""
    job = _document_job(tmp_path, model_dir, 65, max_model_len=64)
    expected = (
        "job.rolling_window_tokens=65 needs spans of 66 tokens but the engine takes at most 65 "
        "(max_model_len=64); lower it to 64 or less"
    )
    for argv in (
        ["validate", str(job)],
        ["submit", "--dry-run", str(job)],
        ["submit", str(job)],
        ["submit", "--master", "local[2]", str(job)],
    ):
        assert main(argv) == 78, argv
        captured = capsys.readouterr()
        assert expected in captured.err, (argv, captured.err)
        assert not (tmp_path / "out").exists(), argv
    assert main(["submit", "--dry-run", str(job)]) == 78
    assert f"# dry run: submitting would exit 78 and write nothing: {expected}" in capsys.readouterr().out


def test_the_largest_rolling_window_the_engine_takes_is_accepted_by_every_check(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The plan-time check and the engine's (ScorePreparer) draw the line at the same window:
    max_model_len input positions (a span of max_model_len + 1 tokens, its last one only scored),
    as lm-evaluation-harness's hf model takes."""
    job = _document_job(tmp_path, model_dir, 64, max_model_len=64)
    for argv in (["validate", str(job)], ["submit", "--dry-run", str(job)], ["submit", str(job)]):
        assert main(argv) == 0, (argv, capsys.readouterr().err)
    assert (tmp_path / "out" / "_SUCCESS").is_file()
    rows = pq.read_table(next((tmp_path / "out").glob("part-*"))).to_pylist()
    assert [r["status"] for r in rows] == ["ok"]
    # status gives a score job's rate as the prompt tokens its run read, as its summary does.
    summary = json.loads((tmp_path / "out" / "_SUCCESS").read_text())["summary"]
    capsys.readouterr()
    assert main(["status", str(tmp_path / "out")]) == 0
    rate = summary["run_prompt_tokens"] / summary["wall_time_s"]
    assert (
        f"speed      {rate:.2f} prompt tok/s read over {summary['wall_time_s']} s" in capsys.readouterr().out
    )


def test_without_engine_max_model_len_the_window_is_held_to_the_models_positions(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    positions = json.loads((model_dir / "config.json").read_text())["max_position_embeddings"]
    over = _document_job(tmp_path, model_dir, positions + 1)
    assert main(["validate", str(over)]) == 78
    assert (
        f"job.rolling_window_tokens={positions + 1} needs spans of {positions + 2} tokens but the engine "
        f"takes at most {positions + 1} (max_model_len={positions})"
    ) in capsys.readouterr().err
    assert main(["validate", str(_document_job(tmp_path, model_dir, positions))]) == 0


@pytest.mark.parametrize("max_model_len", [2, 3, 64, 2048])
def test_the_plan_and_the_engine_refuse_the_same_windows(
    tmp_path: Path, model_dir: Path, max_model_len: int
) -> None:
    """check_sampling_lengths (the plan's check, and the built engine's in check_model_serves_spec)
    and ScorePreparer (what a worker builds its rows with) accept and refuse the same windows."""
    from shardinfer.engine.tokenizer import Tokenizer
    from shardinfer.errors import ConfigError
    from shardinfer.jobs.spec import load_toml, resolve
    from shardinfer.pipeline.job import check_sampling_lengths
    from shardinfer.pipeline.score_rows import ScorePreparer

    tok = Tokenizer(model_dir)
    config = resolve(load_toml(_document_job(tmp_path, model_dir, 1))).config
    for window in sorted({0, 1, *range(max(max_model_len - 3, 0), max_model_len + 3), 5000}):
        windowed = dataclasses.replace(
            config, job=dataclasses.replace(config.job, rolling_window_tokens=window)
        )
        try:
            check_sampling_lengths(windowed, max_model_len)
            plan_accepts = True
        except ConfigError:
            plan_accepts = False
        try:
            ScorePreparer(tok, max_model_len, config.input, window)
            engine_accepts = True
        except ValueError:
            engine_accepts = False
        assert plan_accepts == engine_accepts == (window <= max_model_len), (window, max_model_len)
