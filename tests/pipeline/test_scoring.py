"""The scoring rules against lm-evaluation-harness's own: rolling windows and the context/continuation split."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from shardinfer.engine.tokenizer import Tokenizer
from shardinfer.pipeline.scoring import ScoreInputError, rolling_windows, split_pair


def test_rolling_windows_equal_the_harness_windows() -> None:
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(0, 60)
        window = rng.randint(1, 20)
        tokens = [rng.randint(10, 99) for _ in range(n)]
        want = [make_disjoint_window(w) for w in get_rolling_token_windows(tokens, 7, window, 1)]
        got = [(s.context_ids, s.continuation_ids) for s in rolling_windows(tokens, 7, window)]
        assert got == want, (n, window)
        assert [t for _, cont in got for t in cont] == tokens  # every token predicted once
        assert all(len(ctx) + len(cont) <= window + 1 for ctx, cont in got)


def test_split_moves_trailing_space_and_splits_at_the_context(model_dir: Path) -> None:
    tok = Tokenizer(model_dir)
    spaced = split_pair(tok, "What is the capital of France? ", "Paris.")
    plain = split_pair(tok, "What is the capital of France?", " Paris.")
    assert spaced == plain
    assert plain.context_ids == tok.encode("What is the capital of France?")
    assert tok.decode(plain.continuation_ids) == " Paris."
    assert plain.prompt_ids == tok.encode("What is the capital of France? Paris.")
    empty = split_pair(tok, "", "Hello")
    assert empty.context_ids == [tok.bos_token_id] and empty.continuation_ids == tok.encode("Hello")
    with pytest.raises(ScoreInputError, match="empty"):
        split_pair(tok, "Hello", "")
    with pytest.raises(ScoreInputError, match="whitespace"):
        split_pair(tok, "   ", "Hello")
