"""A score job over the local tasks' rows gives the numbers lm-evaluation-harness's transformers
model gives for the same rows: each choice's loglikelihood and greediness, each document's total."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness_kit import MAX_LENGTH, TASKS_DIR


def _submit(
    tmp_path: Path, model_dir: Path, name: str, rows: list[dict[str, Any]], job: str = "", **inp: str
) -> list[dict]:
    from shardinfer.jobs.cli import main
    from shardinfer.writers.output_store import OutputStore

    data = tmp_path / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / f"out-{name}"
    body = {
        "job": f'task = "score"\n{job}',
        "input": f'path = "{data}"\nid_column = "id"\n' + "".join(f'{k} = "{v}"\n' for k, v in inp.items()),
        "model": f'path = "{model_dir}"\ndevice = "cpu"\ndtype = "float32"',
        "engine": "num_kv_blocks = 128",
        "output": f'path = "{out}"',
    }
    job = tmp_path / f"{name}.toml"
    job.write_text("".join(f"[{k}]\n{v}\n" for k, v in body.items()))
    assert main(["submit", str(job)]) == 0
    table = OutputStore(str(out)).read_committed_table().to_pylist()
    return sorted(table, key=lambda r: (int(r["row_id"]), r["continuation_index"]))


def test_score_job_equals_the_harness(
    tmp_path: Path, tiny_models: dict[str, Path], harness_runs: Any
) -> None:
    _, ref = harness_runs["dense"]
    docs = [json.loads(line) for line in (TASKS_DIR / "mc.jsonl").read_text().splitlines()]
    # The task's prompt is the question and each choice follows the target delimiter, a space.
    rows = [
        {"id": i, "ctx": d["question"], "choices": [" " + c for c in d["choices"]]}
        for i, d in enumerate(docs)
    ]
    got = _submit(
        tmp_path, tiny_models["dense"], "mc", rows, context_column="ctx", continuations_column="choices"
    )
    want = [
        (lp, greedy)
        for s in sorted(ref["samples"]["si_mc"], key=lambda s: s["doc_id"])
        for ((lp, greedy),) in s["resps"]
    ]
    assert len(got) == len(want) == sum(len(d["choices"]) for d in docs)
    for rec, (lp, greedy) in zip(got, want, strict=True):
        assert rec["status"] == "ok"
        assert abs(rec["logprob_sum"] - lp) < 1e-4
        assert rec["is_greedy"] == greedy

    texts = [json.loads(line)["text"] for line in (TASKS_DIR / "docs.jsonl").read_text().splitlines()]
    got = _submit(
        tmp_path,
        tiny_models["dense"],
        "docs",
        [{"id": i, "text": t} for i, t in enumerate(texts)],
        job=f"rolling_window_tokens = {MAX_LENGTH}",
        document_column="text",
    )
    want_docs = [s["resps"][0][0] for s in sorted(ref["samples"]["si_ppl"], key=lambda s: s["doc_id"])]
    for rec, total in zip(got, want_docs, strict=True):
        assert abs(rec["logprob_sum"] - total) < 1e-4
    assert max(len(rec["windows"]) for rec in got) >= 2
