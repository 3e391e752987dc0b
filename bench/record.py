"""Rebuild bench/RESULTS.md's tables from every result JSON under bench/results/.

    python bench/record.py

Throughput rows (bench/throughput.py): date, GPU, commit, workload, batch invariance, shardinfer and
transformers output tok/s, their ratio, and the decode step's fraction of its HBM floor.
Structured-output rows (bench/structured_decode.py): decode step time with every request under a
JSON Schema against the same requests unconstrained, and the relative cost.
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

| date (UTC) | GPU | commit | workload | batch_invariant | requests | shardinfer tok/s | transformers tok/s | ratio | decode/floor |
|---|---|---|---|---|---|---|---|---|---|
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


def fmt(v: object, spec: str) -> str:
    return "—" if v is None else format(v, spec)


def main() -> None:
    rows = []
    records = [json.loads(path.read_text()) for path in (HERE / "results").glob("*.json")]
    for r in sorted(records, key=lambda r: str(r.get("date", ""))):
        if "shardinfer_output_tok_s" not in r:
            continue
        rows.append(f"| {r['date'][:16].replace('T', ' ')} | {r['gpu']} | {r.get('commit') or '—'} | {r['workload']} | "
                    f"{r['batch_invariant']} | {r.get('requests', '—')} | {fmt(r['shardinfer_output_tok_s'], '.0f')} | "
                    f"{fmt(r.get('transformers_output_tok_s'), '.0f')} | {fmt(r.get('ratio'), '.1f')} | "
                    f"{fmt(r.get('decode_floor_fraction'), '.2f')} |")
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
        so_rows.append(f"| {r['date'][:16].replace('T', ' ')} | {r['gpu']} | {r.get('commit') or '—'} | {r['workload']} | "
                       f"{r['requests']} | {matchers} | {accept} | {c['mean_decode_batch']:.0f} | "
                       f"{p['mean_decode_step_ms']:.2f} | {c['mean_decode_step_ms']:.2f} | "
                       f"{c['mask_fill_ms_per_decode_step']:.2f} | "
                       f"{100 * (c['mean_decode_step_ms'] / p['mean_decode_step_ms'] - 1):+.0f}% | "
                       f"{'—' if stall_free is None else f'{100 * stall_free:+.1f}%'} |")
    text = HEADER + "\n".join(rows) + "\n"
    if so_rows:
        text += SO_HEADER + "\n".join(so_rows) + "\n"
    (HERE / "RESULTS.md").write_text(text)
    print(f"{len(rows)} throughput rows, {len(so_rows)} structured-output rows")


if __name__ == "__main__":
    main()
