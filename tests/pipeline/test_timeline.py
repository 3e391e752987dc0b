"""The worker timeline's file is checked before the job runs (jobs/spec.py calls the check), not
when the worker ends with every split committed."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardinfer.errors import ConfigError
from shardinfer.pipeline.timeline import check_timeline_path, open_timeline


def test_check_timeline_path(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    for path, match in (
        (tmp_path, "is a directory: name a file in it"),
        (tmp_path / "missing" / "t.jsonl", "which does not exist: create the directory"),
        (tmp_path / "file" / "t.jsonl", "which is not a directory"),
        ("s3://bucket/t.jsonl", "is a URL"),
    ):
        with pytest.raises(ConfigError, match=r"job\.timeline_path=.* " + match) as info:
            check_timeline_path(str(path))
        assert info.value.exit_code == 78
    check_timeline_path("")
    check_timeline_path(str(tmp_path / "t.jsonl"))
    # The job's own output location is created before any worker ends: a timeline may go there.
    check_timeline_path(str(tmp_path / "out" / "t.jsonl"), str(tmp_path / "out"))
    with pytest.raises(ConfigError, match="does not exist"):
        check_timeline_path(str(tmp_path / "out" / "sub" / "t.jsonl"), str(tmp_path / "out"))
    timeline = open_timeline(str(tmp_path / "t.jsonl"))
    assert timeline is not None
    timeline.mark("engine_build_start")
    timeline.close()
    assert '"event": "engine_build_start"' in (tmp_path / "t.jsonl").read_text()
