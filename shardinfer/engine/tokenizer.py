"""Tokenizer and chat template of a model directory, without transformers.

`tokenizer.json` is read by `tokenizers`; special tokens come from `tokenizer_config.json`
(end-of-sequence ids also from `config.json` and `generation_config.json`); the chat templates from
`chat_template.jinja` and `additional_chat_templates/<name>.jinja`, else from
`tokenizer_config.json`, as transformers reads them (engine.chat_template.model_chat_templates);
the chat template is compiled once, on first use, and rendered in the environment transformers uses
(engine/chat_template.py), inside jinja2's sandbox so a checkpoint's template cannot reach Python
internals.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, overload

from tokenizers import Tokenizer as HFTokenizer

from shardinfer.engine.chat_template import (
    ADDITIONAL_TEMPLATES_DIR,
    SPECIAL_TOKEN_NAMES,
    ChatTemplate,
    model_chat_templates,
)
from shardinfer.engine.sampling_params import checkpoint_eos_token_ids
from shardinfer.errors import ModelLoadError


def _token_text(value: Any) -> str | None:
    """tokenizer_config.json stores special tokens as strings or as AddedToken dicts."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def read_template_file(path: Path) -> str | None:
    """A template file's text (None when absent), read as UTF-8 as transformers reads it, whatever
    the machine's locale: templates carry non-ASCII special tokens."""
    if not path.is_file():
        return None
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ModelLoadError(f"{str(path)!r} is not UTF-8 text ({exc}): save the template as UTF-8") from None


def additional_chat_templates(model_dir: Path) -> dict[str, str]:
    """name -> template of the folder's additional_chat_templates/<name>.jinja files."""
    folder = model_dir / ADDITIONAL_TEMPLATES_DIR
    if not folder.is_dir():
        return {}
    return {
        path.name.removesuffix(".jinja"): text
        for path in sorted(folder.glob("*.jinja"))
        if (text := read_template_file(path)) is not None
    }


def _tokenizer_config(path: Path) -> dict[str, Any]:
    """tokenizer_config.json as a dict ({} when absent); a file that is not a JSON object is a
    ModelLoadError naming it."""
    if not path.is_file():
        return {}
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{str(path)!r} is not valid JSON ({exc}): fix or remove it") from None
    if not isinstance(cfg, dict):
        raise ModelLoadError(
            f"{str(path)!r} holds a JSON {type(cfg).__name__}, not an object: fix or remove it"
        )
    return cfg


