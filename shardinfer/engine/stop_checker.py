"""Whether a request is done after its newest token, and its output text so far.

Order of checks: stop token ids and EOS (unless ignore_eos; both only after min_tokens),
stop strings on the detokenized text (the matched string is cut from the text unless
include_stop_str_in_output), a finished grammar, then max_tokens and max_model_len.
"""

from __future__ import annotations

from shardinfer.engine.request import Request, RequestStatus
from shardinfer.engine.tokenizer import Tokenizer


def check_stop(req: Request, tokenizer: Tokenizer, max_model_len: int,
               n_out: int | None = None) -> tuple[RequestStatus | None, str | int | None, str]:
    """Judge the request after its output token n_out - 1 (default: its last token)."""
    p = req.params
    n_out = req.num_output_tokens if n_out is None else n_out
    token = req.output_token_ids[n_out - 1]
    may_stop = n_out >= p.min_tokens
    is_eos = not p.ignore_eos and token in tokenizer.eos_token_ids
    if may_stop and (is_eos or token in p.stop_token_ids):
        text = tokenizer.decode(req.output_token_ids[: n_out - 1], p.skip_special_tokens)
        # vLLM's stop_reason: the stop token id, but None for an end-of-sequence token.
        return RequestStatus.FINISHED_STOPPED, None if is_eos else token, text
    total = req.num_prompt_tokens + n_out
    if not p.stop:
        # Nothing needs the text before the end: decode it once, when the request ends, rather
        # than the whole output again after every token.
        status = _end_status(req, n_out, total, max_model_len)
        text = tokenizer.decode(req.output_token_ids[:n_out], p.skip_special_tokens) if status is not None else ""
        return status, None, text
    text = tokenizer.decode(req.output_token_ids[:n_out], p.skip_special_tokens)
    if may_stop:
        # Only a match that ends in the newest token's text is new; earlier text was checked before.
        window_start = max(0, len(req.output_text) - max(len(s) for s in p.stop))
        best: tuple[int, str] | None = None
        for s in p.stop:
            idx = text.find(s, window_start)
            if idx >= 0 and (best is None or idx < best[0]):
                best = (idx, s)
        if best is not None:
            idx, s = best
            cut = idx + len(s) if p.include_stop_str_in_output else idx
            return RequestStatus.FINISHED_STOPPED, s, text[:cut]
    return _end_status(req, n_out, total, max_model_len), None, text


def _end_status(req: Request, n_out: int, total: int, max_model_len: int) -> RequestStatus | None:
    """The checks after stop strings: a finished grammar, then max_tokens and max_model_len."""
    if req.grammar is not None and req.grammar.is_finished():
        return RequestStatus.FINISHED_STOPPED
    if n_out >= req.max_tokens or total >= max_model_len:
        return RequestStatus.FINISHED_LENGTH
    return None
