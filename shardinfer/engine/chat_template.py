"""Chat templates rendered as Hugging Face renders them, compiled once per tokenizer.

A checkpoint's `chat_template` is written against the jinja environment of transformers'
`apply_chat_template`, so the same messages must give the same prompt text here, character for
character, or a model sees prompts unlike the ones it was trained and evaluated on. What that
environment adds to plain jinja, and what we set the same way:

- jinja2's immutable sandbox (a template from a checkpoint is untrusted code) with a per-render
  budget of time, loop steps and size (template_budget.py), `trim_blocks` and
  `lstrip_blocks`, and the `loopcontrols` extension (`{% break %}`, `{% continue %}`);
- `raise_exception(message)` and `strftime_now(format)` as globals;
- a `tojson` filter that is plain `json.dumps` (no ASCII or HTML escaping) with its `indent`,
  `separators` and `sort_keys` arguments;
- a `{% generation %}` block (a marker for assistant-token masks in training): rendered as its body;
- what the template sees: messages with None-valued keys dropped, a message's reasoning under
  each of its names, `tools`, `documents`, `add_generation_prompt`, the tokenizer's special
  tokens and any extra keyword arguments (`chat_template_kwargs`, e.g. Qwen3's `enable_thinking`).

Compiling costs far more than rendering, so a `ChatTemplate` compiles its source once and renders
many times. `ChatTemplateEnvironment` is the one place the environment is built: a subclass
(a per-row time or loop budget, say) plugs in through `ChatTemplate(..., environment=...)`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import jinja2.ext
import jinja2.nodes
from jinja2.exceptions import SecurityError, TemplateError

from shardinfer.engine.template_budget import BudgetedSandbox, TemplateBudgetExceeded

# The names a message's reasoning travels under; templates read one of them (Qwen3:
# reasoning_content, gpt-oss: thinking), so each message carries it under all.
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")

# The named special tokens a template may reference, read from tokenizer_config.json.
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)

# Where transformers saves a model's named templates besides chat_template.jinja (the default), one
# `<name>.jinja` file each (tool_use.jinja, rag.jinja).
ADDITIONAL_TEMPLATES_DIR = "additional_chat_templates"

# The widest `tojson(indent=...)` a template may ask for: pretty-printed JSON in a prompt is indented
# by a few spaces, and every line of the output repeats the indent once per nesting level.
MAX_JSON_INDENT = 64

# Appended to the final message for continue_final_message: where it lands in the rendered text
# is where the continued message ends, whatever the template puts after it.
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class ChatTemplateError(ValueError):
    """A chat template that does not compile or render, or messages it cannot take."""


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _bounded_tojson(max_chars: int) -> Any:
    """The `tojson` filter, refusing JSON longer than `max_chars` before building it: a list holding
    one long string many times is small in memory but enormous as text."""

    def tojson(
        value: Any,
        ensure_ascii: bool = False,
        indent: int | str | None = None,
        separators: tuple[str, str] | None = None,
        sort_keys: bool = False,
    ) -> str:
        width = indent if isinstance(indent, int) else len(indent or "")
        if width > MAX_JSON_INDENT:
            raise TemplateBudgetExceeded(
                f"tojson(indent={indent!r:.40}) is wider than {MAX_JSON_INDENT} characters: indent by a few spaces"
            )
        # A separator is written between items and after each key: its text counts once per item.
        separator = sum(len(str(part)) for part in separators) if isinstance(separators, list | tuple) else 2
        if _json_size_bound(value, width, separator, max_chars) > max_chars:
            raise TemplateBudgetExceeded(f"tojson would build a text longer than {max_chars} characters")
        # jinja's own tojson escapes <, >, & and ' for HTML; prompts are not HTML.
        text = json.dumps(
            value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )
        if len(text) > max_chars:  # escapes made it longer than its bound
            raise TemplateBudgetExceeded(f"tojson built a text longer than {max_chars} characters")
        return text

    return tojson


def _json_size_bound(value: Any, indent: int, separator: int, limit: int) -> int:
    """About the most characters `value` takes as JSON (escapes aside), found before building it;
    counting stops just past `limit`. Each item costs its own text, quotes or brackets, its
    separators, a newline and its indent once per level it is nested in."""
    total = 0
    pending = [(value, 0)]
    while pending and total <= limit:
        item, level = pending.pop()
        total += 2 + separator + indent * level
        if isinstance(item, str | bytes | bytearray):
            total += len(item)
        elif isinstance(item, Mapping):
            pending.extend((k, level + 1) for k in item)
            pending.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list | tuple):
            pending.extend((v, level + 1) for v in item)
        else:
            total += 1
    return total


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _Namespace(jinja2.utils.Namespace):
    """jinja's `namespace()` refusing underscore-prefixed names, which lead towards Python internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        # No named `self`, as in jinja's own Namespace: `namespace(self=...)` must stay possible.
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"a chat template may not set the namespace attribute {name!r}: rename it")


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: marks assistant text for training masks; a prompt
    renders its body unchanged."""

    tags = {"generation"}  # noqa: RUF012 - jinja.ext.Extension declares it a plain class attribute

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _body(caller: Any) -> str:
        return str(caller())


class ChatTemplateEnvironment(BudgetedSandbox):
    """The jinja environment of Hugging Face chat templates (see the module docstring)."""

    def __init__(self, **options: Any) -> None:
        extensions = [jinja2.ext.loopcontrols, _GenerationBlock, *options.pop("extensions", [])]
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=extensions, **options)
        self.filters["tojson"] = _bounded_tojson(self.budget.max_chars)
        self.globals["raise_exception"] = _raise_exception
        self.globals["strftime_now"] = _strftime_now
        self.globals["namespace"] = _Namespace


def model_chat_templates(
    config_template: Any, jinja: str | None, additional: Mapping[str, str]
) -> tuple[str | None, dict[str, str]]:
    """(default template, named templates) of a model folder, as transformers loads them from its
    tokenizer_config.json `chat_template` (a template, or a list of {name, template}), its
    chat_template.jinja and its additional_chat_templates/<name>.jinja files (`additional`, by name).

    Template files, when there are any, replace tokenizer_config.json's templates altogether:
    chat_template.jinja is "default" (a file named default.jinja among the others wins over it,
    as in transformers). The named templates are {} when chat_template.jinja is the only file: a
    template name given to a call is then a template text, as transformers reads it. Without a "default" among
    several named templates there is no default template: a call must name one."""
    named: dict[str, str] = {}
    if jinja is not None or additional:
        named = {"default": jinja} if jinja is not None else {}
        named.update(additional)
        if list(named) == ["default"]:  # transformers keeps a lone template file as plain text
            return named["default"], {}
    elif isinstance(config_template, list):
        named = {
            str(t["name"]): t["template"]
            for t in config_template
            if isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str)
        }
    else:
        return (config_template if isinstance(config_template, str) else None), {}
    return named.get("default"), named


def plain_data(value: Any) -> Any:
    """`value` rebuilt from plain JSON types: what a template sees cannot carry methods of rich
    objects (numpy scalars, tensors) that the sandbox does not know to be unsafe."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain_data(k): plain_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_data(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain_data(v) for v in value)
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item):
        return plain_data(item())
    raise ChatTemplateError(
        f"chat template input holds a {type(value).__name__} ({value!r}): give plain "
        "JSON values (str, int, float, bool, None, lists and dicts)"
    )


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """Messages as the template sees them: plain dicts with None-valued keys dropped (an Arrow struct
    or an API response has `tool_calls: None` where a template expects the key to be absent) and the
    reasoning under each of its names."""
    if not isinstance(messages, list | tuple) or not messages:
        raise ChatTemplateError(
            f"chat messages are {messages!r}: give a non-empty list of {{'role': ..., 'content': ...}} dicts"
        )
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or "role" not in message:
            raise ChatTemplateError(
                f"chat message {i} is {message!r}: each message must be a dict with a 'role'"
            )
        msg = {k: v for k, v in plain_data(message).items() if v is not None}
        reasoning = next((msg[k] for k in REASONING_FIELDS if k in msg), None)
        if reasoning is not None:
            msg = {"thinking": reasoning, **msg, "reasoning_content": reasoning}
        out.append(msg)
    return out


