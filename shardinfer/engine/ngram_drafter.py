"""Prompt-lookup drafting: propose the tokens that followed the latest earlier occurrence of the
sequence's last n tokens (n = 3, 2, 1, longest first). No model is involved, so it suits any
checkpoint; it pays off on outputs that copy from the prompt (extraction, editing, code).

Drafts are only proposals: the engine verifies them by sampling every drafted position with the
same (seed, position) noise as plain decoding, so speculative outputs are token-identical to
non-speculative ones (reference/deterministic-speculative-decoding.md).
"""

from __future__ import annotations

MATCH_LENGTHS = (3, 2, 1)
SEARCH_WINDOW = 2048  # only the last tokens are searched: older matches rarely pay, and cost time


def propose(tokens: list[int], max_draft: int) -> list[int]:
    """Up to max_draft tokens that followed the latest earlier match of tokens' suffix."""
    if max_draft <= 0 or len(tokens) < 2:
        return []
    lo = max(0, len(tokens) - SEARCH_WINDOW)
    for n in MATCH_LENGTHS:
        if len(tokens) <= n:
            continue
        suffix = tokens[-n:]
        # Latest start i < len - n with tokens[i : i + n] == suffix.
        for i in range(len(tokens) - n - 1, lo - 1, -1):
            if tokens[i : i + n] == suffix:
                return tokens[i + n : i + n + max_draft]
    return []
