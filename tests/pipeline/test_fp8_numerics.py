"""FP8 weights and an FP8 KV cache are numerics: part of the fingerprint, checked at validation,
named in the job summary, in _SUCCESS and in every part file's metadata."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pipeline_kit import cli, job_toml, part_files, write_shards

from shardinfer.errors import ConfigError
from shardinfer.jobs.spec import validate
from shardinfer.pipeline.config import JobConfig
from shardinfer.pipeline.fingerprint import compute_fingerprint, diff_fingerprint_parts


def _config(model_path: Path, **changes: dict) -> JobConfig:
    data = {
        "job": {"seed": 1, "ds": "2026-12-02"},
        "input": {"path": "in", "prompt_column": "prompt"},
        "model": {"path": str(model_path), "device": "cpu", "dtype": "float32"},
        "engine": {"max_num_seqs": 8},
        "output": {"path": "out"},
    }
    for section, body in changes.items():
        data[section] = {**data.get(section, {}), **body}
    return JobConfig.from_dict(data)


def _fp(cfg: JobConfig) -> dict:
    return compute_fingerprint(cfg, {}, 1)


def test_weight_quantisation_and_kv_dtype_change_the_fingerprint(model_dir: Path) -> None:
    base = _fp(_config(model_dir))
    assert "quantization" not in base["engine.numerics"] and "kv_cache_dtype" not in base["engine.numerics"]
    for changes, key in (
        ({"model": {"quantization": "fp8"}}, "engine.numerics.quantization"),
        ({"engine": {"kv_cache_dtype": "fp8"}}, "engine.numerics.kv_cache_dtype"),
    ):
        fp = _fp(_config(model_dir, **changes))
        assert fp["hash"] != base["hash"]
        assert [line.split(":")[0] for line in diff_fingerprint_parts(base, fp)] == [key]


def test_bad_or_conflicting_quantization_is_a_config_error(model_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"model\.quantization='int4'"):
        validate(_config(model_dir, model={"quantization": "int4"}))
    with pytest.raises(ConfigError, match="disagree"):
        validate(_config(model_dir, model={"quantization": "fp8"}, engine={"quantization": "none"}))
    validate(_config(model_dir, model={"quantization": "fp8"}, engine={"kv_cache_dtype": "fp8"}))


def test_fp8_job_names_its_numerics_in_summary_fingerprint_and_parts(tmp_path: Path, model_dir: Path) -> None:
    shards = write_shards(tmp_path / "in", files=1, rows=4)
    out = tmp_path / "out"
    job = tmp_path / "job.toml"
    # job_toml's first argument is named `model`, so the [model] key goes in by hand.
    text = job_toml(model_dir, str(shards), str(out), engine={"kv_cache_dtype": "fp8"})
    job.write_text(text.replace("[model]\n", '[model]\nquantization = "fp8"\n'))
    done = cli("submit", str(job))
    assert done.returncode == 0, done.stderr
    assert "weights fp8, KV cache fp8" in done.stdout
    success = json.loads((out / "_SUCCESS").read_text())
    numerics = success["fingerprint"]["engine.numerics"]
    assert (numerics["quantization"], numerics["kv_cache_dtype"]) == ("fp8", "fp8")
    for part in part_files(out):
        meta = pq.read_metadata(out / part).metadata
        numerics = json.loads(meta[b"shardinfer.numerics"])
        assert (numerics["quantization"], numerics["kv_cache_dtype"]) == ("fp8", "fp8")
        assert json.loads(meta[b"shardinfer.model"])["quantization"] == "fp8"
