"""The demo model's recorded numbers, recomputed: perplexity and task accuracy by the engine, MTP agreement.

The recorded values were computed at training time with transformers in float32 over the saved weights;
the fixed evaluation data (token windows, tasks) is stored in metrics.json so the check does not depend on
the local Python's standard library.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from shardinfer import SamplingParams


def test_engine_prompt_logprobs_match_transformers(
    engine: Any, hf_model: Any, metrics: dict[str, Any]
) -> None:
    window = metrics["ci"]["ppl_windows"][0][:256]
    out = engine.generate([window], SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
    assert out.prompt_logprobs[0] is None
    with torch.no_grad():
        logits = hf_model(input_ids=torch.tensor([window]), use_cache=False).logits[0].double()
    want = torch.log_softmax(logits[:-1], dim=-1).gather(-1, torch.tensor(window[1:])[:, None])[:, 0]
    got = torch.tensor(out.prompt_logprobs[1:], dtype=torch.float64)
    assert float((got - want).abs().max()) < 1e-4


def test_engine_heldout_perplexity_matches_record(engine: Any, metrics: dict[str, Any]) -> None:
    windows = metrics["ci"]["ppl_windows"]
    outs = engine.generate(windows, SamplingParams(max_tokens=1, prompt_logprobs=0))
    logps = [lp for o in outs for lp in o.prompt_logprobs[1:]]
    assert len(logps) == metrics["eval"]["ci_ppl_tokens"]
    ppl = math.exp(-sum(logps) / len(logps))
    recorded = metrics["eval"]["ci_ppl"]
    assert abs(ppl - recorded) <= 0.01 * recorded, (ppl, recorded)


def test_engine_greedy_task_accuracy(engine: Any, metrics: dict[str, Any]) -> None:
    tasks = metrics["ci"]["tasks"]
    assert len(tasks) == 50
    convs = [[{"role": "user", "content": t["prompt"]}] for t in tasks]
    outs = engine.chat(convs, SamplingParams(temperature=0.0, max_tokens=48))
    for o, t in zip(outs, tasks, strict=True):
        assert o.prompt_token_ids == t["prompt_token_ids"]  # the engine renders the template as training did
    correct = sum(o.outputs[0].text.strip() == t["answer"] for o, t in zip(outs, tasks, strict=True))
    recorded = metrics["eval"]["ci_task_accuracy"]
    assert correct / len(tasks) >= recorded - 0.02, (correct, recorded)


def test_mtp_agreement_matches_record(hf_model: Any, metrics: dict[str, Any], model_dir: Path) -> None:
    from demo_training.evaluate import mtp_agreement
    from demo_training.model import load_mtp
    from safetensors.torch import load_file

    mtp = load_mtp(load_file(str(model_dir / "model.safetensors")), hf_model.config).eval()
    got = mtp_agreement(hf_model, mtp, metrics["ci"]["mtp_sequences"], "cpu")
    recorded = metrics["eval"]["mtp_chat_tasks"]
    assert got["positions"] == recorded["positions"]
    assert abs(got["mtp_top1_agreement"] - recorded["mtp_top1_agreement"]) <= 0.01
    readme = (model_dir / "README.md").read_text()
    assert f"{100 * recorded['mtp_top1_agreement']:.1f}%" in readme
