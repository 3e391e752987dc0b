"""check_prompt: the one answer to "can this prompt become a request?"."""

from __future__ import annotations

import pytest

from shardinfer.engine.prompt_checks import check_prompt
from shardinfer.errors import EmptyPrompt, PromptTooLong


def test_a_prompt_must_leave_room_for_one_token() -> None:
    check_prompt([1] * 7, max_model_len=8)  # one slot left: fine
    with pytest.raises(PromptTooLong, match="prompt has 8 tokens; max_model_len=8") as info:
        check_prompt([1] * 8, max_model_len=8)
    assert info.value.error_code == "prompt_too_long"


def test_an_empty_prompt_is_refused() -> None:
    with pytest.raises(EmptyPrompt, match="prompt is empty") as info:
        check_prompt([], max_model_len=8)
    assert info.value.error_code == "empty_prompt"
