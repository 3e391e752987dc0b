"""`--storage-options` means the same to every command that takes it: a JSON object, or exit 64
with a message that never quotes the text (it may hold a secret)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardinfer.jobs.cli import main

_BAD = [
    ("{bad", "is not JSON"),
    ("[1]", "holds a JSON list: give a JSON object"),
    ('"s3cr3t-value"', "holds a JSON str: give a JSON object"),
]


def _argv(command: str, tmp_path: Path, options: str) -> list[str]:
    out = str(tmp_path / "out")
    if command == "eval":
        return [
            "eval",
            "--model",
            str(tmp_path / "model"),
            "--tasks",
            "any",
            "--output",
            out,
            "--storage-options",
            options,
        ]
    return [command, "--storage-options", options, out]


@pytest.mark.parametrize("command", ["eval", "status", "history"])
@pytest.mark.parametrize(("options", "said"), _BAD)
def test_bad_storage_options_are_a_usage_error_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, options: str, said: str
) -> None:
    assert main(_argv(command, tmp_path, options)) == 64
    err = capsys.readouterr().err
    assert "--storage-options" in err and said in err
    assert "s3cr3t" not in err and "bad" not in err.replace("--storage-options", "")
