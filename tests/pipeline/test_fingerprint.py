"""The fingerprint changes with everything that decides a row's output, and with nothing else."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from shardinfer.pipeline.config import JobConfig
from shardinfer.pipeline.fingerprint import compute_fingerprint, diff_fingerprint_parts, diff_fingerprints


def _config(model_path: Path, **changes: dict) -> JobConfig:
    data = {
        "job": {"seed": 1, "run_id": "a"},
        "input": {"path": "in", "prompt_column": "prompt"},
        "model": {"path": str(model_path), "device": "cpu", "dtype": "float32"},
        "engine": {"max_num_seqs": 8},
        "sampling": {"temperature": 0.5},
        "output": {"path": "out-a"},
    }
    for section, body in changes.items():
        data[section] = {**data.get(section, {}), **body}
    return JobConfig.from_dict(data)


def _fp(cfg: JobConfig) -> dict:
    return compute_fingerprint(cfg, dict(cfg.sampling), 1)


def test_fingerprint_tracks_model_files_and_settings(tmp_path: Path, model_dir: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    base = _fp(_config(model))
    # Not part of what a row's output depends on: run id, output path, scheduling knobs.
    same = _fp(_config(model, job={"run_id": "b"}, output={"path": "out-b"}, engine={"max_num_seqs": 2}))
    assert same["hash"] == base["hash"]
    # Speculative decoding is token-identical to plain decoding: toggling it changes no output.
    spec = _fp(_config(model, engine={"speculative": "mtp", "speculative_depth": 1}))
    assert spec["hash"] == base["hash"]
    changed = {
        "job.seed": _fp(_config(model, job={"seed": 2})),
        "sampling.defaults.temperature": _fp(_config(model, sampling={"temperature": 0.6})),
        "engine.numerics.dtype": _fp(_config(model, model={"dtype": "bfloat16"})),
        "engine.numerics.batch_invariant": _fp(_config(model, engine={"batch_invariant": False})),
        "input.rows.prompt_column": _fp(_config(model, input={"prompt_column": "text"})),
    }
    for key, fp in changed.items():
        assert fp["hash"] != base["hash"]
        assert [line.split(":")[0] for line in diff_fingerprint_parts(base, fp)] == [key]
    cfg_tok = json.loads((model / "tokenizer_config.json").read_text())
    cfg_tok["chat_template"] += " "
    (model / "tokenizer_config.json").write_text(json.dumps(cfg_tok))
    template = _fp(_config(model))
    assert [line.split(":")[0] for line in diff_fingerprint_parts(base, template)] == [
        "tokenizer.chat_template_sha256"
    ]
    with (model / "model.safetensors").open("ab") as f:
        f.write(b"\0")
    (model / "config.json").write_text((model / "config.json").read_text() + "\n")
    weights = _fp(_config(model))
    keys = [line.split(":")[0] for line in diff_fingerprint_parts(template, weights)]
    assert keys == ["model.config_sha256", "model.weights.model.safetensors"]


def test_diff_fingerprints_names_nested_added_and_removed_keys() -> None:
    old = {
        "model": {"path": "m", "dtype": "bf16"},
        "sampling": {"temperature": 0.0},
        "template": "t",
        "gone": 1,
    }
    new = {
        "model": {"path": "m", "dtype": "fp32"},
        "sampling": {"temperature": 0.0, "top_p": 0.9},
        "template": "t",
    }
    assert diff_fingerprints(old, new) == ["gone", "model.dtype", "sampling.top_p"]
    assert diff_fingerprints(old, old) == []
    # A tuple saved to JSON comes back as a list: that is not drift.
    assert diff_fingerprints({"stop": ["a", "b"]}, {"stop": ("a", "b")}) == []
    assert diff_fingerprints({"x": {"a": 1}}, {"x": 1}) == ["x"]


def test_diff_lines_show_old_and_new_values() -> None:
    old = {"hash": "a", "engine.numerics": {"dtype": "float32"}, "job.seed": 1}
    new = {"hash": "b", "engine.numerics": {"dtype": "bfloat16"}, "job.seed": 1, "extra": [1]}
    assert diff_fingerprint_parts(old, new) == [
        'engine.numerics.dtype: "float32" -> "bfloat16"',
        "extra: null -> [1]",
    ]


def test_a_quantised_checkpoint_names_its_quantisation_and_a_float_one_keeps_its_fingerprint(
    tmp_path: Path, model_dir: Path
) -> None:
    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    float_fp = _fp(_config(model))
    assert "model.checkpoint_quantization" not in float_fp
    config = json.loads((model / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
    (model / "config.json").write_text(json.dumps(config))
    fp8 = _fp(_config(model))
    # FP8 checkpoints run in FP8 unless model.quantization says otherwise: a job planned when they
    # were dequantised at load must not resume onto FP8 numerics under the same fingerprint.
    assert fp8["model.checkpoint_quantization"] == "fp8"
    assert sorted(line.split(":")[0] for line in diff_fingerprint_parts(float_fp, fp8)) == [
        "model.checkpoint_quantization",
        "model.config_sha256",
    ]
