"""Writer stage: the output schema, part files, and the create-if-absent commit protocol."""

from shardinfer.errors import (
    CorruptOutputError,
    DamagedPartsError,
    ExclusiveCreateUnsupportedError,
    IncompleteOutputError,
    JobFileConflictError,
    OutputError,
    StaleGenerationError,
    StorageError,
)
from shardinfer.writers.job_file import make_job_record, splits_from_job
from shardinfer.writers.output_store import OutputStore, PartInfo
from shardinfer.writers.schema import OUTPUT_SCHEMA_VERSION, output_schema

__all__ = [
    "OUTPUT_SCHEMA_VERSION",
    "CorruptOutputError",
    "DamagedPartsError",
    "ExclusiveCreateUnsupportedError",
    "IncompleteOutputError",
    "JobFileConflictError",
    "OutputError",
    "OutputStore",
    "PartInfo",
    "StaleGenerationError",
    "StorageError",
    "make_job_record",
    "output_schema",
    "splits_from_job",
]
