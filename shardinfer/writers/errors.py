"""Errors of the output location; `StorageError` (retries exhausted, exit 75) lives in shardinfer.storage."""

from shardinfer.storage import StorageError


class OutputError(Exception):
    """Base of the errors below."""


class JobFileConflictError(OutputError):
    """`_job.json` already exists with other content: another job owns this output location."""


class IncompleteOutputError(OutputError):
    """`finalize` was called while some splits of the plan have no commit marker."""


class CorruptOutputError(OutputError):
    """A marker or part that the protocol could not have written: unreadable, or not matching its hash."""


__all__ = [
    "CorruptOutputError",
    "IncompleteOutputError",
    "JobFileConflictError",
    "OutputError",
    "StorageError",
]
