"""A drafter for benchmarks and tests only: it proposes the target model's own continuation,
recorded from a plain run of the same requests, with each draft token replaced by a wrong one
with probability 1 - alpha.

On random-weight checkpoints no real drafter is accepted often enough to measure speculative
decoding; replaying the recorded continuation makes the acceptance rate a dial (alpha) while the
engine does all the work it does with a real drafter. Whether the draft at output index i is
corrupted is a pure function of (seed, request id, i), so the same position always gets the same
draft, however the steps fall; with a step in flight the drafter offers one draft per possible
number of rejections, and the device picks the one for the position the request really is at.

In a job the engine is built in the job's own process, so the recording and the replay are
switched on there by the environment, which the job's engine builder reads
(pipeline/job.build_engine; benchmarks only, bench/job_throughput.py --record/--replay):

    SHARDINFER_BENCH_REPLAY=record:PATH        every finished request's output, appended to PATH
    SHARDINFER_BENCH_REPLAY=replay:PATH:ALPHA  a drafting engine proposes those outputs

Both key a request by its prompt token ids and seed (request ids follow the job's plan, prompts
and seeds follow its input), so the replay finds the plain run's continuation of each row.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from shardinfer.engine.request import Request

ENV = "SHARDINFER_BENCH_REPLAY"


class ReplayProposer:
    """Engine.drafter.proposer replacement: `recorded[request_id]` is the plain run's output."""

    def __init__(self, recorded: dict[str, list[int]], alpha: float, vocab_size: int, seed: int = 0) -> None:
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha={alpha}: must be in [0, 1] (the chance a draft token is the right one)")
        self.recorded = recorded
        self.alpha = alpha
        self.vocab_size = vocab_size
        self.seed = seed
        # Per request: the draft for every recorded index, drawn once (a draft is a pure function
        # of its index, and drawing it costs a hash: per step it would be host time the benchmark
        # charges to speculation that no real drafter spends).
        self._drafts: dict[str, list[int]] = {}

    def _draw(self, request_id: str, index: int) -> float:
        digest = hashlib.blake2b(f"{self.seed}:{request_id}:{index}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") / 2**64

    def draft_token(self, request_id: str, index: int) -> int | None:
        """The draft for output index `index` (None past the recording)."""
        tokens = self.recorded.get(request_id)
        if tokens is None or index >= len(tokens):
            return None
        return self._draft(request_id, index, tokens[index])

    def _draft(self, request_id: str, index: int, token: int) -> int:
        u = self._draw(request_id, index)
        if u < self.alpha:
            return token
        # A wrong token, chosen by the same draw: never the recorded one.
        shift = 1 + int((u - self.alpha) / (1.0 - self.alpha) * (self.vocab_size - 1)) % (self.vocab_size - 1)
        return (token + shift) % self.vocab_size

    def drafts(self, request_id: str) -> list[int]:
        """The draft for each recorded output index of the request (empty when none is recorded)."""
        drafts = self._drafts.get(request_id)
        if drafts is None:
            tokens = self.recorded.get(request_id, [])
            drafts = self._drafts[request_id] = [self._draft(request_id, i, t) for i, t in enumerate(tokens)]
        return drafts

    def key(self, req: Request) -> str:
        """What `recorded` is keyed by: the request id."""
        return req.request_id

    def __call__(self, req: Request, room: int, in_flight: int) -> list[list[int]]:
        drafts = self.drafts(self.key(req))
        start = req.num_output_tokens  # the host's layout: every draft in flight accepted
        # One draft per number of the in-flight drafts the device may reject.
        choices = [
            drafts[start - rejected : start - rejected + room] for rejected in range(max(1, in_flight))
        ]
        return choices if any(choices) else []


def prompt_key(req: Request) -> str:
    """A request's replay key in a job: its prompt token ids and its seed."""
    digest = hashlib.blake2b(repr(req.prompt_token_ids).encode(), digest_size=16).hexdigest()
    return f"{digest}:{req.seed}"


class PromptReplayProposer(ReplayProposer):
    """ReplayProposer keyed by prompt_key instead of the request id."""

    def key(self, req: Request) -> str:
        return prompt_key(req)


def install_from_env(engine: Any) -> None:
    """Switch the job's engine to recording or replaying (module docstring) when ENV says so."""
    setting = os.environ.get(ENV)
    if not setting:
        return
    mode, _, rest = setting.partition(":")
    if mode == "record":
        _record_outputs(engine, Path(rest))
    elif mode == "replay":
        path, _, alpha = rest.rpartition(":")
        if engine.drafter is None:
            raise ValueError(
                f"{ENV}={setting!r}: replaying drafts needs a drafting engine (speculative='ngram')"
            )
        recorded = {}
        for line in Path(path).read_text().splitlines():
            entry = json.loads(line)
            recorded[entry["key"]] = entry["tokens"]
        engine.drafter.proposer = PromptReplayProposer(recorded, float(alpha), engine.model_config.vocab_size)
    else:
        raise ValueError(f"{ENV}={setting!r}: use record:PATH or replay:PATH:ALPHA")


def _record_outputs(engine: Any, path: Path) -> None:
    retire = engine._retire

    def recording(req: Request) -> Any:
        out = retire(req)
        with path.open("a") as f:
            f.write(json.dumps({"key": prompt_key(req), "tokens": list(req.output_token_ids)}) + "\n")
        return out

    engine._retire = recording
