"""Write the demo's prompt shards: 300 chat tasks of the seven kinds the demo model was trained on.

The tasks come from the demo model's own task generators (tools/demo_training/tasks.py), kinds in
rotation. Each row has a `task_id`, chat `messages`, the task `kind`, the expected `answer` (passed
through to the output so DuckDB can score it), and an optional per-row `max_tokens`. Two rows
are broken on purpose (no messages, and a per-row max_tokens of -1) to show error records.

    python examples/demo/make_demo_data.py [OUT_DIR]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

# tools/ is not a package: its training code is importable once the folder is on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

from demo_training.tasks import KINDS, make_task


def task(rng: random.Random, i: int) -> dict[str, object]:
    made = make_task(rng, KINDS[i % len(KINDS)])
    return {
        "task_id": f"task-{i:04d}",
        "kind": made.kind,
        "answer": made.answer,
        "messages": made.messages(with_answer=False),
        "max_tokens": None,
    }


def main(out_dir: str = "demo-output/prompts", rows: int = 300, files: int = 3) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    data = [task(rng, i) for i in range(rows)]
    data[7]["messages"] = None  # -> error record "empty_prompt"
    data[11]["max_tokens"] = -1  # -> error record "bad_override"
    schema = pa.schema(
        [
            ("task_id", pa.string()),
            ("kind", pa.string()),
            ("answer", pa.string()),
            ("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
            ("max_tokens", pa.int64()),
        ]
    )
    per_file = (rows + files - 1) // files
    for f in range(files):
        chunk = data[f * per_file : (f + 1) * per_file]
        pq.write_table(
            pa.Table.from_pylist(chunk, schema=schema), out / f"prompts-{f:02d}.parquet", row_group_size=50
        )
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Write the demo's prompt shards (Parquet).")
    parser.add_argument("out_dir", nargs="?", default="demo-output/prompts", help="where the shards go")
    print(f"wrote {main(parser.parse_args().out_dir)}")
