"""The engine's checks of a tokenized prompt, in one place for every caller.

`LLMEngine.add_request`, `LLM.generate` (before it queues anything) and the pipeline's row
preparation (on its own thread, before a row reaches the engine) all ask the same question: can
this prompt become a request? Asking it here keeps their answers, messages and error codes equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shardinfer.errors import EmptyPrompt, PromptTooLong

LENGTH_FIX = "shorten the prompt or raise max_model_len"


def length_fix(asked: int, max_model_len: int, num_blocks: int, block_size: int) -> str:
    """What to do about a prompt too long for an engine whose sequences may hold `max_model_len`
    tokens, `asked` (max_model_len, or the model's positions) capped by the KV cache's blocks."""
    if max_model_len >= asked:
        return LENGTH_FIX
    return (
        f"shorten the prompt, or give the KV cache more than its {num_blocks} blocks of {block_size} tokens "
        f"(num_kv_blocks, or a larger memory share): they cap max_model_len at {max_model_len}, below "
        f"the {asked} asked for"
    )


def check_prompt(
    token_ids: Sequence[int], max_model_len: int, fix: str = LENGTH_FIX, *, prompt_only: bool = False
) -> None:
    """Raise EmptyPrompt or PromptTooLong (each carrying its row error code) for an unusable prompt.

    A prompt must leave room for at least one generated token: `len(token_ids) < max_model_len`.
    `fix`: what the message tells the user to do (length_fix: the engine knows what limits it).
    `prompt_only` (max_tokens=0): the prompt is scored, not continued; see check_scored_prompt.
    """
    if not token_ids:
        raise EmptyPrompt("prompt is empty after tokenization: give at least one token")
    if prompt_only:
        check_scored_prompt(token_ids, max_model_len, fix)
        return
    if len(token_ids) >= max_model_len:
        raise PromptTooLong(
            f"prompt has {len(token_ids)} tokens; max_model_len={max_model_len} leaves no room "
            f"to generate: {fix}"
        )


def check_scored_prompt(token_ids: Sequence[int], max_model_len: int, fix: str = LENGTH_FIX) -> None:
    """A prompt-only request's prompt: its last token is only scored, never fed, so the model reads
    len - 1 positions (at most max_model_len), and its first token has no logprob, so it needs two."""
    if len(token_ids) < 2:
        raise EmptyPrompt(
            f"prompt has {len(token_ids)} token; max_tokens=0 scores the prompt from its second token on, "
            "so it needs at least 2: give a longer prompt, or max_tokens >= 1 to generate"
        )
    if len(token_ids) > max_model_len + 1:
        raise PromptTooLong(
            f"prompt has {len(token_ids)} tokens; max_tokens=0 feeds all but the last, so max_model_len="
            f"{max_model_len} scores prompts of at most {max_model_len + 1}: {fix}"
        )


def check_stop_token_ids(stop_token_ids: Sequence[int] | None, vocab_size: int) -> None:
    """A stop token id outside the vocabulary could never stop anything: a ValueError naming it."""
    bad = [t for t in stop_token_ids or () if not 0 <= int(t) < vocab_size]
    if bad:
        raise ValueError(
            f"stop_token_ids holds {bad[0]}, outside the vocabulary: ids must be in [0, {vocab_size})"
        )


def tokenize_prompt(tokenizer: Any, vocab_size: int, prompt: str | list[int]) -> list[int]:
    """A prompt as token ids: text encoded by `tokenizer`, ids checked against the vocabulary
    (a ValueError naming the first id out of range)."""
    if isinstance(prompt, str):
        if prompt == "":
            raise ValueError("prompt is empty: give at least one character or token id")
        ids: list[int] = tokenizer.encode(prompt)
        return ids
    ids = [int(t) for t in prompt]
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt token id {bad[0]} is out of range: ids must be in [0, {vocab_size})")
    return ids
