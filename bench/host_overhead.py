"""Host-side cost of one engine step, without the model: how much CPU time the scheduler, batch
building, sampling bookkeeping and stop checks add per step (GPU steps wait on it unless it
overlaps the device).

    python bench/host_overhead.py [--batch 256] [--steps 200] [--vocab 151936] [--logprobs 1]

The model is replaced by a stub that returns fixed logits instantly, so the time measured is the
engine's own. Greedy sampling keeps the CPU sampler's cost small and constant.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from shardinfer.engine import sampler
from shardinfer.engine.llm_engine import LLMEngine
from shardinfer.engine.sampling_params import SamplingParams
from shardinfer.kernels.top_logprob import TopLogprob, fill_reference
from shardinfer.testing.tiny_checkpoint import make_tiny_checkpoint


class StubModel:
    """Stands in for the model: hidden = zeros, logits = one fixed row per requested token."""

    def __init__(self, real: Any, vocab: int) -> None:
        self.real = real
        self.logits_row = torch.randn(vocab)

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: Any) -> torch.Tensor:
        return torch.zeros(input_ids.shape[0], 1)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.logits_row.expand(hidden.shape[0], -1)


class FixedChoice:
    """What ops.sample_with_logprobs returns (token, its logprob, the row's logsumexp), by argmax.
    The stub's logits are one fixed row, so the answer for a batch size is computed once: a GPU
    step's choice is a kernel launch, and the CPU's own arithmetic would hide the engine's time."""

    def __init__(self) -> None:
        self.by_rows: dict[int, tuple[torch.Tensor, ...]] = {}

    def __call__(
        self, raw: torch.Tensor, x: torch.Tensor, *rest: Any, top: TopLogprob | None = None
    ) -> tuple[torch.Tensor, ...]:
        if top is not None:
            return _argmax_with_logprobs(raw, x, top=top)
        if raw.shape[0] not in self.by_rows:
            self.by_rows[raw.shape[0]] = _argmax_with_logprobs(raw, x)
        return tuple(t.clone() for t in self.by_rows[raw.shape[0]])


def _argmax_with_logprobs(
    raw: torch.Tensor, x: torch.Tensor, *rest: Any, top: TopLogprob | None = None
) -> tuple[torch.Tensor, ...]:
    """What ops.sample_with_logprobs returns (token, its logprob, the row's logsumexp), by argmax."""
    lse = torch.logsumexp(raw, dim=-1)
    tokens = x.argmax(-1)
    if top is not None:
        fill_reference(top, raw, lse)
    return tokens, raw.gather(1, tokens.view(-1, 1)).view(-1) - lse, lse


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument(
        "--logprobs", type=int, default=0, help="SamplingParams.logprobs of every request (0: none)"
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny_checkpoint(
            Path(tmp), "qwen3", vocab_size=args.vocab, max_position_embeddings=4096
        )
        engine = LLMEngine(
            model_dir,
            device="cpu",
            max_num_seqs=args.batch,
            max_model_len=4096,
            num_kv_blocks=args.batch * 80,
        )
        engine.runner.model = StubModel(engine.model, args.vocab)
        # On a GPU the token choice is one kernel launch; here the CPU reference would dominate,
        # so it is replaced by an argmax to leave only the engine's own bookkeeping.
        sampler.gumbel_noise = lambda seeds, positions, vocab: None
        sampler.ops = SimpleNamespace(sample_with_logprobs=FixedChoice())
        params = SamplingParams(
            temperature=0.0, max_tokens=args.steps + 10, ignore_eos=True, logprobs=args.logprobs or None
        )
        for i in range(args.batch):
            engine.add_request(f"r{i}", [1 + (i + j) % 300 for j in range(200 + i % 300)], params)
        while (
            any(r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running)
            or engine.scheduler.waiting
        ):
            engine.step()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            engine.step()
        per_step = (time.perf_counter() - t0) / args.steps
    print(
        f"batch {args.batch}, logprobs {args.logprobs}: {per_step * 1e3:.2f} ms host time per decode step "
        f"({per_step / args.batch * 1e6:.1f} us per request)"
    )


if __name__ == "__main__":
    main()
