"""The Python API where a vLLM user expects vLLM's behaviour: prompt forms, per-request seeds,
checkpoint defaults shared with jobs, progress bars, cumulative logprobs, decoded top logprobs,
stop_reason."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer as RawTokenizer

from shardinfer import LLM, SamplingParams
from shardinfer.engine.output_processor import check_stop
from shardinfer.engine.request import Request, RequestStatus
from shardinfer.pipeline.config import JobConfig
from shardinfer.pipeline.job import resolve_sampling

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(qwen3_dir: Path) -> LLM:
    return LLM(qwen3_dir, device="cpu", dtype="float32")


def test_vllm_prompt_forms(llm: LLM) -> None:
    ids = llm.get_tokenizer().encode("Hello there")
    forms = ["Hello there", ids, {"prompt": "Hello there"}, {"prompt_token_ids": ids}]
    outs = llm.generate(forms, GREEDY, use_tqdm=False)
    assert [o.prompt_token_ids for o in outs] == [ids] * 4
    assert len({tuple(o.outputs[0].token_ids) for o in outs}) == 1
    assert [o.prompt for o in outs] == ["Hello there", None, "Hello there", None]
    (single,) = llm.generate({"prompt": "Hello there"}, GREEDY, use_tqdm=False)
    assert single.prompt_token_ids == ids  # a lone dict is one prompt, not a list of its keys
    (tokens,) = llm.generate({"prompt_token_ids": ids}, GREEDY, use_tqdm=False)
    assert tokens.outputs[0].token_ids == outs[0].outputs[0].token_ids


@pytest.mark.parametrize(
    "bad",
    [
        {"text": "hi"},
        {"prompt": 3},
        {"prompt": "a", "prompt_token_ids": [1]},
        {"prompt_token_ids": []},
        3.5,
        [1.0, 2.0],
        [True, False],
        {"hi", "there"},
        [["a"]],
        None,
    ],
)
def test_other_prompt_forms_are_refused(llm: LLM, bad: Any) -> None:
    with pytest.raises(ValueError, match="prompt"):
        llm.generate(bad, GREEDY, use_tqdm=False)


def test_engine_seed_samples_identical_prompts_independently_and_reproducibly(qwen3_dir: Path) -> None:
    params = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True)
    first = LLM(qwen3_dir, device="cpu", dtype="float32", seed=42)
    runs = [
        first.generate(["Hello"] * 4, params, use_tqdm=False),
        first.generate(["Hello"], params, use_tqdm=False),
    ]
    samples = [tuple(o.outputs[0].token_ids) for run in runs for o in run]
    assert len(set(samples)) == len(samples)  # every request its own sample, across calls too
    again = LLM(qwen3_dir, device="cpu", dtype="float32", seed=42)
    rerun = [
        again.generate(["Hello"] * 4, params, use_tqdm=False),
        again.generate(["Hello"], params, use_tqdm=False),
    ]
    assert [tuple(o.outputs[0].token_ids) for run in rerun for o in run] == samples
    fixed = first.generate(["Hello"] * 2, params.replace(seed=7), use_tqdm=False)
    assert [o.outputs[0].seed for o in fixed] == [7, 7]
    assert fixed[0].outputs[0].token_ids == fixed[1].outputs[0].token_ids  # a request's own seed is kept


def _model_with_generation_config(qwen3_dir: Path, tmp_path: Path, generation: dict[str, Any]) -> Path:
    out = tmp_path / "model"
    shutil.copytree(qwen3_dir, out)
    gen = json.loads((out / "generation_config.json").read_text())
    (out / "generation_config.json").write_text(json.dumps({**gen, **generation}))
    return out


def test_checkpoint_defaults_top_k_zero_and_jobs_share_them(qwen3_dir: Path, tmp_path: Path) -> None:
    model = _model_with_generation_config(
        qwen3_dir, tmp_path, {"do_sample": True, "temperature": 0.6, "top_k": 0, "top_p": 0.9}
    )
    llm = LLM(model, device="cpu", dtype="float32")
    defaults = llm.llm_engine.default_params()
    assert (defaults.temperature, defaults.top_k, defaults.top_p) == (0.6, -1, 0.9)  # top_k 0 is off
    (out,) = llm.generate(["Hello"], use_tqdm=False)
    assert out.outputs[0].finish_reason is not None
    job = JobConfig.from_dict(
        {
            "input": {"path": "x"},
            "model": {"path": str(model)},
            "output": {"path": "y"},
            "sampling": {"max_tokens": 5},
        }
    )
    assert resolve_sampling(job) == defaults.replace(max_tokens=5)


def test_progress_bar_counts_prompts(llm: LLM) -> None:
    bars: list[Any] = []

    class Bar:
        def __init__(self, total: int, **_: Any) -> None:
            self.total, self.n, self.closed = total, 0, False
            bars.append(self)

        def update(self, k: int) -> None:
            self.n += k

        def close(self) -> None:
            self.closed = True

    llm.generate(["a b", "c d", "e f"], GREEDY.replace(n=2), use_tqdm=Bar)
    assert [(b.total, b.n, b.closed) for b in bars] == [(3, 3, True)]


def test_cumulative_logprob_and_decoded_top_logprobs(llm: LLM, qwen3_dir: Path) -> None:
    raw = RawTokenizer.from_file(str(qwen3_dir / "tokenizer.json"))
    (out,) = llm.generate(["Hello"], GREEDY.replace(logprobs=3), use_tqdm=False)
    c = out.outputs[0]
    assert (
        c.cumulative_logprob == pytest.approx(math.fsum(c.logprobs), rel=1e-12) and c.cumulative_logprob < 0
    )
    assert c.top_logprobs is not None and c.top_logprob_tokens is not None
    assert c.top_logprob_tokens == [
        [raw.decode([t], skip_special_tokens=False) for t, _ in step] for step in c.top_logprobs
    ]


def test_stop_reason_as_vllm(llm: LLM) -> None:
    tok = llm.get_tokenizer()
    eos = tok.eos_token_ids[0]
    free = llm.generate(["Hello"], GREEDY.replace(max_tokens=6), use_tqdm=False)[0].outputs[0]
    assert (free.finish_reason, free.stop_reason) == ("length", None)
    stop_id = free.token_ids[1]
    by_id = llm.generate(["Hello"], GREEDY.replace(max_tokens=6, stop_token_ids=[stop_id]), use_tqdm=False)[0]
    assert (by_id.outputs[0].finish_reason, by_id.outputs[0].stop_reason) == ("stop", stop_id)
    # The end-of-sequence token: stop_reason None (a random model rarely samples it, so judge one directly).
    req = Request("r", [1, 2], SamplingParams(max_tokens=4), 1, 4)
    req.output_token_ids = [free.token_ids[0], eos]
    status, reason, _ = check_stop(req, tok, 64)
    assert (status, reason) == (RequestStatus.FINISHED_STOPPED, None)
    req = Request("r", [1, 2], SamplingParams(max_tokens=4, stop_token_ids=[free.token_ids[0]]), 1, 4)
    req.output_token_ids = [free.token_ids[0]]
    assert check_stop(req, tok, 64)[:2] == (RequestStatus.FINISHED_STOPPED, free.token_ids[0])


def test_one_top_logprob_is_the_first_of_three_and_the_greedy_token(llm: LLM) -> None:
    """logprobs=1 comes from the sampling pass (kernels/top_logprob.py), more from a top-k: the
    same entry either way, and under greedy sampling it is the token chosen."""
    prompts = ["Hello", "The quick brown fox", "1 + 2 ="]
    one = llm.generate(prompts, GREEDY.replace(logprobs=1, max_tokens=12), use_tqdm=False)
    three = llm.generate(prompts, GREEDY.replace(logprobs=3, max_tokens=12), use_tqdm=False)
    for a, b in zip(one, three, strict=True):
        ca, cb = a.outputs[0], b.outputs[0]
        assert ca.token_ids == cb.token_ids and ca.top_logprobs is not None and cb.top_logprobs is not None
        for token, lp, top1, top3 in zip(
            ca.token_ids, ca.logprobs, ca.top_logprobs, cb.top_logprobs, strict=True
        ):
            assert len(top1) == 1 and top1[0] == top3[0]
            assert top1[0] == (token, lp)


def test_default_sampling_params_are_the_checkpoints(qwen3_dir: Path, tmp_path: Path) -> None:
    # As vLLM's LLM.get_default_sampling_params: what generate(..., None) uses, to start from.
    model = _model_with_generation_config(
        qwen3_dir, tmp_path, {"temperature": 0.6, "top_p": 0.9, "max_new_tokens": 7}
    )
    llm = LLM(model, device="cpu", dtype="float32")
    defaults = llm.get_default_sampling_params()
    assert (defaults.temperature, defaults.top_p, defaults.max_tokens) == (0.6, 0.9, 7)
    assert defaults.replace(max_tokens=3).temperature == 0.6
