"""`LLM`: the whole-batch API. Expands n samples into single requests with derived seeds, runs
the streaming engine to completion and returns outputs in input order."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shardinfer.engine.llm_engine import LLMEngine
from shardinfer.engine.outputs import RequestOutput
from shardinfer.engine.prompt_checks import check_prompt
from shardinfer.engine.sampling_noise import sample_seeds
from shardinfer.engine.sampling_params import SamplingParams

Prompt = str | list[int]


class LLM:
    def __init__(self, model: str | Path, **engine_kwargs: Any) -> None:
        self.llm_engine = LLMEngine(model, **engine_kwargs)

    @property
    def tokenizer(self) -> Any:
        return self.llm_engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        if isinstance(prompts, str) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]  # type: ignore[list-item]
        prompt_list = list(prompts)  # type: ignore[arg-type]
        if sampling_params is None:
            params_list = [self.llm_engine.default_params()] * len(prompt_list)
        elif isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompt_list)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompt_list):
                raise ValueError(
                    f"got {len(params_list)} SamplingParams for {len(prompt_list)} prompts: "
                    "pass one, or one per prompt"
                )
        return self._run(prompt_list, params_list)

    def chat(
        self,
        messages: list[list[dict[str, Any]]] | list[dict[str, Any]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        chat_template: str | None = None,
    ) -> list[RequestOutput]:
        """Generate from conversations through the chat template, rendered as transformers'
        apply_chat_template renders it. One conversation or a list of them; tools: JSON-schema
        tool definitions; chat_template_kwargs: extra template variables (Qwen3's
        enable_thinking); continue_final_message: continue the last (assistant) message instead of
        opening a new turn (with add_generation_prompt=False); chat_template: use this template
        instead of the model's."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        texts = [
            self.tokenizer.apply_chat_template(
                c,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,  # type: ignore[arg-type]
                tools=tools,
                chat_template_kwargs=chat_template_kwargs,
                chat_template=chat_template,
            )
            for c in conversations
        ]
        # The template already places any BOS token, so encode without adding special tokens again.
        ids = [self.tokenizer.encode(t, add_special_tokens=False) for t in texts]
        return self.generate(ids, sampling_params)

    def _run(self, prompts: list[Prompt], params_list: list[SamplingParams]) -> list[RequestOutput]:
        engine = self.llm_engine
        # Validate every prompt before queueing any, so a bad one costs no work.
        token_ids = []
        for i, prompt in enumerate(prompts):
            try:
                ids = engine.tokenize_prompt(prompt)
                check_prompt(ids, engine.max_model_len)
            except ValueError as exc:
                raise ValueError(f"prompt {i}: {exc}") from exc
            # A bad schema raises GrammarError before any work.
            if params_list[i].structured_output is not None:
                engine.grammar_compiler().compile(params_list[i].structured_output)
            token_ids.append(ids)
        groups: list[list[str]] = []
        for i, (ids, params) in enumerate(zip(token_ids, params_list, strict=True)):
            seed = params.seed if params.seed is not None else (engine.config.seed or secrets.randbits(63))
            names = []
            for j, sample in enumerate(sample_seeds(seed, params.n)):
                rid = f"{id(self)}-{engine._arrivals}-{i}-{j}"
                single = params.replace(n=1, seed=sample)
                engine.add_request(rid, ids, single)
                prompt = prompts[i]
                engine.requests[rid].prompt = prompt if isinstance(prompt, str) else None
                names.append(rid)
            groups.append(names)
        done: dict[str, RequestOutput] = {}
        while engine.has_unfinished():
            for out in engine.step():
                done[out.request_id] = out
        results = []
        for names in groups:
            parts = [done[n] for n in names]
            first = parts[0]
            for j, part in enumerate(parts):
                part.outputs[0].index = j
            first.outputs = [p.outputs[0] for p in parts]
            results.append(first)
        return results
