"""An lm-evaluation-harness model backed by the shardinfer engine, registered as "shardinfer".

    lm_eval --model shardinfer --model_args pretrained=DIR,dtype=float32 --tasks ...
    lm = ShardinferLM("DIR"); lm_eval.simple_evaluate(model=lm, tasks=[...])

Each of the harness's calls hands over every request of a task at once; they all go to the
engine together and its scheduler batches them (`batch_size` is accepted and ignored).
`loglikelihood` inherits the harness's own tokenisation (`TemplateLM._encode_pair`: the split
point, trailing whitespace, empty contexts) and scores through the engine's prompt logprobs,
continuations of one context sharing its prefill; `loglikelihood_rolling` cuts documents into the
harness's rolling windows (`pipeline.scoring.rolling_windows`); `generate_until` samples with the
engine's counter-based sampler, greedy unless the task asks otherwise, each request seeded from
`seed` and its task, document and request index, so results do not depend on batching.

The harness is an optional dependency: `pip install shardinfer[eval]`.
"""

from __future__ import annotations

import collections
from typing import Any

from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from tqdm import tqdm

from shardinfer.engine.llm_engine import LLMEngine
from shardinfer.engine.sampling_params import SamplingParams
from shardinfer.engine.seeds import derive_seed
from shardinfer.errors import ConfigError
from shardinfer.pipeline.score_batch import generate_ids, score_spans
from shardinfer.pipeline.scoring import (
    SPAN_RULE,
    Span,
    encode_text,
    longest_rolling_window,
    prefix_token_id,
    rolling_windows,
)


class ContinuationTooLong(ConfigError, ValueError):
    """A continuation longer than the model's window: the settings, not the run, must change."""


DEFAULT_MAX_GEN_TOKS = 256  # the harness's hf model's default
_SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "min_tokens",
    "seed",
)


