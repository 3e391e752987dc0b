"""Rebuild bench/RESULTS.md's table from every result JSON under bench/results/.

    python bench/record.py

Each row: date, GPU, commit, workload, batch invariance, shardinfer and transformers output tok/s,
their ratio, and the decode step's fraction of its HBM floor.
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

| date (UTC) | GPU | commit | workload | batch_invariant | requests | shardinfer tok/s | transformers tok/s | ratio | decode/floor |
|---|---|---|---|---|---|---|---|---|---|
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
    (HERE / "RESULTS.md").write_text(HEADER + "\n".join(rows) + "\n")
    print(f"{len(rows)} rows")


if __name__ == "__main__":
    main()
