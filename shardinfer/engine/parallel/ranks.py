"""The driver of an expert-parallel engine: N rank processes behind the engine's own interface.

`ExpertParallelEngine(model, expert_parallel_size=N, ...)` starts N rank processes
(rank_main.py), each an LLMEngine holding its share of the routed experts, and answers what the
LLM API and a job's worker ask of an engine: add_request, step, abort, has_unfinished, stats,
tokenizer. A request goes to the rank with the fewest unfinished requests (data-parallel
attention: its KV cache lives there). Every step() steps all ranks together (their MoE layers
exchange rows), and returns the outputs of all of them.

Which rank runs a request changes none of its bits: each rank's engine is batch invariant, and
the experts' rows are computed the same wherever they are (expert_exchange.py). So outputs equal
a one-process engine's, token for token and logprob for logprob.

A rank that dies fails the step with an error naming it; the other ranks are stopped, and a
job resumes from its last commit like after any failed step.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from types import SimpleNamespace
from typing import IO, Any

import torch

from shardinfer.engine.config import EngineConfig
from shardinfer.engine.models.config import ModelConfig, model_directory
from shardinfer.engine.outputs import RequestOutput
from shardinfer.engine.parallel import wire
from shardinfer.engine.parallel.group import DEFAULT_TIMEOUT_S, ExpertParallelError
from shardinfer.engine.parallel.placement import (
    ExpertPlacement,
    balanced_placement,
    peak_and_mean,
    static_placement,
)
from shardinfer.engine.prompt_checks import tokenize_prompt
from shardinfer.engine.sampling_params import SamplingParams, checkpoint_sampling_defaults
from shardinfer.engine.tokenizer import Tokenizer

_ADDRESS = "127.0.0.1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((_ADDRESS, 0))
        return int(s.getsockname()[1])


# How long a rank whose pipe failed is given to report its exit status before it is called running.
_EXIT_STATUS_WAIT_S = 5.0


class _Rank:
    """One rank process and its pipes."""

    def __init__(self, index: int) -> None:
        self.index = index
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "shardinfer.engine.parallel.rank_main", str(index)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.unfinished: set[str] = set()
        self.reported = False  # it replied with an error (a rank that died says nothing)

    def send_spec(self, spec: dict[str, Any]) -> None:
        """The rank's first line on stdin. Not a file: none is left behind by a driver that exits
        without cleaning up (a refused job does not wait for its engine: jobs/engine_prestart.py)."""
        try:
            wire.send(self.stdin, spec)
        except (BrokenPipeError, OSError) as exc:
            raise self.failure("could not be sent its spec") from exc

    @property
    def stdin(self) -> IO[str]:
        assert self.proc.stdin is not None
        return self.proc.stdin

    def send(self, message: dict[str, Any]) -> None:
        try:
            wire.send(self.stdin, message)
        except (BrokenPipeError, OSError) as exc:
            raise self.failure(f"could not send {message['op']!r}") from exc

    def receive(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise self.failure("stopped without replying")
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            self.reported = True
            raise self.failure(reply["error"])
        return reply

    def failure(self, what: str) -> ExpertParallelError:
        code = self.proc.poll()
        if code is None:
            # Its pipe closed as it died: the exit status lands a moment later, and it says why.
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self.proc.wait(timeout=_EXIT_STATUS_WAIT_S)
        status = f"exit code {code}" if code is not None else "still running"
        return ExpertParallelError(
            f"expert-parallel rank {self.index}: {what} ({status}); the engine stops, and a "
            "job resumes from its last commit"
        )


class StepBalance:
    """moe_lb as DeepSeek's EPLB defines it: over (step, MoE layer) pairs, the sum of the busiest
    rank's expert rows over the sum of the mean rank's. Every rank waits at each layer's exchange
    for the busiest one, so imbalance within a step counts even when it evens out over a run.
    Kept for the whole run and for the latest `window` steps."""

    def __init__(self, window: int = 128) -> None:
        self.peak = self.mean = 0.0
        self.recent: deque[tuple[float, float]] = deque(maxlen=window)

    def add(self, rows_per_rank: list[list[int]]) -> None:
        """One step: each rank's rows per MoE layer (ranks that ran no MoE layer report none)."""
        if not rows_per_rank or not all(rows_per_rank) or len({len(r) for r in rows_per_rank}) != 1:
            return
        peak, mean = peak_and_mean(torch.tensor(rows_per_rank, dtype=torch.float64).T)  # [layers, ranks]
        self.peak += peak
        self.mean += mean
        self.recent.append((peak, mean))

    def run(self) -> float:
        return self.peak / self.mean if self.mean else 1.0

    def window(self) -> float:
        mean = sum(m for _, m in self.recent)
        return sum(p for p, _ in self.recent) / mean if mean else 1.0


