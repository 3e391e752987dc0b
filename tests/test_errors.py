"""The error vocabulary: every class carries the exit code DESIGN.md's table gives its failure,
and foreign exceptions map without looking at names or messages."""

from __future__ import annotations

import errno

import pytest

from shardinfer import errors as E


@pytest.mark.parametrize(
    "exc, code",
    [
        (E.UsageError("x"), 64),
        (E.ConfigError("x"), 78),
        (E.FingerprintMismatch("x"), 78),
        (E.InputMissing("x"), 66),
        (E.TooManyBadRows("x"), 65),
        (E.Interrupted("x"), 75),
        (E.Retryable("x"), 75),
        (E.InputMissingError("x"), 66),
        (E.InputSchemaError("x"), 65),
        (E.InputColumnError("x"), 65),
        (E.InputQueryError("x"), 78),
        (E.StorageError(errno.EAGAIN, "x"), 75),
        (E.JobFileConflictError("x"), 78),
        (E.IncompleteOutputError("x"), 75),
        (E.CorruptOutputError("x"), 78),
        (E.ModelLoadError("x"), 78),
        (E.CheckpointError("x"), 78),
        (E.PromptTooLong("x"), 1),
        (E.GrammarError("x"), 1),
        (PermissionError("denied"), 78),
        (KeyboardInterrupt(), 75),
        (RuntimeError("InputMissingError StorageError"), 1),  # a message never picks the code
    ],
)
def test_exit_codes(exc: BaseException, code: int) -> None:
    assert E.exit_code_for(exc) == code


def test_a_foreign_class_named_like_ours_gets_no_special_code() -> None:
    impostor = type("InputMissingError", (Exception,), {})
    assert E.exit_code_for(impostor("no input")) == 1


def test_missing_credentials_need_a_person() -> None:
    botocore = pytest.importorskip("botocore.exceptions")
    assert E.exit_code_for(botocore.NoCredentialsError()) == 78
    assert E.is_credentials_error(botocore.NoCredentialsError())
    assert not E.is_credentials_error(ValueError("NoCredentialsError"))


def test_row_error_codes_travel_with_the_error() -> None:
    assert E.PromptTooLong("p").error_code == "prompt_too_long"
    assert E.EmptyPrompt("p").error_code == "empty_prompt"
    assert E.GrammarError("g").error_code == "invalid_schema"
    row = E.RowError.of(E.PromptTooLong("prompt has 9 tokens"))
    assert (row.error_code, row.code, row.message) == (
        "prompt_too_long",
        "prompt_too_long",
        "prompt has 9 tokens",
    )


def test_engine_refusals_stay_value_errors_and_storage_errors_stay_os_errors() -> None:
    # Callers catching ValueError (the engine's refusals, bad input) or OSError (storage) keep working.
    for cls in (E.PromptTooLong, E.GrammarError, E.ModelLoadError, E.InputSchemaError):
        assert issubclass(cls, ValueError)
    err = E.StorageError(errno.EAGAIN, "still failing")
    assert isinstance(err, OSError) and err.errno == errno.EAGAIN


def test_a_storage_error_reads_as_its_message_and_keeps_its_errno() -> None:
    err = E.StorageError(errno.ENOSPC, "write out/part-1.parquet: no space left")
    assert str(err) == "write out/part-1.parquet: no space left"
    assert (err.errno, err.strerror) == (errno.ENOSPC, "write out/part-1.parquet: no space left")
    assert str(E.StorageError("one argument")) == "one argument"
