"""What an eval writes of lm-evaluation-harness's runs: the logged samples as rows of the eval dump
(writers.schema), and the results of several runs merged into one.

The harness logs, per (document, filter), the requests' arguments, the raw responses, the
filtered responses and the sample's metric values; the dump keeps all of it in typed columns
(and the doc and every metric value as JSON, for what does not fit a column).

`shardinfer eval` runs the harness once per requested task and keeps each run's results (all but
its samples) with that task's committed part; `merge_results` makes of them the record one run of
every task would have returned.
"""

from __future__ import annotations

import json
import math
from typing import Any

# The harness's result keys with one entry per task or group. The harness computes each entry from
# that task's samples alone (a group's from its own subtasks), so the entries of separate runs
# united are those of one run over all their tasks.
PER_TASK_KEYS = ("results", "groups", "group_subtasks", "configs", "versions", "n-shot", "higher_is_better",
                 "n-samples")  # fmt: skip


def to_json(value: Any) -> str:
    from lm_eval.utils import handle_non_serializable

    return json.dumps(value, default=handle_non_serializable, ensure_ascii=False, sort_keys=True)


def _scalar(value: Any) -> float | None:
    if isinstance(value, bool | int | float) and not (isinstance(value, float) and math.isnan(value)):
        return float(value)
    return None


def sample_rows(task: str, request_type: str, samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Dump rows of one task's logged samples, sorted by (doc_id, filter)."""
    rows = []
    for sample in sorted(samples, key=lambda s: (int(s["doc_id"]), str(s.get("filter")))):
        args = [tuple(a) if isinstance(a, list | tuple) else (a,) for a in sample["arguments"]]
        resps = sample["resps"]
        filtered = sample["filtered_resps"]
        row: dict[str, Any] = {
            "row_id": f"{task}/{sample['doc_id']}/{sample.get('filter')}",
            "task": task,
            "doc_id": int(sample["doc_id"]),
            "filter": sample.get("filter"),
            "request_type": request_type,
            "prompt": str(args[0][0]) if args and args[0] else None,
            "target": None if sample.get("target") is None else str(sample["target"]),
            "choices": None,
            "loglikelihoods": None,
            "is_greedy": None,
            "responses": None,
            "filtered_answer": None,
        }
        if request_type in ("loglikelihood", "multiple_choice"):
            row["choices"] = [str(a[1]) for a in args]
            row["loglikelihoods"] = [float(r[0][0]) for r in resps]
            row["is_greedy"] = [bool(r[0][1]) for r in resps]
            best = max(range(len(args)), key=lambda i: row["loglikelihoods"][i]) if args else None
            row["filtered_answer"] = row["choices"][best] if best is not None else None
        elif request_type == "loglikelihood_rolling":
            row["loglikelihoods"] = [float(r[0]) for r in resps]
        else:  # generate_until
            row["responses"] = [str(text) for r in resps for text in r]
            answer = filtered[0] if filtered else None
            row["filtered_answer"] = answer if isinstance(answer, str) or answer is None else to_json(answer)
        values = {name: sample.get(name) for name in sample.get("metrics", [])}
        row["metrics"] = [(k, v) for k, v in ((k, _scalar(v)) for k, v in values.items()) if v is not None]
        row["metrics_json"] = to_json(values)
        row["doc_json"] = to_json(sample.get("doc"))
        rows.append(row)
    return rows


def merge_results(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The results of harness runs over disjoint tasks, as one run over all of them: the per-task
    entries united, in the records' order; the run's own fields (`config`, `date`, the environment)
    those of the first record, the run that started the eval."""
    if not records:
        raise ValueError("no results to merge")
    merged = dict(records[0])
    for key in PER_TASK_KEYS:
        if any(key in record for record in records):
            merged[key] = {name: value for record in records for name, value in record.get(key, {}).items()}
    return merged
