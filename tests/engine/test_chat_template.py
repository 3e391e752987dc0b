"""Chat templates render exactly as transformers' apply_chat_template renders them.

The templates in chat_templates/ are written in the style of real checkpoints' templates (Llama 3
with tools, Qwen3 with thinking, DeepSeek-V3, Mistral): whitespace control, namespaces, `{% break %}`,
`tojson` with arguments, `raise_exception`, `strftime_now`, non-ASCII special tokens. Each is put in
a tokenizer directory, loaded by our Tokenizer and by transformers' AutoTokenizer, and the same
messages must give the same text, character for character.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from shardinfer.engine.chat_template import ChatTemplate, ChatTemplateEnvironment, ChatTemplateError
from shardinfer.engine.template_budget import RenderBudget
from shardinfer.engine.tokenizer import Tokenizer
from shardinfer.testing.tiny_checkpoint import build_tokenizer
from tests.ascii_locale import run_in_ascii_locale

TEMPLATES = Path(__file__).parent / "chat_templates"

SPECIAL_TOKENS = {
    "llama3_tools": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "qwen3_thinking": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "deepseek_v3": {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
    "mistral": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city <in °C> & wind",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TOOL_CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}

PLAIN = [
    {"role": "system", "content": '  You answer briefly; quote "exactly".  '},
    {"role": "user", "content": "Wie spät ist es in Zürich? 東京は?"},
]
MULTI_TURN = [
    {"role": "user", "content": "Hi <b>there</b> & welcome"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Two plus two?"},
]
WITH_TOOLS = [
    {"role": "system", "content": "Use tools when they help."},
    {"role": "user", "content": "Weather in Zürich?"},
    {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
    {"role": "tool", "content": '{"temp": 21, "sky": "clear"}'},
]
THINKING_HISTORY = [
    {"role": "user", "content": "What is 7 * 6?"},
    {"role": "assistant", "content": "<think>\n7 sixes.\n</think>\n\n42"},
    {"role": "user", "content": "And 6 * 9?"},
    {"role": "assistant", "content": "54", "reasoning_content": "six nines"},
]


def _tokenizer_dir(root: Path, name: str) -> Path:
    out = root / name
    build_tokenizer(out)
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
        cfg.pop(key, None)
    cfg.update(SPECIAL_TOKENS[name])
    cfg["chat_template"] = (TEMPLATES / f"{name}.jinja").read_text()
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False))
    return out


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("chat_templates")
    cache: dict[str, tuple[Tokenizer, Any]] = {}

    def load(name: str) -> tuple[Tokenizer, Any]:
        if name not in cache:
            path = _tokenizer_dir(root, name)
            cache[name] = (Tokenizer(path), AutoTokenizer.from_pretrained(str(path)))
        return cache[name]

    return load


CASES = [
    ("llama3_tools", PLAIN, {}),
    ("llama3_tools", MULTI_TURN, {}),
    ("llama3_tools", WITH_TOOLS, {"tools": [WEATHER_TOOL]}),
    ("llama3_tools", PLAIN, {"chat_template_kwargs": {"date_string": "26 Jul 2024"}}),
    ("qwen3_thinking", PLAIN, {}),
    ("qwen3_thinking", MULTI_TURN, {"chat_template_kwargs": {"enable_thinking": False}}),
    ("qwen3_thinking", WITH_TOOLS, {"tools": [WEATHER_TOOL]}),
    ("qwen3_thinking", THINKING_HISTORY, {}),
    ("qwen3_thinking", THINKING_HISTORY, {"add_generation_prompt": False}),
    ("deepseek_v3", PLAIN, {}),
    ("deepseek_v3", MULTI_TURN, {"add_generation_prompt": False}),
    (
        "deepseek_v3",
        [*WITH_TOOLS[:2], {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "21"}],
        {},
    ),
    ("mistral", PLAIN, {}),
    ("mistral", MULTI_TURN, {}),
]


@pytest.mark.parametrize(("name", "messages", "options"), CASES)
def test_renders_as_transformers(
    both: Any, name: str, messages: list[dict[str, Any]], options: dict[str, Any]
) -> None:
    ours, theirs = both(name)
    add = options.get("add_generation_prompt", True)
    kwargs = options.get("chat_template_kwargs", {})
    expected = theirs.apply_chat_template(
        messages, tools=options.get("tools"), add_generation_prompt=add, tokenize=False, **kwargs
    )
    got = ours.apply_chat_template(
        messages, add_generation_prompt=add, tools=options.get("tools"), chat_template_kwargs=kwargs
    )
    assert got == expected


@pytest.mark.parametrize("name", ["llama3_tools", "qwen3_thinking", "mistral"])
def test_continue_final_message_as_transformers(both: Any, name: str) -> None:
    ours, theirs = both(name)
    messages = [*MULTI_TURN, {"role": "assistant", "content": "Two plus two is "}]
    expected = theirs.apply_chat_template(messages, continue_final_message=True, tokenize=False)
    got = ours.apply_chat_template(messages, add_generation_prompt=False, continue_final_message=True)
    assert got == expected
    assert got.rstrip().endswith("Two plus two is")


def test_raise_exception_reaches_the_caller_with_its_message(both: Any) -> None:
    ours, theirs = both("mistral")
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(Exception, match="must alternate") as hf_error:
        theirs.apply_chat_template(bad, tokenize=False)
    with pytest.raises(ChatTemplateError, match="must alternate") as our_error:
        ours.apply_chat_template(bad)
    assert str(hf_error.value) in str(our_error.value)


def test_template_compiles_once_per_tokenizer(both: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    ours, _ = both("qwen3_thinking")
    compiled: list[str] = []
    original = ChatTemplateEnvironment.from_string

    def counting(self: ChatTemplateEnvironment, source: Any, *args: Any, **kwargs: Any) -> Any:
        compiled.append(source)
        return original(self, source, *args, **kwargs)

    monkeypatch.setattr(ChatTemplateEnvironment, "from_string", counting)
    ours._compiled = None
    texts = {ours.apply_chat_template([{"role": "user", "content": f"row {i}"}]) for i in range(50)}
    assert len(texts) == 50
    assert len(compiled) == 1


def test_tojson_arguments_and_no_escaping() -> None:
    template = ChatTemplate(
        "{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ x | tojson(separators=(',', ':')) }}"
        "|{{ x | tojson(sort_keys=true) }}"
    )
    x = {"b": "<é>&'", "a": [1, 2]}
    expected = "|".join(
        [
            json.dumps(x, ensure_ascii=False),
            json.dumps(x, ensure_ascii=False, indent=2),
            json.dumps(x, ensure_ascii=False, separators=(",", ":")),
            json.dumps(x, ensure_ascii=False, sort_keys=True),
        ]
    )
    assert template.render([{"role": "user", "content": "-"}], chat_template_kwargs={"x": x}) == expected


def test_generation_block_renders_its_body() -> None:
    template = ChatTemplate(
        "{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}"
    )
    assert template.render([{"role": "assistant", "content": "hi"}]) == "[hi]"


def test_sandbox_refuses_python_internals() -> None:
    escape = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ChatTemplateError):
        escape.render([{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="'_x'"):
        ChatTemplate("{% set ns = namespace(_x=1) %}{{ ns._x }}").render([{"role": "user", "content": "x"}])


def test_bad_messages_and_options_are_refused() -> None:
    template = ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}")
    with pytest.raises(ChatTemplateError, match="'role'"):
        template.render([{"content": "no role"}])
    with pytest.raises(ChatTemplateError, match="non-empty list"):
        template.render([])
    with pytest.raises(ChatTemplateError, match="contradict"):
        template.render([{"role": "assistant", "content": "a"}], continue_final_message=True)
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for m in messages %}")


# A template that reads content given as a list of text parts, as multimodal-era templates do.
PARTS_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{% if m.content is string %}{{ m.content }}"
    "{% else %}{% for part in m.content %}{% if part.type == 'text' %}{{ part.text }}{% endif %}{% endfor %}"
    "{% endif %}<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_continue_final_message_of_text_parts_as_transformers(both: Any) -> None:
    ours, theirs = both("mistral")
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Two plus"}, {"type": "text", "text": " two?"}],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "It is"}, {"type": "image"}]},
    ]
    expected = theirs.apply_chat_template(
        messages, chat_template=PARTS_TEMPLATE, continue_final_message=True, tokenize=False
    )
    got = ours.apply_chat_template(
        messages, chat_template=PARTS_TEMPLATE, add_generation_prompt=False, continue_final_message=True
    )
    assert got == expected
    assert got.endswith("<|assistant|>It is")
    assert messages[-1]["content"][0]["text"] == "It is"  # the caller's message is left as it was


def test_continue_a_named_field_as_transformers(both: Any) -> None:
    """continue_final_message may name the field to continue (the reasoning, say), as in
    transformers; a truthy string must not be taken for True and continue the content instead."""
    ours, theirs = both("qwen3_thinking")
    messages = [*MULTI_TURN, {"role": "assistant", "content": "", "reasoning_content": "Two and two make"}]
    expected = theirs.apply_chat_template(
        messages, continue_final_message="reasoning_content", tokenize=False
    )
    got = ours.apply_chat_template(
        messages, add_generation_prompt=False, continue_final_message="reasoning_content"
    )
    assert got == expected
    assert got.endswith("Two and two make")


def test_continue_final_message_refuses_what_it_cannot_continue(both: Any) -> None:
    ours, _ = both("qwen3_thinking")
    conv = [*MULTI_TURN, {"role": "assistant", "content": "It is"}]
    with pytest.raises(ChatTemplateError, match="no 'reasoning_content' to continue"):
        ours.apply_chat_template(
            conv, add_generation_prompt=False, continue_final_message="reasoning_content"
        )
    with pytest.raises(ChatTemplateError, match="never reads the field 'summary'"):
        ours.apply_chat_template(
            [*MULTI_TURN, {"role": "assistant", "content": "a", "summary": "b"}],
            add_generation_prompt=False,
            continue_final_message="summary",
        )
    parts_without_text = [*MULTI_TURN, {"role": "assistant", "content": [{"type": "image"}]}]
    with pytest.raises(ChatTemplateError, match="no text part to continue"):
        ours.apply_chat_template(
            parts_without_text,
            chat_template=PARTS_TEMPLATE,
            add_generation_prompt=False,
            continue_final_message=True,
        )


def _template_folder(root: Path, config_template: Any, jinja_file: str | None) -> Path:
    """A tokenizer folder whose tokenizer_config.json holds `config_template` and, if given, a
    chat_template.jinja beside it."""
    build_tokenizer(root)
    cfg = json.loads((root / "tokenizer_config.json").read_text())
    cfg["chat_template"] = config_template
    (root / "tokenizer_config.json").write_text(json.dumps(cfg))
    if jinja_file is not None:
        (root / "chat_template.jinja").write_text(jinja_file)
    return root


NAMED = [
    {"name": "default", "template": "DEFAULT{% for m in messages %}|{{ m.content }}{% endfor %}"},
    {
        "name": "tool_use",
        "template": "TOOLS {{ tools | length }}{% for m in messages %}|{{ m.content }}{% endfor %}",
    },
]


@pytest.mark.parametrize(
    ("config_template", "jinja_file", "call"),
    [
        (NAMED, None, {}),
        (NAMED, None, {"tools": [WEATHER_TOOL]}),
        (NAMED, None, {"chat_template": "tool_use", "tools": []}),
        ("CONFIG{{ messages | length }}", "JINJA{{ messages | length }}", {}),
    ],
)
def test_the_template_chosen_is_transformers_choice(
    tmp_path: Path, config_template: Any, jinja_file: str | None, call: dict[str, Any]
) -> None:
    """Named templates render "tool_use" for a call with tools and "default" otherwise, and a
    chat_template.jinja file wins over tokenizer_config.json's template, as in transformers."""
    from transformers import AutoTokenizer

    folder = _template_folder(tmp_path / "tok", config_template, jinja_file)
    expected = AutoTokenizer.from_pretrained(str(folder)).apply_chat_template(
        MULTI_TURN, add_generation_prompt=False, tokenize=False, **call
    )
    got = Tokenizer(folder).apply_chat_template(MULTI_TURN, add_generation_prompt=False, **call)
    assert got == expected


