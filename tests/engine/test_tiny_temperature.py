"""A temperature just above 0 samples the greedy tokens, however small it is: as vLLM, a
temperature below GREEDY_BELOW is greedy. (Logits divided by a float32 subnormal temperature
overflow to infinities, among which the noise alone used to choose.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from shardinfer import LLM, SamplingParams
from shardinfer.engine.sampling_params import GREEDY_BELOW
from tests.engine.hf_reference import hf_greedy, hf_model

PROMPT = [5, 17, 42, 9]


@pytest.fixture(scope="module")
def greedy_reference(qwen3_dir: Path) -> list[int]:
    tokens, _ = hf_greedy(hf_model(qwen3_dir), PROMPT, 5)
    return tokens


@pytest.fixture(scope="module")
def llm(qwen3_dir: Path) -> LLM:
    return LLM(qwen3_dir, device="cpu", dtype="float32")


@pytest.mark.parametrize("temperature", [1e-40, 1e-45, GREEDY_BELOW / 2])
@pytest.mark.parametrize("filters", [{}, {"top_p": 0.9}, {"min_p": 0.1}, {"top_k": 5}])
def test_tiny_temperature_is_greedy(
    llm: LLM, greedy_reference: list[int], temperature: float, filters: dict[str, float]
) -> None:
    params = SamplingParams(temperature=temperature, max_tokens=5, ignore_eos=True, seed=1, **filters)
    assert params.greedy
    out = llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0]
    assert out.token_ids == greedy_reference


def test_temperature_at_the_threshold_samples() -> None:
    assert not SamplingParams(temperature=GREEDY_BELOW).greedy
