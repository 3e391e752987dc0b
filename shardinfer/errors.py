"""Every error shardinfer raises on purpose, each carrying the codes a caller acts on.

Two codes, two audiences:
  - `exit_code`: what the process returns when this error ends a job. The codes follow sysexits
    so that Airflow, Kubernetes pod-failure policies and cron wrappers can tell "retry me" (75)
    from "fix the job" (64, 65, 66, 78) without parsing logs; anything unplanned is 1.
  - `error_code`: what goes into the output's `error_code` column when this error ends one row
    (or one sample of it) instead of the job; the job goes on.

The code travels with the class (or, for `RowError`, with the instance), so nobody has to find it
by searching an exception's message or by comparing class names. This module is the ground floor
of the package: it imports nothing from shardinfer, and every layer may import it.
"""

from __future__ import annotations

# ---- exit codes of a job ---------------------------------------------------------------------
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 64
EXIT_DATA = 65
EXIT_NO_INPUT = 66
EXIT_RETRYABLE = 75
EXIT_CONFIG = 78

# ---- row error codes (the output's error_code column) -----------------------------------------
INVALID_REQUEST = "invalid_request"  # the engine refused the request for a reason without its own code
INVALID_ROW = "invalid_row"  # the row's cells cannot form a prompt (wrong type, null id, bad messages)
EMPTY_PROMPT = "empty_prompt"
PROMPT_TOO_LONG = "prompt_too_long"
BAD_OVERRIDE = "bad_override"  # a per-row sampling override that is not a valid value
TEMPLATE_ERROR = "template_error"
TOKENIZER_ERROR = "tokenizer_error"
INVALID_SCHEMA = "invalid_schema"  # a structured-output schema or grammar that does not compile
ENGINE_ERROR = "engine_error"  # the engine failed a request it had accepted


class ShardinferError(Exception):
    """Base of every error below. `exit_code` ends a job; `error_code` ends one row."""

    exit_code: int = EXIT_FAILURE
    error_code: str = INVALID_REQUEST


# ---- job-level failures ----------------------------------------------------------------------
class JobError(ShardinferError):
    """A failure of the job as a whole, raised by the pipeline and the CLI."""


class UsageError(JobError):
    """The command line itself is wrong (unknown flag, malformed --conf, missing argument)."""

    exit_code = EXIT_USAGE


class ConfigError(JobError):
    """The job spec is wrong: unknown key, bad value, a column or model that does not exist."""

    exit_code = EXIT_CONFIG


class FingerprintMismatch(ConfigError):
    """The output location belongs to a job with another fingerprint; resuming would mix outputs."""


class InputChanged(ConfigError):
    """The input files differ from the listing the job was planned on (added, removed, rewritten)."""


class InputMissing(JobError):
    """No input rows to read: the path or glob matches nothing."""

    exit_code = EXIT_NO_INPUT


class TooManyBadRows(JobError):
    """More error records than job.max_error_fraction allows."""

    exit_code = EXIT_DATA


class DuplicateRowIds(JobError):
    """`job.unique_ids = true` and some row id occurs in more than one input row."""

    exit_code = EXIT_DATA


class Interrupted(JobError):
    """SIGTERM (or the parent going away): in-flight splits were abandoned uncommitted; rerun to finish."""

    exit_code = EXIT_RETRYABLE


class Retryable(JobError):
    """A transient failure (storage still failing after retries, a worker lost): rerun to finish."""

    exit_code = EXIT_RETRYABLE


# ---- the readers -------------------------------------------------------------------------------
class ReaderError(ShardinferError, ValueError):
    """Base of every reader error; a ValueError so that callers who only care about "bad input"
    can catch one type."""


class InputMissingError(ReaderError):
    """The input path does not exist, or matches no file of the expected format."""

    exit_code = EXIT_NO_INPUT


class InputSchemaError(ReaderError):
    """A file whose content does not fit: a missing column, corrupt Parquet, a bad JSONL line."""

    exit_code = EXIT_DATA


class InputColumnError(InputSchemaError):
    """A column the spec names (input.id_column, prompt_column, messages_column) is not in the input.

    Still an InputSchemaError for callers that catch bad input as one type; the job turns it into
    a ConfigError (exit 78), a mistake in the spec rather than bad data. `missing` and `available`
    name the columns, for a caller that words a hint from them.
    """

    def __init__(
        self, message: str, missing: list[str] | None = None, available: list[str] | None = None
    ) -> None:
        super().__init__(message)
        self.missing = list(missing or [])
        self.available = list(available or [])


class InputQueryError(ReaderError):
    """An `input.query` that cannot run split by split (aggregation, join, ORDER BY, ...) or fails."""

    exit_code = EXIT_CONFIG


