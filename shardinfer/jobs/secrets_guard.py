"""Keep a job's credentials out of everything its processes print.

What the job writes is redacted where it is encoded (writers.parts); printed text has too many
sources for that: the reporter's log lines, an error message quoting a URL, a storage library's
exception text, a traceback, a warning. So every process of a job (the CLI, each `local[N]`
worker, each Ray worker actor) writes its stdout and stderr through `RedactingStream`, which
puts every write through `redaction.redact_text`, and tells it the job's credentials as soon as
the job spec is known (`guard_job`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TextIO

from shardinfer.errors import JobError, exit_code_for
from shardinfer.redaction import is_credential_key, redact_text, remember_secrets, secrets_scope


class RedactingStream:
    """A text stream writing through to `inner` with credentials replaced by `***`."""

    def __init__(self, inner: TextIO) -> None:
        self.inner = inner

    def write(self, text: str) -> int:
        self.inner.write(redact_text(text))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding, buffer, ...
        return getattr(self.inner, name)


def guard_streams() -> None:
    """Route sys.stdout and sys.stderr through `RedactingStream` (once per process). Call it
    before anything keeps a reference to either stream (a reporter, a logging handler)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, RedactingStream):
            setattr(sys, name, RedactingStream(stream))


@contextmanager
def guarded_run() -> Iterator[None]:
    """One CLI run: output guarded, credentials remembered, both undone at the end, so that a
    caller running the CLI in-process keeps its own streams and no secret stays remembered."""
    saved = (sys.stdout, sys.stderr)
    with secrets_scope():
        guard_streams()
        try:
            yield
        finally:
            for name, original in zip(("stdout", "stderr"), saved, strict=True):
                current = getattr(sys, name)
                if isinstance(current, RedactingStream) and current.inner is original:
                    setattr(sys, name, original)


def guard_job(config: dict[str, Any]) -> None:
    """Guard this process's output and remember the credentials of `config` (a job spec as a
    dict, or any storage options) so that no printed line can carry them."""
    remember_secrets(config)
    remember_secrets(environment_secrets(os.environ))
    guard_streams()


# Shorter values of credential-named variables are flags and words ("true", "none"), which every
# line would lose if they were hidden.
_MIN_ENV_SECRET_LEN = 8


def environment_secrets(environ: Mapping[str, str]) -> dict[str, str]:
    """The credential-named environment variables (AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN,
    HF_TOKEN, ...) that hold a credential: storage libraries read them when storage_options name
    none, and their errors are printed. File paths (`*_KEY_FILE`) are kept: they name no secret."""
    return {
        name: value
        for name, value in environ.items()
        if is_credential_key(name)
        and len(value) >= _MIN_ENV_SECRET_LEN
        and not value.startswith(("/", "~", "."))
    }


class RedactedError(JobError):
    """An error passed on across a process boundary with its message redacted and its exit code
    kept (a Ray actor's error travels to the driver, and into Ray's own logs, as text)."""

    def __init__(self, message: str, exit_code: int, kind: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.kind = kind

    def __reduce__(self) -> tuple[Any, tuple[str, int, str]]:  # Ray sends it back to the driver
        return (RedactedError, (str(self), self.exit_code, self.kind))


def redacted_error(exc: BaseException) -> BaseException:
    """`exc` itself when its message holds no credential, else a `RedactedError` with the same exit
    code. Raise it `from None`: the errors it was raised from may quote one."""
    text = str(exc)
    if redact_text(text) == text:
        return exc
    described = text if isinstance(exc, JobError) else f"{type(exc).__name__}: {text}"
    return RedactedError(redact_text(described), exit_code_for(exc), type(exc).__name__)
