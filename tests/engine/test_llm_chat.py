"""LLM.chat's template options give the prompt transformers' apply_chat_template gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardinfer import LLM, SamplingParams

TOOLS_TEMPLATE = (
    "{{ bos_token }}{% if tools %}<|system|>{% for t in tools %}{{ t | tojson }}{% endfor %}<|end|>{% endif %}"
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% if brief is defined and brief %}In short: {% endif %}{% endif %}"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Find «x»",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]


@pytest.fixture(scope="module")
def llm(qwen3_dir: Path) -> LLM:
    return LLM(qwen3_dir, device="cpu", dtype="float32")


def test_chat_options_match_transformers(llm: LLM, qwen3_dir: Path) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(qwen3_dir))
    params = SamplingParams(temperature=0.0, max_tokens=1)
    conv = [{"role": "user", "content": "Hello there"}]
    out = llm.chat(
        conv, params, tools=TOOLS, chat_template_kwargs={"brief": True}, chat_template=TOOLS_TEMPLATE
    )
    expected = hf.apply_chat_template(
        conv,
        tools=TOOLS,
        brief=True,
        chat_template=TOOLS_TEMPLATE,
        add_generation_prompt=True,
        tokenize=False,
    )
    assert "In short: " in expected and "«x»" in expected
    assert out[0].prompt_token_ids == llm.tokenizer.encode(expected, add_special_tokens=False)
    assert out[0].prompt == expected  # the rendered conversation, as a text prompt's output has its text
    # The tokenizer takes transformers' tokenize flag: text by default, the prompt's ids when asked.
    options = {"tools": TOOLS, "chat_template_kwargs": {"brief": True}, "chat_template": TOOLS_TEMPLATE}
    assert llm.get_tokenizer().apply_chat_template(conv, tokenize=False, **options) == expected
    assert llm.get_tokenizer().apply_chat_template(conv, tokenize=True, **options) == out[0].prompt_token_ids

    partial = [*conv, {"role": "assistant", "content": "Hi, I am"}]
    cont = llm.chat([partial], params, add_generation_prompt=False, continue_final_message=True)
    expected = hf.apply_chat_template(partial, continue_final_message=True, tokenize=False)
    assert expected.endswith("Hi, I am")
    assert cont[0].prompt_token_ids == llm.tokenizer.encode(expected, add_special_tokens=False)


def test_chat_refuses_contradicting_options(llm: LLM) -> None:
    with pytest.raises(ValueError, match="continue_final_message"):
        llm.chat([{"role": "assistant", "content": "a"}], continue_final_message=True)
