"""Offline generation with the Python API on the bundled demo model (runs on a CPU in seconds).

.venv/bin/python examples/generate.py
"""

from __future__ import annotations

from pathlib import Path

from shardinfer import LLM, SamplingParams

MODEL = Path(__file__).parent / "models" / "tiny-dsv3-demo"


def main() -> None:
    llm = LLM(MODEL, device="cpu", dtype="float32")
    # The demo model was trained on these task formats (tools/demo_training/tasks.py).
    tasks = [
        "What is 123 + 456?",
        "Reverse the letters: s h a r d",
        "Sort these words alphabetically: rabbit pencil anchor",
        "Extract name, age and city as JSON: Nina, 31, lives in Oslo.",
    ]
    greedy = SamplingParams(temperature=0.0, max_tokens=32, logprobs=2)
    for task, out in zip(
        tasks, llm.chat([[{"role": "user", "content": t}] for t in tasks], greedy), strict=True
    ):
        c = out.outputs[0]
        print(
            f"{task!r} -> {c.text!r} ({c.finish_reason}, {len(c.token_ids)} tokens, "
            f"first token logprob {c.logprobs[0]:.3f}, alternatives {c.top_logprobs[0] if c.top_logprobs else None})"
        )
    # Seeded sampling: the same seed gives the same sample, alone or in any batch.
    sampled = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=24, seed=7, n=3)
    out = llm.chat(
        [[{"role": "user", "content": "Sort these words alphabetically: walnut bread olive"}]], sampled
    )[0]
    for c in out.outputs:
        print(f"sample {c.index} (seed {c.seed}): {c.text!r}")


if __name__ == "__main__":
    main()
