"""What a job is identified by, and what happens at an output location that does not match it:
weights by content, input by the listing planned, a location without `_job.json`, two submits
planning at once, an output inside the input."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pipeline_kit import write_shards

from shardinfer.errors import ConfigError, CorruptOutputError, FingerprintMismatch, InputChanged
from shardinfer.pipeline.config import JobConfig
from shardinfer.pipeline.fingerprint import compute_fingerprint, diff_fingerprint_parts
from shardinfer.pipeline.job import open_job, write_plan


def _config(model_path: Path, inp: Path, out: Path, **sections: dict[str, Any]) -> JobConfig:
    data: dict[str, dict[str, Any]] = {
        "job": {"seed": 3, "split_rows": 4, "run_id": "r1"},
        "input": {"path": str(inp), "id_column": "id", "prompt_column": "prompt"},
        "model": {"path": str(model_path), "device": "cpu", "dtype": "float32"},
        "sampling": {"temperature": 0.5, "max_tokens": 3},
        "output": {"path": str(out)},
    }
    for name, body in sections.items():
        data.setdefault(name, {}).update(body)
    return JobConfig.from_dict(data)


def _fp(cfg: JobConfig) -> dict[str, Any]:
    return compute_fingerprint(cfg, dict(cfg.sampling), 1)


def _rewrite_same_size(path: Path) -> None:
    """New values in place, same size and header: what a re-initialised checkpoint looks like."""
    data = bytearray(path.read_bytes())
    header = 8 + int.from_bytes(data[:8], "little")
    data[header:] = bytes(255 - b for b in data[header:])
    path.write_bytes(bytes(data))
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # a later write


def test_weights_changed_in_place_or_elsewhere_are_another_model(tmp_path: Path, model_dir: Path) -> None:
    model = tmp_path / "m"
    shutil.copytree(model_dir, model)
    cfg = _config(model, tmp_path / "in", tmp_path / "out")
    base = _fp(cfg)
    _rewrite_same_size(model / "model.safetensors")
    changed = _fp(cfg)
    assert [line.split(":")[0] for line in diff_fingerprint_parts(base, changed)] == [
        "model.weights.model.safetensors"
    ]
    # Another directory with the same file names and sizes (and the same header) is not the same.
    twin = tmp_path / "twin"
    shutil.copytree(model_dir, twin, copy_function=shutil.copyfile)  # no metadata copied
    _rewrite_same_size(twin / "model.safetensors")
    assert _fp(_config(twin, tmp_path / "in", tmp_path / "out"))["hash"] != base["hash"]


def test_full_hash_mode_matches_copies_and_caches(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    copy = tmp_path / "copy"
    shutil.copytree(model_dir, copy, copy_function=shutil.copyfile)
    sha = {"model": {"verify_weights": "sha256"}}
    a = _fp(_config(model_dir, tmp_path / "in", tmp_path / "out", **sha))
    b = _fp(_config(copy, tmp_path / "in", tmp_path / "out", **sha))
    assert a["hash"] == b["hash"]  # the same bytes in two places: the same model
    assert (tmp_path / "cache" / "shardinfer" / "weights-sha256.json").is_file()
    _rewrite_same_size(copy / "model.safetensors")
    assert _fp(_config(copy, tmp_path / "in", tmp_path / "out", **sha))["hash"] != a["hash"]
    with pytest.raises(ConfigError, match="verify_weights='md5'"):
        _fp(_config(model_dir, tmp_path / "in", tmp_path / "out", model={"verify_weights": "md5"}))


def test_input_changed_since_planning_is_named(tmp_path: Path, model_dir: Path) -> None:
    shards = write_shards(tmp_path / "in", files=2, rows=8)
    cfg = _config(model_dir, shards, tmp_path / "out")
    job = open_job(cfg)
    write_plan(job, "r1")
    assert open_job(cfg).state == "resume"
    # One file rewritten (other prompts, same rows), one added.
    table = pq.read_table(shards / "prompts-01.parquet")
    table = table.set_column(1, "prompt", pa.array([p + "!" for p in table.column("prompt").to_pylist()]))
    pq.write_table(table, shards / "prompts-01.parquet", row_group_size=4)
    pq.write_table(table, shards / "prompts-02.parquet", row_group_size=4)
    with pytest.raises(InputChanged) as info:
        open_job(cfg)
    message = str(info.value)
    assert "added: " + str(shards / "prompts-02.parquet") in message
    assert "changed: " + str(shards / "prompts-01.parquet") in message
    with pytest.raises(InputChanged, match="were not committed yet"):
        open_job(_config(model_dir, shards, tmp_path / "out", job={"incremental": True}))
    assert open_job(_config(model_dir, shards, tmp_path / "out", job={"start_over": True})).state == "new"


def _later_mtime(path: Path) -> None:
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))


def test_input_copied_or_fetched_again_is_the_same_input(tmp_path: Path, model_dir: Path) -> None:
    # A job resumed on another machine reads input downloaded again: new modification times,
    # the same bytes. It resumes; a same-size rewrite of one value is still named.
    shards = write_shards(tmp_path / "in", files=2, rows=8)
    cfg = _config(model_dir, shards, tmp_path / "out")
    write_plan(open_job(cfg), "r1")
    for path in shards.glob("*.parquet"):
        shutil.copyfile(path, tmp_path / "fetched")
        path.unlink()
        shutil.copyfile(tmp_path / "fetched", path)
        _later_mtime(path)
    assert open_job(cfg).state == "resume"
    target = shards / "prompts-01.parquet"
    table = pq.read_table(target)
    prompts = table.column("prompt").to_pylist()
    prompts[0] = prompts[0][:-1] + ("X" if prompts[0][-1] != "X" else "Y")  # one character, same length
    pq.write_table(
        table.set_column(1, "prompt", pa.array(prompts)), tmp_path / "edited.parquet", row_group_size=4
    )
    assert (tmp_path / "edited.parquet").stat().st_size == target.stat().st_size
    shutil.copyfile(tmp_path / "edited.parquet", target)
    _later_mtime(target)
    with pytest.raises(InputChanged, match="changed: " + str(target)):
        open_job(cfg)


def test_markers_without_job_file_are_damage_not_a_new_job(tmp_path: Path, model_dir: Path) -> None:
    shards = write_shards(tmp_path / "in", files=1, rows=4)
    out = tmp_path / "out"
    cfg = _config(model_dir, shards, out)
    job = open_job(cfg)
    write_plan(job, "r1")
    store = job.store
    split = job.splits[0]
    from store_like import one_part_table

    assert store.commit(split, store.write_part(split, "a", one_part_table(split), {}))
    (out / "_job.json").unlink()
    with pytest.raises(CorruptOutputError, match=r"no _job.json.*job.start_over=true"):
        open_job(_config(model_dir, shards, out, sampling={"temperature": 0.9}))
    fresh = open_job(_config(model_dir, shards, out, job={"start_over": True}))
    assert fresh.state == "new"
    write_plan(fresh, "r2")
    assert fresh.store.committed() == {}
    assert not list((out / "_commits").glob("*.json"))


def test_two_submits_planning_at_once_join_one_job(tmp_path: Path, model_dir: Path) -> None:
    shards = write_shards(tmp_path / "in", files=1, rows=8)
    cfg = _config(model_dir, shards, tmp_path / "out")
    first, second = open_job(cfg), open_job(cfg)
    assert first.state == second.state == "new"
    write_plan(first, "r1")
    write_plan(second, "r2")
    assert second.state == "resume" and second.generation == first.generation
    assert second.splits == first.splits
    other = open_job(_config(model_dir, shards, tmp_path / "out2"))
    other.config.output.path = cfg.output.path  # planned for one location, meets another job there
    other.config.sampling["temperature"] = 0.9
    other.fingerprint = _fp(other.config)
    other.store_ = None
    with pytest.raises(FingerprintMismatch, match=r"sampling\.defaults\.temperature"):
        write_plan(other, "r3")


def test_output_inside_the_input_is_refused(tmp_path: Path, model_dir: Path) -> None:
    shards = write_shards(tmp_path / "in", files=1, rows=4)
    with pytest.raises(ConfigError, match=r"lies inside input\.path"):
        open_job(_config(model_dir, shards, shards / "out"))
    with pytest.raises(ConfigError, match=r"lies inside input\.path"):
        open_job(_config(model_dir, Path(f"{shards}/**.parquet"), shards / "sub" / "out"))
    assert open_job(_config(model_dir, shards / "prompts-00.parquet", tmp_path / "out")).state == "new"
