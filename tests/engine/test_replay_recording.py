"""The replay drafter switched on by the environment, as a job's engine builder installs it
(shardinfer.testing.replay_drafter.install_from_env, called by pipeline/job.build_engine): a plain
run records each request's output keyed by its prompt and seed; a drafting engine then proposes
those outputs whatever its request ids, and its outputs equal the plain run's. (The job path end to
end: tests/bench/test_job_throughput.py.)"""

from __future__ import annotations

import json

import pytest

from shardinfer import LLM, SamplingParams
from shardinfer.testing.replay_drafter import ENV, install_from_env
from tests.engine.speculative_helpers import random_prompts


def _outputs(outs) -> list[tuple]:
    return [(c.token_ids, c.logprobs) for o in outs for c in o.outputs]


def test_a_recorded_plain_run_replays_as_drafts_under_other_request_ids(
    qwen3_dir, tmp_path, monkeypatch
) -> None:
    prompts = random_prompts(384, (6, 30, 11, 19), seed=3)
    params = [
        SamplingParams(temperature=0.8, seed=10 + i, max_tokens=24, ignore_eos=True, logprobs=1)
        for i in range(len(prompts))
    ]
    recording = tmp_path / "recorded.jsonl"
    monkeypatch.setenv(ENV, f"record:{recording}")
    plain_llm = LLM(qwen3_dir, device="cpu", dtype="float32")
    install_from_env(plain_llm.llm_engine)
    plain = plain_llm.generate(prompts, params)
    lines = [json.loads(line) for line in recording.read_text().splitlines()]
    assert sorted(len(e["tokens"]) for e in lines) == [24] * 4

    monkeypatch.setenv(ENV, f"replay:{recording}:0.8")
    spec = LLM(qwen3_dir, device="cpu", dtype="float32", speculative="ngram", speculative_depth=2)
    install_from_env(spec.llm_engine)
    # The prompts in another order: other request ids, the same prompts and seeds.
    order = [2, 0, 3, 1]
    got = spec.generate([prompts[i] for i in order], [params[i] for i in order])
    assert _outputs(got) == _outputs([plain[i] for i in order])
    stats = spec.llm_engine.stats()
    assert stats["draft_tokens"] > 0 and stats["accepted_draft_tokens"] > 0.5 * stats["draft_tokens"]


def test_replaying_needs_a_drafting_engine(qwen3_dir, tmp_path, monkeypatch) -> None:
    recording = tmp_path / "recorded.jsonl"
    recording.write_text("")
    monkeypatch.setenv(ENV, f"replay:{recording}:0.8")
    with pytest.raises(ValueError, match="speculative='ngram'"):
        install_from_env(LLM(qwen3_dir, device="cpu", dtype="float32").llm_engine)


def test_an_unknown_setting_is_refused(qwen3_dir, monkeypatch) -> None:
    monkeypatch.setenv(ENV, "play:somewhere")
    with pytest.raises(ValueError, match="record:PATH or replay:PATH:ALPHA"):
        install_from_env(LLM(qwen3_dir, device="cpu", dtype="float32").llm_engine)
