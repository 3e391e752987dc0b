"""The fingerprint changes with everything that decides a row's output, and with nothing else."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from pathlib import Path

import fsspec
import pytest

from shardinfer.errors import ConfigError
from shardinfer.pipeline.config import JobConfig
from shardinfer.pipeline.fingerprint import (
    compute_fingerprint,
    diff_fingerprint_parts,
    diff_fingerprints,
    model_identity,
)


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


def _checkpoint_folder(root: Path, config: dict, generation: dict | None, weights: tuple[str, ...]) -> Path:
    """A hand-written model folder: config.json, an optional generation_config.json and empty
    safetensors files (an 8-byte header length and an empty JSON header)."""
    root.mkdir()
    (root / "config.json").write_text(json.dumps(config))
    if generation is not None:
        (root / "generation_config.json").write_text(json.dumps(generation))
    for name in weights:
        (root / name).write_bytes(struct.pack("<Q", 2) + b"{}")
    return root


@pytest.mark.parametrize(
    ("config_eos", "generation_eos", "expected"),
    [
        (2, None, None),  # no generation_config.json
        (2, 2, None),  # the same single id
        ([2, 7], [7, 2], None),  # the same ids, listed in another order
        (2, [2, 7], [2, 7]),  # an id config.json does not name: generation also stops there
        (None, 5, [5]),  # config.json names none
        ([2, 7], 9, [9]),
    ],
)
def test_generation_config_eos_ids_are_a_component_only_when_config_json_lacks_them(
    tmp_path: Path, config_eos: object, generation_eos: object, expected: list[int] | None
) -> None:
    generation = None if generation_eos is None else {"eos_token_id": generation_eos, "bos_token_id": 1}
    config = {"eos_token_id": config_eos}
    local = _checkpoint_folder(tmp_path / "m", config, generation, ("model.safetensors",))
    identity = model_identity(str(local))
    assert identity.get("model.generation_eos_token_ids") == expected
    # The same folder on object storage carries the same component.
    url = f"memory://fingerprint-eos/{tmp_path.name}"
    fs = fsspec.filesystem("memory")
    for path in local.iterdir():
        fs.pipe(f"{url.removeprefix('memory://')}/{path.name}", path.read_bytes())
    assert model_identity(url).get("model.generation_eos_token_ids") == expected


def _expected_hash(fp: dict) -> str:
    """The fingerprint hash as its definition states it: sha256 of the canonical JSON of the rest."""
    rest = {k: v for k, v in fp.items() if k != "hash"}
    text = json.dumps(rest, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def test_a_checkpoint_whose_eos_ids_agree_keeps_its_fingerprint_components(model_dir: Path) -> None:
    # The tiny checkpoint's generation_config.json repeats config.json's eos id: its fingerprint has
    # exactly the components jobs planned before the eos component existed have.
    fp = _fp(_config(model_dir))
    assert set(fp) == {
        "fingerprint_version",
        "model.config_sha256",
        "model.weights",
        "tokenizer.sha256",
        "tokenizer.chat_template_sha256",
        "engine.numerics",
        "sampling.defaults",
        "job.seed",
        "input.source",
        "input.rows",
        "output.schema_version",
        "hash",
    }
    assert fp["hash"] == _expected_hash(fp)


def test_only_the_weight_files_the_loader_reads_are_identified(tmp_path: Path, model_dir: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    base = _fp(_config(model))
    assert list(base["model.weights"]) == ["model.safetensors"]
    # Mistral ships consolidated.safetensors beside model.safetensors; only the latter is loaded.
    (model / "consolidated.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}")
    assert _fp(_config(model))["hash"] == base["hash"]
    # Sharded: the index's shards, not a stale shard of an earlier download.
    names = (
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "old-00001-of-00003.safetensors",
    )
    sharded = _checkpoint_folder(tmp_path / "sharded", {"eos_token_id": 2}, None, names)
    index = {"weight_map": {"a": names[0], "b": names[1]}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    assert sorted(model_identity(str(sharded))["model.weights"]) == list(names[:2])
    # No index and no model.safetensors: every *.safetensors, as before.
    (sharded / "model.safetensors.index.json").unlink()
    assert sorted(model_identity(str(sharded))["model.weights"]) == sorted(names)


def test_an_index_naming_a_missing_shard_is_a_config_error(tmp_path: Path) -> None:
    shard = "model-00001-of-00002.safetensors"
    folder = _checkpoint_folder(tmp_path / "m", {"eos_token_id": 2}, None, (shard,))
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ConfigError, match=r"model-00002-of-00002\.safetensors"):
        model_identity(str(folder))
    (folder / "model.safetensors.index.json").unlink()
    (folder / shard).unlink()
    with pytest.raises(ConfigError, match=r"model\.path=.*no \*\.safetensors"):
        model_identity(str(folder))


def test_a_missing_relative_model_path_names_the_directory_it_was_read_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"a relative path, read from the current directory") as caught:
        model_identity("models/missing")
    assert repr(str(tmp_path)) in str(caught.value)
    with pytest.raises(ConfigError) as absolute:
        model_identity(str(tmp_path / "missing"))
    assert "relative path" not in str(absolute.value)
