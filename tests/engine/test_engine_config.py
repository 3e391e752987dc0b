"""Engine arguments that pick implementation strategies: validation, defaults, and wiring."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardinfer import LLM
from shardinfer.engine import config as config_module
from shardinfer.engine.config import EngineConfig, default_num_seqs
from shardinfer.jobs.spec import valid_keys

JSON = {"schema_type": "json", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}


@pytest.mark.parametrize("value", ["yes", 1, 0, "true"])
def test_structured_independent_matchers_must_be_a_bool_or_unset(value: object) -> None:
    with pytest.raises(ValueError, match="structured_independent_matchers="):
        EngineConfig(model="m", structured_independent_matchers=value)  # type: ignore[arg-type]


@pytest.mark.parametrize(("cpus", "want"), [(1, False), (2, False), (3, False), (4, True), (16, True)])
def test_unset_independent_matchers_follow_the_cpu_count(
    monkeypatch: pytest.MonkeyPatch, cpus: int, want: bool
) -> None:
    monkeypatch.setattr(config_module, "usable_cpus", lambda: cpus)
    assert EngineConfig(model="m").independent_matchers is want
    # An explicit setting wins over the CPU count either way.
    assert EngineConfig(model="m", structured_independent_matchers=not want).independent_matchers is (
        not want
    )


def test_usable_cpus_is_positive_and_bounded_by_the_machine() -> None:
    import os

    assert 1 <= config_module.usable_cpus() <= (os.cpu_count() or 1)


@pytest.mark.parametrize("setting", [True, False])
def test_engine_compiler_gets_the_matcher_setting(qwen3_dir: Path, setting: bool) -> None:
    engine = LLM(qwen3_dir, device="cpu", dtype="float32", structured_independent_matchers=setting).llm_engine
    compiler = engine.grammar_compiler()
    assert compiler.independent_matchers is setting
    # Either kind of matcher starts at the grammar's beginning: an object opens with "{".
    allowed = compiler.matcher(JSON).allowed_mask()
    assert allowed[engine.tokenizer.encode("{", add_special_tokens=False)[0]]


def test_engine_compiler_default_follows_the_cpu_count(
    monkeypatch: pytest.MonkeyPatch, qwen3_dir: Path
) -> None:
    monkeypatch.setattr(config_module, "usable_cpus", lambda: 8)
    assert LLM(qwen3_dir, device="cpu", dtype="float32").llm_engine.grammar_compiler().independent_matchers
    monkeypatch.setattr(config_module, "usable_cpus", lambda: 2)
    assert (
        not LLM(qwen3_dir, device="cpu", dtype="float32").llm_engine.grammar_compiler().independent_matchers
    )


def test_job_spec_accepts_the_setting() -> None:
    assert "structured_independent_matchers" in valid_keys("engine")


def test_job_spec_accepts_the_speculative_keys() -> None:
    keys = valid_keys("engine")
    assert keys["speculative"] == "off" and keys["speculative_depth"] == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"speculative": "eagle"}, "speculative='eagle': use one of 'off', 'ngram', 'mtp'"),
        ({"speculative_depth": 9}, r"speculative_depth=9: must be in \[0, 8\]"),
        (
            {"speculative": "mtp", "speculative_ngram_tokens": 2},
            r"choose one drafter, got \['mtp', 'ngram'\]",
        ),
    ],
)
def test_speculative_settings_are_checked(kwargs: dict, message: str) -> None:
    from shardinfer.engine.config import EngineConfig

    with pytest.raises(ValueError, match=message):
        EngineConfig(model="m", **kwargs)


def test_speculative_shorthands_resolve() -> None:
    from shardinfer.engine.config import EngineConfig

    assert (EngineConfig(model="m", speculative_ngram_tokens=4).speculative_mode, 4) == ("ngram", 4)
    assert EngineConfig(model="m", speculative_ngram_tokens=4).draft_depth == 4
    assert (
        EngineConfig(model="m", speculative_mtp=True).speculative_mode,
        EngineConfig(model="m", speculative_mtp=True).draft_depth,
    ) == ("mtp", 1)
    assert EngineConfig(model="m", speculative="ngram").draft_depth == 3
    assert EngineConfig(model="m").draft_depth == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_num_seqs": "8"}, "^max_num_seqs='8': must be an integer, or None$"),
        ({"max_num_seqs": 2.5}, "^max_num_seqs=2.5: must be an integer, or None$"),
        ({"max_num_seqs": True}, "^max_num_seqs=True: must be an integer, or None$"),
        ({"num_kv_blocks": "10"}, "^num_kv_blocks='10': must be an integer, or None$"),
        ({"num_kv_blocks": 2.5}, "^num_kv_blocks=2.5: must be an integer, or None$"),
        ({"max_model_len": "256"}, "^max_model_len='256': must be an integer, or None$"),
        ({"max_model_len": 100.5}, "^max_model_len=100.5: must be an integer, or None$"),
        ({"speculative_depth": "2"}, "^speculative_depth='2': must be an integer$"),
        (
            {"block_size": None},
            r"^block_size=None: must be an integer \(leave it unset for the default, 16\)$",
        ),
        ({"block_size": 16.0}, "^block_size=16.0: must be an integer$"),
        ({"seed": "x"}, "^seed='x': must be an integer$"),
        ({"seed": 1.5}, "^seed=1.5: must be an integer$"),
        ({"enable_prefix_caching": "no"}, "^enable_prefix_caching='no': must be True or False$"),
        ({"enforce_eager": 1}, "^enforce_eager=1: must be True or False$"),
        ({"async_scheduling": "yes"}, "^async_scheduling='yes': must be True or False, or None$"),
        ({"gpu_memory_utilization": "0.5"}, "^gpu_memory_utilization='0.5': must be a finite number$"),
        ({"gpu_memory_utilization": float("nan")}, "^gpu_memory_utilization=nan: must be a finite number$"),
        ({"expert_parallel_size": 2.0}, "^expert_parallel_size=2.0: must be an integer$"),
        ({"kv_cache_dtype": None}, "^kv_cache_dtype=None: must be a string"),
        ({"device": "cuda:x"}, "^device='cuda:x': use 'cpu', 'cuda', 'cuda:N' or 'auto'$"),
    ],
)
def test_values_of_the_wrong_kind_name_field_value_and_kind(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(model="m", **kwargs)


def test_range_checks_still_apply_after_the_kind() -> None:
    with pytest.raises(ValueError, match="block_size=24: must be a power of two"):
        EngineConfig(model="m", block_size=24)
    with pytest.raises(ValueError, match="max_num_seqs=0: must be >= 1"):
        EngineConfig(model="m", max_num_seqs=0)


def test_numpy_integers_and_ints_for_floats_are_accepted_as_python_numbers() -> None:
    import numpy as np

    cfg = EngineConfig(
        model="m",
        max_num_seqs=np.int64(8),
        block_size=np.int32(32),
        num_kv_blocks=np.int64(10),
        gpu_memory_utilization=1,
        seed=np.uint32(5),
    )
    values = (cfg.max_num_seqs, cfg.block_size, cfg.num_kv_blocks, cfg.gpu_memory_utilization, cfg.seed)
    assert values == (8, 32, 10, 1, 5) and {type(v) for v in values} == {int}


@pytest.mark.parametrize(
    ("dtype", "given_as"),
    [
        ("float16", "name"),
        ("float16", "torch"),
        ("bfloat16", "torch"),
        ("float32", "torch"),
        ("half", "torch"),
    ],
)
def test_a_torch_dtype_is_taken_by_its_name(dtype: str, given_as: str) -> None:
    import torch

    value = getattr(torch, dtype) if given_as == "torch" else dtype  # torch.half is torch.float16
    cfg = EngineConfig(model="m", dtype=value)
    assert cfg.torch_dtype == getattr(torch, dtype) and cfg.dtype in config_module.DTYPES
    assert getattr(torch, config_module.DTYPES[cfg.dtype]) == getattr(torch, dtype)


def test_a_torch_device_is_taken_by_its_name() -> None:
    import torch

    cfg = EngineConfig(model="m", device=torch.device("cpu"), dtype=torch.float32)
    assert (cfg.device, cfg.dtype) == ("cpu", "float32")
    assert cfg.torch_device == torch.device("cpu") and cfg.torch_dtype == torch.float32
    assert EngineConfig(model="m", device=torch.device("cuda", 1)).device == "cuda:1"
    assert EngineConfig(model="m", device=torch.device("cuda")).device == "cuda"
    with pytest.raises(ValueError, match=r"^dtype='float64' is not supported"):
        EngineConfig(model="m", dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^device='meta': use 'cpu', 'cuda', 'cuda:N' or 'auto'"):
        EngineConfig(model="m", device=torch.device("meta"))


@pytest.mark.parametrize("device", ["cpu", "auto"])
@pytest.mark.parametrize("dtype", ["auto", *config_module.DTYPES])
def test_device_type_and_dtype_name_are_the_torch_objects_names(device: str, dtype: str) -> None:
    """The names a job's fingerprint records without torch equal those of the objects the engine builds."""
    cfg = EngineConfig(model="m", device=device, dtype=dtype)
    assert cfg.device_type == cfg.torch_device.type
    assert cfg.dtype_name == str(cfg.torch_dtype).removeprefix("torch.")