class ExpertParallelEngine:
    """The engine interface over N rank processes (see the module docstring)."""

    def __init__(
        self,
        model: str | Path,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        placement: ExpertPlacement | None = None,
        **kwargs: Any,
    ) -> None:
        if kwargs.get("device", "auto") == "auto":
            kwargs["device"] = "cpu"
        self.config = EngineConfig.from_kwargs(str(model), **kwargs)
        self.model_dir = model_directory(self.config.model)
        self.model_config = ModelConfig.from_dir(self.model_dir)
        self.size = self.config.parallel_size
        num_logical = int(self.model_config.hf.get("n_routed_experts") or 0)
        if not num_logical:
            raise ValueError(
                f"expert_parallel_size={self.size}: {self.model_config.architecture} has no routed "
                "experts to split; use expert_parallel_size=1 (local[N] runs one engine per device)"
            )
        self.placement = placement or static_placement(num_logical, self.size, self.config.expert_redundancy)
        self.tokenizer = Tokenizer(self.model_dir, self.model_config.eos_token_ids)
        self.timeout_s = timeout_s
        # The ranks get the checked values (a torch dtype as its name, numpy ints as ints): they travel as JSON.
        self._engine_kwargs = {k: getattr(self.config, k, v) for k, v in kwargs.items()}
        self.ranks: list[_Rank] = []
        self.requests: dict[str, SimpleNamespace] = {}
        self._owner: dict[str, _Rank] = {}
        self._arrivals = 0
        self._steps = 0
        self._rebalances = 0
        self._balance = StepBalance()
        self._stopped: str | None = None  # why the ranks are gone: every later call says so
        self._compiler: Any = None
        started = time.monotonic()
        self._start()
        self.start_s = time.monotonic() - started  # rank processes started, engines built

    # -- lifecycle -----------------------------------------------------------------------------
    def _start(self) -> None:
        spec = {
            "size": self.size,
            "num_logical": self.placement.num_logical,
            "physical_to_logical": list(self.placement.physical_to_logical),
            "address": _ADDRESS,
            "port": _free_port(),
            "timeout_s": self.timeout_s,
            "model": str(self.model_dir),
            "engine": self._engine_kwargs,
        }
        self.ranks = [_Rank(i) for i in range(self.size)]
        try:
            for rank in self.ranks:
                rank.send_spec(spec)
            ready = min((r.receive() for r in self.ranks), key=lambda reply: int(reply["max_model_len"]))
            self.max_model_len, self.length_fix = int(ready["max_model_len"]), str(ready["length_fix"])
            self.max_model_len_asked = int(ready["max_model_len_asked"])
        except BaseException:
            self.shutdown()
            raise

    def _running(self) -> list[_Rank]:
        """The ranks, or an ExpertParallelError saying why there are none any more."""
        if not self.ranks:
            raise ExpertParallelError(
                f"the expert-parallel engine has stopped ({self._stopped or 'closed'}); build a "
                "new LLM or engine to go on"
            )
        return self.ranks

    def shutdown(self) -> None:
        """Stop every rank (politely, then by force)."""
        for r in self.ranks:
            if r.proc.poll() is None:
                with contextlib.suppress(BrokenPipeError, OSError):  # it may have died already
                    wire.send(r.stdin, {"op": "exit"})
        for r in self.ranks:
            try:
                r.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                r.proc.kill()
                r.proc.wait()
        self.ranks = []

    def close(self) -> None:
        self.shutdown()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: nothing left to report to
            self.shutdown()

    # -- the engine interface -------------------------------------------------------------------
    def tokenize_prompt(self, prompt: str | list[int]) -> list[int]:
        return tokenize_prompt(self.tokenizer, self.model_config.vocab_size, prompt)

    def default_params(self) -> SamplingParams:
        return SamplingParams(**checkpoint_sampling_defaults(self.model_dir))

    def grammar_compiler(self) -> Any:
        """A compiler for checking structured-output schemas before any request is queued (the
        ranks compile their own for the masks)."""
        if self._compiler is None:
            from shardinfer.engine.structured import StructuredOutputCompiler

            self._compiler = StructuredOutputCompiler(
                str(self.tokenizer.path),
                list(self.tokenizer.eos_token_ids),
                self.model_config.vocab_size,
                independent_matchers=self.config.independent_matchers,
            )
        return self._compiler

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        prompt_logprobs_from: int = 1,
    ) -> None:
        """LLMEngine.add_request on the least busy rank: the rank's engine checks the request, and a
        refusal comes back as the same ValueError (RequestError class and row error code kept)."""
        if request_id in self.requests:
            raise ValueError(
                f"request id {request_id!r} is already in the engine: give each request its own id"
            )
        ids = self.tokenize_prompt(prompt)
        params = params or self.default_params()
        rank = min(self._running(), key=lambda r: (len(r.unfinished), r.index))
        rank.send(
            {
                "op": "add",
                "id": request_id,
                "ids": ids,
                "params": params.to_json_dict(),
                "prompt_logprobs_from": prompt_logprobs_from,
            }
        )
        reply = rank.receive()
        if "refused" in reply:
            raise wire.refusal(reply)
        rank.unfinished.add(request_id)
        self._owner[request_id] = rank
        self.requests[request_id] = SimpleNamespace(prompt=prompt if isinstance(prompt, str) else None)
        self._arrivals += 1

    def has_unfinished(self) -> bool:
        return any(r.unfinished for r in self.ranks)

    @property
    def num_unfinished(self) -> int:
        return sum(len(r.unfinished) for r in self.ranks)

    def step(self) -> list[RequestOutput]:
        """One step of every rank (the ranks with nothing to do meet the others idle); every
        expert_rebalance_steps steps, a rebalance after it."""
        replies = self._everyone({"op": "step"}, f"step {self._steps + 1}")
        self._steps += 1
        self._balance.add([reply["rows"] for reply in replies])
        outputs = [self._finish(wire.output_from_dict(o)) for reply in replies for o in reply["outputs"]]
        every = self.config.expert_rebalance_steps
        if every and self._steps % every == 0 and self.has_unfinished():
            self.rebalance()
        return outputs

    def _everyone(self, message: dict[str, Any], what: str) -> list[dict[str, Any]]:
        """Send one message to every rank and collect their replies; a rank that fails stops them all."""
        failed: list[tuple[_Rank, ExpertParallelError]] = []
        replies = []
        for r in self._running():
            try:
                r.send(message)
            except ExpertParallelError as exc:
                failed.append((r, exc))
        for r in self.ranks:
            if any(r is f for f, _ in failed):
                continue
            try:
                replies.append(r.receive())
            except ExpertParallelError as exc:
                failed.append((r, exc))
        if failed:
            # The rank that stopped says nothing; the others report its absence from a collective.
            first = next((error for rank, error in failed if not rank.reported), failed[0][1])
            self.shutdown()
            self._stopped = f"{what} failed: {first}"
            raise ExpertParallelError(self._stopped) from first
        return replies

    def abort(self, request_id: str) -> RequestOutput | None:
        rank = self._owner.get(request_id)
        if rank is None or not self.ranks:  # unknown, or gone with the stopped ranks
            return None
        rank.send({"op": "abort", "id": request_id})
        outs = rank.receive()["outputs"]
        return self._finish(wire.output_from_dict(outs[0])) if outs else None

    def _finish(self, out: RequestOutput) -> RequestOutput:
        record = self.requests.get(out.request_id)
        if record is not None:
            out.prompt = record.prompt
        if out.finished:
            rank = self._owner.pop(out.request_id, None)
            if rank is not None:
                rank.unfinished.discard(out.request_id)
            self.requests.pop(out.request_id, None)
        return out

    # -- load and placement -------------------------------------------------------------------
    def _gather(self) -> list[dict[str, Any]]:
        return self._everyone({"op": "stats"}, "stats")

    def stats(self) -> dict[str, float]:
        """The ranks' counters summed (rates averaged, start-up the slowest rank's), plus
        expert_parallel_size, moe_lb and moe_lb_window (StepBalance: 1.0 is balanced), the
        rebalances, and rank<i>_expert_rows (each rank's rows over the run)."""
        replies = self._gather()
        out: dict[str, float] = {}
        for reply in replies:
            for key, value in reply["stats"].items():
                if key.endswith("_rate") or key.startswith("draft_acceptance"):
                    out[key] = out.get(key, 0.0) + float(value) / len(replies)  # the ranks' mean
                elif key.endswith("_start_s") or key == "max_num_seqs":
                    # The ranks build at once; each rank's scheduler has its own batch cap.
                    out[key] = max(out.get(key, 0.0), float(value))
                else:
                    out[key] = out.get(key, 0.0) + float(value)
        out["engine_start_s"] = self.start_s
        out["expert_parallel_size"] = float(self.size)
        out["expert_rebalances"] = float(self._rebalances)
        loads = self.rank_loads(replies)
        out["moe_lb"], out["moe_lb_window"] = self._balance.run(), self._balance.window()
        for i, total in enumerate(loads.sum(dim=0).tolist() if loads.numel() else []):
            out[f"rank{i}_expert_rows"] = float(total)
        return out

    @staticmethod
    def rank_loads(replies: list[dict[str, Any]]) -> torch.Tensor:
        """[MoE layers, ranks]: rows each rank's experts computed, per layer."""
        per_rank = [torch.tensor(r["expert_rows"], dtype=torch.float64) for r in replies]
        if not per_rank or per_rank[0].numel() == 0:
            return torch.zeros(0, len(replies), dtype=torch.float64)
        return torch.stack(per_rank, dim=1)

    def expert_load(self) -> torch.Tensor:
        """[MoE layers, logical experts]: tokens routed to each expert so far, all ranks' requests."""
        loads = [torch.tensor(r["expert_tokens"], dtype=torch.float64) for r in self._gather()]
        return torch.stack(loads).sum(dim=0)

    def rebalance(self, redundant: int | None = None) -> ExpertPlacement:
        """Place the experts again from the load measured so far (placement.balanced_placement),
        with `redundant` extra replicas (default: the engine's expert_redundancy). Runs between
        steps, also with requests in flight: the ranks move expert weights among themselves
        (expert_moves.py) and keep their requests and KV caches. No output bit depends on the
        placement, so every output is what it would have been."""
        load = self.expert_load()
        extra = self.config.expert_redundancy if redundant is None else redundant
        placement = balanced_placement(load, self.size, extra)
        self._everyone(
            {"op": "place", "physical_to_logical": list(placement.physical_to_logical)}, "rebalance"
        )
        self.placement = placement
        self._rebalances += 1
        return self.placement
