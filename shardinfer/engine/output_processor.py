"""From sampled tokens to what the caller sees: reading a launched step's tokens back, accepting
each into its request (logprobs, grammar, stop checks), prompt logprobs, and `RequestOutput`s.

Stop checks, in order: stop token ids and EOS (unless ignore_eos; both only after min_tokens),
stop strings on the detokenized text (the matched string, or the stop token's text, is cut from the
text unless include_stop_str_in_output), a finished grammar, then max_tokens and max_model_len.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardinfer.engine.grammar_masks import GrammarMaskFiller
from shardinfer.engine.in_flight import InFlightStep
from shardinfer.engine.outputs import CompletionOutput, RequestOutput
from shardinfer.engine.prompt_scores import PromptScores, read_scores
from shardinfer.engine.request import Request, RequestStatus
from shardinfer.engine.sampler import DISCARDED, DRAFTS, SampleResult
from shardinfer.engine.tokenizer import Tokenizer

if TYPE_CHECKING:
    from shardinfer.engine.structured import GrammarViolation

    # What read_back hands the step's completion: the sampled tokens, the live rows (request,
    # output slot or DRAFTS, first row, rows) and, per grammar row's request, the matcher's
    # refusal or None.
    Accepted = tuple[SampleResult, list[tuple[Request, int, int, int]], dict[int, GrammarViolation | None]]


class OutputProcessor:
    def __init__(
        self,
        tokenizer: Tokenizer,
        max_model_len: int,
        requests: dict[str, Request],
        grammar_masks: GrammarMaskFiller,
        counters: dict[str, float],
    ) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.requests = requests  # the engine's requests in flight, by id (shared, not copied)
        self.grammar_masks = grammar_masks
        self.counters = counters

    def read_back(self, step: InFlightStep) -> Accepted:
        """Wait for a launched step's sampled tokens (its only host sync) and advance the grammar
        matchers of its live rows by them, in one batched call: all that the next step's masks
        need. The rest of the step's bookkeeping is the engine's completion of the step."""
        assert step.sampled is not None
        result = step.sampled.result()
        live: list[tuple[Request, int, int, int]] = []  # (request, output slot or DRAFTS, first row, rows)
        row = 0
        for i, req in enumerate(step.requests):
            first, row = row, row + step.counts[i]
            slot = step.output_slots[i]
            if slot == DISCARDED or req.status.finished or self.requests.get(req.request_id) is not req:
                continue  # aborted, or finished by an earlier token while this one was in flight
            live.append((req, slot, first, step.counts[i]))
        constrained = [
            (req, result.token_ids[first])
            for req, slot, first, _ in live
            if slot != DRAFTS and req.grammar is not None
        ]
        return result, live, self.grammar_masks.accept_tokens(constrained)

    def accept_sampled(
        self, req: Request, slot: int, result: SampleResult, row: int, violation: GrammarViolation | None
    ) -> None:
        """Put sampled row `row`'s token into its placeholder at `slot` (its matcher already took it)."""
        req.output_token_ids[slot] = result.token_ids[row]
        req.num_placeholders -= 1
        self.accept_token(
            req,
            slot,
            result.logprobs[row],
            result.top_logprobs[row],
            advance_grammar=False,
            violation=violation,
        )

    def accept_token(
        self,
        req: Request,
        slot: int,
        logprob: float,
        top: list[tuple[int, float]] | None,
        advance_grammar: bool = True,
        violation: GrammarViolation | None = None,
    ) -> None:
        """Output token `slot` is now known: record it, advance the grammar, check for a stop.
        advance_grammar=False: the matcher already took the token in read_back's batched accept,
        and `violation` is its refusal, if any."""
        token = req.output_token_ids[slot]
        req.output_logprobs.append(logprob)
        if top is not None:
            req.output_top_logprobs.append(top)
        self.counters["generated_tokens"] += 1
        if req.grammar is not None:
            try:
                if violation is not None:
                    raise violation
                if advance_grammar:
                    req.grammar.accept(token)
            except (
                RuntimeError
            ) as exc:  # the mask should make this impossible; fail the request, not the step
                req.error = f"structured output: {exc}"
                req.output_text = self.tokenizer.decode(
                    req.output_token_ids[:slot], req.params.skip_special_tokens
                )
                del req.output_token_ids[slot + 1 :]
                req.num_placeholders = 0
                req.finish(RequestStatus.FINISHED_ERROR)
                return
        status, reason, text = check_stop(req, self.tokenizer, self.max_model_len, slot + 1)
        req.output_text = text
        if status is not None:
            # Tokens launched after this one (asynchronous scheduling) are discarded.
            del req.output_token_ids[slot + 1 :]
            req.num_placeholders = 0
            req.finish(status, reason)

    def record_prompt_logprobs(self, req: Request, scores: PromptScores) -> None:
        """Append a step's scored prompt positions (they follow the ones recorded before)."""
        values, tops = read_scores(scores, req.params.prompt_logprobs or 0)
        req.prompt_logprobs.extend(values)
        req.prompt_top_logprobs.extend(tops)

    def finish_prompt_only(self, req: Request) -> None:
        """End a prompt-only request whose prompt logprobs are all in: it asked for no token, so it
        ends as any request that reached its max_tokens does, with no output."""
        req.finish(RequestStatus.FINISHED_LENGTH)

    def abort(self, req: Request) -> RequestOutput:
        """End a request the caller gave up on; tokens still being sampled are dropped with it."""
        req.finish(RequestStatus.FINISHED_ABORTED)
        if req.num_placeholders:
            del req.output_token_ids[req.num_output_tokens - req.num_placeholders :]
            req.num_placeholders = 0
        req.output_text = self.tokenizer.decode(req.output_token_ids, req.params.skip_special_tokens)
        return self.output(req)

    def output(self, req: Request) -> RequestOutput:
        p = req.params
        completion = CompletionOutput(
            index=0,
            text=req.output_text,
            token_ids=list(req.output_token_ids),
            logprobs=list(req.output_logprobs),
            top_logprobs=list(req.output_top_logprobs) if p.logprobs else None,
            finish_reason=req.status.value if req.status.finished else None,
            seed=req.seed,
            stop_reason=req.stop_reason,
            error=req.error,
        )
        return RequestOutput(
            request_id=req.request_id,
            prompt=req.prompt,
            prompt_token_ids=list(req.prompt_token_ids),
            prompt_logprobs=list(req.prompt_logprobs) if p.prompt_logprobs is not None else None,
            prompt_top_logprobs=list(req.prompt_top_logprobs) if p.prompt_logprobs else None,
            outputs=[completion],
            num_cached_tokens=req.cached_prompt_tokens,
            finished=req.status.finished,
            metrics={"preemptions": float(req.num_preemptions)},
        )


