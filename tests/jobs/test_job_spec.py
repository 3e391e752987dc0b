"""Job spec resolution: layers and precedence, key checking with suggestions, types, placeholders."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from shardinfer.errors import ConfigError, UsageError
from shardinfer.jobs.spec import load_properties, parse_conf, resolve

BASE = {
    "model": {"path": "m"},
    "input": {"path": "in"},
    "output": {"path": "out/{ds}/{run_id}"},
    "sampling": {"temperature": 0.9, "top_p": 0.8},
}


def test_precedence_conf_over_properties_over_file_over_defaults(tmp_path: Path) -> None:
    props = tmp_path / "p.conf"
    props.write_text("sampling.temperature 0.5\nsampling.top_p=0.6\njob.split_rows = 10\n")
    spec = resolve(BASE, properties=load_properties(props), confs=[parse_conf("sampling.temperature=0.1")])
    cfg = spec.config
    assert (cfg.sampling["temperature"], cfg.sampling["top_p"], cfg.job.split_rows, cfg.job.seed) == (
        0.1,
        0.6,
        10,
        0,
    )
    assert spec.sources["sampling.temperature"] == "--conf"
    assert spec.sources["sampling.top_p"] == "properties file"
    toml_props = tmp_path / "p.toml"
    toml_props.write_text("[sampling]\ntop_p = 0.3\n")
    assert resolve(BASE, properties=load_properties(toml_props)).config.sampling["top_p"] == 0.3


def test_placeholders_and_generated_run_id() -> None:
    spec = resolve(BASE, confs=[parse_conf("job.ds=2024-02-03")], run_id="scheduled__2024-02-03")
    assert spec.config.output.path == "out/2024-02-03/scheduled__2024-02-03"
    today = datetime.date(2030, 1, 2)
    auto = resolve(BASE, today=today).config
    assert auto.job.ds == "2030-01-02" and auto.job.run_id.startswith("manual__")
    assert auto.output.path == f"out/2030-01-02/{auto.job.run_id}"
    assert auto.input.prompt_column == "prompt"  # the default when neither column is named


@pytest.mark.parametrize(
    ("conf", "hint"),
    [
        ("sampling.temprature=0.5", "'temperature'"),
        ("sampler.top_p=0.5", "'sampling'"),
        ("job.split_row=5", "'split_rows'"),
        ("engine.max_num_seq=4", "'max_num_seqs'"),
        ("input.promt_column=x", "'prompt_column'"),
    ],
)
def test_unknown_keys_name_the_nearest_valid_key(conf: str, hint: str) -> None:
    with pytest.raises(ConfigError, match=hint):
        resolve(BASE, confs=[parse_conf(conf)])


@pytest.mark.parametrize(
    ("conf", "match"),
    [
        ("engine.speculative=bogus", r"engine\.speculative='bogus': use one of 'off', 'ngram', 'mtp'"),
        ("engine.speculative_depth=-1", r"engine\.speculative_depth=-1: must be in \[0, "),
        ("engine.kv_cache_dtype=fp16", r"engine\.kv_cache_dtype='fp16' is not supported"),
        ("engine.block_size=24", r"engine\.block_size=24: must be a power of two"),
        ("model.dtype=float13", r"model\.dtype='float13' is not supported"),
        ("model.device=tpu", r"model\.device='tpu'"),
        ("engine.max_num_seqs=0", r"engine\.max_num_seqs=0: must be >= 1"),
        ("engine.gpu_memory_utilization=1.5", r"engine\.gpu_memory_utilization=1\.5: must be in \(0, 1\]"),
    ],
)
def test_engine_values_are_checked_with_the_spec(conf: str, match: str) -> None:
    """The engine's value checks run when the spec is resolved (so a dry run reports them and a
    real run fails before planning, exit 78), naming the job file's key."""
    with pytest.raises(ConfigError, match=match) as info:
        resolve(BASE, confs=[parse_conf(conf)])
    assert info.value.exit_code == 78


def test_values_are_typed_and_checked() -> None:
    cfg = resolve(
        BASE,
        confs=[
            parse_conf("job.seed=7"),
            parse_conf("job.run_id=20240101"),
            parse_conf("input.passthrough_columns=a,b"),
            parse_conf('sampling.stop=["x"]'),
            parse_conf("sampling.temperature=1"),
        ],
    ).config
    assert cfg.job.seed == 7 and cfg.job.run_id == "20240101" and cfg.input.passthrough_columns == ["a", "b"]
    assert cfg.sampling["stop"] == ["x"] and isinstance(cfg.sampling["temperature"], float)
    for bad, match in (
        ("job.seed=abc", "job.seed"),
        ("sampling.top_p=0", "top_p"),
        ("job.split_rows=0", "split_rows"),
        ("sampling.seed=3", "job.seed"),
        ("job.ds=tomorrow", "YYYY-MM-DD"),
        ('input.override_columns=["logprobs"]', "logprobs"),
        ("input.messages_column=m", "both set"),
    ):
        with pytest.raises(ConfigError, match=match):
            resolve({**BASE, "input": {"path": "in", "prompt_column": "p"}}, confs=[parse_conf(bad)])
    with pytest.raises(ConfigError, match=r"model\.path is not set"):
        resolve({k: v for k, v in BASE.items() if k != "model"})
    with pytest.raises(UsageError):
        parse_conf("no_equals_sign")