# Templates a checkpoint could carry to take the worker down: each must fail its render with a
# ChatTemplateError naming what went past the limit, before building the text or recursing out.
RUNAWAY_TEMPLATES = {
    "a macro calling itself": (
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "recursed too deeply",
    ),
    "a recursive loop": ("{% for m in [1] recursive %}{{ loop([1]) }}{% endfor %}", "recursed too deeply"),
    "a billion-space JSON indent": ("{{ [[1]] | tojson(indent=10**9) }}", "indent by a few spaces"),
    "a huge JSON separator": (
        "{{ [1, 2, 3] | tojson(separators=(' ' * 3000000, ':')) }}",
        "tojson would build",
    ),
    "lorem ipsum of a hundred million words": ("{{ lipsum(1000, false, 10000, 100000) }}", "lipsum"),
    "a list repeating a long string": ("{{ (['x' * 1000000] * 1000) | join }}", "'*' would build"),
    "a list doubling a long string": ("{% set a = ['x' * 3000000] %}{{ (a + a) | join }}", "'+' would build"),
    "bytes repeated": ("{{ 'x'.encode() * 10**10 }}", "'*' would build"),
    "a printf width from the arguments": ("{{ '%*s' % (999999999, 'x') }}", "was given 999999999"),
    "a printf width after a mapping key": ("{{ '%(a)999999999s' % {'a': 'x'} }}", "asks for a width"),
    "the format filter's width": ("{{ '%999999999s' | format('x') }}", "asks for a width"),
    "tabs expanded a million wide": ("{{ ('\t' * 1000).expandtabs(1000000) }}", "expandtabs(1000000)"),
}


