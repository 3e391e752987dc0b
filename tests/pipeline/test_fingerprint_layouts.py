"""A model folder on object storage is identified by the files the loader reads, as the same folder
on local disk is: real-world Hugging Face layouts carry files beside the checkpoint that are never
loaded (Mistral's consolidated.safetensors, a stale shard, pytorch_model.bin)."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

import fsspec
import pytest

from shardinfer.engine.models.loader import checkpoint_files
from shardinfer.errors import ConfigError, ModelLoadError
from shardinfer.pipeline.fingerprint import model_identity
from tests.ascii_locale import run_in_ascii_locale

SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
INDEX = {"metadata": {"total_size": 4}, "weight_map": {"a.weight": SHARDS[0], "b.weight": SHARDS[1]}}
EMPTY_SAFETENSORS = struct.pack("<Q", 2) + b"{}"

# name -> the files of a folder (besides config.json): bytes, or a dict written as JSON.
LAYOUTS: dict[str, dict[str, Any]] = {
    "model.safetensors and Mistral's consolidated.safetensors": {
        "model.safetensors": EMPTY_SAFETENSORS,
        "consolidated.safetensors": EMPTY_SAFETENSORS,
    },
    "an index, its shards, a stale shard, consolidated.safetensors and a pickle": {
        "model.safetensors.index.json": INDEX,
        SHARDS[0]: EMPTY_SAFETENSORS,
        SHARDS[1]: EMPTY_SAFETENSORS,
        "model-00001-of-00003.safetensors": EMPTY_SAFETENSORS,
        "consolidated.safetensors": EMPTY_SAFETENSORS,
        "pytorch_model.bin": b"pickle",
    },
    "shards without an index": {SHARDS[0]: EMPTY_SAFETENSORS, SHARDS[1]: EMPTY_SAFETENSORS},
}


def _folder(root: Path, files: dict[str, Any]) -> Path:
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"eos_token_id": 2}))
    for name, body in files.items():
        (root / name).write_bytes(body if isinstance(body, bytes) else json.dumps(body).encode())
    return root


def _upload(local: Path, url: str) -> str:
    fs = fsspec.filesystem("memory")
    for path in local.iterdir():
        fs.pipe(f"{url.removeprefix('memory://')}/{path.name}", path.read_bytes())
    return url


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_remote_folder_is_identified_by_the_files_the_loader_reads(tmp_path: Path, layout: str) -> None:
    local = _folder(tmp_path / "m", LAYOUTS[layout])
    url = _upload(local, f"memory://layouts/{tmp_path.name}")
    loaded = [p.name for p in checkpoint_files(local)]  # what the engine reads: the reference
    assert list(model_identity(str(local))["model.weights"]) == loaded
    assert sorted(model_identity(url)["model.weights"]) == sorted(loaded)


def test_a_stray_file_beside_a_remote_checkpoint_keeps_its_fingerprint(tmp_path: Path) -> None:
    files = LAYOUTS["an index, its shards, a stale shard, consolidated.safetensors and a pickle"]
    clean = {k: v for k, v in files.items() if k in ("model.safetensors.index.json", *SHARDS)}
    url = _upload(_folder(tmp_path / "clean", clean), f"memory://layouts/{tmp_path.name}-clean")
    stray = _upload(_folder(tmp_path / "stray", files), f"memory://layouts/{tmp_path.name}-stray")
    assert model_identity(stray) == model_identity(url)


@pytest.mark.parametrize(
    ("files", "loader_says", "config_says"),
    [
        ({"model.safetensors.index.json": INDEX, SHARDS[0]: EMPTY_SAFETENSORS}, SHARDS[1], SHARDS[1]),
        (
            {"model.safetensors.index.json": b"{not json", SHARDS[0]: EMPTY_SAFETENSORS},
            "not a safetensors index",
            "not a safetensors index",
        ),
        (
            {"model.safetensors.index.json": {"metadata": {}}, SHARDS[0]: EMPTY_SAFETENSORS},
            "no weight_map",
            "no weight_map",
        ),
        ({"pytorch_model.bin": b"pickle"}, "pytorch_model.bin", r"no \*\.safetensors.*pytorch_model\.bin"),
    ],
)
def test_a_remote_folder_the_loader_refuses_is_refused_with_the_same_reason(
    tmp_path: Path, files: dict[str, Any], loader_says: str, config_says: str
) -> None:
    local = _folder(tmp_path / "m", files)
    with pytest.raises(ModelLoadError, match=loader_says):
        checkpoint_files(local)
    url = _upload(local, f"memory://layouts/{tmp_path.name}")
    for where in (str(local), url):
        with pytest.raises(ConfigError, match=config_says) as caught:
            model_identity(where)
        assert f"model.path={where!r}" in str(caught.value)


def _upload_tree(local: Path, url: str) -> str:
    fs = fsspec.filesystem("memory")
    for path in local.rglob("*"):
        if path.is_file():
            fs.pipe(
                f"{url.removeprefix('memory://')}/{path.relative_to(local).as_posix()}", path.read_bytes()
            )
    return url


def _template_hashes(folder: Path, url: str) -> tuple[str | None, str | None]:
    fsspec.filesystem("memory").rm(url.removeprefix("memory://"), recursive=True)
    _upload_tree(folder, url)
    key = "tokenizer.chat_template_sha256"
    return model_identity(str(folder))[key], model_identity(url)[key]


def test_the_fingerprint_names_the_template_a_job_renders_here_and_on_object_storage(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "m", {"model.safetensors": EMPTY_SAFETENSORS})
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "CONFIG"}))
    (folder / "chat_template.jinja").write_bytes("DEFAULT ünï {{ messages }}".encode())
    (folder / "additional_chat_templates").mkdir()
    (folder / "additional_chat_templates" / "tool_use.jinja").write_text("TOOLS")
    url = _upload_tree(folder, f"memory://layouts/{tmp_path.name}")
    # sha256 of the default template as canonical JSON: a job renders the default one.
    default = hashlib.sha256(json.dumps("DEFAULT ünï {{ messages }}").encode()).hexdigest()
    assert _template_hashes(folder, url) == (default, default)
    # No job renders tool_use (jobs pass no tools): editing it is no change of job.
    (folder / "additional_chat_templates" / "tool_use.jinja").write_text("OTHER TOOLS")
    assert _template_hashes(folder, url) == (default, default)
    # Without chat_template.jinja the template files still replace tokenizer_config.json's template
    # (as in transformers): there is no default one, so no template for a job to render.
    (folder / "chat_template.jinja").unlink()
    assert _template_hashes(folder, url) == (None, None)
    # A default.jinja among them is the default.
    (folder / "additional_chat_templates" / "default.jinja").write_text("NAMED DEFAULT")
    named = hashlib.sha256(json.dumps("NAMED DEFAULT").encode()).hexdigest()
    assert _template_hashes(folder, url) == (named, named)


def test_the_template_is_hashed_as_utf8_whatever_the_locale(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "m", {"model.safetensors": EMPTY_SAFETENSORS})
    (folder / "chat_template.jinja").write_bytes("<｜User｜>{{ messages[0].content }}".encode())
    expected = hashlib.sha256(json.dumps("<｜User｜>{{ messages[0].content }}").encode()).hexdigest()
    script = (
        "import sys; from shardinfer.pipeline.fingerprint import model_identity; "
        "print(model_identity(sys.argv[1])['tokenizer.chat_template_sha256'])"
    )
    run = run_in_ascii_locale(script, str(folder))
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == expected


@pytest.mark.parametrize(
    ("body", "says"), [(b"{'chat_template': 'x'}", "not valid JSON"), (b"[1]", "JSON list")]
)
def test_a_broken_tokenizer_config_is_a_config_error_naming_it(
    tmp_path: Path, body: bytes, says: str
) -> None:
    folder = _folder(tmp_path / "m", {"model.safetensors": EMPTY_SAFETENSORS, "tokenizer_config.json": body})
    url = _upload(folder, f"memory://layouts/{tmp_path.name}")
    for where in (str(folder), url):
        with pytest.raises(
            ConfigError, match=f"model.path=.*tokenizer_config.json.*{says}.*fix or remove it"
        ):
            model_identity(where)


def test_a_misspelt_verify_weights_is_refused_for_a_remote_model_too(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "m", {"model.safetensors": EMPTY_SAFETENSORS})
    url = _upload(folder, f"memory://layouts/{tmp_path.name}")
    for where in (str(folder), url):
        with pytest.raises(ConfigError, match=r"model\.verify_weights='sha265': use one of stat, sha256"):
            model_identity(where, None, "sha265")
