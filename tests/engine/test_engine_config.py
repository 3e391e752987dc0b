"""Engine arguments that pick implementation strategies: validation, defaults, and wiring."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardinfer import LLM
from shardinfer.engine import config as config_module
from shardinfer.engine.config import EngineConfig
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
