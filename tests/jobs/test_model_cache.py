"""A model.path URL copied once per machine into a verified local cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fsspec
import pytest

from shardinfer.errors import ConfigError
from shardinfer.jobs.model_cache import MANIFEST, local_model_path
from shardinfer.pipeline.fingerprint import model_identity


def _upload(model_dir: Path, url: str) -> None:
    fs = fsspec.filesystem("memory")
    for path in sorted(model_dir.iterdir()):
        if path.is_file():
            fs.pipe(f"{url.removeprefix('memory://')}/{path.name}", path.read_bytes())


def test_url_model_is_copied_once_verified_and_recopied_when_damaged(model_dir: Path, tmp_path: Path) -> None:
    url = "memory://models/tiny-a"
    _upload(model_dir, url)
    cache = tmp_path / "cache"
    local = Path(local_model_path(url, cache_dir=str(cache)))
    originals = {p.name: p.read_bytes() for p in model_dir.iterdir() if p.is_file()}
    assert {p.name: p.read_bytes() for p in local.iterdir() if p.name != MANIFEST} == originals
    weights = next(p for p in local.iterdir() if p.suffix == ".safetensors")
    stamp = weights.stat().st_mtime_ns
    assert Path(local_model_path(url, cache_dir=str(cache))) == local
    assert weights.stat().st_mtime_ns == stamp  # reused, not copied again
    weights.write_bytes(weights.read_bytes()[:-7])  # a damaged cache entry
    assert Path(local_model_path(url, cache_dir=str(cache))) == local
    assert weights.read_bytes() == originals[weights.name]
    # The same files under the URL give the local folder's config, tokenizer and template hashes
    # and the same weight files (identified there by name and size, without reading headers).
    remote, here = model_identity(url), model_identity(str(model_dir))
    assert {k: v for k, v in remote.items() if k != "model.weights"} == {
        k: v for k, v in here.items() if k != "model.weights"
    }
    assert remote["model.weights"].keys() == here["model.weights"].keys()


def test_a_replaced_model_gets_a_new_cache_entry(model_dir: Path, tmp_path: Path) -> None:
    url = "memory://models/tiny-b"
    _upload(model_dir, url)
    first = local_model_path(url, cache_dir=str(tmp_path))
    fsspec.filesystem("memory").pipe("/models/tiny-b/config.json", b'{"changed": true}\n')
    second = local_model_path(url, cache_dir=str(tmp_path))
    assert second != first and (Path(second) / "config.json").read_bytes() == b'{"changed": true}\n'


def test_local_paths_pass_through_and_a_url_without_a_model_is_refused(tmp_path: Path) -> None:
    assert local_model_path(str(tmp_path)) == str(tmp_path)
    assert local_model_path(f"file://{tmp_path}") == str(tmp_path)
    fsspec.filesystem("memory").pipe("/models/empty/readme.txt", b"no model here")
    with pytest.raises(ConfigError, match="memory://models/empty"):
        local_model_path("memory://models/empty", cache_dir=str(tmp_path / "c"))


def test_an_s3_model_is_copied_without_the_files_the_job_never_reads(
    model_dir: Path, tmp_path: Path, s3_bucket: Any
) -> None:
    """Only the checkpoint the loader reads, the small files and the named chat templates are copied:
    Mistral's consolidated.safetensors and a pytorch_model.bin beside it would double the download."""
    import s3fs

    admin = s3fs.S3FileSystem(**s3_bucket.storage_options)
    source = {p.name: p.read_bytes() for p in model_dir.iterdir() if p.is_file()}
    source["additional_chat_templates/tool_use.jinja"] = b"TOOLS {{ tools | length }}"
    extra = {
        "consolidated.safetensors": source["model.safetensors"],
        "pytorch_model.bin": b"a pickle",
        "additional_chat_templates/notes.txt": b"not a template",
    }
    for name, body in {**source, **extra}.items():
        admin.pipe(f"{s3_bucket.name}/model/{name}", body)
    local = Path(local_model_path(s3_bucket.url("model"), s3_bucket.storage_options, str(tmp_path)))
    copied = {p.relative_to(local).as_posix(): p.read_bytes() for p in local.rglob("*") if p.is_file()}
    copied.pop(MANIFEST)
    assert copied == source
    # A stray file changed or removed on the store names the same cache entry.
    admin.rm(f"{s3_bucket.name}/model/pytorch_model.bin")
    admin.invalidate_cache()
    assert Path(local_model_path(s3_bucket.url("model"), s3_bucket.storage_options, str(tmp_path))) == local
