"""`LLM`: the whole-batch API, shaped like vLLM's. Takes vLLM's prompt forms, expands n samples
into single requests with derived seeds, runs the streaming engine to completion and returns
outputs in input order.

Seeds: a request without `SamplingParams.seed` gets `derive_seed(engine seed, "request", position)`,
position counting every prompt this LLM has been given since it was built, so identical prompts
are sampled independently and a fresh LLM with the same seed given the same calls samples the
same. Engine seed 0 (the default) draws a random seed per request instead.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Mapping, Sequence
from numbers import Integral
from pathlib import Path
from typing import Any

from shardinfer.engine.chat_messages import normalize_messages
from shardinfer.engine.engines import make_engine
from shardinfer.engine.llm_engine import LLMEngine
from shardinfer.engine.outputs import RequestOutput
from shardinfer.engine.prompt_checks import check_prompt, check_stop_token_ids
from shardinfer.engine.sampling_params import SamplingParams
from shardinfer.engine.seeds import derive_seed, sample_seeds

# vLLM's prompt forms: text, token ids, {"prompt": text}, {"prompt_token_ids": ids}.
Prompt = str | list[int] | Mapping[str, Any]
_PROMPT_FORMS = (
    'a string, a list of token ids, {"prompt": str}, {"prompt_token_ids": [int, ...]}, or a list of these'
)


def _is_token_ids(value: Any) -> bool:
    return (
        isinstance(value, list | tuple)
        and bool(value)
        and all(isinstance(t, Integral) and not isinstance(t, bool) for t in value)
    )


def _is_empty_ids(value: Any) -> bool:
    return isinstance(value, list | tuple) and not value


def normalize_prompts(prompts: Any) -> list[str | list[int]]:
    """vLLM's prompt forms -> a list of texts and token-id lists; anything else is a ValueError
    naming the prompt and the accepted forms (a dict is never mistaken for a list of its keys)."""
    if isinstance(prompts, str | Mapping) or _is_token_ids(prompts):
        prompts = [prompts]
    if not isinstance(prompts, list | tuple):
        raise ValueError(f"prompts is a {type(prompts).__name__} ({prompts!r:.100}): give {_PROMPT_FORMS}")
    return [_one_prompt(i, p) for i, p in enumerate(prompts)]


def _one_prompt(i: int, prompt: Any) -> str | list[int]:
    if isinstance(prompt, str):
        return prompt
    if _is_token_ids(prompt):
        return [int(t) for t in prompt]
    if _is_empty_ids(prompt) or (
        isinstance(prompt, Mapping)
        and set(prompt) == {"prompt_token_ids"}
        and _is_empty_ids(prompt["prompt_token_ids"])
    ):
        # Named as what it is: the form is right, the prompt is empty.
        raise ValueError(f"prompt {i} is an empty list of token ids: give at least one token id")
    if isinstance(prompt, Mapping):
        keys = set(prompt)
        if keys == {"prompt"} and isinstance(prompt["prompt"], str):
            return str(prompt["prompt"])
        if keys == {"prompt_token_ids"} and _is_token_ids(prompt["prompt_token_ids"]):
            return [int(t) for t in prompt["prompt_token_ids"]]
        raise ValueError(
            f"prompt {i} is the dict {prompt!r:.200}: a prompt dict holds exactly one key, "
            '"prompt" (a string) or "prompt_token_ids" (a non-empty list of ints)'
        )
    raise ValueError(
        f"prompt {i} is a {type(prompt).__name__} ({prompt!r:.100}): each prompt must be "
        f"{_PROMPT_FORMS.removesuffix(', or a list of these')}"
    )


class LLM:
    def __init__(self, model: str | Path, **engine_kwargs: Any) -> None:
        # expert_parallel_size > 1: the same interface over rank processes (engine/parallel/ranks.py)
        self.llm_engine: LLMEngine = make_engine(model, **engine_kwargs)
        self._positions = 0  # prompts taken so far: the position that seeds unseeded requests

    @property
    def tokenizer(self) -> Any:
        return self.llm_engine.tokenizer

    def get_tokenizer(self) -> Any:
        """The model's tokenizer (encode, decode, apply_chat_template), as vLLM's LLM.get_tokenizer."""
        return self.llm_engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """The params `generate` uses when given None, as vLLM's: the checkpoint's
        generation_config.json over SamplingParams' own defaults. An explicit SamplingParams does
        not inherit them; start from these (`.replace(max_tokens=64)`) to keep them."""
        return self.llm_engine.default_params()

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool | Callable[..., Any] = True,
    ) -> list[RequestOutput]:
        """One RequestOutput per prompt, in input order. sampling_params: one for all prompts, one
        per prompt, or None for the checkpoint's defaults (generation_config.json). use_tqdm: show
        a progress bar over prompts (or a tqdm-like callable to build it)."""
        prompt_list = normalize_prompts(prompts)
        if sampling_params is None:
            params_list = [self.llm_engine.default_params()] * len(prompt_list)
        elif isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompt_list)
        else:
            if not isinstance(sampling_params, list | tuple):
                raise ValueError(
                    f"sampling_params is a {type(sampling_params).__name__} "
                    f"({sampling_params!r:.100}): give a SamplingParams, a list of them (one per "
                    "prompt) or None"
                )
            params_list = list(sampling_params)
            wrong = next((i for i, p in enumerate(params_list) if not isinstance(p, SamplingParams)), None)
            if wrong is not None:
                raise ValueError(
                    f"sampling_params[{wrong}] is a {type(params_list[wrong]).__name__} "
                    f"({params_list[wrong]!r:.100}): each must be a SamplingParams, e.g. "
                    "SamplingParams(max_tokens=64)"
                )
            if len(params_list) != len(prompt_list):
                raise ValueError(
                    f"got {len(params_list)} SamplingParams for {len(prompt_list)} prompts: "
                    "pass one, or one per prompt"
                )
        return self._run(prompt_list, params_list, use_tqdm)

    def chat(
        self,
        messages: list[list[dict[str, Any]]] | list[dict[str, Any]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool | Callable[..., Any] = True,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool | str = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        chat_template: str | None = None,
    ) -> list[RequestOutput]:
        """Generate from conversations through the chat template, rendered as transformers'
        apply_chat_template renders it. One conversation or a list of them; tools: JSON-schema
        tool definitions; chat_template_kwargs: extra template variables (Qwen3's
        enable_thinking); continue_final_message: continue the last (assistant) message instead of
        opening a new turn (with add_generation_prompt=False), or, given a field's name such as
        "reasoning_content", continue that field; chat_template: use this template instead of the
        model's, or the name of one of the model's named templates ("tool_use" is chosen by itself
        when tools are given and the model has it)."""
        conversations = _conversations(messages)
        texts = []
        for i, conversation in enumerate(conversations):
            try:
                # Text content as a job gives it to the template (parts joined, images refused).
                text = self.tokenizer.apply_chat_template(
                    normalize_messages(conversation),
                    add_generation_prompt=add_generation_prompt,
                    continue_final_message=continue_final_message,
                    tools=tools,
                    chat_template_kwargs=chat_template_kwargs,
                    chat_template=chat_template,
                )
            except ValueError as exc:
                raise _prefixed(exc, f"conversation {i}") from exc
            if not text:
                raise ValueError(
                    f"conversation {i}: the chat template rendered it as an empty prompt; check the "
                    "template (chat_template, or the model's tokenizer_config.json)"
                )
            texts.append(text)
        # The template already places any BOS token, so encode without adding special tokens again.
        ids = [self.tokenizer.encode(t, add_special_tokens=False) for t in texts]
        outputs = self.generate(ids, sampling_params, use_tqdm)
        for output, text in zip(outputs, texts, strict=True):
            output.prompt = text  # the rendered conversation: what the model read, as text
        return outputs

    def _request_seed(self, params: SamplingParams, position: int) -> int:
        if params.seed is not None:
            return int(params.seed)
        engine_seed = self.llm_engine.config.seed
        return derive_seed(engine_seed, "request", position) if engine_seed else secrets.randbits(63)

    def _run(
        self,
        prompts: list[str | list[int]],
        params_list: list[SamplingParams],
        use_tqdm: bool | Callable[..., Any],
    ) -> list[RequestOutput]:
        engine = self.llm_engine
        # Validate every prompt before queueing any, so a bad one costs no work.
        token_ids = []
        for i, prompt in enumerate(prompts):
            try:
                ids = engine.tokenize_prompt(prompt)
                check_prompt(
                    ids, engine.max_model_len, engine.length_fix, prompt_only=params_list[i].max_tokens == 0
                )
                check_stop_token_ids(params_list[i].stop_token_ids, engine.model_config.vocab_size)
                if (
                    params_list[i].structured_output is not None
                ):  # a bad schema: GrammarError, before any work
                    engine.grammar_compiler().compile(params_list[i].structured_output)
            except ValueError as exc:
                raise _prefixed(exc, f"prompt {i}") from exc
            token_ids.append(ids)
        first_position, self._positions = self._positions, self._positions + len(prompts)
        groups: list[list[str]] = []
        owner: dict[str, int] = {}
        done: dict[str, RequestOutput] = {}
        bar = None
        try:
            for i, (ids, params) in enumerate(zip(token_ids, params_list, strict=True)):
                seed = self._request_seed(params, first_position + i)
                names = []
                for j, sample in enumerate(sample_seeds(seed, params.n)):
                    rid = f"{id(self)}-{engine._arrivals}-{i}-{j}"
                    try:
                        engine.add_request(rid, ids, params.replace(n=1, seed=sample))
                    except ValueError as exc:
                        raise _prefixed(exc, f"prompt {i}") from exc
                    prompt = prompts[i]
                    engine.requests[rid].prompt = prompt if isinstance(prompt, str) else None
                    names.append(rid)
                    owner[rid] = i
                groups.append(names)
            remaining = [len(g) for g in groups]
            bar = _progress_bar(use_tqdm, len(groups))
            while engine.has_unfinished():
                for out in engine.step():
                    done[out.request_id] = out
                    i = owner[out.request_id]
                    remaining[i] -= 1
                    if bar is not None and remaining[i] == 0:
                        bar.update(1)
        except BaseException:
            # A refused prompt, a failed step or Ctrl-C: this call's requests leave the engine with
            # it, so the next call starts from an empty engine instead of meeting their outputs.
            for rid in owner:
                if rid not in done:
                    with contextlib.suppress(Exception):
                        engine.abort(rid)
            raise
        finally:
            if bar is not None:
                bar.close()
        return [self._merge([done[n] for n in names], params_list[i]) for i, names in enumerate(groups)]

    def _merge(self, parts: list[RequestOutput], params: SamplingParams) -> RequestOutput:
        """One RequestOutput holding a prompt's n samples, with the API's decoded top-logprob tokens."""
        first = parts[0]
        for j, part in enumerate(parts):
            completion = part.outputs[0]
            completion.index = j
            if completion.top_logprobs is not None:
                completion.top_logprob_tokens = [
                    [self.tokenizer.decode([t], skip_special_tokens=False) for t, _ in step]
                    for step in completion.top_logprobs
                ]
        first.outputs = [p.outputs[0] for p in parts]
        return first


def _prefixed(exc: ValueError, where: str) -> ValueError:
    """The same error (its class, hence a row's error code) with the failing input named first."""
    try:
        return type(exc)(f"{where}: {exc}")
    except TypeError:  # a class that takes other arguments
        return ValueError(f"{where}: {exc}")


def _conversations(messages: Any) -> list[Any]:
    """One conversation (a list of message dicts) or a list of them, as a list of conversations."""
    if isinstance(messages, list | tuple) and messages and all(isinstance(m, list | tuple) for m in messages):
        return list(messages)
    if isinstance(messages, list | tuple) and messages and all(isinstance(m, Mapping) for m in messages):
        return [list(messages)]
    raise ValueError(
        f"messages={messages!r:.120}: give one conversation, a list of {{'role': ..., 'content': ...}} "
        "dicts, or a list of such conversations"
    )


def _progress_bar(use_tqdm: bool | Callable[..., Any], total: int) -> Any:
    if not use_tqdm or total == 0:
        return None
    if callable(use_tqdm):
        return use_tqdm(total=total, desc="Processed prompts", unit="prompt")
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="Processed prompts", unit="prompt", dynamic_ncols=True)
