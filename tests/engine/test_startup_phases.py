"""Start-up phase timing: the clock's bookkeeping, and the phases a CPU engine reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardinfer.engine.llm_engine import LLMEngine
from shardinfer.engine.startup_phases import StartupPhases
from shardinfer.testing.tiny_checkpoint import make_tiny_checkpoint


def test_a_phase_timed_twice_adds_up_and_is_closed_by_the_sync() -> None:
    synced: list[str] = []
    phases = StartupPhases(sync=lambda: synced.append("sync"))
    with phases.phase("load"):
        pass
    phases.add("load", 2.0)
    with phases.phase("capture"):
        pass
    assert list(phases.seconds) == ["load", "capture"]
    assert phases.seconds["load"] >= 2.0
    assert synced == ["sync", "sync"]


def test_a_failed_phase_is_still_recorded_without_the_sync() -> None:
    synced: list[str] = []
    phases = StartupPhases(sync=lambda: synced.append("sync"))
    with pytest.raises(RuntimeError), phases.phase("load"):
        raise RuntimeError("damaged")
    assert list(phases.seconds) == ["load"] and phases.seconds["load"] >= 0.0
    assert synced == []  # the device is not waited on for a phase that failed


def test_a_cpu_engine_reports_its_phases(tmp_path: Path) -> None:
    model = make_tiny_checkpoint(tmp_path / "m", "qwen3", num_hidden_layers=1)
    phases = LLMEngine(model, device="cpu", num_kv_blocks=32).startup_phases
    # No CUDA: no device start, warm-up, graph capture or heap freeze.
    assert sorted(phases) == sorted(
        ["tokenizer_s", "model_load_s", "kv_sizing_s", "block_table_s", "total_s"]
    )
    assert all(v >= 0.0 for v in phases.values())
    sequential = phases["model_load_s"] + phases["kv_sizing_s"] + phases["block_table_s"]
    assert sequential <= phases["total_s"]
