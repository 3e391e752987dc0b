"""`--storage-options JSON`, the flag every command that reads an output location takes."""

from __future__ import annotations

import json
from typing import Any

from shardinfer.errors import UsageError
from shardinfer.jobs.secrets_guard import guard_job


def parse_storage_options(text: str) -> dict[str, Any]:
    """The flag's JSON object, its credentials kept out of every line printed after this.

    The text is never quoted back in an error: it may hold a key or a secret that was not
    understood."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise UsageError(
            f"--storage-options is not JSON ({type(exc).__name__} at character {getattr(exc, 'pos', '?')}); "
            "e.g. '{\"anon\": true}'"
        ) from None
    if not isinstance(value, dict):
        raise UsageError(f"--storage-options holds a JSON {type(value).__name__}: give a JSON object")
    guard_job(value)
    return value
