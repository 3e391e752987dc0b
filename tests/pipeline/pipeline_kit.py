"""Shared by tests/pipeline and tests/jobs: a tiny model built once per session, prompt shards,
job files, a CLI runner and readers of committed output.

Torch on CPU runs one thread per process here: the suite shares two cores with other test
processes, and oversubscribed intra-op threads make a tiny model ten times slower.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]


def tiny_model(base: Path) -> Path:
    """A random-init qwen3 checkpoint under the session's base temp dir (built on first use)."""
    out = base / "tiny-qwen3"
    if not (out / "config.json").is_file():
        from shardinfer.testing.tiny_checkpoint import make_tiny_checkpoint

        make_tiny_checkpoint(out, "qwen3", num_hidden_layers=1)
    return out


def prompt_rows(file_index: int, n: int) -> list[dict[str, Any]]:
    words = ["fox", "engine", "parquet", "shard", "hello", "world", "split", "commit", "token", "seed"]
    return [
        {
            "id": f"f{file_index}-{i:03d}",
            "prompt": f"{words[i % 10]} {words[(i * 3 + file_index) % 10]} {i}",
            "topic": words[(i + file_index) % 10],
        }
        for i in range(n)
    ]


def write_shards(
    directory: Path,
    files: int = 2,
    rows: int = 8,
    row_group: int = 4,
    extra: list[dict[str, Any]] | None = None,
) -> Path:
    """Parquet prompt shards: `files` files of `rows` rows (id, prompt, topic); `extra` rows go to the last."""
    directory.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        data = prompt_rows(f, rows) + (extra or [] if f == files - 1 else [])
        pq.write_table(
            pa.Table.from_pylist(data), directory / f"prompts-{f:02d}.parquet", row_group_size=row_group
        )
    return directory


def job_toml(model: Path | str, input_path: str, output_path: str, /, **sections: dict[str, Any]) -> str:
    """A job file; `sections` (job=..., sampling=..., ...) are merged over small test defaults."""
    spec: dict[str, dict[str, Any]] = {
        "job": {"seed": 11, "split_rows": 4, "max_inflight_requests": 8, "max_splits_in_flight": 2},
        "input": {
            "path": input_path,
            "id_column": "id",
            "prompt_column": "prompt",
            "passthrough_columns": ["topic"],
        },
        "model": {"path": str(model), "device": "cpu", "dtype": "float32"},
        "engine": {"num_kv_blocks": 128, "max_num_seqs": 8},
        "sampling": {"temperature": 0.8, "max_tokens": 5, "logprobs": 2, "prompt_logprobs": 1},
        "output": {"path": output_path},
    }
    for name, body in sections.items():
        spec.setdefault(name, {}).update(body)
    return "\n".join(
        f"[{name}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in body.items()) for name, body in spec.items()
    )


def standard_job(
    tmp_path: Path, model: Path | str, input_path: str, /, **sections: dict[str, Any]
) -> tuple[Path, Path]:
    """(job file, output dir): `tmp_path/job.toml` written by job_toml, output to `tmp_path/out`."""
    out = tmp_path / "out"
    job = tmp_path / "job.toml"
    job.write_text(job_toml(model, input_path, str(out), **sections))
    return job, out


def fine_grained_job(tmp_path: Path, model: Path | str, input_path: str) -> tuple[Path, Path]:
    """(job file, output dir) for a job of one-row splits, one request at a time: many commit
    points, so a run interrupted at any instant dies with work left. Outputs are unchanged by it."""
    return standard_job(tmp_path, model, input_path, job={"split_rows": 1, "max_inflight_requests": 1})


def _toml(value: Any) -> str:
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


def cli_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop("SHARDINFER_TEST_CRASH_AT", None)
    env.update(extra)
    return env


def cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardinfer", *args],
        capture_output=True,
        text=True,
        env=env or cli_env(),
        cwd=REPO,
        timeout=timeout,
    )


def start_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "shardinfer", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env or cli_env(),
        cwd=REPO,
    )


def committed_rows(url: str, storage_options: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Committed output rows (through the markers, hashes verified), sorted by (row_id, sample)."""
    from shardinfer.writers.output_store import OutputStore

    table = OutputStore(url, storage_options).read_committed_table()
    return sorted(table.to_pylist(), key=lambda r: (r["row_id"], r["sample_index"]))


def part_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("part-*.parquet"))


def marker_parts(directory: Path) -> list[str]:
    import json

    return sorted(json.loads(p.read_text())["part"] for p in (directory / "_commits").glob("*.json"))
