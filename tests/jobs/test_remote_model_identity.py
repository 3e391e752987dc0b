"""A model on object storage is identified by its weights' listed checksums (S3's ETag), not their
sizes alone: a fine-tuned checkpoint written over the old one has the same sizes. A job planned when
sizes were all the fingerprint held still resumes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import s3fs
from pipeline_kit import standard_job

from shardinfer.jobs.spec import load_toml, resolve
from shardinfer.pipeline.fingerprint import compute_fingerprint, model_identity
from shardinfer.pipeline.job import open_job, write_plan
from shardinfer.writers.schema import OUTPUT_SCHEMA_VERSION


def test_a_weight_rewritten_at_its_size_is_another_model(model_dir: Path, s3_bucket: Any) -> None:
    url = s3_bucket.put_folder(model_dir, "model")
    before = model_identity(url, s3_bucket.storage_options)
    weights = (model_dir / "model.safetensors").read_bytes()
    # Other values in the same tensors: same header, same size, as a fine-tune saved over the model.
    tuned = weights[:-64] + bytes(b ^ 0xFF for b in weights[-64:])
    fs = s3fs.S3FileSystem(**s3_bucket.storage_options)
    fs.pipe(f"{s3_bucket.name}/model/model.safetensors", tuned)
    after = model_identity(url, s3_bucket.storage_options)
    assert after["model.weights"]["model.safetensors"]["size"] == len(weights)
    assert after["model.weights"] != before["model.weights"]
    # Sizes alone (what was identified before) could not tell the two apart.
    by_size = model_identity(url, s3_bucket.storage_options, checksums=False)
    assert by_size["model.weights"] == {"model.safetensors": len(weights)}


def test_a_job_planned_with_weights_by_size_still_resumes(
    tmp_path: Path, model_dir: Path, shards: Path, s3_bucket: Any
) -> None:
    url = s3_bucket.put_folder(model_dir, "model")
    job, _ = standard_job(tmp_path, url, str(shards), model={"storage_options": s3_bucket.storage_options})
    config = resolve(load_toml(str(job))).config
    planned = open_job(config)
    older = compute_fingerprint(
        config, planned.sampling.to_json_dict(), OUTPUT_SCHEMA_VERSION, remote_checksums=False
    )
    assert older["hash"] != planned.fingerprint["hash"]
    planned.fingerprint = older  # as a version that identified remote weights by size stored it
    write_plan(planned, "older")
    resumed = open_job(config)
    assert resumed.state == "resume"
    assert resumed.fingerprint["hash"] == older["hash"]
