"""shardinfer as an lm-evaluation-harness model, against the harness's own transformers model on the
same tiny checkpoints (a dense model and a DeepSeek-V3 one): every per-sample loglikelihood within
1e-4, the same accuracies and the same greedy generations (after the task's regex filter too)."""

from __future__ import annotations

from typing import Any

import pytest

FAMILIES = ["dense", "deepseek_v3"]


def _samples(run: dict[str, Any], task: str) -> list[dict[str, Any]]:
    return sorted(run["samples"][task], key=lambda s: s["doc_id"])


@pytest.mark.parametrize("family", FAMILIES)
def test_multiple_choice_loglikelihoods_and_accuracies(harness_runs: Any, family: str) -> None:
    ours, ref = harness_runs[family]
    pairs = list(zip(_samples(ours, "si_mc"), _samples(ref, "si_mc"), strict=True))
    assert len(pairs) == 6
    for a, b in pairs:
        assert a["arguments"] == b["arguments"]
        got = [r[0] for r in a["resps"]]
        want = [r[0] for r in b["resps"]]
        assert len(got) == len(want) >= 3
        for (lp, greedy), (lp_ref, greedy_ref) in zip(got, want, strict=True):
            assert abs(lp - lp_ref) < 1e-4
            assert greedy == greedy_ref
        assert (a["acc"], a["acc_norm"]) == (b["acc"], b["acc_norm"])
    for metric in ("acc,none", "acc_norm,none"):
        assert ours["results"]["si_mc"][metric] == ref["results"]["si_mc"][metric]


@pytest.mark.parametrize("family", FAMILIES)
def test_rolling_loglikelihoods(harness_runs: Any, family: str) -> None:
    ours, ref = harness_runs[family]
    for a, b in zip(_samples(ours, "si_ppl"), _samples(ref, "si_ppl"), strict=True):
        assert abs(a["resps"][0][0] - b["resps"][0][0]) < 1e-4
    for metric in ("word_perplexity,none", "byte_perplexity,none", "bits_per_byte,none"):
        assert ours["results"]["si_ppl"][metric] == pytest.approx(ref["results"]["si_ppl"][metric], rel=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generations_and_filtered_answers(harness_runs: Any, family: str) -> None:
    ours, ref = harness_runs[family]
    pairs = list(zip(_samples(ours, "si_gen"), _samples(ref, "si_gen"), strict=True))
    assert len(pairs) == 4
    for a, b in pairs:
        assert a["resps"] == b["resps"]
        assert a["filtered_resps"] == b["filtered_resps"]
        assert a["exact_match"] == b["exact_match"]
    assert any(a["resps"][0][0] for a, _ in pairs)  # something was generated


def test_chat_templated_prompts(tiny_models: Any) -> None:
    """With the harness's apply_chat_template, prompts go through the model's chat template (our
    sandboxed rendering against transformers'): the same scores and the same generations."""
    from harness_kit import hf_reference, run_harness

    from shardinfer.integrations.lm_eval import ShardinferLM

    model_dir = tiny_models["dense"]
    lm = ShardinferLM(str(model_dir), device="cpu", dtype="float32", max_length=32)
    ours = run_harness(lm, tasks=["si_mc", "si_gen"], chat=True)
    ref = hf_reference(model_dir, ["si_mc", "si_gen"], chat=True)
    for a, b in zip(_samples(ours, "si_mc"), _samples(ref, "si_mc"), strict=True):
        assert a["arguments"] == b["arguments"]
        assert a["arguments"][0][0].startswith("<|bos|><|user|>")
        for (lp, greedy), (lp_ref, greedy_ref) in zip(
            (r[0] for r in a["resps"]), (r[0] for r in b["resps"]), strict=True
        ):
            assert abs(lp - lp_ref) < 1e-4 and greedy == greedy_ref
    for a, b in zip(_samples(ours, "si_gen"), _samples(ref, "si_gen"), strict=True):
        assert a["arguments"] == b["arguments"] and a["resps"] == b["resps"]


def test_windows_take_every_position_as_the_harness_does(tiny_models: Any, harness_runs: Any) -> None:
    """Without max_length, a window takes all max_model_len positions, as the harness's hf model's
    max_length does: the span's last token is scored, never fed. The reference is the harness's
    own transformers model with max_length = max_model_len."""
    from harness_kit import MAX_LENGTH, run_harness

    from shardinfer.integrations.lm_eval import ShardinferLM

    lm = ShardinferLM(str(tiny_models["dense"]), device="cpu", dtype="float32", max_model_len=MAX_LENGTH)
    assert lm.max_length == MAX_LENGTH
    ours = run_harness(lm, tasks=["si_ppl", "si_mc"])
    _, ref = harness_runs["dense"]
    for a, b in zip(_samples(ours, "si_ppl"), _samples(ref, "si_ppl"), strict=True):
        assert abs(a["resps"][0][0] - b["resps"][0][0]) < 1e-4
    for a, b in zip(_samples(ours, "si_mc"), _samples(ref, "si_mc"), strict=True):
        for (lp, greedy), (lp_ref, greedy_ref) in zip(
            (r[0] for r in a["resps"]), (r[0] for r in b["resps"]), strict=True
        ):
            assert abs(lp - lp_ref) < 1e-4 and greedy == greedy_ref
    too_long = rf"max_length={MAX_LENGTH + 1}: the engine takes at most {MAX_LENGTH} here \(max_model_len={MAX_LENGTH}\)"
    with pytest.raises(ValueError, match=too_long):
        ShardinferLM(
            str(tiny_models["dense"]),
            device="cpu",
            dtype="float32",
            max_model_len=MAX_LENGTH,
            max_length=MAX_LENGTH + 1,
        )
