"""DeepSeek-V3/V2 on CUDA (Triton MLA kernel, CUDA graphs) against the same model on CPU.

Run on a GPU machine: `pytest -m gpu tests/engine/models/test_deepseek_gpu.py`. The tiny configs
use qk_rope_head_dim=16, the smallest rope width the MLA kernel's tensor-core dots take.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from deepseek_helpers import (
    REGIMES,
    V2_REGIMES,
    PagedRunner,
    generate_batch,
    load_model,
    make_deepseek_v2_checkpoint,
)

from shardinfer import LLM, SamplingParams
from shardinfer.testing.tiny_checkpoint import make_tiny_checkpoint

pytestmark = pytest.mark.gpu

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [20, 21, 22], list(range(30, 51))]
CASES = ["base", "qlora_yarn_mscale", "group_limited", "v2_group_limited"]


@pytest.fixture(scope="module")
def checkpoints() -> dict[str, Path]:
    root = Path(tempfile.mkdtemp(prefix="shardinfer-deepseek-gpu-"))
    out = {}
    for case in CASES:
        if case in V2_REGIMES:
            out[case] = make_deepseek_v2_checkpoint(root / case, **{**V2_REGIMES[case], "qk_rope_head_dim": 16})
        else:
            out[case] = make_tiny_checkpoint(root / case, "deepseek_v3", **{**REGIMES[case], "qk_rope_head_dim": 16})
    yield out
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("case", CASES)
def test_cuda_matches_cpu_and_is_batch_invariant(checkpoints: dict[str, Path], case: str) -> None:
    cpu = load_model(checkpoints[case])
    gpu = load_model(checkpoints[case])
    gpu.to_device(torch.device("cuda"))
    want_tokens, want = generate_batch(PagedRunner(cpu), PROMPTS, 5)
    got_tokens, got = generate_batch(PagedRunner(gpu, device="cuda"), PROMPTS, 5)
    assert got_tokens == want_tokens
    assert max((a - b).abs().max().item() for a, b in zip(got, want, strict=True)) <= 1e-5
    _, alone = generate_batch(PagedRunner(gpu, device="cuda", seed=5), PROMPTS[2:], 5)
    assert torch.equal(alone[0], got[2])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_llm_cuda_graphs_equal_eager_and_chunked(checkpoints: dict[str, Path], dtype: str) -> None:
    params = [SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=1),
              SamplingParams(temperature=0.8, top_p=0.9, max_tokens=8, seed=3, ignore_eos=True, logprobs=1)]

    def run(**kw: object) -> list[tuple[list[int], list[float]]]:
        llm = LLM(checkpoints["group_limited"], device="cuda", dtype=dtype, **kw)
        return [(c.token_ids, c.logprobs) for p in params for o in llm.generate(PROMPTS, p) for c in o.outputs]

    graphs = run()
    assert graphs == run(enforce_eager=True)
    assert graphs == run(max_num_batched_tokens=5)
    if dtype == "float32":
        cpu = LLM(checkpoints["group_limited"], device="cpu", dtype=dtype)
        want = [(c.token_ids, c.logprobs) for p in params for o in cpu.generate(PROMPTS, p) for c in o.outputs]
        assert [t for t, _ in graphs] == [t for t, _ in want]
