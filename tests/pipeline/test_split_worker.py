"""The split worker with the real engine, in process: rows equal the engine's own batch API on the
same seeds, bad rows become error records, backpressure holds, and a stop commits nothing partial."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pipeline_kit import committed_rows

from shardinfer import LLM, SamplingParams
from shardinfer.engine.llm_engine import LLMEngine
from shardinfer.engine.seeds import derive_seed
from shardinfer.errors import Interrupted, TooManyBadRows
from shardinfer.pipeline.config import JobConfig
from shardinfer.pipeline.job import finalize_job, open_job, run_worker, write_plan

ENGINE = {"num_kv_blocks": 64, "max_num_seqs": 4, "max_model_len": 48}
SAMPLING = {"temperature": 0.9, "top_k": 20, "max_tokens": 4, "logprobs": 2, "prompt_logprobs": 1}


def _rows() -> list[dict[str, Any]]:
    good = [
        {"id": f"r{i}", "prompt": f"hello fox {i}", "temperature": None, "so_args": None} for i in range(7)
    ]
    bad = [
        {"id": "null", "prompt": None, "temperature": None, "so_args": None},
        {"id": "long", "prompt": "parquet shard " * 40, "temperature": None, "so_args": None},
        {"id": "hot", "prompt": "hello", "temperature": -2.0, "so_args": None},
        # Passes SamplingParams' checks, fails to compile in the engine.
        {
            "id": "gram",
            "prompt": "hello",
            "temperature": None,
            "so_args": '{"schema_type": "json", "schema": "{bad"}',
        },
    ]
    return good[:3] + bad[:2] + good[3:] + bad[2:]


def _config(tmp_path: Path, model_dir: Path, **job: Any) -> JobConfig:
    inp = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist(_rows()), inp, row_group_size=3)
    return JobConfig.from_dict(
        {
            "job": {"seed": 5, "split_rows": 3, "max_error_fraction": 0.5, "run_id": "t1", **job},
            "input": {
                "path": str(inp),
                "id_column": "id",
                "prompt_column": "prompt",
                "override_columns": ["temperature", "so_args"],
                "passthrough_columns": ["prompt"],
            },
            "model": {"path": str(model_dir), "device": "cpu", "dtype": "float32"},
            "engine": ENGINE,
            "sampling": SAMPLING,
            "output": {"path": str(tmp_path / "out")},
        }
    )


def _run(config: JobConfig, engine: Any = None, stop: threading.Event | None = None) -> dict[str, Any]:
    job = open_job(config)
    write_plan(job, "t1")
    run_worker(job, job.splits, stop or threading.Event(), "t1", engine=engine)
    return finalize_job(job, "t1", {})


def test_rows_match_the_batch_api_and_bad_rows_become_errors(tmp_path: Path, model_dir: Path) -> None:
    config = _config(tmp_path, model_dir)
    success = _run(config)
    assert success["summary"]["rows_ok"] == 7 and success["summary"]["rows_error"] == 4
    rows = {r["row_id"]: r for r in committed_rows(config.output.path)}
    assert {k: rows[k]["error_code"] for k in ("null", "long", "hot", "gram")} == {
        "null": "empty_prompt",
        "long": "prompt_too_long",
        "hot": "bad_override",
        "gram": "invalid_schema",
    }
    assert all(
        rows[k]["status"] == "error" and rows[k]["token_ids"] is None for k in ("null", "long", "hot", "gram")
    )
    assert rows["hot"]["prompt"] == "hello"  # passthrough columns are kept on error records too
    # Reference: the engine's whole-batch API, one call, with the documented per-row seeds.
    llm = LLM(str(model_dir), device="cpu", dtype="float32", **ENGINE)
    # A prompt too long for the model was tokenised: its record holds its length (output-schema.md).
    (long,) = [r["prompt"] for r in _rows() if r["id"] == "long"]
    assert rows["long"]["prompt_tokens"] == len(llm.get_tokenizer().encode(long, add_special_tokens=True))
    assert rows["null"]["prompt_tokens"] is None
    good = [r for r in _rows() if r["id"].startswith("r")]
    params = [SamplingParams(**SAMPLING, seed=derive_seed(5, r["id"], 0)) for r in good]
    outs = llm.generate([r["prompt"] for r in good], params)
    for r, out in zip(good, outs, strict=True):
        got, comp = rows[r["id"]], out.outputs[0]
        assert got["status"] == "ok" and got["seed"] == derive_seed(5, r["id"], 0)
        assert got["token_ids"] == comp.token_ids and got["text"] == comp.text
        assert got["token_logprobs"] == pytest.approx(comp.logprobs, abs=0, rel=1e-6)
        assert got["top_token_ids"] == [[t for t, _ in step] for step in comp.top_logprobs]
        assert got["prompt_tokens"] == len(out.prompt_token_ids)
        assert got["prompt_logprobs"][0] is None and len(got["prompt_logprobs"]) == len(out.prompt_token_ids)
        assert got["prompt_logprobs"][1:] == pytest.approx(out.prompt_logprobs[1:], abs=0, rel=1e-6)
        assert got["finish_reason"] == comp.finish_reason
    # Output order inside each part is input order.
    ordered = [
        r["row_id"]
        for s in sorted(Path(config.output.path).glob("part-*"))
        for r in pq.read_table(s).to_pylist()
    ]
    assert ordered == [r["id"] for r in _rows()]


def test_error_budget_exceeded_is_too_many_bad_rows(tmp_path: Path, model_dir: Path) -> None:
    with pytest.raises(TooManyBadRows, match="4 of 11"):
        _run(_config(tmp_path, model_dir, max_error_fraction=0.3))
    assert not (tmp_path / "out" / "_SUCCESS").exists()


class _SpyEngine:
    """The real engine, recording the largest number of unfinished requests ever admitted."""

    def __init__(self, engine: LLMEngine, stop_when: Any = None, stop: threading.Event | None = None):
        self._engine = engine
        self.peak = 0
        self._stop_when, self._stop = stop_when, stop

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def add_request(self, *args: Any) -> None:
        self._engine.add_request(*args)
        self.peak = max(self.peak, self._engine.num_unfinished)

    def step(self) -> Any:
        if self._stop is not None and self._stop_when():
            self._stop.set()
        return self._engine.step()


def test_backpressure_bounds_requests_in_the_engine(tmp_path: Path, model_dir: Path) -> None:
    config = _config(tmp_path, model_dir, max_inflight_requests=2, max_error_fraction=1.0)
    spy = _SpyEngine(LLMEngine(str(model_dir), device="cpu", dtype="float32", **ENGINE))
    _run(config, engine=spy)
    assert spy.peak == 2


def test_stop_abandons_incomplete_splits(tmp_path: Path, model_dir: Path) -> None:
    config = _config(
        tmp_path, model_dir, max_inflight_requests=1, max_splits_in_flight=1, max_error_fraction=1.0
    )
    stop = threading.Event()
    job = open_job(config)
    # Stop in the middle of the second split: right after the first commit appears.
    spy = _SpyEngine(
        LLMEngine(str(model_dir), device="cpu", dtype="float32", **ENGINE),
        lambda: any((Path(config.output.path) / "_commits").glob("00000.*.json")),
        stop,
    )
    write_plan(job, "t1")
    with pytest.raises(Interrupted):
        run_worker(job, job.splits, stop, "t1", engine=spy)
    committed = job.store.committed()
    assert 0 < len(committed) < len(job.splits)
    for index, marker in committed.items():  # whatever was committed is whole
        assert marker["rows"] == job.splits[index].num_rows
    assert not spy.has_unfinished()  # in-flight requests were aborted


def test_two_workers_racing_on_the_same_splits_commit_each_once(tmp_path: Path, model_dir: Path) -> None:
    (tmp_path / "solo").mkdir()
    solo = _config(tmp_path / "solo", model_dir, max_error_fraction=1.0)
    _run(solo)
    config = _config(tmp_path, model_dir, max_error_fraction=1.0)
    job = open_job(config)
    write_plan(job, "t1")
    results: list[Any] = []

    def worker() -> None:
        engine = LLMEngine(str(model_dir), device="cpu", dtype="float32", **ENGINE)
        results.append(run_worker(open_job(config), job.splits, threading.Event(), "t1", engine=engine))

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = sorted(results[0].committed + results[1].committed)
    assert won == [s.index for s in job.splits]  # every split won exactly once
    attempts = [i for r in results for i in r.committed + r.lost + r.skipped]
    assert sorted(set(attempts)) == won
    finalize_job(job, "t1", {})
    out = Path(config.output.path)
    named = sorted(m["part"] for m in job.store.committed().values())
    assert sorted(p.name for p in out.glob("part-*.parquet")) == named  # no orphan survives finalize
    assert committed_rows(config.output.path) == committed_rows(solo.output.path)
