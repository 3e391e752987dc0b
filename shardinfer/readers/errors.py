"""Errors the readers raise; each message names the file, the value and the fix.

The job maps `InputMissingError` to exit code 66 (no input) and `InputSchemaError` to a data error.
Both are ValueErrors so that callers who only care about "bad input" can catch one type.
"""


class ReaderError(ValueError):
    """Base of every reader error."""


class InputMissingError(ReaderError):
    """The input path does not exist, or matches no file of the expected format."""


class InputSchemaError(ReaderError):
    """A file whose content does not fit: a missing column, corrupt Parquet, a bad JSONL line."""


class InputColumnError(InputSchemaError):
    """A column the spec names (input.id_column, prompt_column, messages_column) is not in the input.

    Still an InputSchemaError for callers that catch bad input as one type; the job treats it as a
    mistake in the spec (exit 78) rather than bad data.
    """


class InputQueryError(ReaderError):
    """An `input.query` that cannot run split by split (aggregation, join, ORDER BY, ...) or fails."""
