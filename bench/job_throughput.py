"""The whole job against the bare engine: `shardinfer submit` on Parquet shards, then the engine's
own step loop on the same rows, in one invocation.

    python bench/job_throughput.py --workload dense-small|dense-8b|moe-16b [--rows 1024]
                                   [--master local] [--job-conf KEY=VALUE]... [--out bench/results]
    python bench/job_throughput.py --workload tiny --rows 64 --device cpu     # a CPU smoke run
    python bench/job_throughput.py --workload demo --out-range 64 96 [--job-conf engine.speculative=mtp]
    python bench/job_throughput.py --workload dense-8b --skip-engine --record /tmp/rec.jsonl
    python bench/job_throughput.py --workload dense-8b --skip-engine --replay /tmp/rec.jsonl:0.8 \
                                   --job-conf engine.speculative=ngram [--job-conf engine.speculative_depth=3]

Workload `demo` is the bundled demo model (trained, with an MTP layer: the one checkpoint here
whose drafts are accepted, so the one where speculation can shorten a job's tail) on chat tasks of
the kinds it was trained on, through the `messages` column and its chat template, decoded
greedily, stopping at its end of sequence (`max_tokens` is only a cap there).

Writes `--files` Parquet files of text prompts (U[in-range] tokens each) with a per-row
`max_tokens` column (U[out-range]) used as an override, runs `python -m shardinfer submit` as a
subprocess (ignore_eos, logprobs=1, split_rows=128 unless `--job-conf` says otherwise) with
`job.timeline_path` set, and then builds an engine in this process and steps it over the same
prompts and lengths. Reports (and writes `job-<workload>-<stamp>.json` under `--out`):

    job_output_tok_s     completion tokens / job wall (process start to exit)
    engine_output_tok_s  the same tokens / the engine's generate wall (engine start excluded)
    steady_ratio         job vs engine tokens/s over the middle 80% of completed tokens, each
                         from its own timeline (the job's: pipeline/timeline.py)
    wall_ratio           job wall / (engine start + generate)
    startup_s            import, job planning, engine build (with the engine's own phases when
                         it times them), first step, first committed split, from process start
    gpu_idle_fraction    device time between the job's first and last step launch with nothing
                         queued by the step loop
    peak_rss_mb          the job process's peak RSS (its workers' with --master local[N])

--record and --replay measure speculative decoding in a job on a random-weight checkpoint, as
bench/spec_decode.py does for the engine: the first run records every row's output
(shardinfer.testing.replay_drafter), the second replays it as drafts, each token right with
probability ALPHA (so the drafts of the job's tail are as good as those of its start). Both rows
carry `output_digest` (a hash of every committed row's token ids): equal digests mean speculative
decoding wrote the plain run's tokens.

`python bench/record.py` adds the JSON to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.job_timeline import job_startup, steady_rate, tail_seconds, timeline_points
from bench.workloads import SHAPES, add_step_limit_args, bench_commit, build_checkpoint
from shardinfer.testing.replay_drafter import ENV as REPLAY_ENV

DEMO = Path(__file__).resolve().parent.parent / "examples" / "models" / "tiny-dsv3-demo"

IMPORTS = "import torch, shardinfer.engine.llm_engine, shardinfer.pipeline.job, shardinfer.jobs.cli"


def _child_env() -> dict[str, str]:
    """The environment of the job subprocess: this checkout first on the path, the caller's path after it."""
    paths = [str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))


def make_rows(
    model_dir: Path, n: int, in_range: tuple[int, int], out_range: tuple[int, int], seed: int = 0
) -> list[dict[str, Any]]:
    """n rows of text whose token counts are about U[in_range] (text decoded from random ids, so its
    re-encoding differs a little) and a max_tokens drawn from U[out_range]."""
    from shardinfer.engine.tokenizer import Tokenizer

    tok = Tokenizer(model_dir)
    vocab = tok._tok.get_vocab_size()
    special = len(tok._tok.get_added_tokens_decoder())
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        ids = [rng.randrange(special, vocab) for _ in range(rng.randint(*in_range))]
        rows.append({"id": f"row-{i:07d}", "prompt": tok.decode(ids), "max_tokens": rng.randint(*out_range)})
    return rows


