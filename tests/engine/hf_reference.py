"""transformers as the independent reference: logits and greedy continuations of a checkpoint."""

from __future__ import annotations

from pathlib import Path

import torch


def hf_model(model_dir: Path) -> torch.nn.Module:
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@torch.no_grad()
def hf_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([ids])).logits[0].float()


@torch.no_grad()
def hf_greedy(model: torch.nn.Module, ids: list[int], max_new_tokens: int) -> tuple[list[int], torch.Tensor]:
    """(generated ids, log-softmax of the scores at each step [N, V])."""
    out = model.generate(
        torch.tensor([ids]),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        output_scores=True,
        return_dict_in_generate=True,
        eos_token_id=None,
        pad_token_id=0,
        min_new_tokens=max_new_tokens,
    )
    scores = torch.stack(out.scores)[:, 0].float().log_softmax(-1)
    return out.sequences[0, len(ids) :].tolist(), scores