# ---- storage and the output location ------------------------------------------------------------
class StorageError(OSError, ShardinferError):
    """A storage call that still failed after the bounded retries: retry the job later.

    Raised as `StorageError(errno, message)`, so callers can test `errno` (EAGAIN, ENOSPC, ...);
    printed as the message alone, without OSError's "[Errno 11]" prefix, which tells a user nothing.
    """

    exit_code = EXIT_RETRYABLE

    def __str__(self) -> str:
        return self.strerror if self.strerror is not None else super().__str__()


class OutputError(ShardinferError):
    """Base of the errors of the output location below."""


class JobFileConflictError(OutputError):
    """`_job.json` already exists with other content: another job owns this output location."""

    exit_code = EXIT_CONFIG  # the output location needs a person


class IncompleteOutputError(OutputError):
    """`finalize` was called while some splits of the plan have no commit marker."""

    exit_code = EXIT_RETRYABLE


class CorruptOutputError(OutputError):
    """A marker or part that the protocol could not have written: unreadable, or not matching its hash."""

    exit_code = EXIT_CONFIG  # the output location needs a person


class DamagedPartsError(CorruptOutputError):
    """Committed parts that no longer match their markers; `damaged` maps split index -> reason.

    Retryable: a rerun of the job recomputes the damaged splits."""

    exit_code = EXIT_RETRYABLE

    def __init__(self, message: str, damaged: dict[int, str]) -> None:
        super().__init__(message)
        self.damaged = damaged


class StaleGenerationError(OutputError):
    """The output location now belongs to another generation of the job (it was started over):
    this run's work must not be committed or finalized there."""

    exit_code = EXIT_CONFIG


class ExclusiveCreateUnsupportedError(OutputError):
    """The store does not honour create-if-absent; commits there could not pick one winner."""

    exit_code = EXIT_CONFIG


# ---- the engine --------------------------------------------------------------------------------
class ModelLoadError(ShardinferError, ValueError):
    """A model directory that cannot be loaded: missing file, unsupported architecture, bad config."""

    exit_code = EXIT_CONFIG


class CheckpointError(ModelLoadError):
    """A checkpoint whose tensors do not match the model: missing, unexpected or mis-shaped."""


class RequestError(ShardinferError, ValueError):
    """A request the engine refuses; the engine keeps serving every other request.

    A ValueError, as every refusal of the engine's `add_request` is; the job records the row with
    this class's `error_code`.
    """


class EmptyPrompt(RequestError):
    """A prompt of zero tokens: there is nothing to continue from."""

    error_code = EMPTY_PROMPT


class PromptTooLong(RequestError):
    """A prompt that fills max_model_len, leaving no room for one generated token."""

    error_code = PROMPT_TOO_LONG


class GrammarError(RequestError):
    """An invalid structured-output schema or grammar."""

    error_code = INVALID_SCHEMA


# ---- one row of a job ---------------------------------------------------------------------------
class RowError(ShardinferError):
    """A row that cannot become a request; `error_code` goes to the output's error_code column.

    Unlike the classes above, the code is chosen where the row fails (one class, many reasons).
    """

    def __init__(self, error_code: str, message: str, prompt_tokens: int | None = None) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.message = message
        # The prompt's length where it was tokenised before the row failed (a prompt too long for
        # the model): the error record's prompt_tokens.
        self.prompt_tokens = prompt_tokens

    @property
    def code(self) -> str:
        return self.error_code

    @classmethod
    def of(cls, exc: ShardinferError, prompt_tokens: int | None = None) -> RowError:
        """The row error for an error that carries its own code (a PromptTooLong, a GrammarError)."""
        return cls(exc.error_code, str(exc), prompt_tokens)


# ---- exit codes of anything ---------------------------------------------------------------------
def _credential_errors() -> tuple[type[BaseException], ...]:
    """botocore's missing-credentials errors, when botocore is installed (it comes with s3fs)."""
    try:
        from botocore.exceptions import NoCredentialsError, PartialCredentialsError
    except ImportError:
        return ()
    return (NoCredentialsError, PartialCredentialsError)


def is_credentials_error(exc: BaseException) -> bool:
    """True when object storage found no (or incomplete) credentials: a person must fix the setup."""
    kinds = _credential_errors()
    return bool(kinds) and isinstance(exc, kinds)


def exit_code_for(exc: BaseException) -> int:
    """The exit code for any exception: our own carry theirs; a few foreign ones are known here."""
    if isinstance(exc, ShardinferError):
        return exc.exit_code
    if isinstance(exc, PermissionError) or is_credentials_error(exc):
        return EXIT_CONFIG  # storage credentials or permissions: a person must fix the setup
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_RETRYABLE
    return EXIT_FAILURE