@register_model("shardinfer")
class ShardinferLM(TemplateLM):
    def __init__(
        self,
        pretrained: str,
        device: str | None = "auto",
        dtype: str = "auto",
        seed: int = 1234,
        max_length: int | None = None,
        max_gen_toks: int = DEFAULT_MAX_GEN_TOKS,
        batch_size: int | str | None = None,
        max_batch_size: int | None = None,
        span_rule: str = SPAN_RULE,
        **engine_kwargs: Any,
    ) -> None:
        super().__init__()
        del batch_size, max_batch_size  # the engine batches by its own token budget
        self.engine = LLMEngine(pretrained, device=device or "auto", dtype=dtype, **engine_kwargs)
        self.model_dir = str(pretrained)
        self.seed = int(seed)
        self._max_gen_toks = int(max_gen_toks)
        # A span of `max_length` input positions has max_length + 1 tokens, its last one scored but
        # never fed (a prompt-only request), as in the harness's hf model: every position the
        # engine has is usable. (`span_rule`: an eval planned before that keeps its shorter spans.)
        longest = longest_rolling_window(self.engine.max_model_len, span_rule)
        if max_length is not None and not 1 <= int(max_length) <= longest:
            raise ValueError(
                f"max_length={max_length}: the engine takes at most {longest} here "
                f"(max_model_len={self.engine.max_model_len}); lower it or raise max_model_len"
            )
        self._max_length = int(max_length) if max_length is not None else longest
        tok = self.engine.tokenizer
        self._prefix = prefix_token_id(tok)
        eos = tok.encode(tok.eos_token, add_special_tokens=False) if tok.eos_token else []
        self._eot = eos[0] if len(eos) == 1 else (tok.eos_token_ids[0] if tok.eos_token_ids else self._prefix)

    # -- what the harness asks of a TemplateLM -----------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self._eot

    @property
    def prefix_token_id(self) -> int:
        return self._prefix

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def tokenizer_name(self) -> str:
        return self.model_dir

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return self.engine.tokenizer.chat_template or ""

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        tok = self.engine.tokenizer
        if add_special_tokens is None:
            ids = encode_text(tok, string)
        else:
            ids = tok.encode(string, add_special_tokens=add_special_tokens)
        left = kwargs.get("left_truncate_len")
        return ids[-left:] if left else ids

    def tok_decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        return str(self.engine.tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens))

    def apply_chat_template(
        self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        text = str(
            self.engine.tokenizer.apply_chat_template(
                chat_history, add_generation_prompt=add_generation_prompt
            )
        )
        if not add_generation_prompt and chat_history:
            # The harness prefills the last (assistant) message: end the text right after its
            # content, so the model continues it, as transformers' continue_final_message does.
            last = str(chat_history[-1]["content"])
            cut = text.rfind(last)
            if last and cut >= 0:
                text = text[: cut + len(last)]
        return text

    # -- the three request types ---------------------------------------------------------------------
    def _loglikelihood_tokens(
        self,
        requests: list[tuple[tuple[str, str] | None, list[int], list[int]]],
        disable_tqdm: bool = False,
        **kwargs: Any,
    ) -> list[tuple[float, bool]]:
        spans = []
        for request, context, continuation in requests:
            if not continuation:
                raise ValueError(
                    f"a request of the task has an empty continuation (context, continuation: {request!r:.120}): "
                    "nothing to score"
                )
            if len(continuation) > self.max_length:
                raise ContinuationTooLong(
                    f"a continuation of {len(continuation)} tokens cannot be scored with max_length="
                    f"{self.max_length}: raise max_model_len (shardinfer eval: --conf engine.max_model_len=N) "
                    "or max_length"
                )
            # As the harness does: keep the last max_length + 1 tokens, dropping context from the left.
            whole = (context + continuation)[-(self.max_length + 1) :]
            spans.append(Span(whole[: len(whole) - len(continuation)], continuation))
        with tqdm(total=len(spans), disable=disable_tqdm, desc="shardinfer loglikelihood") as bar:
            scores = score_spans(self.engine, spans, bar.update)
        answers = [(s.logprob_sum, s.is_greedy) for s in scores]
        for (request, _, _), answer in zip(requests, answers, strict=True):
            if request is not None:
                self.cache_hook.add_partial("loglikelihood", request, answer)
        return answers

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        owners: list[int] = []
        spans: list[Span] = []
        for i, (text,) in enumerate(req.args for req in requests):
            windows = rolling_windows(self.tok_encode(text), self.prefix_token_id, self.max_length)
            spans += windows
            owners += [i] * len(windows)
        with tqdm(total=len(spans), disable=disable_tqdm, desc="shardinfer rolling windows") as bar:
            scores = score_spans(self.engine, spans, bar.update)
        totals = [0.0] * len(requests)
        for owner, score in zip(owners, scores, strict=True):
            totals[owner] += score.logprob_sum
        for req, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        prompts: list[list[int]] = []
        params: list[SamplingParams] = []
        stops: list[list[str]] = []
        occurrence: collections.Counter[str] = collections.Counter()
        eos_text = self.tok_decode([self.eot_token_id], skip_special_tokens=False)
        for req in requests:
            context, gen_kwargs = req.args
            kwargs = normalize_gen_kwargs(dict(gen_kwargs), self.max_gen_toks)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos_text)
            max_gen = int(kwargs.pop("max_gen_toks"))
            # A request repeated by the task (repeats > 1) is the same object several times: each
            # occurrence gets its own sample.
            key = f"{req.task_name}/{req.doc_id}/{req.idx}"
            seed = derive_seed(self.seed, key, occurrence[key])
            occurrence[key] += 1
            params.append(self._sampling(kwargs, until, max_gen, seed))
            ids = self.tok_encode(context)
            prompts.append(ids[-(self.max_length - max_gen) :] if self.max_length > max_gen else ids)
            stops.append(until)
        with tqdm(total=len(prompts), disable=disable_tqdm, desc="shardinfer generate_until") as bar:
            outs = generate_ids(self.engine, prompts, params, bar.update)
        texts = []
        for req, out, until in zip(requests, outs, stops, strict=True):
            # As the harness's transformers model: the generated tokens (up to the one completing a
            # stop string) decoded without special tokens, then cut at the first stop string.
            text = postprocess_generated_text(self.tok_decode(list(out.outputs[0].token_ids)), until, None)
            self.cache_hook.add_partial("generate_until", req.args, text)
            texts.append(text)
        return texts

    def _sampling(self, kwargs: dict[str, Any], until: list[str], max_gen: int, seed: int) -> SamplingParams:
        do_sample = bool(kwargs.pop("do_sample", False))
        temperature = float(kwargs.pop("temperature", 0.0))
        temperature = temperature if do_sample else 0.0
        unknown = [k for k in kwargs if k not in _SAMPLING_KEYS]
        if unknown:
            raise ValueError(
                f"generation kwargs {unknown} are not supported by shardinfer; supported: until, max_gen_toks, "
                f"do_sample, {', '.join(_SAMPLING_KEYS)}"
            )
        settings = {k: v for k, v in kwargs.items() if k != "seed"}
        return SamplingParams(
            temperature=temperature,
            max_tokens=max_gen,
            stop=until,
            seed=int(kwargs.get("seed", seed)),
            # Stop strings are matched in the text with special tokens, as the harness's
            # transformers model matches them: a chat task's `until` is often a special token's
            # text ("<|im_end|>"), which the text without special tokens never holds.
            skip_special_tokens=False,
            **settings,
        )
