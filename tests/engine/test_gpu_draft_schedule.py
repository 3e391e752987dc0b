"""The confidence schedule on CUDA (run on a GPU machine: pytest -m gpu): steps timed with CUDA
events feed the budget without any host sync, MTP confidences come back with the drafts, and the
output stays plain decoding's."""

from __future__ import annotations

import pytest
import torch

from shardinfer import LLM, SamplingParams
from tests.engine.speculative_helpers import DEMO, finish, replay_setup

pytestmark = pytest.mark.gpu


def test_gpu_timed_steps_feed_the_budget_without_blocking_the_host(qwen3_dir) -> None:
    engine, outs = replay_setup(qwen3_dir, 5, speculative="ngram", speculative_depth=3)
    budget = engine.drafter.budget
    assert engine.step_timer is not None and budget.scheduled  # the default confidence budget
    for _ in range(30):  # prefill, then decode steps whose times come back
        engine.step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(12):  # timing, reading the times and choosing the depth never wait
            engine.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    got = finish(engine, len(outs))
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in outs]
    stats = engine.stats()
    assert stats["timed_draft_steps"] > 0
    assert budget.times.estimate and all(ms > 0 for ms in budget.times.estimate.values())
    assert {w for w, _ in budget.times.estimate} <= set(engine.runner.graph_widths)
    assert 0.0 <= stats["speculation_off_share"] <= 1.0 and "mean_draft_tokens_per_step" in stats


def test_gpu_mtp_confidences_come_back_with_the_drafts() -> None:
    chats = [[{"role": "user", "content": c}] for c in ("What is 4821 + 377?", "What is 12 times 13?")]
    params = [
        SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, logprobs=1),
        SamplingParams(temperature=0.8, max_tokens=40, seed=5, ignore_eos=True),
    ]
    want = LLM(DEMO, device="cuda", dtype="bfloat16", max_num_seqs=4).chat(chats, params)
    spec = LLM(DEMO, device="cuda", dtype="bfloat16", max_num_seqs=4, speculative="mtp", speculative_depth=2)
    got = spec.chat(chats, params)
    assert [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in got] == [
        (o.outputs[0].token_ids, o.outputs[0].logprobs) for o in want
    ]
    budget = spec.llm_engine.drafter.budget
    # Verified drafts were counted in their probability deciles (a trained head is mostly sure).
    assert sum(budget.calibration.reached[0]) > 0
    assert sum(budget.calibration.reached[0][5:]) > sum(budget.calibration.reached[0][:5])
