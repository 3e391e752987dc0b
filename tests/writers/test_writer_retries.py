"""Retry classification and the bounded backoff loop of shardinfer.storage."""

from __future__ import annotations

import errno

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from shardinfer.storage import RetryPolicy, StorageError, is_transient, with_retries


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (ConnectionResetError(), True),
        (TimeoutError(), True),
        (OSError(errno.EBUSY, "SlowDown"), True),  # s3fs's translation of 503
        (OSError(getattr(errno, "EREMOTEIO", errno.EIO), "InternalError"), True),  # of 500
        (EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), True),
        (ClientError({"Error": {"Code": "SlowDown"}}, "PutObject"), True),
        (ClientError({"Error": {"Code": "AccessDenied"}}, "PutObject"), False),
        (FileExistsError("marker"), False),
        (FileNotFoundError("x"), False),
        (PermissionError("x"), False),
        (OSError(errno.EINVAL, "InvalidBucketName"), False),
        (ValueError("bad"), False),
    ],
)
def test_is_transient(exc: BaseException, transient: bool) -> None:
    assert is_transient(exc) is transient


def test_transient_errors_are_retried_then_succeed() -> None:
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("peer closed")
        return "done"

    assert with_retries(RetryPolicy(5, 0.0, 0.0), "write x", flaky) == "done"
    assert len(calls) == 3


def test_exhausted_retries_raise_storage_error_naming_the_operation() -> None:
    calls = []

    def down() -> None:
        calls.append(1)
        raise OSError(errno.EBUSY, "SlowDown")

    with pytest.raises(StorageError, match=r"write s3://b/p: still failing after 4 attempts") as info:
        with_retries(RetryPolicy(4, 0.0, 0.0), "write s3://b/p", down)
    assert len(calls) == 4 and isinstance(info.value.__cause__, OSError)


def test_permanent_errors_and_lost_commits_are_not_retried() -> None:
    calls = []

    def exists() -> None:
        calls.append(1)
        raise FileExistsError("_commits/00001.json")

    with pytest.raises(FileExistsError):
        with_retries(RetryPolicy(5, 0.0, 0.0), "commit", exists)
    assert len(calls) == 1


def test_backoff_delays_grow_and_are_capped() -> None:
    policy = RetryPolicy(attempts=10, base_delay=0.1, max_delay=1.0)
    for k, ceiling in [(1, 0.1), (2, 0.2), (3, 0.4), (5, 1.0), (9, 1.0)]:
        delay = policy.delay(k)
        assert ceiling / 2 <= delay <= ceiling
    with pytest.raises(ValueError, match="attempts=0"):
        RetryPolicy(attempts=0)
