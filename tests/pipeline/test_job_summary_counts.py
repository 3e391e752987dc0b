"""The job summary counts the samples cut by max_tokens (finish_reason "length")."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pipeline_kit import committed_rows

from shardinfer.pipeline.config import JobConfig
from shardinfer.pipeline.job import finalize_job, open_job, run_worker, write_plan


def test_summary_counts_rows_cut_by_max_tokens(tmp_path: Path, model_dir: Path) -> None:
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    every_token = list(range(vocab))  # stop at the first token, whatever it is
    rows = [{"id": f"r{i}", "prompt": f"hello fox {i}", "stop_token_ids": None} for i in range(3)]
    rows += [{"id": f"s{i}", "prompt": f"shard {i}", "stop_token_ids": every_token} for i in range(2)]
    inp = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist(rows), inp)
    config = JobConfig.from_dict(
        {
            "job": {"seed": 1, "split_rows": 2, "run_id": "t1"},
            "input": {
                "path": str(inp),
                "id_column": "id",
                "prompt_column": "prompt",
                "override_columns": ["stop_token_ids"],
            },
            "model": {"path": str(model_dir), "device": "cpu", "dtype": "float32"},
            "engine": {"num_kv_blocks": 64, "max_num_seqs": 4, "max_model_len": 48},
            "sampling": {"temperature": 0.0, "max_tokens": 3, "ignore_eos": True},
            "output": {"path": str(tmp_path / "out")},
        }
    )
    job = open_job(config)
    write_plan(job, "t1")
    run_worker(job, job.splits, threading.Event(), "t1")
    summary = finalize_job(job, "t1", {})["summary"]
    reasons = {r["row_id"]: r["finish_reason"] for r in committed_rows(config.output.path)}
    assert reasons == {"r0": "length", "r1": "length", "r2": "length", "s0": "stop", "s1": "stop"}
    assert summary["rows_cut_by_max_tokens"] == 3
    # The rows stopped at their first token wrote no text (a stop token is not part of it).
    texts = {r["row_id"]: r["text"] for r in committed_rows(config.output.path)}
    assert texts["s0"] == texts["s1"] == ""
    assert summary["rows_empty_text"] == sum(1 for t in texts.values() if t == "")
