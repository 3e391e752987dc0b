"""What a job's error records say, in one line: for the error that ends a job with too many of them.

Read only on that path: the committed parts' status and error columns, part by part.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow.compute as pc

from shardinfer.writers.output_store import OutputStore

_MESSAGE_CHARS = 200


def error_digest(store: OutputStore, committed: dict[int, dict[str, Any]], codes: int = 3) -> str:
    """'prompt_too_long 20, invalid_row 2; first: row 'r3' (prompt_too_long): prompt has ...', over
    the committed parts in split order; '' when they hold no error record."""
    counts: Counter[str] = Counter()
    first: tuple[str, str, str] | None = None
    for index in sorted(committed):
        table = store.read_part_columns(
            committed[index]["part"], ["row_id", "status", "error_code", "error_message"]
        )
        errors = table.filter(pc.equal(table["status"], "error"))
        codes_here = [str(c) for c in errors["error_code"].to_pylist()]
        counts.update(codes_here)
        if first is None and errors.num_rows:
            message = str(errors["error_message"][0].as_py() or "")
            if len(message) > _MESSAGE_CHARS:
                message = message[:_MESSAGE_CHARS] + "..."
            first = (str(errors["row_id"][0].as_py()), codes_here[0], message)
    if first is None:
        return ""
    top = ", ".join(f"{code} {n}" for code, n in counts.most_common(codes))
    more = f" and {len(counts) - codes} more code(s)" if len(counts) > codes else ""
    row, code, message = first
    return f"{top}{more}; first: row {row!r} ({code}): {message}"
