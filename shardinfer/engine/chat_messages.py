"""Chat messages checked and brought to the form chat templates expect: text content, as vLLM sends it.

A template prints `message['content']` as it finds it, so anything but a string is corrupted
silently: `None` becomes the word "None", a list of OpenAI-style parts becomes its Python repr.
Before rendering:

- a string stays as it is;
- a list of parts becomes one string, its text parts joined with "\\n" (vLLM's rule for
  text-only models): a part is a plain string or an object of type "text" (also "input_text",
  "output_text", "refusal", "thinking") holding its text; a text or refusal part without text is
  skipped, as vLLM does; any other part (an image, audio) is refused: the models here read text;
- `None` (or a missing content) is refused, except on a message carrying `tool_calls`, whose
  content templates that know tool calls handle themselves, as Hugging Face's do.
"""

from __future__ import annotations

from typing import Any

# Part types whose payload is text, and the key holding it.
_TEXT_PART_KEYS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}
_SKIPPED_WHEN_EMPTY = ("text", "refusal")


class MessageError(ValueError):
    """A chat message that cannot be sent to a text model as it is; the message says which and why."""


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """New message dicts with text content (see the module docstring); MessageError if impossible."""
    if not isinstance(messages, list) or not messages:
        raise MessageError("messages must be a non-empty list of {role, content} objects")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise MessageError(
                f"message {i} is not an object with a string 'role' (and a 'content'): {_short(message)}"
            )
        content = message.get("content")
        if content is None:
            if message.get("tool_calls"):
                out.append(dict(message))
                continue
            raise MessageError(
                f"message {i} (role {message['role']!r}) has no content (null or missing); give it text, "
                "or drop the message (only a message with tool_calls may have null content)"
            )
        out.append({**message, "content": _text_of(content, i)})
    return out


def _text_of(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise MessageError(
            f"message {index} content is {type(content).__name__}: expected a string or a list of "
            '{"type": "text", "text": ...} parts'
        )
    texts = []
    for j, part in enumerate(content):
        if isinstance(part, str):
            texts.append(part)
            continue
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(part, dict) or kind not in _TEXT_PART_KEYS:
            raise MessageError(
                f"message {index} content part {j} has type {kind!r}: only text parts "
                f"({', '.join(sorted(_TEXT_PART_KEYS))}) can go to a text model; remove the part"
            )
        text = part.get(_TEXT_PART_KEYS[kind])
        if text is None and kind in _SKIPPED_WHEN_EMPTY:
            continue
        if not isinstance(text, str):
            raise MessageError(
                f"message {index} content part {j} ({kind!r}) holds {type(text).__name__} where its "
                f"{_TEXT_PART_KEYS[kind]!r} text should be"
            )
        texts.append(text)
    return "\n".join(texts)


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
