"""`make demo`: write prompt shards, run `shardinfer submit examples/demo/job.toml` on CPU, show results.

Everything it writes goes under demo-output/ (ignored by git). The bundled demo model
(examples/models/tiny-dsv3-demo) is used when present; otherwise a random-init tiny checkpoint
is built there first, so the demo runs on a fresh checkout with no download.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORK = REPO / "demo-output"
BUNDLED = REPO / "examples" / "models" / "tiny-dsv3-demo"
DS = "2024-01-01"  # the demo's "scheduled date": output goes to .../ds=2024-01-01


def model_path() -> Path:
    if (BUNDLED / "config.json").is_file():
        return BUNDLED
    fallback = WORK / "random-tiny-qwen3"
    if not (fallback / "config.json").is_file():
        from shardinfer.testing.tiny_checkpoint import make_tiny_checkpoint

        print(f"bundled demo model not found; building a random-init one in {fallback}")
        make_tiny_checkpoint(fallback, "qwen3")
    return fallback


def main() -> int:
    os.chdir(REPO)
    sys.path.insert(0, str(REPO / "examples" / "demo"))
    from make_demo_data import main as make_data

    print(f"1. prompt shards -> {make_data(str(WORK / 'prompts'))}", flush=True)
    model = model_path()
    output = WORK / "output" / f"ds={DS}"
    shutil.rmtree(output, ignore_errors=True)  # a fresh run each time (a re-run would just exit 0)
    cmd = [
        sys.executable,
        "-m",
        "shardinfer",
        "submit",
        "--master",
        "local[2]",
        "--run-id",
        f"demo__{DS}",
        "--conf",
        f"job.ds={DS}",
        "--conf",
        f"model.path={model}",
        "examples/demo/job.toml",
    ]
    print("2. " + " ".join(["shardinfer", *cmd[3:]]), flush=True)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    started = time.monotonic()
    code = subprocess.call(cmd, env=env)
    print(f"   exit code {code} after {time.monotonic() - started:.1f} s")
    if code != 0:
        return code
    show(output)
    return 0


def show(output: Path) -> None:
    """Query the committed output with DuckDB, through the file list in _SUCCESS (never a listing)."""
    import duckdb

    success = json.loads((output / "_SUCCESS").read_text())
    files = [str(output / f["path"]) for f in success["files"]]
    con = duckdb.connect()
    file_list = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
    con.execute(f"CREATE VIEW out AS SELECT * FROM read_parquet([{file_list}])")
    print("\n3. DuckDB over the committed files listed in _SUCCESS\n")
    print(
        con.sql("""
        SELECT row_id, kind, answer, text, status, finish_reason, completion_tokens AS toks,
               round(list_sum(token_logprobs), 3) AS logprob
        FROM out ORDER BY row_id LIMIT 8""")
    )
    print(
        con.sql("""
        SELECT kind, count(*) AS rows, round(avg((trim(text) = answer)::INT), 3) AS exact_match
        FROM out WHERE status = 'ok' GROUP BY kind ORDER BY kind""")
    )
    print(con.sql("SELECT row_id, error_code, error_message FROM out WHERE status = 'error' ORDER BY row_id"))
    summary = success["summary"]
    print(
        f"summary: {summary['rows_ok']} ok, {summary['rows_error']} error, {summary['prompt_tokens']} tokens in, "
        f"{summary['completion_tokens']} out, {summary['output_tokens_per_s']} tok/s, "
        f"prefix-cache hit rate {summary['prefix_cache_hit_rate']:.1%}, {summary['wall_time_s']} s"
    )


if __name__ == "__main__":
    sys.exit(main())