def test_the_job_spec_names_the_engine_key_of_a_wrong_kind() -> None:
    from shardinfer.errors import ConfigError
    from shardinfer.jobs.spec import parse_conf, resolve

    base = {"model": {"path": "m"}, "input": {"path": "in"}, "output": {"path": "out"}}
    with pytest.raises(ConfigError, match=r"engine\.num_kv_blocks='ten': must be an integer, or None"):
        resolve(base, confs=[parse_conf("engine.num_kv_blocks=ten")])
    with pytest.raises(ConfigError, match=r"\[sampling\]: SamplingParams\.logprobs=2\.5: must be an integer"):
        resolve(base, confs=[parse_conf("sampling.logprobs=2.5")])
    confs = ["engine.num_kv_blocks=10", "sampling.logprobs=2", "sampling.temperature=1"]
    spec = resolve(base, confs=[parse_conf(c) for c in confs])
    assert spec.config.engine["num_kv_blocks"] == 10 and spec.config.sampling["logprobs"] == 2


def test_the_step_limits_follow_the_device_unless_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset, a GPU engine takes at most 1024 sequences and 16384 tokens a step, a CPU one 256 and
    8192; given values are kept on either."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpu, cpu = EngineConfig("m", device="cuda"), EngineConfig("m", device="cpu")
    assert (gpu.num_seqs, gpu.token_budget) == (1024, 16384)
    assert (cpu.num_seqs, cpu.token_budget) == (256, 8192)
    assert (EngineConfig("m", device="auto").num_seqs, EngineConfig("m", device="cuda:1").token_budget) == (
        1024,
        16384,
    )
    given = EngineConfig("m", device="cuda", max_num_seqs=64, max_num_batched_tokens=2048)
    assert (given.num_seqs, given.token_budget) == (64, 2048)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert EngineConfig("m", device="auto").num_seqs == 256
    with pytest.raises(
        ValueError, match=r"^max_num_seqs=0: must be >= 1, or unset for the device's default$"
    ):
        EngineConfig("m", max_num_seqs=0)


