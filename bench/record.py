"""Rebuild bench/RESULTS.md's tables from every result JSON under bench/results/.

    python bench/record.py

Throughput rows (bench/throughput.py): date, GPU, commit, workload, batch invariance, shardinfer and
transformers output tok/s, their ratio, and the decode step's fraction of its HBM floor.
Structured-output rows (bench/structured_decode.py): decode step time with every request under a
JSON Schema against the same requests unconstrained, and the relative cost. Job rows
(bench/job_throughput.py, `job-*.json`): the whole job against the engine on the same rows.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent
HEADER = """# Benchmark results

Measured on an H200 with `bench/throughput.py` (raw JSON in `bench/results/`). Output tok/s
counts generated tokens over wall time; `decode/floor` is the HBM floor of one decode step at the
largest steady batch (weights + that batch's KV over the measured copy bandwidth) divided by the
measured step time (1.0 = at the floor). The transformers column is its `generate_batch`
(continuous batching) on the same checkpoint, with fewer requests and a fixed output length (see
each JSON's `transformers` entry), or static `generate` where `generate_batch` cannot run the model.
Since 2026-11-30 04:50 each JSON's `slow_step_stacks` shows where steps over 150 ms spent their
time: a run on a machine whose Triton cache is cold includes kernel compiles there (moe-16b at
7b9f5a6, 05:00: 8611 tok/s with 4.85 s of prefill-carrying steps; warm, 05:03-05:04: 2.4 s).
A run with FP8 weights or an FP8 KV cache names them after its workload; `vs baseline` is its
tok/s over the same requests run with the checkpoint's weights and a bf16 cache in the same
invocation (`--baseline`; — where none ran).

| date (UTC) | GPU | commit | workload | batch_invariant | requests | shardinfer tok/s | transformers tok/s | ratio | decode/floor | vs baseline |
|---|---|---|---|---|---|---|---|---|---|---|
"""


SO_HEADER = """
## Structured outputs

`bench/structured_decode.py`: every request under a JSON Schema (random-init weights, a 32k
byte-level BPE vocabulary), then the same requests unconstrained with the lengths the constrained
run produced. Mean pure-decode step time of each, the host time filling grammar masks per step,
and the cost (constrained / plain - 1; target <= +5%). "accept": how a step's tokens advance the
matchers (one batched call on llguidance's threads, or one by one; — before it was recorded).
"stall-free": the cost over decode steps paired by order, leaving out steps over 3x their run's
median in either run (one-off stalls: Triton compiles mid-run, which hit either run).

| date (UTC) | GPU | commit | workload | requests | matchers | accept | mean batch | plain step ms | constrained step ms | mask fill ms | cost | stall-free |
|---|---|---|---|---|---|---|---|---|---|---|---|---|
"""


JOB_HEADER = """
## Jobs

`bench/job_throughput.py`: the whole `shardinfer submit` (Parquet shards in, committed parts
out; per-row max_tokens, ignore_eos, logprobs=1) against the engine's own step loop on the same
rows. Job tok/s: completion tokens over the job's wall from process start to exit; engine tok/s:
over the generate wall alone. steady: job vs engine over the middle 80% of completed tokens;
wall: job wall / (engine start + generate); start: process start to the first step; idle: the
device's idle share between the job's first and last step launch; job steady tok/s: the job's own
rate over the middle 80% of its completed tokens (what a longer job tends to); tail s: how long
its last 5% of rows took (runs from before the count was kept show —); floor tok/s: the engine
run's tokens over the sum of its steps' HBM floors (its weights — a MoE model's by the experts its
rows are expected to touch — and each running request's KV read once per step at the measured
copy bandwidth), and job/floor the job's tok/s over it. A `ray` master either
started its own local cluster or joined a running one (`ray, running`); a job's `--conf` keys
other than the standard ones follow its workload.

| date (UTC) | GPU | commit | workload | batch_invariant | master | rows | job tok/s | job steady tok/s | engine tok/s | steady | wall | start s | 1st commit s | tail s | gpu idle | peak RSS MB | floor tok/s | job/floor |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
"""


SPEC_HEADER = """
## Speculative decoding

`bench/spec_decode.py`: plain decoding and speculative decoding in the same run, drafted by the
replay drafter (the plain run's own continuation, each draft token wrong with probability
1 - alpha); output tok/s over the whole generate call; "accept": drafts accepted / drafted;
"identical": speculative outputs equal plain ones, tokens and logprobs. "plain/floor" and
"spec/floor": each run's tok/s over its HBM floor (its steps, each reading its weights and its
contexts' KV once at the measured copy bandwidth; — for runs from before the floor was recorded).
A step's weights are the dense ones and, for a MoE model, the routed experts its rows are expected
to touch (bench/gpu_timing.StepBytes); the rows before 2026-12-02 11:00 counted every expert, so
moe-16b's small batches read above 1.0 there.

| date (UTC) | GPU | commit | workload | batch | alpha | depth | scheduled | plain tok/s | spec tok/s | speedup | accept | identical | plain/floor | spec/floor |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
"""


def spec_rows(records: list[dict]) -> list[str]:
    rows = []
    for r in sorted(records, key=lambda r: str(r.get("date", ""))):
        if not str(r.get("workload", "")).startswith(("dense", "moe")) or "alpha" not in str(r.get("points")):
            continue
        if r.get("gpu") == "cpu":
            continue
        for p in r["points"]:
            rows.append(
                f"| {r['date'][:16].replace('T', ' ')} | {r['gpu']} | {r.get('commit') or '—'} | "
                f"{r['workload']} | {p['batch']} | {p['alpha']} | {p['depth']} | {p['scheduled']} | "
                f"{p['plain_tok_s']:.0f} | {p['spec_tok_s']:.0f} | {p['spec_tok_s'] / p['plain_tok_s']:.2f} | "
                f"{fmt(p.get('acceptance'), '.2f')} | {p['identical']} | "
                f"{fmt(_ratio(p['plain_tok_s'], p.get('plain_floor_tok_s')), '.2f')} | "
                f"{fmt(_ratio(p['spec_tok_s'], p.get('spec_floor_tok_s')), '.2f')} |"
            )
    return rows


DEMO_SPEC_HEADER = """
### Real drafters on the demo model

`bench/spec_decode.py --workload demo`: the bundled trained demo model (4 layers and one MTP layer)
on generated chat tasks, plain decoding beside prompt lookup and beside its MTP layer at a fixed
depth, each on a fresh engine; tok/s over one generate call. Its answers are short (steps: the
speculative run's engine steps, prefill included), so these say what the drafters accept, not
what they gain on a long decode: at this size a step is bound by its launches, not its bytes.

| date (UTC) | GPU | commit | drafter | depth | batch | temperature | plain tok/s | spec tok/s | speedup | accept | identical | steps |
|---|---|---|---|---|---|---|---|---|---|---|---|---|
"""


def demo_spec_rows(records: list[dict]) -> list[str]:
    rows = []
    for r in sorted(records, key=lambda r: str(r.get("date", ""))):
        if r.get("workload") != "demo" or r.get("gpu") in (None, "cpu") or "points" not in r:
            continue
        for p in r["points"]:
            rows.append(
                f"| {r['date'][:16].replace('T', ' ')} | {r['gpu']} | {r.get('commit') or '—'} | "
                f"{p['drafter']} | {p['depth']} | {p['batch']} | {p['temperature']} | "
                f"{p['plain_tok_s']:.0f} | {p['spec_tok_s']:.0f} | {p['spec_tok_s'] / p['plain_tok_s']:.2f} | "
                f"{fmt(p.get('acceptance_rate'), '.2f')} | {p['identical']} | {p['steps']:.0f} |"
            )
    return rows


SCORE_HEADER = """
## Scoring (loglikelihood)

`bench/loglikelihood_throughput.py`: a 4-choice task with 512-token contexts scored by shardinfer's
lm-evaluation-harness model, beside the harness's own `hf` model (transformers, same checkpoint,
same dtype) on the first documents in the same run. Continuations/s and input tokens/s over each
side's scoring wall; prefix hits: the share of prompt tokens served from the prefix cache (a
context's continuations share its KV). max |Δ|: the largest difference of a continuation's summed
logprob between the two on the documents both scored (bf16 numerics of two different kernel sets;
the CPU tests hold float32 agreement within 1e-4).

| date (UTC) | GPU | commit | workload | docs | shardinfer cont/s | input tok/s | prefix hits | hf docs | hf cont/s | ratio | max abs logprob diff |
|---|---|---|---|---|---|---|---|---|---|---|---|
"""


def score_rows(records: list[dict]) -> list[str]:
    rows = []
    for r in sorted(records, key=lambda r: str(r.get("date", ""))):
        if r.get("bench") != "loglikelihood" or r.get("gpu") == "cpu":
            continue
        ours, hf = r["shardinfer"], r.get("hf") or {}
        rows.append(
            f"| {r['date'][:16].replace('T', ' ')} | {r['gpu']} | {r.get('commit') or '—'} | {r['workload']} | "
            f"{r['docs']} | {ours['continuations_per_s']:.1f} | {ours['input_tokens_per_s']:.0f} | "
            f"{fmt(ours.get('prefix_cache_hit_rate'), '.2f')} | {r.get('hf_docs', '—')} | "
            f"{fmt(hf.get('continuations_per_s'), '.1f')} | {fmt(r.get('continuations_per_s_ratio'), '.2f')} | "
            f"{fmt(r.get('max_abs_logprob_diff'), '.3f')} |"
        )
    return rows


STANDARD_CONF = ("job.split_rows=", "engine.num_kv_blocks=")  # sizing, not what is being compared

STARTUP_HEADER = """
## Start-up with an empty kernel cache

`bench/startup.py`: each mode a fresh process that builds the engine and generates a first batch
(prompts × prompt length, 16 tokens out). `cold`: an empty Triton cache directory; `warm`: the one
the previous cold run filled. `ahead on`/`off`: compiling the start-up's kernels ahead on a thread
pool (engine/precompile.py) or each at its first launch. Seconds from the process's start. Late:
kernel variants the first batch still compiled at their launch.

| date (UTC) | GPU | commit | workload | CPUs | mode | import | engine build | compiled ahead | warm-up | graph capture | first batch | total | variants ahead | late |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
"""


def startup_rows(records: list[dict]) -> list[str]:
    out = []
    for r in sorted(records, key=lambda r: str(r.get("date", ""))):
        if r.get("bench") != "startup" or not r.get("gpu"):
            continue
        for run in r["runs"]:
            ph, ahead = run["phases"], run.get("compiled_ahead") or {}
            cache, precompile = run["mode"].split("-")
            out.append(
                f"| {r['date'][:16].replace('T', ' ')} | {r['gpu']} | {r.get('commit') or '—'} | {_numerics(r)}, "
                f"{r['requests']} × {r['prompt_len']} | {r.get('cpus', '—')} | {cache}, ahead {precompile} | "
                f"{run['import_s']:.1f} | {run['engine_build_s']:.1f} | {fmt(ph.get('precompile_s'), '.1f')} | "
                f"{fmt(ph.get('warm_up_s'), '.1f')} | {fmt(ph.get('graph_capture_s'), '.1f')} | "
                f"{run['first_batch_s']:.1f} | {run['total_s']:.1f} | {ahead.get('variants', '—')} | "
                f"{len(run.get('compiled_in_first_batch', []))} |"
            )
    return out


def job_row(r: dict) -> str:
    start = r.get("startup_s") or {}
    master = r.get("master", "local")
    if r.get("ray_cluster") == "running":
        master += ", running"
    workload = r["workload"] + "".join(
        f", {c}" for c in r.get("job_conf") or [] if not c.startswith(STANDARD_CONF)
    )
    if r.get("replay_alpha") is not None:
        workload += f", replay drafts at alpha {r['replay_alpha']}"
    if r.get("triton_cache") == "cold":  # job_throughput.py --triton-cache cold
        workload += ", empty kernel cache"
    if r.get("precompile") == "off":
        workload += ", no compiling ahead"
    return (
        f"| {r['date'][:16].replace('T', ' ')} | {r['gpu']} | {r.get('commit') or '—'} | {workload} | "
        f"{r['batch_invariant']} | {master} | {r['rows']} | {fmt(r['job_output_tok_s'], '.0f')} | "
        f"{fmt(r.get('job_steady_tok_s'), '.0f')} | {fmt(r.get('engine_output_tok_s'), '.0f')} | {fmt(r.get('steady_ratio'), '.3f')} | "
        f"{fmt(r.get('wall_ratio'), '.2f')} | {fmt(start.get('first_step_s'), '.1f')} | "
        f"{fmt(r.get('time_to_first_commit_s'), '.1f')} | {fmt(r.get('tail_s'), '.1f')} | "
        f"{fmt(r.get('gpu_idle_fraction'), '.3f')} | "
        f"{fmt(r.get('peak_rss_mb'), '.0f')} | {fmt(r.get('floor_tok_s'), '.0f')} | "
        f"{fmt(r.get('job_floor_fraction'), '.2f')} |"
    )


def _numerics(r: dict) -> str:
    """The workload, with the weights' and the KV cache's format where a run chose one."""
    extra = [
        f"{what} {r[key]}"
        for key, what in (("quantization", "weights"), ("kv_cache_dtype", "KV"))
        if r.get(key) not in (None, "auto")
    ]
    if r.get("fp8_tiling") not in (None, "default"):  # throughput.py --fp8-tiling
        extra.append(f"FP8 tiling {r['fp8_tiling']}")
    if r.get("bf16_tilings") == "default":  # no measured bf16 tilings for this GPU model
        extra.append("bf16 default tilings")
    if r.get("quantization") == "fp8" and r.get("fp8_tilings") == "measured":
        extra.append("FP8 measured tilings")  # this GPU model's file, not the defaults
    if r.get("omp_num_threads_env"):  # set in the environment of the run (engine/host_threads.py)
        extra.append(f"OMP_NUM_THREADS={r['omp_num_threads_env']}")
    if r.get("warm_engine_requests"):  # throughput.py --warm-engine-requests: the call began with it
        extra.append(f"after an untimed engine of {r['warm_engine_requests']} requests")
    settings = r.get("settings") or {}
    extra += [
        f"{name} {settings[name]}"
        for name in _SCHEDULING
        if settings.get(name) not in (None, _default(name, str(r.get("date", ""))))
    ]
    return ", ".join([r["workload"], *extra])


# Engine settings a run may change from their defaults without changing a bit of its output: a
# row names them, so two runs of one workload are told apart.
_SCHEDULING = ("max_num_seqs", "max_num_batched_tokens")
# The GPU's (max_num_seqs, max_num_batched_tokens) defaults, each from the date it took effect;
# the last is the engine's own (DEVICE_STEP_DEFAULTS, checked by the tests).
GPU_STEP_DEFAULTS_SINCE = (
    ("", (256, 8192)),
    ("2026-12-06T04:30", (512, 16384)),
    ("2026-12-06T06:38", (1024, 16384)),
)


def _default(name: str, date: str) -> object:
    """The engine's default on a GPU when the run was made. Since max_num_seqs depends on the KV
    cache (config.default_num_seqs), the benches record it as None unless given: never named."""
    defaults = [values for since, values in GPU_STEP_DEFAULTS_SINCE if since <= date][-1]
    return defaults[_SCHEDULING.index(name)]


def variant_changes(variant: dict) -> str:
    """What a same-call variant run changed (throughput.py's --variant-* options), as one string."""
    kv = variant.get("kv_cache_dtype")
    parts = (variant.get("fp8_tiling"), variant.get("flags"), variant.get("settings"), kv and f"KV {kv}")
    return " ".join(x for x in parts if x)


def _second_run_rows(r: dict) -> list[str]:
    """Rows for a throughput JSON's second run of the same requests in the same call: the fused
    launches off (--compare-unfused) or a variant's tilings or settings (--variant-*), and the main
    configuration run again after a variant (--repeat-main)."""
    out = []
    for key in ("unfused", "variant", "main_again"):
        other = r.get(key)
        if not other:
            continue
        if key == "unfused":
            what = "fused launches off (`--compare-unfused`, same call)"
        elif key == "variant":
            what = f"variant `{variant_changes(other)}` (same call)"
        else:
            what = "main configuration again, after the variant (same call)"
        decode = other.get("decode") or {}
        floor = decode["floor_ms"] / decode["median_step_ms"] if decode.get("median_step_ms") else None
        out.append(
            f"| {r['date'][:16].replace('T', ' ')} | {r['gpu']} | {r.get('commit') or '—'} | {_numerics(r)}, {what} | "
            f"{r['batch_invariant']} | {r.get('requests', '—')} | {fmt(other['output_tok_s'], '.0f')} | — | — | "
            f"{fmt(floor, '.2f')} | — |"
        )
    return out


def _ratio(value: float, floor: float | None) -> float | None:
    return value / floor if floor else None


def fmt(v: object, spec: str) -> str:
    return "—" if v is None else format(v, spec)


def main() -> None:
    rows = []
    records = [json.loads(path.read_text()) for path in (HERE / "results").glob("*.json")]
    for r in sorted(records, key=lambda r: str(r.get("date", ""))):
        if "shardinfer_output_tok_s" not in r:
            continue
        rows.append(
            f"| {r['date'][:16].replace('T', ' ')} | {r['gpu']} | {r.get('commit') or '—'} | {_numerics(r)} | "
            f"{r['batch_invariant']} | {r.get('requests', '—')} | {fmt(r['shardinfer_output_tok_s'], '.0f')} | "
            f"{fmt(r.get('transformers_output_tok_s'), '.0f')} | {fmt(r.get('ratio'), '.1f')} | "
            f"{fmt(r.get('decode_floor_fraction'), '.2f')} | {fmt(r.get('speedup_over_baseline'), '.2f')} |"
        )
        rows.extend(_second_run_rows(r))
    so_rows = []
    for r in sorted(records, key=lambda r: str(r.get("date", ""))):
        if r.get("bench") != "structured_decode" or r.get("device") != "cuda":
            continue
        c, p = r["constrained"], r["plain"]
        if r.get("independent_matchers"):
            matchers = "independent"
        elif r.get("templates"):  # copies spread over this many templates of the grammar
            matchers = f"copies of {r['templates']} templates"
        else:
            matchers = "shared copies"
        accept = {True: "batched", False: "one by one"}.get(r.get("parallel_accept"), "—")  # type: ignore[call-overload]
        stall_free = r.get("constrained_decoding_cost_stall_free")
        so_rows.append(
            f"| {r['date'][:16].replace('T', ' ')} | {r['gpu']} | {r.get('commit') or '—'} | {r['workload']} | "
            f"{r['requests']} | {matchers} | {accept} | {c['mean_decode_batch']:.0f} | "
            f"{p['mean_decode_step_ms']:.2f} | {c['mean_decode_step_ms']:.2f} | "
            f"{c['mask_fill_ms_per_decode_step']:.2f} | "
            f"{100 * (c['mean_decode_step_ms'] / p['mean_decode_step_ms'] - 1):+.0f}% | "
            f"{'—' if stall_free is None else f'{100 * stall_free:+.1f}%'} |"
        )
    job_rows = [
        job_row(r)
        for r in sorted(records, key=lambda r: str(r.get("date", "")))
        if r.get("bench") == "job_throughput" and r.get("device") == "cuda"
    ]
    text = HEADER + "\n".join(rows) + "\n"
    if so_rows:
        text += SO_HEADER + "\n".join(so_rows) + "\n"
    if job_rows:
        text += JOB_HEADER + "\n".join(job_rows) + "\n"
    sd_rows = spec_rows(records)
    if sd_rows:
        text += SPEC_HEADER + "\n".join(sd_rows) + "\n"
    demo_rows = demo_spec_rows(records)
    if demo_rows:
        text += DEMO_SPEC_HEADER + "\n".join(demo_rows) + "\n"
    sc_rows = score_rows(records)
    if sc_rows:
        text += SCORE_HEADER + "\n".join(sc_rows) + "\n"
    st_rows = startup_rows(records)
    if st_rows:
        text += STARTUP_HEADER + "\n".join(st_rows) + "\n"
    (HERE / "RESULTS.md").write_text(text)
    print(f"{len(rows)} throughput rows, {len(so_rows)} structured-output rows, {len(job_rows)} job rows")


if __name__ == "__main__":
    main()
