"""Choosing a kernel's tiling: one mechanism for the matmul, the MoE GEMMs and the per-head matmul.

A problem is keyed by its shape and dtype (the matmul: (N, K, dtype); the FP8 GEMM: (N, K); MoE:
(hidden, intermediate, dtype); per-head matmul: (H, K, N, dtype)). Its tilings come from, in order:

    1. the family's overrides (measured winners; tests and tuning runs set them),
    2. the tilings measured on this GPU model (the matmul's matmul_configs/<gpu name>.json, the
       FP8 GEMM's fp8_matmul_configs/<gpu name>.json; `read_measured`),
    3. the family's defaults for the shape and the device (the MoE's depend on the compute
       capability).

and form a `Tiling`: one tiling per range of batch size. The batch size (the matmul's M, the
MoE's rows per expert) picks among them, but never the reduction order: each family switches
only between tilings that sum every row in the same order (its module docstring says why its
choices qualify), so a row's bits do not depend on its batch. A family whose tilings are not
known to be interchangeable has one tiling for every size.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch

C = TypeVar("C")  # a family's tiling dataclass
K = TypeVar("K", bound=Hashable)  # a family's problem key


@dataclass(frozen=True)
class Tiling(Generic[C]):
    """The tilings of one problem by batch size: `by_m` holds (max_m, config) in ascending max_m,
    the first whose max_m >= the size is used; `rest` serves larger sizes (and every size when
    by_m is empty)."""

    rest: C
    by_m: tuple[tuple[float, C], ...] = ()

    def for_m(self, m: float) -> C:
        for max_m, config in self.by_m:
            if m <= max_m:
                return config
        return self.rest

    @property
    def configs(self) -> list[C]:
        return [c for _, c in self.by_m] + [self.rest]


def below(bound: float) -> float:
    """The largest float under `bound`: a by_m entry (below(b), c) serves every size < b with c."""
    import math

    return math.nextafter(bound, -math.inf)


def measured_path(directory: Path, gpu_name: str) -> Path:
    """Where a GPU model's measured tilings live (`NVIDIA H200` -> `<directory>/NVIDIA_H200.json`)."""
    return directory / (re.sub(r"[^A-Za-z0-9.-]+", "_", gpu_name).strip("_") + ".json")


def tiling_from_entry(entry: dict[str, Any], make: Callable[[dict[str, Any]], C]) -> Tiling[C]:
    """A measured-tilings file entry's Tiling: `config` for large sizes, `by_m` a list of
    {"max_m", "config"} in increasing max_m; `make` builds (and checks) one config from its fields."""
    by_m = tuple((int(b["max_m"]), make(b["config"])) for b in entry.get("by_m", ()))
    if [m for m, _ in by_m] != sorted({m for m, _ in by_m}):
        raise ValueError(f"by_m of {entry.get('n')}x{entry.get('k')} must list increasing max_m")
    return Tiling(make(entry["config"]), by_m)


def entry_fields(tiling: Tiling[Any]) -> dict[str, Any]:
    """The inverse of tiling_from_entry: a Tiling's `config` and (where it has any) `by_m` fields."""
    fields: dict[str, Any] = {"config": asdict(tiling.rest)}
    if tiling.by_m:
        fields["by_m"] = [{"max_m": max_m, "config": asdict(cfg)} for max_m, cfg in tiling.by_m]
    return fields


def write_measured(
    path: Path,
    entries: Iterable[dict[str, Any]],
    key: Callable[[dict[str, Any]], Any],
    header: dict[str, Any],
) -> str:
    """Merge entries into the measured-tilings file at path (entries of problems not given are kept;
    `key` names an entry's problem and orders the file), under `header`; returns the text written."""
    merged = {key(e): e for e in (json.loads(path.read_text())["entries"] if path.is_file() else [])}
    merged.update((key(e), e) for e in entries)
    text = json.dumps({**header, "entries": sorted(merged.values(), key=key)}, indent=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return text


def read_measured(
    path: Path, parse: Callable[[dict[str, Any]], tuple[K, Tiling[C]]], family: str, tool: str
) -> dict[K, Tiling[C]]:
    """A GPU model's measured tilings file (`{"entries": [...]}`), each entry parsed (and checked)
    by `parse` into its problem key and Tiling; empty when the file is absent. A file that cannot be
    read names itself, the tool that rewrites it and the way back to the defaults."""
    if not path.is_file():
        return {}
    table: dict[K, Tiling[C]] = {}
    try:
        for entry in json.loads(path.read_text())["entries"]:
            key, tiling = parse(entry)
            table[key] = tiling
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # JSONDecodeError is a ValueError
        raise ValueError(
            f"measured {family} tilings in {path} are unreadable ({type(e).__name__}: {e}); "
            f"re-run {tool} --write-configs on this GPU, or delete the file to use the default tilings"
        ) from e
    return table


class TileChooser(Generic[K, C]):
    """One family's tiling selection (module docstring).

    overrides: problem key -> one tiling for every size, or a Tiling; the family's module-level
        dict, read at each choice, so entries set later (tests, tuning runs) count.
    default: (key, device or None) -> the family's Tiling for that problem there.
    measured: GPU model name -> {key: Tiling} measured on that model, or None for a family
        without measured tilings.
    """

    def __init__(
        self,
        overrides: Mapping[K, C | Tiling[C]],
        default: Callable[[K, torch.device | None], Tiling[C]],
        measured: Callable[[str], dict[K, Tiling[C]]] | None = None,
    ) -> None:
        self.overrides = overrides
        self.default = default
        self.measured = measured

    def tiling(self, key: K, gpu_name: str | None = None, device: torch.device | None = None) -> Tiling[C]:
        """The problem's tilings by batch size."""
        override = self.overrides.get(key)
        if override is not None:
            return override if isinstance(override, Tiling) else Tiling(override)
        if gpu_name is not None and self.measured is not None:
            measured = self.measured(gpu_name).get(key)
            if measured is not None:
                return measured
        return self.default(key, device)

    def choose(
        self,
        key: K,
        size: float | None = None,
        gpu_name: str | None = None,
        device: torch.device | None = None,
    ) -> C:
        """The tiling the problem runs at batch size `size` (None: the one for the largest sizes)."""
        tiling = self.tiling(key, gpu_name, device)
        return tiling.rest if size is None else tiling.for_m(size)
