"""The replay drafter's proposals, drawn once per request, against its per-index definition."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from shardinfer.testing.replay_drafter import ReplayProposer


def _request(request_id: str, num_output_tokens: int) -> Any:
    return SimpleNamespace(request_id=request_id, num_output_tokens=num_output_tokens)


def test_proposals_follow_the_per_index_draft_for_every_rejection_count() -> None:
    recorded = {"a": list(range(100, 140)), "b": [7, 8, 9]}
    proposer = ReplayProposer(recorded, 0.6, 512, seed=5)
    for request_id, tokens in recorded.items():
        for out in range(len(tokens) + 2):
            for in_flight in range(min(out, 4) + 1):
                for room in (1, 3):
                    want = []
                    for rejected in range(max(1, in_flight)):
                        draft = []
                        for i in range(out - rejected, out - rejected + room):
                            token = proposer.draft_token(request_id, i)
                            if token is None:
                                break
                            draft.append(token)
                        want.append(draft)
                    got = proposer(_request(request_id, out), room, in_flight)
                    assert got == (want if any(want) else []), (request_id, out, in_flight, room)
    assert proposer(_request("unknown", 3), 2, 1) == []


def test_alpha_sets_the_share_of_right_drafts() -> None:
    tokens = list(range(2000))
    drafts = ReplayProposer({"r": tokens}, 0.8, 50_000, seed=1).drafts("r")
    right = sum(d == t for d, t in zip(drafts, tokens, strict=True))
    assert 1500 < right < 1700  # 0.8 of 2000 within a few standard deviations
    assert ReplayProposer({"r": tokens}, 1.0, 50_000).drafts("r") == tokens