def check_stop(
    req: Request, tokenizer: Tokenizer, max_model_len: int, n_out: int | None = None
) -> tuple[RequestStatus | None, str | int | None, str]:
    """Whether the request is done after its output token n_out - 1 (default: its last token), and
    its output text so far."""
    p = req.params
    n_out = req.num_output_tokens if n_out is None else n_out
    token = req.output_token_ids[n_out - 1]
    may_stop = n_out >= p.min_tokens
    is_eos = not p.ignore_eos and token in tokenizer.eos_token_ids
    if may_stop and (is_eos or token in p.stop_token_ids):
        # As vLLM: the stop token's own text is part of the output only with include_stop_str_in_output.
        kept = n_out if p.include_stop_str_in_output else n_out - 1
        text = tokenizer.decode(req.output_token_ids[:kept], p.skip_special_tokens)
        # vLLM's stop_reason: the stop token id, but None for an end-of-sequence token.
        return RequestStatus.FINISHED_STOPPED, None if is_eos else token, text
    total = req.num_prompt_tokens + n_out
    if not p.stop:
        # Nothing needs the text before the end: decode it once, when the request ends, rather
        # than the whole output again after every token.
        status = _end_status(req, n_out, total, max_model_len)
        text = (
            tokenizer.decode(req.output_token_ids[:n_out], p.skip_special_tokens)
            if status is not None
            else ""
        )
        return status, None, text
    text = tokenizer.decode(req.output_token_ids[:n_out], p.skip_special_tokens)
    if may_stop:
        # Only a match that ends past the text already checked is new: it starts at most
        # len(s) - 1 characters before that text's end (an older one was either found then or
        # came before min_tokens, where stop strings do not count).
        checked = _checked_prefix_len(req.output_text, text)
        best: tuple[int, str] | None = None
        for s in p.stop:
            idx = text.find(s, max(0, checked - len(s) + 1))
            if idx >= 0 and (best is None or idx < best[0]):
                best = (idx, s)
        if best is not None:
            idx, s = best
            cut = idx + len(s) if p.include_stop_str_in_output else idx
            return RequestStatus.FINISHED_STOPPED, s, text[:cut]
    return _end_status(req, n_out, total, max_model_len), None, text


def _checked_prefix_len(previous: str, text: str) -> int:
    """How much of `text` (the output decoded now) was already searched for stop strings as
    `previous` (the output decoded one token earlier).

    Decoding more tokens can rewrite the end of the earlier text: an incomplete UTF-8 character
    decodes to replacement characters, one per byte with a byte-fallback tokenizer, and to the
    character itself once its last byte arrives. So `previous` is only trusted up to its trailing
    replacement characters, and only where `text` still agrees with it.
    """
    stable = len(previous.rstrip("\ufffd"))
    if text.startswith(previous[:stable]):
        return stable
    # A decoder that rewrote earlier text (rare): trust only the common prefix.
    same = 0
    for a, b in zip(previous[:stable], text, strict=False):
        if a != b:
            break
        same += 1
    return same


def _end_status(req: Request, n_out: int, total: int, max_model_len: int) -> RequestStatus | None:
    """The checks after stop strings: a finished grammar, then max_tokens and max_model_len."""
    if req.grammar is not None and req.grammar.is_finished():
        return RequestStatus.FINISHED_STOPPED
    if n_out >= req.max_tokens or total >= max_model_len:
        return RequestStatus.FINISHED_LENGTH
    return None
