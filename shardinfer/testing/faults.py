"""Fault injection for the crash tests: a worker that kills itself at a named instant.

The commit protocol's hard cases are the instants between a part write and its marker, and
between the last marker and `_SUCCESS`; random kills rarely land there. The pipeline calls
`crash_point` at each such instant, and it does nothing unless a test armed it through the
environment (so it reaches worker processes too). Never set these variables outside tests.
"""

from __future__ import annotations

import os
import signal

CRASH_ENV = "SHARDINFER_TEST_CRASH_AT"


def crash_point(name: str, split_index: int | None = None) -> None:
    """Test-only fault injection: SIGKILL this process at a named point of the commit protocol.

    `SHARDINFER_TEST_CRASH_AT=<name>` (after_part | after_commit | before_success) arms it;
    `SHARDINFER_TEST_CRASH_SPLIT=<k>` limits it to split k; `SHARDINFER_TEST_CRASH_ONCE=<file>`
    makes it fire once (the file is created just before the kill, and an existing file disarms
    it), so a retried worker inheriting the environment survives. Used by the crash tests to hit
    the exact instants between a part write and its marker, which random kills rarely do.
    Never set these outside tests.
    """
    if os.environ.get(CRASH_ENV) != name:
        return
    only = os.environ.get("SHARDINFER_TEST_CRASH_SPLIT")
    if only is not None and split_index is not None and int(only) != split_index:
        return
    once = os.environ.get("SHARDINFER_TEST_CRASH_ONCE")
    if once:
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
    os.kill(os.getpid(), signal.SIGKILL)
