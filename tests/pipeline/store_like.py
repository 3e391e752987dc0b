"""A part table in the output schema for one split, for tests that commit without an engine."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from shardinfer.writers import output_schema


def one_part_table(split: Any) -> pa.Table:
    rows = [
        {"row_id": f"{split.file_index}:{r}", "sample_index": 0, "status": "ok", "text": f"t{r}"}
        for r in range(split.row_start, split.row_end)
    ]
    return pa.Table.from_pylist(rows, schema=output_schema())