def test_an_unset_gpu_batch_is_the_ceiling_only_where_the_kv_cache_holds_it() -> None:
    """1024 sequences where the cache holds 2048 tokens for each of them (max_model_len where
    shorter), else 512; the CPU's default does not depend on its cache."""
    assert default_num_seqs("cuda", 1024 * 2048, 4096) == 1024
    assert default_num_seqs("cuda", 10 * 1024 * 2048, 40960) == 1024
    assert default_num_seqs("cuda", 1024 * 2048 - 1, 4096) == 512
    assert default_num_seqs("cuda", 16, 4096) == 512
    assert default_num_seqs("cuda", 1024 * 1000, 1000) == 1024
    assert default_num_seqs("cuda", 1024 * 1000 - 1, 1000) == 512
    assert default_num_seqs("cpu", 16, 4096) == default_num_seqs("cpu", 10**9, 4096) == 256


def test_the_scheduler_takes_the_runners_batch_cap(tiny_checkpoint) -> None:
    """The engine's scheduler holds the cap in effect: as given, else the device's default."""
    model_dir = tiny_checkpoint("qwen3")
    default = LLM(model_dir, device="cpu", dtype="float32").llm_engine
    assert default.runner.num_seqs == default.scheduler.max_num_seqs == 256
    given = LLM(model_dir, device="cpu", dtype="float32", max_num_seqs=7).llm_engine
    assert given.runner.num_seqs == given.scheduler.max_num_seqs == 7
