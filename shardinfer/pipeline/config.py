"""The resolved configuration of one job, as typed sections.

`jobs.spec` builds a `JobConfig` from TOML, a properties file and `--conf` overrides; the
pipeline only ever sees this object. Field defaults here ARE the job defaults (documented in
docs/jobs.md). `engine` and `sampling` stay plain dicts because their keys are the engine's
own arguments and `SamplingParams` fields, validated against those classes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class JobSection:
    name: str = "shardinfer-job"
    seed: int = 0
    split_rows: int = 1000
    max_error_fraction: float = 0.1  # above this share of error records the job exits 65
    run_id: str = ""  # filled from --run-id, else generated; never part of the fingerprint
    ds: str = ""  # the scheduled date (YYYY-MM-DD) for `{ds}` in output paths; default: today (UTC)
    # Backpressure: rows stop entering the engine while this many requests are unfinished; twice
    # the engine's largest default batch, a queue to refill it from.
    max_inflight_requests: int = 2048
    # Splits read ahead and held for reassembly, per worker; 0: enough to keep
    # max_inflight_requests requests admitted while the slowest row of each split finishes.
    max_splits_in_flight: int = 0
    batch_rows: int = 256  # rows per Arrow record batch when reading
    start_over: bool = False  # discard an existing output location with another fingerprint
    task: str = "generate"  # "generate" | "score" (loglikelihoods of given text: docs/jobs.md)
    # Score jobs over documents: model input positions per rolling window; 0 = the longest the
    # engine takes (max_model_len: a window's span is window + 1 tokens, its last one scored but
    # never fed, as in lm-evaluation-harness's hf model).
    rolling_window_tokens: int = 0
    # A local file to append the worker's timeline to (pipeline/timeline.py); "" = none.
    timeline_path: str = ""
    # Input files added since the job was planned become new splits beside the committed ones.
    incremental: bool = False
    # A row id repeated in the input is a data error (exit 65), not only counted in the summary.
    unique_ids: bool = False


@dataclass
class InputSection:
    path: str = ""
    format: str = "auto"  # "parquet" | "jsonl" | "auto" (by extension)
    query: str = ""  # DuckDB SQL over the table `input`
    id_column: str = ""
    prompt_column: str = ""
    messages_column: str = ""
    # Extra variables for the chat template, e.g. {enable_thinking = false} for Qwen3.
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    # Score jobs: a context and its continuation(s) (a string or a list of strings) per row, or a
    # document scored whole in rolling windows.
    context_column: str = ""
    continuations_column: str = ""
    document_column: str = ""
    # Columns whose non-null values replace the job's sampling value of the same name, per row.
    override_columns: list[str] = field(default_factory=list)
    # Input columns copied unchanged into every output record of the row.
    passthrough_columns: list[str] = field(default_factory=list)
    storage_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class ModelSection:
    path: str = ""
    dtype: str = "auto"  # "auto": bfloat16 on cuda, float32 on cpu
    device: str = "auto"  # "auto": cuda when available, else cpu
    # Weights: "" follows the checkpoint (FP8 checkpoints stay FP8), "fp8" quantises a float
    # checkpoint at load (block-scaled), "none" dequantises FP8 checkpoints; see docs/quantization.md.
    quantization: str = ""
    # For a model.path on object storage (s3://..., any fsspec URL): copied once per machine.
    storage_options: dict[str, Any] = field(default_factory=dict)
    # How weight files are identified in the fingerprint: "stat" (size, header hash, modification
    # time) or "sha256" (full content hash, cached); see pipeline/weights_identity.py.
    verify_weights: str = "stat"


@dataclass
class OutputSection:
    path: str = ""
    storage_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class RaySection:
    """`--master ray`: where the cluster is and what each worker actor asks of it."""

    address: str = ""  # "" -> RAY_ADDRESS, else a local cluster; "ray://HOST:PORT" for Ray Client
    num_workers: int = 0  # worker actors; 0 -> one per GPU of the cluster (per CPU slot without GPUs)
    num_cpus_per_worker: float = 1.0  # on clusters without GPUs
    max_restarts: int = -1  # replacement actors a run may start; -1 -> as many as num_workers
    resources: dict[str, float] = field(default_factory=dict)  # extra custom resources per actor
    model_cache_dir: str = ""  # where nodes cache a model.path URL; "" -> ~/.cache/shardinfer/models
    runtime_env: dict[str, Any] = field(default_factory=dict)  # for --deploy-mode cluster's driver


@dataclass
class JobConfig:
    job: JobSection = field(default_factory=JobSection)
    input: InputSection = field(default_factory=InputSection)
    model: ModelSection = field(default_factory=ModelSection)
    engine: dict[str, Any] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=dict)
    output: OutputSection = field(default_factory=OutputSection)
    ray: RaySection = field(default_factory=RaySection)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobConfig:
        return cls(
            job=JobSection(**data.get("job", {})),
            input=InputSection(**data.get("input", {})),
            model=ModelSection(**data.get("model", {})),
            engine=dict(data.get("engine", {})),
            sampling=dict(data.get("sampling", {})),
            output=OutputSection(**data.get("output", {})),
            ray=RaySection(**data.get("ray", {})),
        )


TASKS = ("generate", "score")

# Sampling fields a row may not override: they decide which columns the output has.
SCHEMA_FIELDS = ("logprobs", "prompt_logprobs")

# Sections whose keys are fixed dataclass fields (engine/sampling are checked elsewhere).
TYPED_SECTIONS: dict[str, type] = {
    "job": JobSection,
    "input": InputSection,
    "model": ModelSection,
    "output": OutputSection,
    "ray": RaySection,
}