@pytest.mark.parametrize("name", list(RUNAWAY_TEMPLATES))
def test_runaway_templates_fail_their_render_with_a_message(name: str) -> None:
    source, message = RUNAWAY_TEMPLATES[name]
    with pytest.raises(ChatTemplateError, match=re.escape(message)):
        ChatTemplate(source).render([{"role": "user", "content": "hi"}])


def test_the_size_bounds_leave_ordinary_json_and_long_text_alone() -> None:
    # Just under the default size limit, and JSON of a few items indented as templates indent it.
    messages = [{"role": "user", "content": "hi"}]
    text = ChatTemplate("{{ ('x' * 3000000) | length }}|{{ messages | tojson(indent=4) }}").render(messages)
    assert text == "3000000|" + json.dumps(messages, indent=4)
    sized = ChatTemplate(
        "{{ messages | tojson }}", environment=ChatTemplateEnvironment(budget=RenderBudget(max_chars=80))
    )
    assert sized.render(messages) == json.dumps(messages, ensure_ascii=False)


TOOL_USE = "TOOLS {{ (tools or []) | length }}{% for m in messages %}|{{ m.content }}{% endfor %}"
DEFAULT = "DEFAULT{% for m in messages %}|{{ m.content }}{% endfor %}"


def _saved_by_transformers(root: Path, templates: dict[str, str]) -> Path:
    """A tokenizer folder as transformers' save_pretrained writes named templates: the default as
    chat_template.jinja, each other one as additional_chat_templates/<name>.jinja."""
    from transformers import AutoTokenizer

    build_tokenizer(root / "source")
    tok = AutoTokenizer.from_pretrained(str(root / "source"))
    tok.chat_template = templates
    tok.save_pretrained(str(root / "saved"))
    assert (root / "saved" / "additional_chat_templates" / "tool_use.jinja").is_file()
    return root / "saved"


