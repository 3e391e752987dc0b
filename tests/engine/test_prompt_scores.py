"""Prompt logprobs scored a bounded number of rows at a time (engine/prompt_scores.py).

References: a float64 log-softmax of the same logits, and the engine's own scores of the same
prompts with chunks large enough for every row of a step at once.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shardinfer.engine import prompt_scores
from shardinfer.engine.llm_engine import LLMEngine
from shardinfer.engine.models.config import ModelConfig
from shardinfer.engine.prompt_scores import chunk_rows, read_scores, score_rows, split_scores
from shardinfer.engine.sampling_params import SamplingParams


def _logits(n: int, vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, vocab, generator=g)
    x[:, 5] = x[:, 9] = 9.0  # a tie for the best: the lower id ranks first
    return x


def test_chunk_rows_follows_the_budget() -> None:
    assert chunk_rows(1000, budget_bytes=24 * 1000 * 7) == 7
    assert chunk_rows(10**6, budget_bytes=10) == 1  # never fewer than one row


@pytest.mark.parametrize("rows_per_chunk", [1, 3, 100])
def test_scores_equal_a_float64_log_softmax_in_any_chunking(rows_per_chunk: int) -> None:
    vocab, n = 50, 11
    hidden = _logits(n, vocab)  # the "LM head" is the identity: rows are their own logits
    seen: list[int] = []

    def head(h: torch.Tensor) -> torch.Tensor:
        seen.append(h.shape[0])
        return h

    rows = [10, 0, 3, 3, 7]
    targets = [1, 5, 9, 49, 0]
    values, ids, tops = score_rows(
        head, hidden, rows, targets, 3, vocab, budget_bytes=24 * vocab * rows_per_chunk
    )
    assert max(seen) <= rows_per_chunk and sum(seen) == len(rows)
    want = torch.log_softmax(hidden.double(), dim=-1)
    assert torch.allclose(values.double(), want[rows, targets], atol=1e-6)
    assert ids is not None and tops is not None
    for i, r in enumerate(rows):
        order = sorted(range(vocab), key=lambda v: (-want[r, v].item(), v))[:3]
        assert ids[i].tolist() == order
        assert order[:2] == [5, 9]
        assert torch.allclose(tops[i].double(), want[r, order], atol=1e-6)


def test_no_top_entries_when_none_are_asked() -> None:
    hidden = _logits(4, 20)
    values, ids, tops = score_rows(lambda h: h, hidden, [0, 1], [2, 3], 0, 20)
    assert ids is None and tops is None and values.shape == (2,)
    (a, b) = split_scores([4, 9], [1, 1], values, ids, tops)
    assert (a.first, b.first, len(a), len(b)) == (4, 9, 1, 1)
    assert read_scores(a, 0) == ([values[0].item()], [None])
    assert read_scores(b, 2) == ([values[1].item()], [None])


def test_split_and_read_give_each_request_its_rows_and_its_own_k() -> None:
    hidden = _logits(6, 30)
    values, ids, tops = score_rows(lambda h: h, hidden, list(range(6)), [1] * 6, 4, 30)
    parts = split_scores([0, 10], [2, 4], values, ids, tops)
    assert [len(p) for p in parts] == [2, 4]
    got, top = read_scores(parts[1], 2)
    assert got == values[2:].tolist()
    assert ids is not None and tops is not None
    assert top == [list(zip(ids[i, :2].tolist(), tops[i, :2].tolist(), strict=True)) for i in range(2, 6)]


def test_a_score_step_never_computes_more_logits_rows_than_a_chunk(
    qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step carrying 96 scored positions, with chunks of 5 rows: every LM-head call stays within
    a chunk (or the step's sampling rows), and the scores equal those of one chunk for the step."""
    prompts = [[(7 * i + 3 + s) % 300 + 20 for i in range(n)] for s, n in enumerate((33, 41, 25))]
    params = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=2, seed=0)

    def run() -> tuple[list, list[int]]:
        engine = LLMEngine(
            qwen3_dir, device="cpu", dtype="float32", num_kv_blocks=64, max_num_batched_tokens=256
        )
        calls: list[int] = []
        head = engine.runner.model.compute_logits

        def counted(h: torch.Tensor) -> torch.Tensor:
            calls.append(h.shape[0])
            return head(h)

        monkeypatch.setattr(engine.runner.model, "compute_logits", counted)
        for i, ids in enumerate(prompts):
            engine.add_request(str(i), ids, params)
        outs = {}
        while engine.has_unfinished():
            for out in engine.step():
                outs[out.request_id] = out
        got = [(outs[str(i)].prompt_logprobs, outs[str(i)].prompt_top_logprobs) for i in range(3)]
        return got, calls

    whole, whole_calls = run()
    assert max(whole_calls) == sum(len(p) - 1 for p in prompts)  # one call scored every position
    vocab = ModelConfig.from_dir(qwen3_dir).vocab_size
    monkeypatch.setattr(prompt_scores, "SCORE_CHUNK_BYTES", 24 * vocab * 5)
    chunked, chunked_calls = run()
    assert max(chunked_calls) <= 5 and len(chunked_calls) > len(whole_calls)
    assert chunked == whole
