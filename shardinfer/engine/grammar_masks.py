"""Grammar masks for a step's constrained sampling rows, filled on the host by the structured-output
compiler, on the engine thread or on a mask thread of their own.

With asynchronous scheduling the fill of step N's masks overlaps the engine thread's other work:
it starts as soon as step N-1's tokens are accepted into the matchers, and step N's sampling
waits for it only when it is queued (docs/structured-outputs.md).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardinfer.engine.model_runner import StepLogits
from shardinfer.engine.request import Request
from shardinfer.engine.sampler import GrammarMasks

if TYPE_CHECKING:
    from shardinfer.engine.structured import GrammarViolation


class GrammarMaskFiller:
    """Owns the structured-output compiler (built on first use) and the mask thread."""

    def __init__(
        self,
        tokenizer_path: Path,
        eos_token_ids: list[int],
        vocab_size: int,
        independent_matchers: bool,
        pin_memory: bool,
    ) -> None:
        self.tokenizer_path = tokenizer_path
        self.eos_token_ids = eos_token_ids
        self.vocab_size = vocab_size
        self.independent_matchers = independent_matchers
        self.pin_memory = pin_memory
        self._compiler: Any = None
        self._mask_thread: ThreadPoolExecutor | None = None

    def compiler(self) -> Any:
        if self._compiler is None:
            from shardinfer.engine.structured import StructuredOutputCompiler

            # Mask threads: llguidance's own default, 80% of the CPUs the process may use (1 to 32),
            # is kept: from 4 CPUs, where matchers are independent and scale with threads, it
            # gives 3 or more; on 2 CPUs it gives 1 thread (and copies of one template), leaving
            # the other CPU to the engine thread, which on a CPU device runs the model too.
            self._compiler = StructuredOutputCompiler(
                str(self.tokenizer_path),
                list(self.eos_token_ids),
                self.vocab_size,
                independent_matchers=self.independent_matchers,
            )
        return self._compiler

    def accept_tokens(self, sampled: list[tuple[Request, int]]) -> dict[int, GrammarViolation | None]:
        """Advance each request's matcher by its sampled token, in one batched call; per id(request),
        the matcher's refusal or None."""
        if not sampled:
            return {}
        refusals = self.compiler().accept_tokens([(req.grammar, t) for req, t in sampled])
        return dict(zip((id(req) for req, _ in sampled), refusals, strict=True))

    def fill(self, constrained: list[tuple[Request, int]]) -> GrammarMasks | None:
        """The next-token mask of each (request, sampling row), filled in one call on the compiler's threads."""
        if not constrained:
            return None
        from shardinfer.engine.structured import allocate_bitmask

        compiler = self.compiler()
        bitmask = allocate_bitmask(len(constrained), self.vocab_size, pin_memory=self.pin_memory)
        compiler.fill_bitmasks([(req.grammar, j) for j, (req, _) in enumerate(constrained)], bitmask)
        return GrammarMasks(bitmask, [row for _, row in constrained])

    def fill_on_mask_thread(self, constrained: list[tuple[Request, int]]) -> Future[GrammarMasks | None]:
        """Start filling the masks on the mask thread; returns once the fill has begun."""
        if self._mask_thread is None:
            self._mask_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shardinfer-masks")
        started = threading.Event()

        def fill() -> GrammarMasks | None:
            started.set()
            return self.fill(constrained)

        future = self._mask_thread.submit(fill)
        # A thread waiting for the GIL gets it when the holder blocks, or else only after the
        # interpreter's switch interval. The engine thread goes straight on to Python
        # bookkeeping, so the fill would start up to one switch interval late, all of it on the
        # path to this step's sampling. Blocking here hands the GIL over at once; the mask thread
        # gives it back as soon as it is inside llguidance's fill.
        started.wait()
        return future


def constrained_rows(
    step_logits: StepLogits, violations: dict[int, GrammarViolation | None]
) -> list[tuple[Request, int]]:
    """(request, first sampling row) of the rows that need a grammar mask, decided as soon as
    the previous step's tokens are accepted: not for finished requests, finished grammars or
    matchers that refused their token. A request the previous step's other checks (stop
    strings, stop ids) are about to end still gets one; its row is discarded unsampled-for."""
    rows, first = [], 0
    for req, count in zip(step_logits.sample_requests, step_logits.sample_counts, strict=True):
        if (
            req.grammar is not None
            and not req.status.finished
            and not req.grammar.is_finished()
            and violations.get(id(req)) is None
        ):
            rows.append((req, first))
        first += count
    return rows