class ChatTemplate:
    """A chat template compiled once; `render` is safe to call from several threads."""

    def __init__(
        self,
        source: str,
        special_tokens: Mapping[str, str] | None = None,
        environment: ChatTemplateEnvironment | None = None,
    ) -> None:
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        env = environment if environment is not None else ChatTemplateEnvironment()
        try:
            self._template = env.from_string(source)
        except TemplateError as exc:
            raise ChatTemplateError(f"the chat template does not compile: {exc}") from exc

    def render(
        self,
        messages: Any,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool | str = False,
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text of `messages`. continue_final_message: end the text inside the final
        (assistant) message so the model continues it, instead of opening a new one; True continues
        its content (a string, or the last text part of a list), a field name such as
        "reasoning_content" continues that field, as in transformers."""
        if continue_final_message and add_generation_prompt:
            raise ChatTemplateError(
                "continue_final_message=True and add_generation_prompt=True contradict each other: "
                "continue the final message, or open a new assistant turn, not both"
            )
        chat = normalize_messages(messages)
        if tools is not None and (
            not isinstance(tools, list | tuple) or not all(isinstance(t, Mapping) for t in tools)
        ):
            raise ChatTemplateError(f"tools={tools!r} must be a list of JSON-schema dicts")
        final = ""
        if continue_final_message:
            final = self._tag_final_message(chat[-1], continue_final_message)
        kwargs = {**self.special_tokens, **_template_kwargs(chat_template_kwargs)}
        try:
            text = self._template.render(
                messages=chat,
                tools=plain_data(tools),
                documents=plain_data(documents),
                add_generation_prompt=add_generation_prompt,
                **kwargs,
            )
        except TemplateError as exc:
            raise ChatTemplateError(f"the chat template failed to render: {exc}") from exc
        except RecursionError as exc:
            # A macro or recursive loop calling itself without end: Python's own depth limit stops
            # it before the budget's step count does.
            raise ChatTemplateError(
                "the chat template failed to render: it recursed too deeply (a macro or recursive "
                "loop that calls itself without end on these messages)"
            ) from exc
        except MemoryError as exc:
            raise ChatTemplateError(
                "the chat template failed to render: it ran out of memory building its text"
            ) from exc
        except (TypeError, ValueError, ArithmeticError, LookupError, AttributeError) as exc:
            # A template's own expressions failing on these messages ('+' on a string and a number,
            # a division by zero): the template or the messages are wrong, not the engine.
            raise ChatTemplateError(
                f"the chat template failed to render these messages: {type(exc).__name__}: {exc}"
            ) from exc
        if continue_final_message:
            text = _cut_after_final_message(text, final)
        return text

    def _tag_final_message(self, message: dict[str, Any], how: bool | str) -> str:
        """Appends the continue tag to the text of `message` that is to be continued (in place) and
        returns that text. `how`: True for the content, or the name of the field to continue."""
        if not isinstance(how, bool | str) or how == "":
            raise ChatTemplateError(
                f"continue_final_message={how!r} must be True, False or the name of the final "
                "message's field to continue (e.g. 'reasoning_content')"
            )
        field = how if isinstance(how, str) else "content"
        final = message.get(field)
        if final is None:
            raise ChatTemplateError(
                f"continue_final_message is set, but the final message has no {field!r} to continue"
            )
        # Reasoning travels under several names (normalize_messages): tag every copy of it, so
        # whichever name the template reads carries the tag.
        fields = [field]
        if field in REASONING_FIELDS:
            fields = [f for f in REASONING_FIELDS if message.get(f) == final]
        if not any(f in self.source for f in fields):
            raise ChatTemplateError(
                f"continue_final_message={how!r}, but the chat template never reads the field "
                f"{field!r}: it cannot be continued with this template"
            )
        if isinstance(final, list | tuple):
            return _tag_last_text_part(final, field)
        if not isinstance(final, str):
            raise ChatTemplateError(
                f"continue_final_message is set, but the final message's {field!r} is "
                f"{type(final).__name__} ({final!r:.100}): it must be a string or a list of text parts"
            )
        for f in fields:
            message[f] = final + _CONTINUE_TAG
        return final


def _tag_last_text_part(parts: list[Any] | tuple[Any, ...], field: str) -> str:
    """The text of the last part holding one (a {"type": "text", "text": ...} part), tagged in place."""
    for part in reversed(parts):
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            text: str = part["text"]
            part["text"] = text + _CONTINUE_TAG
            return text
    raise ChatTemplateError(
        f"continue_final_message is set, but the final message's {field!r} has no text part to "
        'continue: give it a {"type": "text", "text": ...} part'
    )


# Variables render() sets itself; chat_template_kwargs may not replace them.
_RENDER_ARGUMENTS = ("messages", "tools", "documents", "add_generation_prompt")


def _template_kwargs(chat_template_kwargs: Any) -> dict[str, Any]:
    """chat_template_kwargs as template variables: a mapping of names the render does not set itself."""
    if chat_template_kwargs is None:
        return {}
    if not isinstance(chat_template_kwargs, Mapping):
        raise ChatTemplateError(
            f"chat_template_kwargs={chat_template_kwargs!r:.100} must be a dict of template "
            "variables, e.g. {'enable_thinking': False}"
        )
    taken = [k for k in chat_template_kwargs if k in _RENDER_ARGUMENTS]
    if taken:
        raise ChatTemplateError(
            f"chat_template_kwargs sets {taken[0]!r}, which the render sets itself: pass it "
            f"as the {taken[0]} argument instead"
        )
    return dict(plain_data(dict(chat_template_kwargs)))


def _cut_after_final_message(text: str, final: str) -> str:
    """The rendered text up to the end of the final message's content (where its tag landed)."""
    tag = _CONTINUE_TAG.strip()
    if final.strip() not in text or tag not in text:
        raise ChatTemplateError(
            "continue_final_message=True, but the chat template does not render the final "
            "message's content: it cannot be continued with this template"
        )
    at = text.rindex(tag)
    if text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return text[:at]
    return text[:at].rstrip()  # the template trimmed the tag's trailing space, and the message's with it
