"""Child process of test_bounded_memory: one job over a prepared input with the stub engine,
printing its peak RSS (MB) after the job, and the RSS after imports alone, as JSON.

    python tests/pipeline/memory_job.py MODEL_DIR INPUT OUTPUT SPLIT_ROWS
"""

from __future__ import annotations

import json
import resource
import sys
import threading


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    model_dir, input_path, output_path, split_rows = sys.argv[1:5]
    from shardinfer.pipeline.config import JobConfig
    from shardinfer.pipeline.job import finalize_job, open_job, run_worker, write_plan
    from shardinfer.testing.stub_engine import StubEngine

    engine = StubEngine(model_dir, max_model_len=64, max_num_seqs=256)
    after_imports = _peak_mb()
    config = JobConfig.from_dict(
        {
            "job": {
                "seed": 1,
                "split_rows": int(split_rows),
                "run_id": "mem",
                "batch_rows": 1024,
                "max_inflight_requests": 512,
                "max_splits_in_flight": 2,
            },
            "input": {"path": input_path, "prompt_column": "prompt"},
            "model": {"path": model_dir, "device": "cpu"},
            "sampling": {"max_tokens": 1},
            "output": {"path": output_path},
        }
    )
    job = open_job(config)
    write_plan(job, "mem")
    run_worker(job, job.splits, threading.Event(), "mem", engine=engine)
    summary = finalize_job(job, "mem", {})
    print(
        json.dumps(
            {
                "after_imports_mb": after_imports,
                "peak_mb": _peak_mb(),
                "cpu_s": _cpu_s(),
                "records": summary.get("summary", summary)["records"],
            }
        )
    )


if __name__ == "__main__":
    main()
