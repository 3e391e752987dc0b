"""--deploy-mode cluster's pieces: the Jobs API address, the driver's command, following the Ray Job."""

from __future__ import annotations

import argparse
import io
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest

from shardinfer.errors import UsageError
from shardinfer.jobs.progress import Reporter
from shardinfer.jobs.ray_submit import (
    driver_command,
    follow,
    jobs_api_address,
    properties_text,
    split_credential_confs,
)
from shardinfer.jobs.spec import load_properties


def test_jobs_api_address_precedence() -> None:
    assert jobs_api_address("ray", "http://head:8265", "http://other:8265") == "http://head:8265"
    assert jobs_api_address("ray", "head:6379", "https://env:8265") == "https://env:8265"
    assert jobs_api_address("ray://head.example:10001", "", "") == "http://head.example:8265"
    with pytest.raises(UsageError, match="RAY_ADDRESS"):
        jobs_api_address("ray", "head:6379", "")


def test_driver_command_reissues_the_submit_in_client_mode() -> None:
    args = argparse.Namespace(
        log_format="json", run_id="r-7", name=None, verbose=True, conf=["sampling.temperature=0.5"]
    )
    assert driver_command(args, "job.toml", "job.properties") == [
        "python", "-m", "shardinfer", "submit", "--master", "ray", "--deploy-mode", "client",
        "--log-format", "json", "--run-id", "r-7", "--verbose", "--properties-file", "job.properties",
        "--conf", "sampling.temperature=0.5", "job.toml",
    ]  # fmt: skip


def test_credential_confs_travel_in_a_properties_file_not_on_the_command_line(tmp_path: Path) -> None:
    confs = [
        "sampling.temperature=0.5",
        'input.storage_options={key = "AKIA9", secret = "s3cr3t-9", client_kwargs = {endpoint_url = "http://h:9"}}',
        "input.path=https://u:pw@host/data.jsonl",
        "output.path=s3://bucket/out",
    ]
    public, secret = split_credential_confs(confs)
    assert public == ["sampling.temperature=0.5", "output.path=s3://bucket/out"]
    assert secret == confs[1:3]
    user_file = tmp_path / "user.properties"
    user_file.write_text("job.seed 3\ninput.path=/old/path\n")
    written = tmp_path / "job.properties"
    written.write_text(properties_text(str(user_file), secret))
    values = {}
    for key, value, _ in load_properties(written):
        values[key] = value  # later lines win, as resolve() applies them
    assert values == {
        "job.seed": 3,
        "input.path": "https://u:pw@host/data.jsonl",  # the --conf entry over the user's file
        "input.storage_options": {
            "key": "AKIA9",
            "secret": "s3cr3t-9",
            "client_kwargs": {"endpoint_url": "http://h:9"},
        },
    }


class _Status(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


@dataclass
class _Info:
    driver_exit_code: int | None


class _FakeJobs:
    """A Jobs API whose job runs for two polls, logging a line each time, then ends."""

    def __init__(self, final: _Status, exit_code: int | None) -> None:
        self.polls = 0
        self.final = final
        self.exit_code = exit_code

    def get_job_status(self, submission: str) -> _Status:
        self.polls += 1
        return _Status.RUNNING if self.polls < 3 else self.final

    def get_job_logs(self, submission: str) -> str:
        return "".join(f"line {i}\n" for i in range(min(self.polls, 3)))

    def get_job_info(self, submission: str) -> Any:
        return _Info(self.exit_code)

    def stop_job(self, submission: str) -> None:
        raise AssertionError("not stopped in this test")


@pytest.mark.parametrize(
    ("final", "driver_code", "expected"),
    [
        (_Status.SUCCEEDED, 0, 0),
        (_Status.FAILED, 65, 65),
        (_Status.FAILED, None, 1),
        (_Status.STOPPED, None, 75),
    ],
)
def test_follow_prints_each_log_line_once_and_returns_the_drivers_code(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    final: _Status,
    driver_code: int | None,
    expected: int,
) -> None:
    monkeypatch.setattr("shardinfer.jobs.ray_submit.POLL_S", 0.0)
    code = follow(_FakeJobs(final, driver_code), "sub-1", _Status, Reporter("-", stream=io.StringIO()))
    assert code == expected
    assert capsys.readouterr().out == "line 0\nline 1\nline 2\n"
