"""JSON output on the demo model: the default JSON schema keeps the model's own (spaced) JSON.

The demo model writes `{"name": "Emil", "age": 43, ...}` with spaces, as it was trained. Forced
compact JSON pushed it off that distribution (invalid or wrong objects); JSON with free
whitespace, the default, must give the same correct answers as no constraint at all.
"""

from __future__ import annotations

import json
from typing import Any

from shardinfer import SamplingParams

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}},
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


def test_default_json_schema_gives_the_recorded_answers(engine: Any, metrics: dict[str, Any]) -> None:
    tasks = [
        t for t in metrics["ci"]["tasks"] if t["prompt"].startswith("Extract name, age and city as JSON")
    ][:3]
    assert len(tasks) == 3
    convs = [[{"role": "user", "content": t["prompt"]}] for t in tasks]
    for structured_output in ({"schema_type": "json"}, {"schema_type": "json", "schema": PERSON}):
        outs = engine.chat(
            convs, SamplingParams(temperature=0.0, max_tokens=40, structured_output=structured_output)
        )
        for out, task in zip(outs, tasks, strict=True):
            assert json.loads(out.outputs[0].text) == json.loads(task["answer"]), (
                structured_output,
                out.outputs[0].text,
            )
