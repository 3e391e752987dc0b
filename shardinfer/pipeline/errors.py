"""Job-level failures, each carrying the process exit code a scheduler should see.

The codes follow sysexits so that Airflow, Kubernetes pod-failure policies and cron wrappers can
tell "retry me" (75) from "fix the job" (64, 65, 66, 78) without parsing logs. The `jobs` layer
maps any exception to a code through `exit_code_for`; everything not listed is 1.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 64
EXIT_DATA = 65
EXIT_NO_INPUT = 66
EXIT_RETRYABLE = 75
EXIT_CONFIG = 78


class JobError(Exception):
    """Base of the failures below; `exit_code` is what the process returns."""

    exit_code = EXIT_FAILURE


class UsageError(JobError):
    """The command line itself is wrong (unknown flag, malformed --conf, missing argument)."""

    exit_code = EXIT_USAGE


class ConfigError(JobError):
    """The job spec is wrong: unknown key, bad value, a column or model that does not exist."""

    exit_code = EXIT_CONFIG


class FingerprintMismatch(ConfigError):
    """The output location belongs to a job with another fingerprint; resuming would mix outputs."""


class InputMissing(JobError):
    """No input rows to read: the path or glob matches nothing."""

    exit_code = EXIT_NO_INPUT


class TooManyBadRows(JobError):
    """More error records than job.max_error_fraction allows."""

    exit_code = EXIT_DATA


class Interrupted(JobError):
    """SIGTERM (or the parent going away): in-flight splits were abandoned uncommitted; rerun to finish."""

    exit_code = EXIT_RETRYABLE


class Retryable(JobError):
    """A transient failure (storage still failing after retries, a worker lost): rerun to finish."""

    exit_code = EXIT_RETRYABLE


def exit_code_for(exc: BaseException) -> int:
    """Exit code for any exception, including the readers'/writers' own error classes.

    Those are matched by class name so that this module does not import the IO stack (and a
    missing optional layer cannot break error reporting).
    """
    if isinstance(exc, JobError):
        return exc.exit_code
    names = {cls.__name__ for cls in type(exc).__mro__}
    if "InputMissingError" in names:
        return EXIT_NO_INPUT
    if "InputQueryError" in names:
        return EXIT_CONFIG
    if "InputSchemaError" in names:  # a missing column, corrupt Parquet, a bad JSONL line: the data
        return EXIT_DATA
    if "StorageError" in names:
        return EXIT_RETRYABLE
    if "JobFileConflictError" in names or "CorruptOutputError" in names:
        return EXIT_CONFIG  # the output location needs a person: another job's, or damaged
    if "IncompleteOutputError" in names:
        return EXIT_RETRYABLE
    if "ModelLoadError" in names:
        return EXIT_CONFIG
    if names & {"NoCredentialsError", "PartialCredentialsError", "PermissionError"}:
        return EXIT_CONFIG  # storage credentials or permissions: a person must fix the setup
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_RETRYABLE
    return EXIT_FAILURE