class Tokenizer:
    def __init__(self, model_dir: str | Path, eos_token_ids: tuple[int, ...] = ()) -> None:
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise ModelLoadError(
                f"no tokenizer.json in {str(model_dir)!r}: shardinfer reads tokenizers in the "
                "`tokenizers` JSON format (save one with tokenizer.save_pretrained)"
            )
        self.path = path
        try:
            self._tok = HFTokenizer.from_file(str(path))
        except Exception as exc:  # the tokenizers library reports a bad file as a bare Exception
            raise ModelLoadError(
                f"{str(path)!r} is not a readable tokenizer ({exc}): save it again with "
                "tokenizer.save_pretrained"
            ) from None
        cfg = _tokenizer_config(model_dir / "tokenizer_config.json")
        self.bos_token = _token_text(cfg.get("bos_token"))
        self.eos_token = _token_text(cfg.get("eos_token"))
        self.add_bos_token = bool(cfg.get("add_bos_token", False))
        # The default template renders; a named one ("tool_use", from tokenizer_config.json's list or
        # additional_chat_templates/) where a call names it or passes tools, as transformers chooses.
        template, self._named_templates = model_chat_templates(
            cfg.get("chat_template"),
            read_template_file(model_dir / "chat_template.jinja"),
            additional_chat_templates(model_dir),
        )
        self.chat_template: str | None = template
        # End-of-sequence ids: config.json's (passed in), generation_config.json's, then the
        # tokenizer's eos_token, as transformers and vLLM stop at each of them.
        ids = list(eos_token_ids)
        try:
            ids += [t for t in checkpoint_eos_token_ids(model_dir) if t not in ids]
        except ValueError as exc:
            raise ModelLoadError(str(exc)) from None
        if self.eos_token is not None:
            eos_id = self._tok.token_to_id(self.eos_token)
            if eos_id is not None and eos_id not in ids:
                ids.append(eos_id)
        self.eos_token_ids: tuple[int, ...] = tuple(ids)
        self.bos_token_id = self._tok.token_to_id(self.bos_token) if self.bos_token else None
        # What a template sees as bos_token, eos_token, ...: the named special tokens that are set.
        self.special_tokens = {
            name: text for name in SPECIAL_TOKEN_NAMES if (text := _token_text(cfg.get(name))) is not None
        }
        self._compiled: ChatTemplate | None = None
        self._compiled_named: dict[str, ChatTemplate] = {}
        self._compile_lock = threading.Lock()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._with_bos(
            list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids), add_special_tokens
        )

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        """`[encode(t) for t in texts]`, tokenised in parallel outside the interpreter lock (the
        job's preparation thread then leaves the engine thread the interpreter). A tokenizer.json
        that pads would pad a batch to its longest text, so it is encoded text by text."""
        if self._tok.padding is not None:
            return [self.encode(t, add_special_tokens) for t in texts]
        encodings = self._tok.encode_batch(texts, add_special_tokens=add_special_tokens)
        return [self._with_bos(list(e.ids), add_special_tokens) for e in encodings]

    def _with_bos(self, ids: list[int], add_special_tokens: bool) -> list[int]:
        if (
            add_special_tokens
            and self.add_bos_token
            and self.bos_token_id is not None
            and (not ids or ids[0] != self.bos_token_id)
        ):
            ids.insert(0, self.bos_token_id)
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=skip_special_tokens))

    def compiled_chat_template(self) -> ChatTemplate:
        """The model's chat template, compiled on first use and kept for every later row."""
        if self._compiled is None:
            if not self.chat_template:
                raise ValueError(self._no_default_template())
            with self._compile_lock:
                if self._compiled is None:
                    self._compiled = ChatTemplate(self.chat_template, self.special_tokens)
        return self._compiled

    def _no_default_template(self) -> str:
        if self._named_templates:
            names = sorted(self._named_templates)
            return (
                f"this model's chat templates are named {names} and none is 'default': pass "
                "chat_template=<one of those names>, or add the default as chat_template.jinja"
            )
        return (
            "this model's tokenizer_config.json has no chat_template: use generate() with plain "
            "prompts, or add a chat_template to the model directory"
        )

    def _template_for(self, chat_template: str | None, tools: list[dict[str, Any]] | None) -> ChatTemplate:
        """The template a call renders with, chosen as transformers chooses: `chat_template` names
        one of the model's named templates or is a template itself; else "tool_use" (when the model
        has one) for a call with tools; else the model's default."""
        name = chat_template if chat_template in self._named_templates else None
        if chat_template is None and tools is not None and "tool_use" in self._named_templates:
            name = "tool_use"
        if name is not None:
            with self._compile_lock:
                if name not in self._compiled_named:
                    self._compiled_named[name] = ChatTemplate(
                        self._named_templates[name], self.special_tokens
                    )
                return self._compiled_named[name]
        if chat_template is not None:
            return ChatTemplate(chat_template, self.special_tokens)
        return self.compiled_chat_template()

    @overload
    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = ...,
        *,
        tokenize: Literal[False] = ...,
        continue_final_message: bool | str = ...,
        tools: list[dict[str, Any]] | None = ...,
        documents: list[dict[str, Any]] | None = ...,
        chat_template_kwargs: Mapping[str, Any] | None = ...,
        chat_template: str | None = ...,
    ) -> str: ...

    @overload
    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = ...,
        *,
        tokenize: Literal[True],
        continue_final_message: bool | str = ...,
        tools: list[dict[str, Any]] | None = ...,
        documents: list[dict[str, Any]] | None = ...,
        chat_template_kwargs: Mapping[str, Any] | None = ...,
        chat_template: str | None = ...,
    ) -> list[int]: ...

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        *,
        tokenize: bool = False,
        continue_final_message: bool | str = False,
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        chat_template: str | None = None,
    ) -> str | list[int]:
        """The prompt text of one conversation, as transformers' apply_chat_template(tokenize=False)
        gives it, or with tokenize=True its token ids (the text encoded without adding special
        tokens: the template places them); raises ValueError (ChatTemplateError) naming what is
        wrong. chat_template: a template to use instead of the model's (compiled for this call).
        Unlike transformers' default, tokenize is False unless asked."""
        template = self._template_for(chat_template, tools)
        text = template.render(
            messages,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tools=tools,
            documents=documents,
            chat_template_kwargs=chat_template_kwargs,
        )
        return self.encode(text, add_special_tokens=False) if tokenize else text
