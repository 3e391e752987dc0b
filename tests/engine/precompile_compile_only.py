"""Run an engine's compile-ahead passes (engine/precompile.py) for Hopper on a machine without a GPU
and print what they compiled as one JSON line.

The compile-only driver of tests/kernels/hopper_compile.py stands in for the GPU: it answers the
questions the JIT asks before compiling and raises on any launch, so a pass that completes
launched nothing. The model is built on the CPU and its operations are routed to the Triton
kernels, which see CPU tensors and compile for sm_90. Run as a script in a fresh interpreter
with TRITON_INTERPRET unset:

    precompile_compile_only.py FAMILY WORKERS ENGINE_KWARGS_JSON CHECKPOINT_OVERRIDES_JSON
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "kernels"))

from hopper_compile import _compile_only

from shardinfer import LLM
from shardinfer.testing.tiny_checkpoint import make_tiny_checkpoint

BATCHED_TOKENS = 2100  # prompts of one KV chunk and of two (engine/precompile.py)


def main() -> None:
    family, workers = sys.argv[1], int(sys.argv[2])
    engine_kwargs, overrides = json.loads(sys.argv[3]), json.loads(sys.argv[4])
    model_dir = make_tiny_checkpoint(
        tempfile.mkdtemp(), family, dtype="bfloat16", max_position_embeddings=4096, **overrides
    )
    llm = LLM(
        model_dir,
        device="cpu",
        dtype="bfloat16",
        max_model_len=4096,
        max_num_batched_tokens=BATCHED_TOKENS,
        **engine_kwargs,
    )
    runner = llm.llm_engine.runner
    _compile_only()
    from shardinfer.engine import precompile
    from shardinfer.kernels import ops

    ops._use_triton = lambda t: True  # type: ignore[assignment]  # the CPU tensors go to the kernels
    start = time.perf_counter()
    first = precompile.precompile(runner, None, BATCHED_TOKENS, workers=workers)
    wall = time.perf_counter() - start
    again = precompile.precompile(runner, None, BATCHED_TOKENS, workers=workers)
    assert first is not None and again is not None
    print(
        json.dumps(
            {
                "variants": first.variants,
                "workers": first.workers,
                "wall_s": wall,
                "drain_s": first.drain_s,
                "second_pass_variants": again.variants,
            }
        )
    )


if __name__ == "__main__":
    main()
