"""End-of-sequence ids that only generation_config.json names (instruct checkpoints list their
end-of-turn token there): greedy generation stops where transformers' generate() stops."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from shardinfer import LLM, SamplingParams
from shardinfer.errors import ModelLoadError
from tests.engine.hf_reference import hf_greedy, hf_model


def _with_generation_eos(qwen3_dir: Path, tmp_path: Path, eos: object) -> Path:
    out = tmp_path / "model"
    shutil.copytree(qwen3_dir, out)
    gen = json.loads((out / "generation_config.json").read_text())
    (out / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": eos}))
    return out


def test_generation_config_eos_stops_greedy_where_transformers_stops(qwen3_dir: Path, tmp_path: Path) -> None:
    prompt = [5, 17, 42, 9]
    free, _ = hf_greedy(hf_model(qwen3_dir), prompt, 6)
    config_eos = json.loads((qwen3_dir / "config.json").read_text())["eos_token_id"]
    # The third greedy token becomes an end-of-sequence id, named in generation_config.json only.
    new_eos = free[2]
    assert new_eos != config_eos and new_eos not in free[:2]
    model = _with_generation_eos(qwen3_dir, tmp_path, [config_eos, new_eos])
    hf = hf_model(model)
    with torch.no_grad():  # transformers' generate reads the eos ids from generation_config.json
        expected = hf.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)[
            0, len(prompt) :
        ].tolist()
    assert expected == free[:3]
    llm = LLM(model, device="cpu", dtype="float32")
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=6), use_tqdm=False)[0].outputs[0]
    assert (out.token_ids, out.finish_reason, out.stop_reason) == (expected, "stop", None)
    assert out.text == llm.get_tokenizer().decode(expected[:2])  # the eos is not part of the text
    ignored = llm.generate(
        [prompt], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True), use_tqdm=False
    )
    assert ignored[0].outputs[0].token_ids == free


@pytest.mark.parametrize("eos", ["<|eos|>", [1, -3], 2.5])
def test_bad_generation_config_eos_names_the_file(qwen3_dir: Path, tmp_path: Path, eos: object) -> None:
    model = _with_generation_eos(qwen3_dir, tmp_path, eos)
    with pytest.raises(ModelLoadError, match=r"generation_config\.json.*eos_token_id holds"):
        LLM(model, device="cpu", dtype="float32")
