"""`--log-format json` makes every line JSON, usage and spec errors included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardinfer.jobs.cli import main


@pytest.mark.parametrize(
    ("argv", "code", "needle"),
    [
        (["submit", "--log-format", "json", "--no-such-flag", "job.toml"], 64, "--no-such-flag"),
        (["submit", "--log-format=json", "missing-job.toml"], 64, "missing-job.toml"),
        (["status", "--log-format", "json"], 64, "unrecognized arguments"),
    ],
)
def test_usage_and_spec_errors_are_json_lines(
    argv: list[str], code: int, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == code
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]
    assert records and records[-1]["level"] == "error" and needle in records[-1]["msg"]


def test_config_error_is_a_json_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job.toml"
    job.write_text('[job]\nseeed = 1\n[model]\npath = "m"\n[input]\npath = "i"\n[output]\npath = "o"\n')
    assert main(["submit", "--log-format", "json", str(job)]) == 78
    record = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert record["level"] == "error" and "seeed" in record["msg"] and record["exit_code"] == 78
