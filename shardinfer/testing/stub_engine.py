"""An engine that returns preset tokens at once: the job path's host cost, with no model to hide it.

It has the streaming engine's surface the pipeline drives (`add_request`, `step`, `abort`,
`has_unfinished`, `num_unfinished`, `stats`, `tokenizer`, `max_model_len`) and answers every
request with `max_tokens` tokens taken from one preset array, with fixed logprobs. Up to
`max_num_seqs` requests run at once; a request finishes after one step per token, as in
decoding, and a step may wait `step_s` with the interpreter lock released, as an engine thread
waits for its device. Used to measure what the reader, row preparation, result
assembly and writer cost per row and per token (bench/job_host_overhead.py), and to run jobs of
millions of rows in tests where a real model would take hours.

The tokens of a request depend on its seed only, so outputs are deterministic across batch
sizes and restarts, like the real engine's.
"""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path

import numpy as np

from shardinfer.engine.outputs import CompletionOutput, RequestOutput
from shardinfer.engine.sampling_params import SamplingParams
from shardinfer.engine.tokenizer import Tokenizer


def write_stub_model_dir(out_dir: str | Path) -> Path:
    """A folder a job accepts as a model (tokenizer, config.json, a one-tensor weight file) for
    the stub engine: the job fingerprints these files, the stub reads only the tokenizer."""
    from safetensors.numpy import save_file

    from shardinfer.testing.tiny_checkpoint import build_tokenizer

    out = Path(out_dir)
    build_tokenizer(out)
    (out / "config.json").write_text('{"model_type": "stub"}\n')
    save_file({"stub": np.zeros(1, dtype=np.float32)}, str(out / "model.safetensors"))
    return out


class StubEngine:
    def __init__(
        self,
        tokenizer_dir: str | Path,
        max_model_len: int = 4096,
        max_num_seqs: int = 256,
        vocab: int = 384,
        step_s: float = 0.0,
    ) -> None:
        """`step_s`: seconds each step waits with the interpreter lock released, as an engine
        thread waits for its device; 0 answers at once."""
        self.tokenizer = Tokenizer(tokenizer_dir)
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.vocab = vocab
        self.step_s = step_s
        self._waiting: deque[tuple[str, list[int], SamplingParams]] = deque()
        self._ids = set[str]()
        self._running: list[tuple[tuple[str, list[int], SamplingParams], int]] = []  # (request, last step)
        self._step_index = 0
        self.counters = {
            "prompt_tokens": 0.0,
            "generated_tokens": 0.0,
            "steps": 0.0,
            "finished_requests": 0.0,
        }
        # One preset completion as long as any request may ask for; a request gets a slice of it
        # starting at an offset from its seed.
        rng = np.random.default_rng(0)
        self._tokens = rng.integers(0, vocab, size=2 * max_model_len).tolist()
        self._logprobs = (-rng.random(2 * max_model_len)).astype(np.float32).astype(float).tolist()
        self._tops: dict[int, list[list[tuple[int, float]]]] = {}

    def add_request(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        if request_id in self._ids:
            raise ValueError(f"request id {request_id!r} is already in flight")
        if len(prompt) >= self.max_model_len:
            raise ValueError(f"prompt has {len(prompt)} tokens; max_model_len={self.max_model_len}")
        self._ids.add(request_id)
        self._waiting.append((request_id, prompt, params))

    def abort(self, request_id: str) -> None:
        self._ids.discard(request_id)
        self._waiting = deque(w for w in self._waiting if w[0] != request_id)
        self._running = [r for r in self._running if r[0][0] != request_id]

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running)

    @property
    def num_unfinished(self) -> int:
        return len(self._waiting) + len(self._running)

    def step(self) -> list[RequestOutput]:
        self.counters["steps"] += 1
        while self._waiting and len(self._running) < self.max_num_seqs:
            request = self._waiting.popleft()
            self._running.append((request, self._length(request[1], request[2])))
        if self.step_s:
            time.sleep(self.step_s)
        self._step_index += 1
        outs = []
        still = []
        for request, end in self._running:
            if end <= self._step_index:
                self._ids.discard(request[0])
                outs.append(self._output(*request))
            else:
                still.append((request, end))
        self._running = still
        return outs

    def _length(self, prompt: list[int], params: SamplingParams) -> int:
        """The step at which a request admitted now finishes: one step per generated token."""
        return self._step_index + max(1, min(params.max_tokens or 16, self.max_model_len - len(prompt)))

    def _output(self, rid: str, prompt: list[int], params: SamplingParams) -> RequestOutput:
        n = min(params.max_tokens or 16, self.max_model_len - len(prompt))
        start = (params.seed or 0) % self.max_model_len
        ids = self._tokens[start : start + n]
        lps = self._logprobs[start : start + n]
        top = self._top(params.logprobs)[start : start + n] if params.logprobs else None
        self.counters["prompt_tokens"] += len(prompt)
        self.counters["generated_tokens"] += n
        self.counters["finished_requests"] += 1
        completion = CompletionOutput(
            index=0,
            text="stub",
            token_ids=ids,
            logprobs=lps,
            top_logprobs=top,
            finish_reason="length",
            seed=params.seed or 0,
        )
        prompt_lps: list[float | None] | None = None
        if params.prompt_logprobs is not None:
            prompt_lps = [None] + [-1.0] * (len(prompt) - 1)
        return RequestOutput(rid, None, prompt, prompt_lps, [completion])

    def _top(self, k: int) -> list[list[tuple[int, float]]]:
        """Preset top-k lists (the real engine builds them while sampling, not at the end)."""
        if k not in self._tops:
            self._tops[k] = [[(t, lp)] * k for t, lp in zip(self._tokens, self._logprobs, strict=True)]
        return self._tops[k]

    def stats(self) -> dict[str, float]:
        return dict(self.counters)
