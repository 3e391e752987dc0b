"""The measured-tilings file format (kernels/tuning.py): what the bench tools write is what the
kernels read back, and a write keeps the entries of problems it does not name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardinfer.kernels import fp8_matmul, matmul, tuning


@pytest.mark.parametrize(
    "directory, parse, key",
    [
        (matmul.CONFIG_DIR, matmul._measured_entry, lambda e: (e["n"], e["k"], e["dtype"])),
        (fp8_matmul.CONFIG_DIR, fp8_matmul._measured_entry, lambda e: (e["n"], e["k"])),
    ],
)
def test_shipped_files_are_written_back_entry_for_entry(tmp_path: Path, directory: Path, parse, key) -> None:
    shipped = sorted(directory.glob("*.json"))
    assert shipped
    for path in shipped:
        original = json.loads(path.read_text())
        read = [parse(e) for e in original["entries"]]
        entries = [
            {**{n: e[n] for n in ("n", "k", "dtype") if n in e}, **tuning.entry_fields(t)}
            for e, (_, t) in zip(original["entries"], read, strict=True)
        ]
        out = tmp_path / path.name
        tuning.write_measured(out, entries, key, {"gpu": original["gpu"]})
        assert json.loads(out.read_text())["entries"] == original["entries"]


def test_a_write_merges_into_the_file(tmp_path: Path) -> None:
    path = tmp_path / "GPU.json"
    first = tuning.entry_fields(fp8_matmul.tiling(1024, 512))
    tuning.write_measured(
        path,
        [{"n": 2048, "k": 512, **first}, {"n": 1024, "k": 512, **first}],
        lambda e: (e["n"], e["k"]),
        {"gpu": "GPU"},
    )
    tuning.write_measured(
        path, [{"n": 1024, "k": 512, "config": first["config"]}], lambda e: (e["n"], e["k"]), {"gpu": "GPU"}
    )
    entries = json.loads(path.read_text())["entries"]
    assert [(e["n"], e["k"]) for e in entries] == [(1024, 512), (2048, 512)]
    assert entries[0] == {"n": 1024, "k": 512, "config": first["config"]}  # replaced
    assert entries[1] == {"n": 2048, "k": 512, **first}  # kept
    assert "by_m" in first  # the FP8 default tiling changes by M, so the kept entry carries its ranges