@pytest.mark.parametrize(
    "call", [{}, {"tools": [WEATHER_TOOL]}, {"chat_template": "tool_use"}, {"chat_template": "default"}]
)
def test_named_template_files_render_as_transformers_renders_them(
    tmp_path: Path, call: dict[str, Any]
) -> None:
    from transformers import AutoTokenizer

    folder = _saved_by_transformers(tmp_path, {"default": DEFAULT, "tool_use": TOOL_USE})
    expected = AutoTokenizer.from_pretrained(str(folder)).apply_chat_template(
        MULTI_TURN, add_generation_prompt=False, tokenize=False, **call
    )
    got = Tokenizer(folder).apply_chat_template(MULTI_TURN, add_generation_prompt=False, **call)
    assert got == expected


@pytest.mark.parametrize(
    ("config_template", "tool_use_file", "call"),
    [
        # A tool_use.jinja file beside tokenizer_config.json's template replaces it: no default.
        ("CONFIG{{ messages | length }}", TOOL_USE, {}),
        ("CONFIG{{ messages | length }}", TOOL_USE, {"tools": [WEATHER_TOOL]}),
        # Named templates, none of them "default".
        ([{"name": "a", "template": DEFAULT}, {"name": "tool_use", "template": TOOL_USE}], None, {}),
        (
            [{"name": "a", "template": DEFAULT}, {"name": "tool_use", "template": TOOL_USE}],
            None,
            {"chat_template": "a"},
        ),
    ],
)
def test_a_folder_without_a_default_template_is_refused_where_transformers_refuses_it(
    tmp_path: Path, config_template: Any, tool_use_file: str | None, call: dict[str, Any]
) -> None:
    from transformers import AutoTokenizer

    folder = _template_folder(tmp_path / "tok", config_template, None)
    if tool_use_file is not None:
        (folder / "additional_chat_templates").mkdir()
        (folder / "additional_chat_templates" / "tool_use.jinja").write_text(tool_use_file)
    reference = AutoTokenizer.from_pretrained(str(folder))
    ours = Tokenizer(folder)
    try:
        expected = reference.apply_chat_template(
            MULTI_TURN, add_generation_prompt=False, tokenize=False, **call
        )
    except ValueError:
        with pytest.raises(ValueError, match=r"none is 'default': pass chat_template="):
            ours.apply_chat_template(MULTI_TURN, add_generation_prompt=False, **call)
        assert ours.chat_template is None  # a job refuses such a model before its first row
        return
    assert ours.apply_chat_template(MULTI_TURN, add_generation_prompt=False, **call) == expected


def test_template_files_are_read_as_utf8_whatever_the_locale(tmp_path: Path) -> None:
    """DeepSeek's template carries non-ASCII special tokens; a machine whose locale is not UTF-8
    must still read them as transformers does (UTF-8), not fail or garble them."""
    build_tokenizer(tmp_path)
    source = (TEMPLATES / "deepseek_v3.jinja").read_text(encoding="utf-8")
    (tmp_path / "chat_template.jinja").write_bytes(source.encode())
    (tmp_path / "additional_chat_templates").mkdir()
    (tmp_path / "additional_chat_templates" / "tool_use.jinja").write_bytes(source.encode())
    script = (
        "import sys; from shardinfer.engine.tokenizer import Tokenizer; t = Tokenizer(sys.argv[1]); "
        "print(ascii(t.chat_template)); print(ascii(t._named_templates['tool_use']))"
    )
    run = run_in_ascii_locale(script, str(tmp_path))
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [ascii(source), ascii(source)]
