"""Names of the files the commit protocol writes, and what they say about the job generation.

A *generation* is one planning of a job at one output location: the first characters of the
fingerprint hash and a random part, chosen when `_job.json` is created (again on a start-over).
Every part file and every commit marker names its generation, so work of an older generation
(a job still running while another one started over the location) can never be counted by the
current one: its markers are simply not the current generation's.

    part-{split}-{generation}-{attempt}.parquet
    _commits/{split}.{generation}.{number}.json

`{number}` is the marker generation of the split, 0 for the first commit. A committed part found
damaged (deleted, truncated, replaced) is computed again and committed under the next number,
created only if absent like the first, so of two repairers exactly one wins; the highest number
present is the split's marker.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

COMMITS_DIR = "_commits"
_GENERATION = re.compile(r"^[0-9a-f]{6,32}-[0-9a-f]{6,32}$")
_MARKER = re.compile(r"^(\d+)\.([0-9a-f]+-[0-9a-f]+)\.(\d+)\.json$")


def new_generation(fingerprint_hash: str) -> str:
    """A fresh generation for a job with this fingerprint: never equal to an earlier one."""
    prefix = re.sub(r"[^0-9a-f]", "", fingerprint_hash.lower())[:12] or "0" * 12
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def check_generation(generation: str) -> str:
    if not _GENERATION.match(generation):
        raise ValueError(f"generation={generation!r} is not a job generation (hex-hex)")
    return generation


@dataclass(frozen=True, order=True)
class MarkerName:
    """A parsed `_commits/` file name."""

    split: int
    generation: str
    number: int

    @property
    def file_name(self) -> str:
        return marker_file_name(self.split, self.generation, self.number)


def marker_file_name(split: int, generation: str, number: int) -> str:
    return f"{split:05d}.{generation}.{number}.json"


def parse_marker_name(name: str) -> MarkerName | None:
    """The marker a `_commits/` file name denotes, or None for anything else (temporary files)."""
    m = _MARKER.match(name)
    if not m:
        return None
    return MarkerName(int(m.group(1)), m.group(2), int(m.group(3)))


def current_markers(names: list[MarkerName], generation: str) -> dict[int, MarkerName]:
    """Split -> its marker in `generation`: the highest marker number present for the split."""
    best: dict[int, MarkerName] = {}
    for marker in names:
        if marker.generation != generation:
            continue
        if marker.split not in best or marker.number > best[marker.split].number:
            best[marker.split] = marker
    return dict(sorted(best.items()))
