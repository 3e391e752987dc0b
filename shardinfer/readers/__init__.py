"""Reader stage: input paths/globs on any fsspec filesystem -> deterministic splits -> Arrow batches."""

from shardinfer.errors import (
    InputColumnError,
    InputMissingError,
    InputQueryError,
    InputSchemaError,
    ReaderError,
)
from shardinfer.readers.spec import InputSpec
from shardinfer.readers.splits import list_input_files, plan_splits, read_schema, read_split
from shardinfer.splits import ROW_INDEX_COLUMN, Split

__all__ = [
    "ROW_INDEX_COLUMN",
    "InputColumnError",
    "InputMissingError",
    "InputQueryError",
    "InputSchemaError",
    "InputSpec",
    "ReaderError",
    "Split",
    "list_input_files",
    "plan_splits",
    "read_schema",
    "read_split",
]
