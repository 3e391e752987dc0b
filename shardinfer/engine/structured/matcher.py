"""One request's position in its grammar: which tokens may come next, and what was accepted.

A GrammarMatcher wraps llguidance's `LLMatcher` (an Earley parser over the grammar's lexemes,
with a token trie of the tokenizer) and adds what the engine needs on top: masks as torch
tensors of the model's logits width, exceptions instead of a silent error state, and a count
of accepted tokens so `rollback` can refuse to undo more than was done.

Life of a matcher inside the engine (see docs/structured-outputs.md):

    m = compiler.matcher(params.structured_output)        # one per sample
    loop: fill_bitmask / allowed_mask -> sample under the mask -> m.accept(token)
    stop when the token is an eos, or m.is_finished() (the grammar cannot go on)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import llguidance
import torch

from shardinfer.engine.structured.bitmask import bitmask_width, check_host_bitmask, unpack_bitmask

if TYPE_CHECKING:
    from shardinfer.engine.structured.compiler import CompiledGrammar


class GrammarViolation(RuntimeError):
    """A token the grammar did not allow was accepted: the sampler ignored the mask (an engine bug)."""


class GrammarMatcher:
    """Independent per-sample grammar state; cheap to create (a copy of the compiled template)."""

    def __init__(
        self,
        grammar: CompiledGrammar,
        ll_matcher: llguidance.LLMatcher,
        num_accepted: int = 0,
        template: int | None = None,
    ) -> None:
        self.grammar = grammar
        self.vocab_size = grammar.vocab_size
        self.eos_token_ids = grammar.eos_token_ids
        self._m = ll_matcher
        self._num_accepted = num_accepted
        # Which of the grammar's templates this matcher is a copy of (it shares that template's
        # lexer cache and lock); None for a matcher built from the grammar alone.
        self.template = template
        self._finished = self._read_finished()

    # ---- masks ---------------------------------------------------------------------------
    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write this matcher's next-token mask into row `row` of an int32 [B, ceil(V/32)] CPU tensor."""
        check_host_bitmask(bitmask, self.vocab_size)
        if not 0 <= row < bitmask.shape[0]:
            raise ValueError(f"row={row} is outside the bitmask's {bitmask.shape[0]} rows")
        self._check_usable()
        target = bitmask[row]
        # llguidance writes ceil(V/32) words straight into the tensor's memory, releasing the GIL.
        self._m.unsafe_compute_mask_ptr(target.data_ptr(), target.numel() * target.element_size())

    def allowed_mask(self) -> torch.Tensor:
        """bool [vocab_size]: tokens allowed next; eos only where the grammar may end."""
        bitmask = torch.empty((1, bitmask_width(self.vocab_size)), dtype=torch.int32)
        self.fill_bitmask(bitmask, 0)
        return unpack_bitmask(bitmask, self.vocab_size)[0]

    # ---- advancing -----------------------------------------------------------------------
    def accept(self, token_id: int) -> None:
        """Advance by one sampled token; raises GrammarViolation if the mask did not allow it.

        After a violation the matcher is unusable (llguidance keeps the error state); the request
        should end with finish_reason "error".
        """
        self.check_acceptable(token_id)
        self.record_consumed(token_id, bool(self._m.consume_token(token_id)))

    def check_acceptable(self, token_id: int) -> None:
        """Raise GrammarViolation unless token_id may be handed to llguidance (usable matcher,
        id inside the vocabulary); whether the grammar allows it is llguidance's answer."""
        self._check_usable()
        if not 0 <= token_id < self.vocab_size:
            raise GrammarViolation(f"token id {token_id} is outside the vocabulary [0, {self.vocab_size})")

    def record_consumed(self, token_id: int, ok: bool) -> None:
        """Book llguidance's answer to consuming token_id (here or in a batched call)."""
        if not ok:
            self._finished = False
            raise GrammarViolation(
                f"token {token_id} is not allowed by the {self.grammar.schema_type} "
                f"grammar here: {self._m.get_error()[:500]}"
            )
        self._num_accepted += 1
        self._finished = self._read_finished()

    def validate(self, token_ids: list[int]) -> int:
        """How many leading tokens of `token_ids` the grammar would accept in a row, without
        changing state (for checking speculative drafts)."""
        self._check_usable()
        if any(not 0 <= t < self.vocab_size for t in token_ids):
            return next(i for i, t in enumerate(token_ids) if not 0 <= t < self.vocab_size)
        return int(self._m.validate_tokens(token_ids))

    def rollback(self, n: int) -> None:
        """Undo the last `n` accepted tokens (eos included), restoring the exact earlier mask."""
        if not 0 <= n <= self._num_accepted:
            raise ValueError(f"rollback({n}): only {self._num_accepted} tokens were accepted")
        if n == 0:
            return
        if not self._m.rollback(n):
            raise GrammarViolation(f"llguidance could not roll back {n} tokens: {self._m.get_error()[:500]}")
        self._num_accepted -= n
        self._finished = self._read_finished()

    def reset(self) -> None:
        """Back to the start of the grammar, as if no token had been accepted."""
        if not self._m.reset():
            raise GrammarViolation(f"llguidance could not reset the matcher: {self._m.get_error()[:500]}")
        self._num_accepted = 0
        self._finished = self._read_finished()

    def fork(self) -> GrammarMatcher:
        """An independent copy at the same position (one per sample when n > 1)."""
        return GrammarMatcher(self.grammar, self._m.deep_copy(), self._num_accepted, self.template)

    # ---- state ---------------------------------------------------------------------------
    def is_finished(self) -> bool:
        """True once the grammar is done: eos was accepted, or no token but eos may follow.

        The engine can end the sample ("stop") here without sampling the eos. Kept from the last
        change of state rather than asked of llguidance, so that the engine thread can read it
        while the mask thread fills this matcher's mask.
        """
        return self._finished

    def _read_finished(self) -> bool:
        return bool(self._m.is_stopped()) and not self._m.is_error()

    def can_finish(self) -> bool:
        """True when the text so far is a complete match (eos would be allowed now)."""
        return bool(self._m.is_accepting()) and not self._m.is_error()

    @property
    def num_accepted(self) -> int:
        return self._num_accepted

    @property
    def ll_matcher(self) -> llguidance.LLMatcher:
        """The wrapped llguidance matcher, for batched calls through an LLExecutor."""
        return self._m

    def _check_usable(self) -> None:
        if self._m.is_error():
            raise GrammarViolation(f"the grammar matcher is in an error state: {self._m.get_error()[:500]}")

    def __repr__(self) -> str:
        return (
            f"GrammarMatcher({self.grammar.schema_type}, accepted={self._num_accepted}, "
            f"finished={self.is_finished()}, can_finish={self.can_finish()})"
        )
