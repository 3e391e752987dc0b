"""Metrics recorded with the demo model: held-out perplexity, greedy task accuracy, MTP agreement.

All of it runs on transformers' DeepseekV3ForCausalLM in float32 over the *saved* (bf16-rounded) weights,
so the numbers are what any float32 engine loading the checkpoint should reproduce.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from transformers import DeepseekV3ForCausalLM

from .model import MTPLayer, main_hidden_and_logits
from .tasks import Task, is_correct


def windows(docs: Sequence[Sequence[int]], length: int, min_len: int = 16) -> list[list[int]]:
    """Cut each document's tokens into consecutive, independent windows of `length` tokens."""
    out: list[list[int]] = []
    for doc in docs:
        for start in range(0, len(doc), length):
            piece = list(doc[start : start + length])
            if len(piece) >= min_len:
                out.append(piece)
    return out


def _by_length(seqs: Sequence[Sequence[int]], batch: int) -> list[list[int]]:
    """Batches of indices whose sequences share one length, so no padding or masks are needed."""
    groups: dict[int, list[int]] = defaultdict(list)
    for i, s in enumerate(seqs):
        groups[len(s)].append(i)
    return [idx[i : i + batch] for _, idx in sorted(groups.items()) for i in range(0, len(idx), batch)]


@torch.no_grad()
def nll_sum(
    model: DeepseekV3ForCausalLM, seqs: Sequence[Sequence[int]], device: str, batch: int = 16
) -> tuple[float, int]:
    """Sum of -log p(t[i] | t[<i]) over every position i >= 1 of every sequence, and the count."""
    total, count = 0.0, 0
    for idx in _by_length(seqs, batch):
        ids = torch.tensor([list(seqs[i]) for i in idx], device=device)
        logits = model(input_ids=ids, use_cache=False).logits.float()
        logp = F.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None])
        total -= float(logp.double().sum())
        count += ids.numel() - ids.shape[0]
    return total, count


def perplexity(model: DeepseekV3ForCausalLM, seqs: Sequence[Sequence[int]], device: str) -> float:
    total, count = nll_sum(model, seqs, device)
    return math.exp(total / count)


@torch.no_grad()
def greedy(
    model: DeepseekV3ForCausalLM,
    prompts: Sequence[Sequence[int]],
    max_new: int,
    eos: int,
    device: str,
    batch: int = 64,
) -> list[list[int]]:
    """Greedy completions (EOS excluded), recomputing the whole prefix each step: simple and exact."""
    out: list[list[int]] = [[] for _ in prompts]
    for idx in _by_length(prompts, batch):
        ids = torch.tensor([list(prompts[i]) for i in idx], device=device)
        done = torch.zeros(len(idx), dtype=torch.bool, device=device)
        for _ in range(max_new):
            nxt = model(input_ids=ids, use_cache=False).logits[:, -1].float().argmax(-1)
            for row, i in enumerate(idx):
                if not done[row] and int(nxt[row]) != eos:
                    out[i].append(int(nxt[row]))
            done |= nxt == eos
            if bool(done.all()):
                break
            ids = torch.cat([ids, nxt[:, None]], dim=1)
    return out


def task_accuracy(
    model: DeepseekV3ForCausalLM,
    tasks: Sequence[Task],
    prompts: Sequence[Sequence[int]],
    decode,
    eos: int,
    device: str,
    max_new: int = 48,
) -> tuple[float, dict[str, float], list[str]]:
    """Exact-match accuracy overall and per task kind, plus the decoded completions."""
    completions = [decode(c) for c in greedy(model, prompts, max_new, eos, device)]
    hits: dict[str, list[bool]] = defaultdict(list)
    for task, text in zip(tasks, completions, strict=True):
        hits[task.kind].append(is_correct(task, text))
    per_kind = {k: sum(v) / len(v) for k, v in sorted(hits.items())}
    overall = sum(sum(v) for v in hits.values()) / len(tasks)
    return overall, per_kind, completions


@torch.no_grad()
def mtp_agreement(
    model: DeepseekV3ForCausalLM, mtp: MTPLayer, seqs: Sequence[Sequence[int]], device: str, batch: int = 16
) -> dict[str, float]:
    """How often the MTP head's top-1 for t[j+2] equals the main model's top-1 for t[j+2].

    The MTP head sees the true t[j+1] (teacher forcing), as speculative decoding does once t[j+1] is accepted.
    Also reported: MTP top-1 accuracy against the true t[j+2], and the main model's own top-1 accuracy.
    """
    agree = mtp_right = main_right = n = 0
    for idx in _by_length(seqs, batch):
        ids = torch.tensor([list(seqs[i]) for i in idx], device=device)
        if ids.shape[1] < 3:
            continue
        hidden, logits = main_hidden_and_logits(model, ids)
        pos = torch.arange(ids.shape[1] - 1, device=device)[None].expand(ids.shape[0], -1)
        mtp_logits = mtp(model, ids[:, 1:], hidden[:, :-1], pos)
        mtp_top = mtp_logits[:, :-1].float().argmax(-1)  # predictions of t[j+2], j = 0..L-3
        main_top = logits[:, 1:-1].float().argmax(-1)  # the main model's prediction of the same tokens
        truth = ids[:, 2:]
        agree += int((mtp_top == main_top).sum())
        mtp_right += int((mtp_top == truth).sum())
        main_right += int((main_top == truth).sum())
        n += truth.numel()
    return {
        "mtp_top1_agreement": agree / n,
        "mtp_top1_accuracy": mtp_right / n,
        "main_top1_accuracy": main_right / n,
        "positions": n,
    }
