"""Damage a person has to act on is refused with a fix that works: a commit marker or `_job.json`
that is not a JSON object (hand-edited, or another program's), and a committed part changed at its
size. Following each message, the job completes with the rows of a fresh uninterrupted run."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pipeline_kit import committed_rows, standard_job

from shardinfer.jobs.cli import main


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if "ERROR" in line]
    assert lines, "no error was reported"
    return lines[-1]


@pytest.mark.parametrize("content", ["{not json", "[1, 2]"])
def test_an_unreadable_marker_names_a_fix_that_works(
    tmp_path: Path,
    model_dir: Path,
    shards: Path,
    reference: list[dict[str, Any]],
    content: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    job, out = standard_job(tmp_path, model_dir, str(shards))
    assert main(["submit", str(job)]) == 0
    marker = sorted((out / "_commits").glob("*.json"))[2]
    marker.write_text(content)
    assert main(["submit", str(job)]) == 78
    message = _error_line(capsys)
    assert str(marker) in message and "start the job over" not in message
    assert "delete it and run the job again" in message
    marker.unlink()  # as the message says
    assert main(["submit", str(job)]) == 0
    assert committed_rows(str(out)) == reference


def test_an_unreadable_job_file_names_a_fix_that_works(
    tmp_path: Path,
    model_dir: Path,
    shards: Path,
    reference: list[dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    job, out = standard_job(tmp_path, model_dir, str(shards))
    assert main(["submit", str(job)]) == 0
    (out / "_job.json").write_text('{"fingerprint": ')
    assert main(["submit", str(job)]) == 78
    message = _error_line(capsys)
    assert str(out / "_job.json") in message
    # The fix it names, word for word: delete the file, then run with the start-over flag.
    flag = re.search(r"--conf (job\.start_over=true)", message)
    assert "delete it" in message and flag is not None
    (out / "_job.json").unlink()
    assert main(["submit", "--conf", flag.group(1), str(job)]) == 0
    assert committed_rows(str(out)) == reference


def test_a_part_changed_at_its_size_names_a_fix_that_works(
    tmp_path: Path, model_dir: Path, shards: Path, reference: list[dict[str, Any]]
) -> None:
    """A reader finds the changed part by its hash; a resubmit, which checks sizes only, calls the
    job complete. The reader's message must name what makes the rerun recompute the split."""
    from shardinfer.errors import CorruptOutputError
    from shardinfer.writers import OutputStore

    job, out = standard_job(tmp_path, model_dir, str(shards))
    assert main(["submit", str(job)]) == 0
    part = sorted(out.glob("part-*.parquet"))[3]
    data = bytearray(part.read_bytes())
    data[len(data) // 3] ^= 0x01
    part.write_bytes(bytes(data))
    with pytest.raises(CorruptOutputError) as info:
        OutputStore(str(out)).read_committed_table()
    message = str(info.value)
    assert str(part) in message and "delete that part file and run the job again" in message
    part.unlink()  # as the message says
    assert main(["submit", str(job)]) == 0
    assert committed_rows(str(out)) == reference
