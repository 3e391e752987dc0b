"""Compiling ahead (engine/precompile.py, kernels/compile_ahead.py): the passes compile, for
Hopper, every kernel variant a model's prefill steps and sampler reach, launch nothing, and leave
nothing for a second pass to compile. Checked on the CPU through the compile-only driver
(precompile_compile_only.py); the GPU test (test_gpu_precompile.py) checks that an engine's
build then compiles nothing at a launch and that outputs do not change."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from shardinfer.engine.forward_context import SKIP_SLOT
from shardinfer.engine.precompile import (
    PREFILL_SEQUENCE_TOKENS,
    precompile_enabled,
    prefill_batch,
    prefill_shapes,
)
from shardinfer.errors import ConfigError
from tests.kernels.kernel_checks import run_compile_script

MLA_KERNEL_SHAPES = {"qk_rope_head_dim": 16, "kv_lora_rank": 64}  # what the Triton MLA kernel takes


@pytest.mark.parametrize(
    ("family", "engine_kwargs", "overrides"),
    [
        (
            "qwen3",
            {"quantization": "fp8", "kv_cache_dtype": "fp8"},
            {"hidden_size": 256, "intermediate_size": 512},
        ),
        ("deepseek_v3", {}, MLA_KERNEL_SHAPES),
    ],
)
def test_compile_ahead_compiles_every_variant_of_the_passes_and_launches_nothing(
    tmp_path: Path, family: str, engine_kwargs: dict[str, str], overrides: dict[str, int]
) -> None:
    # The stand-in driver raises on any launch: a clean exit means the passes launched nothing.
    lines = run_compile_script(
        Path(__file__).with_name("precompile_compile_only.py"),
        tmp_path / "triton",
        family,
        "2",
        json.dumps(engine_kwargs),
        json.dumps(overrides),
    )
    got = json.loads(lines[-1])
    assert got["variants"] > 0, got
    assert got["second_pass_variants"] == 0, f"the first pass left variants to compile: {got}"


def test_prefill_batch_covers_the_tokens_in_sequences_from_position_zero() -> None:
    host = prefill_batch(2 * 2048 + 5, 2048, block_size=16)
    lens = np.diff(host.query_start_loc)
    assert lens.tolist() == [2048, 2048, 5]
    assert host.seq_lens.tolist() == lens.tolist()
    assert len(host.input_ids) == len(host.positions) == 2 * 2048 + 5
    assert host.positions[2048] == 0 and host.positions[-1] == 4
    assert (host.slot_mapping == SKIP_SLOT).all()
    assert host.block_tables.shape == (3, 2048 // 16) and (host.block_tables == 0).all()


def test_prefill_shapes_cover_both_divisibilities_and_one_and_several_kv_chunks() -> None:
    short, long = PREFILL_SEQUENCE_TOKENS
    assert prefill_shapes(8192, 4096) == [(8192, short), (8192, long), (8191, short), (8191, long)]
    assert prefill_shapes(8192, 300) == [(8192, 300), (8191, 300)]  # no prompt may be longer
    assert prefill_shapes(1, 4096) == [(1, 1)]


def test_precompile_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHARDINFER_PRECOMPILE", raising=False)
    assert precompile_enabled()
    for off in ("0", "off", "false"):
        monkeypatch.setenv("SHARDINFER_PRECOMPILE", off)
        assert not precompile_enabled()
    monkeypatch.setenv("SHARDINFER_PRECOMPILE", " Yes ")
    assert precompile_enabled()
    monkeypatch.setenv("SHARDINFER_PRECOMPILE", "disable")
    with pytest.raises(ConfigError, match=r"SHARDINFER_PRECOMPILE='disable': set it to 1 .* or to 0") as err:
        precompile_enabled()
    assert err.value.exit_code == 78


def test_a_failing_pass_leaves_compiling_to_the_launches(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Compiling ahead is an optimisation: a pass that raises is logged and the build goes on."""
    import contextlib

    from shardinfer.engine import precompile as module
    from shardinfer.kernels import compile_ahead

    class Runner:
        batch_invariant = True

        def warm_up(self) -> None:
            raise RuntimeError("a pass that needed its kernel's output")

    monkeypatch.setattr(compile_ahead, "available", lambda: True)
    monkeypatch.setattr(
        compile_ahead,
        "compile_instead_of_launch",
        lambda workers=None: contextlib.nullcontext(compile_ahead.CompileAhead()),
    )
    with caplog.at_level("WARNING", logger=module.__name__):
        assert module.precompile(Runner(), None, 64) is None  # type: ignore[arg-type]
    assert "a pass that needed its kernel's output" in caplog.text
    assert "SHARDINFER_PRECOMPILE=0" in caplog.text
