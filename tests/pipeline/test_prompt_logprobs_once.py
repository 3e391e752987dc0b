"""Prompt logprobs are a property of the input row: with n samples they are stored once, in the
row's first sample, and asking for them only there leaves every sample's tokens as they were."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pipeline_kit import committed_rows

from shardinfer import LLM, SamplingParams
from shardinfer.engine.seeds import derive_seed
from shardinfer.pipeline.config import JobConfig
from shardinfer.pipeline.fingerprint import compute_fingerprint
from shardinfer.pipeline.job import finalize_job, open_job, run_worker, write_plan

ENGINE = {"num_kv_blocks": 64, "max_num_seqs": 4}
SAMPLING = {"temperature": 0.9, "max_tokens": 4, "prompt_logprobs": 1, "n": 3}
PROMPTS = {"a": "hello fox 1", "b": "parquet shard engine 2"}


def _config(tmp_path: Path, model_dir: Path, **sampling: object) -> JobConfig:
    inp = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist([{"id": k, "prompt": p} for k, p in PROMPTS.items()]), inp)
    return JobConfig.from_dict(
        {
            "job": {"seed": 7, "split_rows": 2, "run_id": "t1"},
            "input": {"path": str(inp), "id_column": "id", "prompt_column": "prompt"},
            "model": {"path": str(model_dir), "device": "cpu", "dtype": "float32"},
            "engine": ENGINE,
            "sampling": {**SAMPLING, **sampling},
            "output": {"path": str(tmp_path / "out")},
        }
    )


def test_prompt_logprobs_are_stored_once_per_row(tmp_path: Path, model_dir: Path) -> None:
    config = _config(tmp_path, model_dir)
    job = open_job(config)
    write_plan(job, "t1")
    run_worker(job, job.splits, threading.Event(), "t1")
    finalize_job(job, "t1", {})
    rows = committed_rows(config.output.path)
    assert [(r["row_id"], r["sample_index"]) for r in rows] == [(k, j) for k in PROMPTS for j in range(3)]
    # Reference: the batch API, every sample its own request asking for prompt logprobs.
    llm = LLM(str(model_dir), device="cpu", dtype="float32", **ENGINE)
    single = {k: v for k, v in SAMPLING.items() if k != "n"}
    for row in rows:
        params = SamplingParams(**single, seed=derive_seed(7, row["row_id"], row["sample_index"]))
        ref = llm.generate([PROMPTS[row["row_id"]]], params)[0]
        assert row["token_ids"] == ref.outputs[0].token_ids  # tokens unchanged without prompt logprobs
        if row["sample_index"] == 0:
            assert row["prompt_logprobs"][0] is None
            assert row["prompt_logprobs"][1:] == pytest.approx(ref.prompt_logprobs[1:], abs=0, rel=1e-6)
        else:
            assert row["prompt_logprobs"] is None


def test_the_layout_is_in_the_fingerprint_of_jobs_it_changes(tmp_path: Path, model_dir: Path) -> None:
    def parts(**sampling: object) -> dict[str, object]:
        cfg = _config(tmp_path, model_dir, **sampling)
        return compute_fingerprint(cfg, {**SAMPLING, **sampling}, 1)

    assert parts()["output.prompt_logprobs"] == "first_sample"
    # One sample per row, or no prompt logprobs: the same layout as before, the same fingerprint.
    assert "output.prompt_logprobs" not in parts(n=1)
    assert "output.prompt_logprobs" not in parts(prompt_logprobs=None)
