"""A finished job's finalize and `status` over many splits on S3, with each request a round trip.

The output goes to a moto S3 server in its own process, through the test suite's proxy
(tests/s3_server.py) made to hold every request for `--latency-ms` first, as a remote store's
round trip would. A stub engine writes the parts (one row a split by default) over a direct
connection; then finalize and `status` run through the slow one, with the per-part reads several
at once (writers.parts.map_parts) and, in the same invocation, one at a time
(PART_READ_CONCURRENCY=1), each on its own fresh output. `status` runs before finalize, when it
sums the parts' footers, as it does for a job that is running or was interrupted. CPU only; needs the test extras (moto).

    python bench/finalize_latency.py --splits 300 --latency-ms 20 [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of at least 1")
    return value


def _start_moto(port: int) -> subprocess.Popen[bytes]:
    code = (
        "import logging, time\n"
        "logging.getLogger('werkzeug').setLevel(logging.ERROR)\n"
        "from moto.moto_server.threaded_moto_server import ThreadedMotoServer\n"
        f"ThreadedMotoServer(ip_address='127.0.0.1', port={port}, verbose=False).start()\n"
        "while True: time.sleep(60)\n"
    )
    return subprocess.Popen([sys.executable, "-c", code])


def _wait_for(endpoint: str) -> None:
    import urllib.request

    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(endpoint, timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _delay_every_request(seconds: float) -> None:
    import s3_server

    forward = s3_server._ProxyHandler._forward

    def delayed(self: Any, *args: Any, **kwargs: Any) -> Any:
        time.sleep(seconds)
        return forward(self, *args, **kwargs)

    s3_server._ProxyHandler._forward = delayed  # type: ignore[method-assign]


def _job_config(src: str, model: Path, output: str, options: dict[str, Any]) -> Any:
    from shardinfer.pipeline.config import JobConfig

    return JobConfig.from_dict(
        {
            "job": {"seed": 1, "split_rows": 1, "run_id": "bench", "max_splits_in_flight": 8},
            "input": {"path": src, "prompt_column": "prompt", "id_column": "id"},
            "model": {"path": str(model), "device": "cpu"},
            "sampling": {"max_tokens": 1},
            "output": {"path": output, "storage_options": options},
        }
    )


def _measure(
    label: str, src: str, model: Path, output: str, fast: dict[str, Any], proxy: Any, concurrency: int
) -> dict[str, Any]:
    from shardinfer.jobs.status import show_status
    from shardinfer.pipeline.job import finalize_job, open_job, run_worker, write_plan
    from shardinfer.testing.stub_engine import StubEngine
    from shardinfer.writers import parts

    engine = StubEngine(str(model), max_model_len=64, max_num_seqs=64)
    job = open_job(_job_config(src, model, output, fast))
    write_plan(job, "bench")
    run_worker(job, job.splits, threading.Event(), "bench", engine=engine)

    parts.PART_READ_CONCURRENCY, saved = concurrency, parts.PART_READ_CONCURRENCY
    try:
        slow = proxy.storage_options()
        # status first, while every split is committed and nothing is finalized: it then sums the
        # parts' footers (a finished job's totals come from `_SUCCESS`).
        printed = io.StringIO()
        before, start = len(proxy.requests), time.perf_counter()
        with contextlib.redirect_stdout(printed):
            show_status(output, slow, as_json=True)
        status_s, status_requests = time.perf_counter() - start, len(proxy.requests) - before
        state = json.loads(printed.getvalue())
        finishing = open_job(_job_config(src, model, output, slow))
        before, start = len(proxy.requests), time.perf_counter()
        summary = finalize_job(finishing, "bench", {})
        finalize_s, finalize_requests = time.perf_counter() - start, len(proxy.requests) - before
    finally:
        parts.PART_READ_CONCURRENCY = saved
    return {
        "reads": label,
        "part_read_concurrency": concurrency,
        "records": summary.get("summary", summary)["records"],
        "finalize_s": round(finalize_s, 2),
        "finalize_requests": finalize_requests,
        "status_s": round(status_s, 2),
        "status_requests": status_requests,
        "status_state": state["state"],
        "status_records": state["records"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--splits", type=_positive, default=300, help="one-row splits in the job")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="added to every S3 request")
    parser.add_argument("--out", type=Path, help="a folder for the JSON result")
    args = parser.parse_args()
    if args.latency_ms < 0:
        parser.error(f"--latency-ms {args.latency_ms}: give 0 or more")

    import tempfile

    import pyarrow as pa
    import pyarrow.parquet as pq
    import s3fs
    from s3_server import FaultProxy, free_port, s3_options

    from shardinfer.testing.stub_engine import write_stub_model_dir
    from shardinfer.writers import parts

    _delay_every_request(args.latency_ms / 1000)
    port = free_port()
    moto = _start_moto(port)
    endpoint = f"http://127.0.0.1:{port}"
    proxy = None
    scratch = tempfile.TemporaryDirectory(prefix="finalize-bench-")
    try:
        _wait_for(endpoint)
        fast = s3_options(endpoint)
        s3fs.S3FileSystem(**fast).mkdir("finalize-bench")
        proxy = FaultProxy(endpoint, every=0, faults=("503",))
        work = Path(scratch.name)
        model = write_stub_model_dir(work / "model")
        src = str(work / "in.parquet")
        ids = [f"row-{i}" for i in range(args.splits)]
        pq.write_table(pa.table({"id": ids, "prompt": [f"hi {i}" for i in ids]}), src, row_group_size=1)
        rows = [
            _measure(label, src, model, f"s3://finalize-bench/{label}", fast, proxy, concurrency)
            for label, concurrency in (("concurrent", parts.PART_READ_CONCURRENCY), ("serial", 1))
        ]
    finally:
        if proxy is not None:
            proxy.stop()
        moto.kill()
        moto.wait()
        scratch.cleanup()
    result = {"splits": args.splits, "latency_ms": args.latency_ms, "runs": rows}
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        (args.out / f"finalize-latency-{stamp}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"{args.splits} splits, {args.latency_ms:g} ms a request")
    print(f"{'reads':<11} {'finalize s':>10} {'requests':>9} {'status s':>9} {'requests':>9}")
    for row in rows:
        print(
            f"{row['reads']:<11} {row['finalize_s']:>10} {row['finalize_requests']:>9} "
            f"{row['status_s']:>9} {row['status_requests']:>9}"
        )
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
