"""The engine's checks of a tokenized prompt, in one place for every caller.

`LLMEngine.add_request`, `LLM.generate` (before it queues anything) and the pipeline's row
preparation (on its own thread, before a row reaches the engine) all ask the same question: can
this prompt become a request? Asking it here keeps their answers, messages and error codes equal.
"""

from __future__ import annotations

from collections.abc import Sequence

from shardinfer.errors import EmptyPrompt, PromptTooLong


def check_prompt(token_ids: Sequence[int], max_model_len: int) -> None:
    """Raise EmptyPrompt or PromptTooLong (each carrying its row error code) for an unusable prompt.

    A prompt must leave room for at least one generated token: `len(token_ids) < max_model_len`.
    """
    if not token_ids:
        raise EmptyPrompt("prompt is empty after tokenization: give at least one token")
    if len(token_ids) >= max_model_len:
        raise PromptTooLong(
            f"prompt has {len(token_ids)} tokens; max_model_len={max_model_len} leaves no room "
            "to generate: shorten the prompt or raise max_model_len"
        )
