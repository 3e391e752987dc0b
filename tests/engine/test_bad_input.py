"""Bad input names the value and the limit; the engine keeps serving everyone else."""

from __future__ import annotations

from typing import Any

import pytest

from shardinfer import LLM, SamplingParams
from shardinfer.errors import CheckpointError, ModelLoadError


@pytest.fixture(scope="module")
def llm(qwen3_dir) -> LLM:
    return LLM(qwen3_dir, device="cpu", dtype="float32", max_model_len=64)


@pytest.mark.parametrize(
    "prompt, message",
    [
        ("", "prompt is empty"),
        ([], "prompt is empty"),
        ([5, 100000], r"token id 100000 is out of range: ids must be in \[0, \d+\)"),
        ([-1], "token id -1 is out of range"),
        (list(range(3, 67)), "prompt has 64 tokens; max_model_len=64"),
    ],
)
def test_bad_prompt_rejected_while_others_keep_running(llm: LLM, prompt, message: str) -> None:
    engine = llm.llm_engine
    engine.add_request("good", [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    engine.step()
    with pytest.raises(ValueError, match=message):
        engine.add_request("bad", prompt, SamplingParams())
    outs = []
    while engine.has_unfinished():
        outs.extend(engine.step())
    assert [o.request_id for o in outs] == ["good"] and len(outs[0].outputs[0].token_ids) == 4


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=-0.1), "temperature=-0.1 is invalid: must be >= 0"),
        (dict(top_p=0.0), "top_p=0.0 is invalid"),
        (dict(top_k=-2), "top_k=-2 is invalid: must be -1 or 0"),
        (dict(top_k=2**31), "top_k=2147483648 is above 2147483647"),
        (dict(min_p=1.5), "min_p=1.5"),
        (dict(max_tokens=0), "max_tokens=0 without prompt_logprobs asks for nothing: .* set prompt_logprobs"),
        (
            dict(max_tokens=-1),
            r"max_tokens=-1 is invalid: must be >= 1, None \(up to max_model_len\), or 0 with "
            "prompt_logprobs",
        ),
        (dict(n=0), "n=0"),
        (dict(logprobs=21), r"logprobs=21 is invalid: must be None or in \[0, 20\]"),
        (dict(min_tokens=5, max_tokens=2), "min_tokens=5 is invalid: must be <= max_tokens=2"),
        (dict(stop=[""]), "stop"),
        (dict(so_args={"schema_type": "yaml"}), "schema_type must be one of"),
    ],
)
def test_invalid_sampling_values(kwargs, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_generate_names_the_bad_prompt_index_and_does_no_work(llm: LLM) -> None:
    steps = llm.llm_engine.counters["steps"]
    with pytest.raises(ValueError, match="prompt 1: prompt is empty"):
        llm.generate(["fine", ""], SamplingParams(max_tokens=2))
    assert llm.llm_engine.counters["steps"] == steps and not llm.llm_engine.has_unfinished()


def test_a_bad_schema_names_its_prompt_and_keeps_its_class(llm: LLM) -> None:
    """Among many prompts, the one whose structured output cannot compile is named, as every other
    refusal of generate names its prompt; it stays a GrammarError (a row's invalid_schema)."""
    from shardinfer.engine.structured import GrammarError

    bad = SamplingParams(
        max_tokens=2, structured_output={"schema_type": "json", "schema": {"uniqueItems": True}}
    )
    steps = llm.llm_engine.counters["steps"]
    with pytest.raises(GrammarError, match=r"^prompt 1: .*uniqueItems"):
        llm.generate(["a", "b"], [SamplingParams(max_tokens=2), bad])
    assert llm.llm_engine.counters["steps"] == steps and not llm.llm_engine.has_unfinished()


def test_unknown_engine_argument_suggests_the_right_one(qwen3_dir) -> None:
    with pytest.raises(ValueError, match="'max_num_seq' \\(did you mean 'max_num_seqs'\\?\\)"):
        LLM(qwen3_dir, max_num_seq=4)


def test_model_errors(tmp_path, qwen3_dir) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LLM(tmp_path / "nope")
    (tmp_path / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}')
    with pytest.raises(ModelLoadError, match="architecture 'GPT2LMHeadModel' is not supported; supported: "):
        LLM(tmp_path)
    with pytest.raises(ValueError, match="dtype='float8' is not supported"):
        LLM(qwen3_dir, dtype="float8")


def test_missing_and_misshaped_tensors(tmp_path, qwen3_dir) -> None:
    import shutil

    from safetensors.torch import load_file, save_file

    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(qwen3_dir / name, tmp_path / name)
    tensors = load_file(qwen3_dir / "model.safetensors")
    dropped = dict(tensors)
    dropped.pop("model.layers.1.mlp.up_proj.weight")
    save_file(dropped, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"lacks tensors \['layers.1.mlp.up_proj.weight'\]"):
        LLM(tmp_path)
    bad = dict(tensors)
    bad["model.norm.weight"] = bad["model.norm.weight"][:-1].clone()
    save_file(bad, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"'model\.norm\.weight' has shape"):
        LLM(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ModelLoadError, match="pickle checkpoints are never loaded"):
        LLM(tmp_path)


@pytest.mark.parametrize("empty", [[[]], [{"prompt_token_ids": []}], ["Hello", ()]])
def test_empty_token_id_prompt_is_named_as_empty(llm: LLM, empty: list[Any]) -> None:
    index = len(empty) - 1
    with pytest.raises(
        ValueError, match=rf"^prompt {index} is an empty list of token ids: give at least one"
    ):
        llm.generate(empty, SamplingParams(max_tokens=1), use_tqdm=False)