def demo_rows(n: int, out_range: tuple[int, int], seed: int = 0) -> list[dict[str, Any]]:
    """n chat tasks of the kinds the demo model was trained on, each with a max_tokens cap from
    U[out_range]."""
    from bench.spec_decode import demo_chats

    rng = random.Random(seed)
    return [
        {"id": f"row-{i:07d}", "messages": chat, "max_tokens": rng.randint(*out_range)}
        for i, chat in enumerate(demo_chats(n))
    ]


def sampling(args: argparse.Namespace) -> dict[str, Any]:
    """The rows' sampling settings besides max_tokens: random weights decode to a fixed length
    (ignore_eos), the demo model to its own end of sequence."""
    if args.workload == "demo":
        return {"temperature": 0.0, "ignore_eos": False}
    return {"temperature": 1.0, "ignore_eos": True}


def write_shards(rows: list[dict[str, Any]], directory: Path, files: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    per = -(-len(rows) // files)
    for f in range(files):
        chunk = rows[f * per : (f + 1) * per]
        if chunk:
            pq.write_table(
                pa.Table.from_pylist(chunk), directory / f"prompts-{f:02d}.parquet", row_group_size=128
            )


def job_spec(args: argparse.Namespace, model_dir: Path, input_glob: str, output: Path, timeline: Path) -> str:
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    prompt = 'messages_column = "messages"' if args.workload == "demo" else 'prompt_column = "prompt"'
    sample = sampling(args)
    return f"""[job]
seed = 1
split_rows = 128
timeline_path = {json.dumps(str(timeline))}
[input]
path = {json.dumps(input_glob)}
id_column = "id"
{prompt}
override_columns = ["max_tokens"]
[model]
path = {json.dumps(str(model_dir))}
device = "{args.device}"
dtype = "{dtype}"
[engine]
{engine_toml(args)}
[sampling]
temperature = {sample["temperature"]}
ignore_eos = {json.dumps(sample["ignore_eos"])}
logprobs = 1
[output]
path = {json.dumps(str(output))}
"""


# --job-conf keys that set numerics: the engine run takes them too, so both sides of the comparison
# compute the same thing (FP8 weights and cache in the job and bf16 in the engine would compare two
# different workloads).
NUMERICS_CONF = {"model.quantization": "quantization", "engine.kv_cache_dtype": "kv_cache_dtype"}


def numerics_conf(job_conf: list[str]) -> dict[str, Any]:
    """The engine arguments of the --job-conf entries in NUMERICS_CONF, values parsed as the job parses them."""
    from shardinfer.jobs.spec import parse_conf

    parsed = (parse_conf(item, "--job-conf")[:2] for item in job_conf)
    return {NUMERICS_CONF[key]: value for key, value in parsed if key in NUMERICS_CONF}


def job_engine_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The job's engine settings as recorded: the spec's (engine_kwargs), the numerics keys, and any
    --job-conf engine.* key over them, typed as the job parses them."""
    from shardinfer.jobs.spec import parse_conf

    parsed = (parse_conf(item, "--job-conf")[:2] for item in args.job_conf)
    given = {key.removeprefix("engine."): value for key, value in parsed if key.startswith("engine.")}
    return {**engine_kwargs(args), **numerics_conf(args.job_conf), **given}


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "batch_invariant": args.batch_invariant == "on",
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "max_model_len": args.max_model_len,
    }


def engine_toml(args: argparse.Namespace) -> str:
    """The spec's [engine] table; a setting left to the engine (None) is not written."""
    return "\n".join(f"{k} = {json.dumps(v)}" for k, v in engine_kwargs(args).items() if v is not None)


def run_job(args: argparse.Namespace, spec_path: Path, log_path: Path) -> tuple[float, float, int, float]:
    """Runs the job (run_measured): its peak RSS is the job's own, with its workers'."""
    cmd = [sys.executable, "-m", "shardinfer", "submit", "--master", args.master, "--log-format", "json"]
    for conf in args.job_conf:
        cmd += ["--conf", conf]
    cmd.append(str(spec_path))
    env = _child_env()
    if args.triton_cache == "cold":  # an empty Triton cache: the job compiles every kernel it runs
        env["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-cold-")
    env["SHARDINFER_PRECOMPILE"] = "1" if args.precompile == "on" else "0"
    if args.record:
        Path(args.record).write_text("")  # the recording appends: start it empty
        env[REPLAY_ENV] = f"record:{args.record}"
    elif args.replay:
        env[REPLAY_ENV] = f"replay:{args.replay}"
    return run_measured(cmd, log_path, env)


# Runs argv[2:] and writes "exit-code peak-rss-kB" of it to argv[1]. A process forked from this one
# counts this one's resident memory until it execs (a bench that built a checkpoint: gigabytes), so
# the command is started from this small interpreter instead.
_RSS_PROBE = (
    "import resource, subprocess, sys\n"
    "code = subprocess.run(sys.argv[2:]).returncode\n"
    "kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "open(sys.argv[1], 'w').write(f'{code} {kb}')\n"
)


def run_measured(
    cmd: list[str], log_path: Path, env: dict[str, str] | None = None
) -> tuple[float, float, int, float]:
    """Runs cmd with its output in log_path; returns (spawn and exit time as wall-clock seconds, exit
    code, cmd's peak RSS in MB with its descendants'). The times include the probe interpreter's
    start (tens of milliseconds)."""
    probe_out = log_path.with_name(log_path.name + ".rss")
    with open(log_path, "w") as log:
        spawned = time.time()
        subprocess.run(
            [sys.executable, "-c", _RSS_PROBE, str(probe_out), *cmd],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        exited = time.time()
    code, kb = probe_out.read_text().split()
    probe_out.unlink()
    return spawned, exited, int(code), int(kb) / 1024


def output_digest(output: Path) -> str:
    """A hash of every row's token ids in the job's output (a row committed twice counts once)."""
    import hashlib

    import pyarrow.parquet as pq

    rows: dict[tuple[str, int], list[int]] = {}
    for part in sorted(output.glob("part-*.parquet")):
        table = pq.read_table(part, columns=["row_id", "sample_index", "token_ids"]).to_pylist()
        for r in table:
            rows[(r["row_id"], r["sample_index"])] = r["token_ids"] or []
    return hashlib.sha256(json.dumps(sorted(rows.items())).encode()).hexdigest()


def import_seconds() -> float:
    """Import time of what a job process imports, in a fresh interpreter (page cache warm)."""
    code = f"import time; t = time.perf_counter(); {IMPORTS}; print(time.perf_counter() - t)"
    env = _child_env()
    return float(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
        ).stdout.strip()
    )


def run_engine(args: argparse.Namespace, model_dir: Path, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The engine's own step loop over the same prompts and lengths (what LLM.generate runs)."""
    from bench.gpu_timing import copy_bandwidth, decode_bytes
    from shardinfer import LLM, SamplingParams

    # Measured before the engine takes its KV budget (the copy needs 4 GiB of free memory).
    bandwidth = copy_bandwidth() if args.device == "cuda" else None
    t0 = time.perf_counter()
    llm = LLM(
        model_dir,
        device=args.device,
        dtype="bfloat16" if args.device == "cuda" else "float32",
        **engine_kwargs(args),
        **numerics_conf(args.job_conf),
    )
    start_s = time.perf_counter() - t0
    engine = llm.llm_engine
    step_bytes = decode_bytes(engine)
    running = engine.scheduler.running
    floor_s = 0.0
    t1 = time.time()
    tokenizer = llm.get_tokenizer()
    for i, row in enumerate(rows):
        params = SamplingParams(max_tokens=row["max_tokens"], logprobs=1, seed=i, **sampling(args))
        if "messages" in row:  # as LLM.chat renders and encodes a conversation
            text = tokenizer.apply_chat_template(row["messages"], add_generation_prompt=True)
            engine.add_request(f"r{i}", tokenizer.encode(text, add_special_tokens=False), params)
        else:
            engine.add_request(f"r{i}", row["prompt"], params)
    points: list[tuple[float, int]] = [(t1, 0)]
    tokens = 0
    while engine.has_unfinished():
        if bandwidth is not None:  # each step's HBM floor, at the contexts it is about to read
            context = sum(r.num_tokens for r in running)
            floor_s += step_bytes.floor_s(len(running), context, bandwidth)
        done = sum(len(out.outputs[0].token_ids) for out in engine.step())
        if done:
            tokens += done
            points.append((time.time(), tokens))
    wall = time.time() - t1
    phases = dict(getattr(engine, "startup_phases", {}) or {})
    del engine, llm
    return {
        "engine_start_s": start_s,
        "generate_s": wall,
        "completion_tokens": tokens,
        "points": points,
        "startup_phases": phases,
        "floor_s": floor_s if bandwidth is not None else None,
        "copy_bandwidth_GBps": bandwidth / 1e9 if bandwidth is not None else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="dense-small", choices=[*sorted(SHAPES), "demo"])
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--in-range", type=int, nargs=2, default=(100, 1024))
    ap.add_argument("--out-range", type=int, nargs=2, default=(100, 1024))
    ap.add_argument("--master", default="local", help="the job's --master (local, local[N], ray, ...)")
    ap.add_argument(
        "--job-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra --conf for the job, e.g. job.max_splits_in_flight=8 (repeatable)",
    )
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--batch-invariant", default="on", choices=["on", "off"])
    add_step_limit_args(ap)
    ap.add_argument(
        "--max-model-len", type=int, default=None, help="default 4096; 1024 for demo (its positions)"
    )
    ap.add_argument("--skip-engine", action="store_true", help="run the job only")
    ap.add_argument(
        "--triton-cache",
        default="warm",
        choices=["warm", "cold"],
        help="cold: the job gets an empty Triton cache directory, as on a fresh machine",
    )
    ap.add_argument(
        "--precompile",
        default="on",
        choices=["on", "off"],
        help="the job's SHARDINFER_PRECOMPILE (engine/precompile.py)",
    )
    replay = ap.add_mutually_exclusive_group()
    replay.add_argument("--record", metavar="PATH", help="record every row's output to PATH (for --replay)")
    replay.add_argument(
        "--replay",
        metavar="PATH:ALPHA",
        help="draft each row's recorded output, each token right with probability ALPHA (needs a drafting "
        "engine: --job-conf engine.speculative=ngram)",
    )
    ap.add_argument("--ckpt-dir", default=str(Path(tempfile.gettempdir()) / "shardinfer-bench"))
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    if args.replay:
        path, _, alpha = args.replay.rpartition(":")
        try:
            ok = Path(path).is_file() and 0.0 <= float(alpha) <= 1.0
        except ValueError:
            ok = False
        if not ok:
            ap.error(
                f"--replay {args.replay!r}: need PATH:ALPHA, PATH a recording made with --record, ALPHA in [0, 1]"
            )
        modes = [
            c.partition("=")[2].strip("'\"") for c in args.job_conf if c.startswith("engine.speculative=")
        ]
        if modes != ["ngram"]:
            ap.error(
                "--replay replaces the prompt-lookup drafter's proposals: add --job-conf engine.speculative=ngram"
            )

    if args.max_model_len is None:
        args.max_model_len = 1024 if args.workload == "demo" else 4096
    if args.workload == "demo":
        model_dir = DEMO
    else:
        model_dir = build_checkpoint(args.workload, Path(args.ckpt_dir) / args.workload, device=args.device)
    if args.device == "cuda":
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()  # a checkpoint built just now must not shrink the job's KV cache
    rows = (
        demo_rows(args.rows, tuple(args.out_range))
        if args.workload == "demo"
        else make_rows(model_dir, args.rows, tuple(args.in_range), tuple(args.out_range))
    )
    now = dt.datetime.now(dt.UTC)
    stamp = now.strftime("%Y%m%d-%H%M%S")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="job-bench-") as tmp:
        work = Path(tmp)
        write_shards(rows, work / "input", args.files)
        timeline_path = work / "timeline.jsonl"
        spec = work / "job.toml"
        spec.write_text(
            job_spec(args, model_dir, str(work / "input" / "*.parquet"), work / "output", timeline_path)
        )
        log_path = out_dir / f"job-{args.workload}-{stamp}.log"
        spawned, exited, code, peak_rss_mb = run_job(args, spec, log_path)
        if code != 0:
            sys.exit(f"the job exited {code}; see {log_path}")
        digest = output_digest(work / "output")
        events = [json.loads(line) for line in timeline_path.read_text().splitlines() if line.strip()]
    job_wall = exited - spawned
    commits = [e for e in events if e["event"] == "split_committed" and e.get("won")]
    job_tokens = sum(int(e["completion_tokens"]) for e in commits)
    startup = job_startup(events, spawned, import_seconds())
    device = next((e for e in events if e["event"] == "device"), {})
    engine = None if args.skip_engine else run_engine(args, model_dir, rows)
    job_rate = job_tokens / job_wall
    steady_job = steady_rate(timeline_points(events))
    result: dict[str, Any] = {
        "bench": "job_throughput",
        "workload": args.workload,
        "gpu": _gpu_name(args.device),
        "commit": bench_commit(),
        "date": now.isoformat(),
        "batch_invariant": args.batch_invariant == "on",
        "rows": args.rows,
        "master": args.master,
        # A Ray job either joins a running cluster (RAY_ADDRESS) or starts one, a fixed cost of its own.
        "ray_cluster": (
            ("running" if os.environ.get("RAY_ADDRESS") else "started by the job")
            if args.master.startswith("ray")
            else None
        ),
        "device": args.device,
        "job_conf": args.job_conf,
        "triton_cache": args.triton_cache,
        "precompile": args.precompile,
        "job_output_tok_s": job_rate,
        "engine_output_tok_s": None,
        "steady_ratio": None,
        "wall_ratio": None,
        "startup_s": startup,
        "time_to_first_commit_s": startup.get("first_commit_s"),
        "gpu_idle_fraction": device.get("gpu_idle_fraction"),
        "device_timeline": device,
        "peak_rss_mb": peak_rss_mb,
        "job_wall_s": job_wall,
        "completion_tokens": job_tokens,
        "job_steady_tok_s": steady_job,
        "tail_s": tail_seconds(events),
        "splits_committed": len(commits),
        "in_range": list(args.in_range),
        "out_range": list(args.out_range),
        "files": args.files,
        "engine_settings": job_engine_settings(args),
        "output_digest": digest,
        "replay_alpha": float(args.replay.rpartition(":")[2]) if args.replay else None,
    }
    if engine is not None:
        steady_engine = steady_rate(engine.pop("points"))
        result.update(
            engine_output_tok_s=engine["completion_tokens"] / engine["generate_s"],
            steady_ratio=steady_job / steady_engine if steady_job and steady_engine else None,
            wall_ratio=job_wall / (engine["engine_start_s"] + engine["generate_s"]),
            engine=engine,
            engine_steady_tok_s=steady_engine,
        )
        if engine["floor_s"]:
            # Tokens over the summed step floors: the engine's rate if every step only read its bytes.
            floor_tok_s = engine["completion_tokens"] / engine["floor_s"]
            result.update(
                floor_tok_s=floor_tok_s,
                engine_floor_fraction=result["engine_output_tok_s"] / floor_tok_s,
                job_floor_fraction=job_rate / floor_tok_s,
            )
        if engine["completion_tokens"] != job_tokens:
            print(f"warning: the job generated {job_tokens} tokens, the engine {engine['completion_tokens']}")
    path = out_dir / f"job-{args.workload}-{stamp}.json"
    path.write_text(json.dumps(result, indent=2))
    print(format_table(result))
    print("RESULT " + json.dumps(result))


def _gpu_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(0) if device == "cuda" else "cpu"


def format_table(r: dict[str, Any]) -> str:
    def f(v: Any, spec: str) -> str:
        return "—" if v is None else format(v, spec)

    s = r["startup_s"]
    lines = [
        f"{'workload':<12} {'rows':>6} {'job tok/s':>10} {'engine tok/s':>13} {'steady':>7} {'wall':>6} "
        f"{'start s':>8} {'1st commit s':>13} {'gpu idle':>9} {'rss MB':>7}",
        f"{r['workload']:<12} {r['rows']:>6} {f(r['job_output_tok_s'], '.0f'):>10} "
        f"{f(r['engine_output_tok_s'], '.0f'):>13} {f(r['steady_ratio'], '.3f'):>7} {f(r['wall_ratio'], '.2f'):>6} "
        f"{f(s.get('first_step_s'), '.1f'):>8} {f(r['time_to_first_commit_s'], '.1f'):>13} "
        f"{f(r['gpu_idle_fraction'], '.3f'):>9} {f(r['peak_rss_mb'], '.0f'):>7}",
        "startup: " + ", ".join(f"{k} {v:.2f}" for k, v in s.items() if isinstance(v, float)),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
