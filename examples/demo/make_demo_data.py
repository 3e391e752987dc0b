"""Write the demo's prompt shards: 300 chat tasks of the seven kinds the demo model was trained on.

Each row has a `task_id`, chat `messages`, the task `kind`, the expected `answer` (passed
through to the output so DuckDB can score it), and an optional per-row `max_tokens`. Two rows
are broken on purpose (no messages, and a per-row max_tokens of -1) to show error records.

    python examples/demo/make_demo_data.py [OUT_DIR]
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

WORDS = [
    "apple",
    "basket",
    "bread",
    "candle",
    "chair",
    "copper",
    "dragon",
    "engine",
    "falcon",
    "garden",
    "hammer",
    "house",
    "insect",
    "island",
    "jacket",
    "kettle",
    "lizard",
    "maple",
    "meadow",
    "needle",
    "orange",
    "piano",
    "queen",
    "rabbit",
    "saddle",
    "stone",
    "table",
    "walnut",
    "yellow",
    "zebra",
]
NAMES = ["Emil", "Wei", "Vera", "Omar", "Yusuf", "Chen"]
CITIES = ["Quito", "Cairo", "Berlin", "Austin", "Paris", "Accra"]


def task(rng: random.Random, i: int) -> dict[str, object]:
    kind = ["add", "sub", "mul", "reverse", "sort_words", "sort_numbers", "json"][i % 7]
    if kind in ("add", "sub", "mul"):
        a, b = (
            (rng.randint(10, 999), rng.randint(2, 9))
            if kind == "mul"
            else (rng.randint(10, 9999), rng.randint(2, 99))
        )
        op = {"add": "+", "sub": "-", "mul": "*"}[kind]
        prompt, answer = f"What is {a} {op} {b}?", str({"add": a + b, "sub": a - b, "mul": a * b}[kind])
    elif kind == "reverse":
        letters = [chr(rng.randint(97, 122)) for _ in range(rng.randint(4, 8))]
        prompt, answer = f"Reverse the letters: {' '.join(letters)}", " ".join(reversed(letters))
    elif kind == "sort_words":
        words = rng.sample(WORDS, 6)
        prompt, answer = f"Sort these words alphabetically: {' '.join(words)}", " ".join(sorted(words))
    elif kind == "json":
        name, city, age = rng.choice(NAMES), rng.choice(CITIES), rng.randint(18, 90)
        prompt = f"Extract name, age and city as JSON: {name} lives in {city} and is {age} years old."
        answer = f'{{"name": "{name}", "age": {age}, "city": "{city}"}}'
    else:
        nums = rng.sample(range(10, 99), 5)
        prompt = f"Sort these numbers in ascending order: {' '.join(map(str, nums))}"
        answer = " ".join(map(str, sorted(nums)))
    return {
        "task_id": f"task-{i:04d}",
        "kind": kind,
        "answer": answer,
        "messages": [{"role": "user", "content": prompt}],
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
    print(f"wrote {main(*sys.argv[1:2])}")
