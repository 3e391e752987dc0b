"""The indexed prompt lookup (ngram_index.py) proposes exactly what drafting.lookup proposes over
the whole sequence, as a request's tokens evolve the way the engine changes them: committed
tokens appended, drafts and a placeholder for the token in flight appended, rejected drafts
removed, placeholders resolved."""

from __future__ import annotations

import random

from shardinfer.engine.drafting import NgramProposer, lookup, ngram_proposer
from shardinfer.engine.ngram_index import SEARCH_WINDOW, IndexedLookup
from shardinfer.engine.request import PLACEHOLDER, Request
from shardinfer.engine.sampling_params import SamplingParams


def _request(prompt: list[int]) -> Request:
    return Request("r", list(prompt), SamplingParams(), seed=0, max_tokens=10_000)


def test_indexed_lookup_equals_lookup_on_growing_sequences() -> None:
    rng = random.Random(11)
    for trial in range(60):
        vocab = rng.choice([2, 3, 5, 40])
        req = _request([rng.randrange(vocab) for _ in range(rng.randint(0, 30))])
        indexed = IndexedLookup()
        for _ in range(rng.randint(1, 120)):
            req.output_token_ids.append(rng.randrange(vocab))  # committed
            # Sometimes an uncommitted tail: drafts, then the placeholder of the token after them.
            tail = rng.randint(0, 4) if rng.random() < 0.5 else 0
            for _ in range(tail):
                req.output_token_ids.append(rng.randrange(vocab))
            req.num_placeholders = tail
            tokens = req.all_token_ids
            for length in {len(tokens), len(tokens) - 1}:
                if length >= max(0, req.num_resolved_tokens):
                    k = rng.randint(0, 4)
                    assert indexed(req, length, k) == lookup(tokens[:length], k), (trial, tokens, length, k)
            # The tail goes: rejected drafts removed (the next append commits the bonus token).
            del req.output_token_ids[len(req.output_token_ids) - tail :]
            req.num_placeholders = 0


def test_indexed_lookup_honours_the_search_window() -> None:
    # The suffix 7, 8, 9 occurs once before, more than a window back: nothing is proposed. Moved
    # into the window, the same occurrence is found (and the token before it, 6, agrees too).
    for gap, want in ((2100, ([], 0)), (2000, ([1, 5], 4))):
        prompt = [6, 7, 8, 9, 1] + [5] * gap + [6, 7, 8, 9]
        req = _request(prompt)
        assert lookup(prompt, 2) == want
        assert IndexedLookup()(req, len(prompt), 2) == want


def test_ngram_proposer_with_index_equals_the_plain_one_in_flight() -> None:
    rng = random.Random(3)
    proposer = NgramProposer()
    req = _request([rng.randrange(4) for _ in range(20)])
    for step in range(200):
        req.output_token_ids.append(rng.randrange(4))
        in_flight = step % 3
        if in_flight:  # drafts of the step in flight, then its placeholder
            req.output_token_ids += [rng.randrange(4) for _ in range(in_flight - 1)] + [PLACEHOLDER]
        req.num_placeholders = in_flight
        room = rng.randint(1, 3)
        want = ngram_proposer(req, room, in_flight)
        got = proposer(req, room, in_flight)
        assert (got.choices, got.confidence) == (want.choices, want.confidence), step
        del req.output_token_ids[len(req.output_token_ids) - in_flight :]
        req.num_placeholders = 0


def test_indexed_lookup_past_several_windows_keeps_a_bounded_index() -> None:
    """Sequences several search windows long: the index drops starts no later lookup can reach,
    and still proposes what lookup over the whole sequence proposes."""
    rng = random.Random(5)
    for vocab in (3, 50, 5000):
        req = _request([rng.randrange(vocab) for _ in range(100)])
        indexed = IndexedLookup()
        for step in range(5200):
            req.output_token_ids.append(rng.randrange(vocab))
            if step % 97 == 0 or step > 5150:
                tokens = req.all_token_ids
                assert indexed(req, len(tokens), 3) == lookup(tokens, 3), (vocab, step)
            else:
                indexed(req, len(req.all_token_ids), 3)
        index = indexed._indexes[req]
        assert index.base > 0 and all(len(d) <= 2 * SEARCH_WINDOW + 1 for d in index.latest.values())
