"""Compiling ahead on the GPU (engine/precompile.py; run on a GPU machine: pytest -m gpu): once the
compile-ahead pass has run, the rest of an engine's build (warm-up, graph capture) compiles no
kernel at a launch, and the engine's outputs are those of an engine built without it."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch

from shardinfer import LLM, SamplingParams

pytestmark = pytest.mark.gpu

MLA_KERNEL_SHAPES = {"qk_rope_head_dim": 16, "kv_lora_rank": 64}


def _forget_compiled_kernels() -> None:
    """Empty every shardinfer kernel's in-memory variants, as in a fresh process (Triton's on-disk
    cache stays: loading from it counts as compiling here too)."""
    from triton.runtime.jit import JITFunction

    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("shardinfer.kernels"):
            for value in vars(module).values():
                if isinstance(value, JITFunction):
                    value.device_caches.clear()


def _outputs(llm: LLM, prompts: list[list[int]]) -> list[tuple[list[int], Any]]:
    params = [
        SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=i, logprobs=1)
        for i in range(len(prompts))
    ]
    return [
        (o.outputs[0].token_ids, o.outputs[0].logprobs) for o in llm.generate(prompts, params, use_tqdm=False)
    ]


@pytest.mark.parametrize(
    ("family", "engine_kwargs", "overrides"),
    [
        ("qwen3", {}, {}),
        (
            "qwen3",
            {"quantization": "fp8", "kv_cache_dtype": "fp8"},
            {"hidden_size": 256, "intermediate_size": 512},
        ),
        ("deepseek_v3", {}, MLA_KERNEL_SHAPES),
    ],
)
def test_gpu_build_compiles_nothing_at_a_launch_after_compiling_ahead(
    tiny_checkpoint: Any,
    monkeypatch: pytest.MonkeyPatch,
    family: str,
    engine_kwargs: dict[str, str],
    overrides: dict[str, int],
) -> None:
    import triton

    model_dir = tiny_checkpoint(family, **overrides)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 300, (n,), generator=g).tolist() for n in (5, 40, 130, 17)]
    kwargs = dict(device="cuda", dtype="bfloat16", max_num_batched_tokens=512, **engine_kwargs)

    monkeypatch.setenv("SHARDINFER_PRECOMPILE", "0")
    _forget_compiled_kernels()
    off = LLM(model_dir, **kwargs)
    assert off.llm_engine.runner.compiled_ahead is None
    want = _outputs(off, prompts)
    del off

    monkeypatch.setenv("SHARDINFER_PRECOMPILE", "1")
    _forget_compiled_kernels()
    compiles: list[tuple[str, bool]] = []  # (kernel, compiled ahead) in the order they happened

    def record(*, fn: Any, is_manual_warmup: bool, **_: Any) -> None:
        compiles.append((fn.name, is_manual_warmup))

    monkeypatch.setattr(triton.knobs.runtime, "jit_cache_hook", record)
    on = LLM(model_dir, **kwargs)
    ahead = on.llm_engine.runner.compiled_ahead
    assert ahead is not None and ahead.variants > 0
    first_ahead = next(i for i, (_, warm) in enumerate(compiles) if warm)
    late = [name for name, warm in compiles[first_ahead:] if not warm]
    assert not late, f"compiled at a launch after the compile-ahead pass: {late}"
    built = len(compiles)
    got = _outputs(on, prompts)
    print(
        f"{family} {engine_kwargs}: {ahead.variants} variants ahead on {ahead.workers} threads; "
        f"compiled by the first requests: {[name for name, _ in compiles[built:]]}"
    )
    assert got == want
