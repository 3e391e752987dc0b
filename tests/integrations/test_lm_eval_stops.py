"""generate_until's stop strings against the harness's own transformers model: a stop string that
is a special token's text (a chat task's "<|im_end|>") ends the generation there, as it does there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Every special token of the test tokenizer but the EOS (which ends a generation anyway).
SPECIAL_STOPS = ["<|bos|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]


def _requests(until: list[str]) -> list[Any]:
    from lm_eval.api.instance import Instance

    requests = []
    for i in range(40):
        prompt = f"Q: item {i} word {i * 7 % 13} is\nA:"
        req = Instance(
            "generate_until", {}, (prompt, {"until": until, "max_gen_toks": 40, "do_sample": False}), i
        )
        req.task_name, req.doc_id = "stops", i
        requests.append(req)
    return requests


def _hf_model(model_dir: Path) -> Any:
    import transformers
    from lm_eval.models.huggingface import HFLM

    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(model_dir / "tokenizer.json"),
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|eos|>",
    )
    return HFLM(
        pretrained=str(model_dir), tokenizer=tok, dtype="float32", max_length=128, device="cpu", batch_size=1
    )


def test_a_special_token_as_stop_string_ends_the_generation_as_in_the_harness(
    tiny_models: dict[str, Path],
) -> None:
    from shardinfer.integrations.lm_eval import ShardinferLM

    model_dir = tiny_models["dense"]
    hf = _hf_model(model_dir)
    want = hf.generate_until(_requests(SPECIAL_STOPS), disable_tqdm=True)
    unstopped = hf.generate_until(_requests([]), disable_tqdm=True)
    assert want != unstopped  # some generation reaches a special token before its end
    ours = ShardinferLM(str(model_dir), device="cpu", dtype="float32", max_length=128)
    assert ours.generate_until(_requests(SPECIAL_STOPS), disable_tqdm=True) == want
    assert ours.generate_until(_requests([]), disable_tqdm=True) == unstopped
