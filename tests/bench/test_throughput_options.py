"""bench/throughput.py's FP8 tiling experiments: which tilings they override, their restores, and the refusals."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.kernels.bench_matmul import MODELS  # noqa: E402
from bench.throughput import (  # noqa: E402
    _decode_summary,
    changed_flags,
    changed_tilings,
    parse_flags,
    parse_settings,
    parse_tiling_change,
    prefer_tma_tilings,
)
from shardinfer.kernels import fp8_matmul, paged_attention  # noqa: E402


def test_tma_tilings_are_the_defaults_with_operands_through_tma() -> None:
    defaults = {nk: fp8_matmul.tiling(*nk) for nk in MODELS["8b"][1].values()}
    saved = dict(fp8_matmul.CONFIG_OVERRIDES)
    try:
        prefer_tma_tilings("dense-8b")
        for (n, k), default in defaults.items():
            got = fp8_matmul.tiling(n, k)
            assert all(c.tma for c in got.configs)
            # Everything else is the default's: the same tiles, so the same bits.
            assert [m for m, _ in got.by_m] == [m for m, _ in default.by_m]
            for mine, theirs in zip(got.configs, default.configs, strict=True):
                assert (mine.block_m, mine.block_n, mine.num_warps, mine.num_stages, mine.persistent) == (
                    theirs.block_m,
                    theirs.block_n,
                    theirs.num_warps,
                    theirs.num_stages,
                    theirs.persistent,
                )
    finally:
        fp8_matmul.CONFIG_OVERRIDES.clear()
        fp8_matmul.CONFIG_OVERRIDES.update(saved)


def _throughput(*args: str) -> subprocess.CompletedProcess[str]:
    """bench/throughput.py run with `args`: --help, or options it must refuse before any GPU work."""
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / "throughput.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_tma_tiling_without_fp8_weights_is_refused(tmp_path: Path) -> None:
    done = _throughput("--fp8-tiling", "tma", "--out", str(tmp_path))
    assert done.returncode == 2 and "add --quantization fp8" in done.stderr, done.stderr[-2000:]
    assert not list(tmp_path.iterdir())


def test_results_table_names_a_non_default_fp8_tiling() -> None:
    from bench.record import _numerics

    run = {"workload": "dense-8b", "quantization": "fp8", "kv_cache_dtype": "fp8"}
    assert _numerics(run) == "dense-8b, weights fp8, KV fp8"
    assert _numerics({**run, "fp8_tiling": "default"}) == "dense-8b, weights fp8, KV fp8"
    assert _numerics({**run, "fp8_tiling": "tma"}) == "dense-8b, weights fp8, KV fp8, FP8 tiling tma"


def test_results_table_names_a_run_without_measured_bf16_tilings() -> None:
    from bench.record import _numerics

    run = {"workload": "dense-8b"}
    assert _numerics({**run, "bf16_tilings": "measured"}) == "dense-8b"
    assert _numerics({**run, "bf16_tilings": "default"}) == "dense-8b, bf16 default tilings"


def test_results_table_names_an_fp8_run_on_measured_fp8_tilings() -> None:
    from bench.record import _numerics

    run = {"workload": "dense-8b", "quantization": "fp8"}
    assert _numerics({**run, "fp8_tilings": "default"}) == "dense-8b, weights fp8"
    assert _numerics({**run, "fp8_tilings": "measured"}) == "dense-8b, weights fp8, FP8 measured tilings"
    assert _numerics({"workload": "dense-8b", "fp8_tilings": "measured"}) == "dense-8b"  # bf16 weights


def test_results_table_names_scheduling_settings_against_the_defaults_of_the_run_date() -> None:
    from bench.record import GPU_STEP_DEFAULTS_SINCE, _numerics
    from shardinfer.engine.config import DEVICE_STEP_DEFAULTS

    assert GPU_STEP_DEFAULTS_SINCE[-1][1] == DEVICE_STEP_DEFAULTS["cuda"]
    run = {"workload": "moe-16b", "settings": {"max_num_seqs": 512, "max_num_batched_tokens": 16384}}
    assert _numerics({**run, "date": "2026-12-06T06:30:00"}) == "moe-16b"
    assert _numerics({**run, "date": "2026-12-06T08:00:00"}) == "moe-16b, max_num_seqs 512"
    assert _numerics({**run, "date": "2026-12-04T08:00:00"}) == (
        "moe-16b, max_num_seqs 512, max_num_batched_tokens 16384"
    )


def test_variant_tilings_change_one_field_and_are_restored() -> None:
    change = parse_tiling_change("split_k=1,num_stages=3")
    assert change == {"split_k": 1, "num_stages": 3}
    before = {nk: fp8_matmul.tiling(*nk) for nk in MODELS["8b"][1].values()}
    with changed_tilings("dense-8b", change):
        for (n, k), default in before.items():
            got = fp8_matmul.tiling(n, k)
            assert [m for m, _ in got.by_m] == [m for m, _ in default.by_m]
            for mine, theirs in zip(got.configs, default.configs, strict=True):
                assert (mine.split_k, mine.num_stages) == (1, 3)
                assert (mine.block_m, mine.block_n, mine.tma) == (theirs.block_m, theirs.block_n, theirs.tma)
    assert {nk: fp8_matmul.tiling(*nk) for nk in before} == before


def test_variant_flags_are_set_for_the_block_and_restored() -> None:
    flags = parse_flags("kernels.paged_attention.FP8_NUM_STAGES=2")
    shipped = paged_attention.FP8_NUM_STAGES
    with changed_flags(flags):
        assert paged_attention.FP8_NUM_STAGES == 2
    assert shipped == paged_attention.FP8_NUM_STAGES


@pytest.mark.parametrize(
    "text, parse, needle",
    [
        ("block_q=64", parse_tiling_change, "not FIELD=VALUE with FIELD one of"),
        ("split_k", parse_tiling_change, "not FIELD=VALUE"),
        ("kernels.paged_attention.NO_SUCH=1", parse_flags, "has no setting 'NO_SUCH'"),
        ("PAGE=1", parse_flags, "is not MODULE.NAME=VALUE"),
        ("max_num_seq=512", parse_settings, "is not NAME=POSITIVE_INT with NAME one of"),
        ("max_num_seqs=0", parse_settings, "is not NAME=POSITIVE_INT"),
        ("max_num_seqs=lots", parse_settings, "is not NAME=POSITIVE_INT"),
    ],
)
def test_variant_options_name_the_bad_item(text: str, parse: object, needle: str) -> None:
    with pytest.raises(SystemExit, match=needle):
        parse(text)  # type: ignore[operator]


def test_variant_settings_parse_to_engine_keywords() -> None:
    assert parse_settings("max_num_seqs=512, max_num_batched_tokens=16384") == {
        "max_num_seqs": 512,
        "max_num_batched_tokens": 16384,
    }
    assert parse_settings("logprobs=1") == {"logprobs": 1}  # a job's sampling.logprobs, in the variant run


def test_record_writes_a_row_for_a_same_call_second_run() -> None:
    from bench.record import _second_run_rows

    run = {
        "date": "2026-12-04T03:52:51",
        "gpu": "NVIDIA H200",
        "commit": "abc1234",
        "workload": "dense-8b",
        "quantization": "fp8",
        "kv_cache_dtype": "fp8",
        "batch_invariant": True,
        "requests": 512,
        "variant": {
            "fp8_tiling": "split_k=1",
            "flags": None,
            "output_tok_s": 10263.1,
            "decode": {"floor_ms": 5.0, "median_step_ms": 12.5},
        },
    }
    assert _second_run_rows(run) == [
        "| 2026-12-04 03:52 | NVIDIA H200 | abc1234 | dense-8b, weights fp8, KV fp8, variant `split_k=1` (same call) | "
        "True | 512 | 10263 | — | — | 0.40 | — |"
    ]
    assert _second_run_rows({k: v for k, v in run.items() if k != "variant"}) == []
    settings = {**run, "variant": {**run["variant"], "fp8_tiling": None, "settings": "max_num_seqs=512"}}
    assert "variant `max_num_seqs=512` (same call)" in _second_run_rows(settings)[0]


def test_record_writes_a_row_for_the_main_run_repeated_after_a_variant() -> None:
    """--repeat-main's run gets its own row after the variant's, with its own decode fraction."""
    from bench.record import _second_run_rows

    run = {
        "date": "2026-12-07T16:44:54",
        "gpu": "NVIDIA H100 80GB HBM3",
        "commit": "abc1234",
        "workload": "dense-8b",
        "quantization": "fp8",
        "kv_cache_dtype": "fp8",
        "batch_invariant": True,
        "requests": 1024,
        "variant": {"fp8_tiling": "split_k=1", "output_tok_s": 12054.0, "decode": {}},
        "main_again": {"output_tok_s": 11785.4, "decode": {"floor_ms": 13.0, "median_step_ms": 26.0}},
    }
    rows = _second_run_rows(run)
    assert len(rows) == 2 and "variant `split_k=1`" in rows[0]
    assert rows[1] == (
        "| 2026-12-07 16:44 | NVIDIA H100 80GB HBM3 | abc1234 | dense-8b, weights fp8, KV fp8, main "
        "configuration again, after the variant (same call) | True | 1024 | 11785 | — | — | 0.50 | — |"
    )


def test_record_names_the_untimed_engine_a_call_began_with() -> None:
    from bench.record import _numerics

    run = {"workload": "dense-small", "quantization": "fp8", "warm_engine_requests": 64}
    assert _numerics(run) == "dense-small, weights fp8, after an untimed engine of 64 requests"
    assert _numerics({**run, "warm_engine_requests": 0}) == "dense-small, weights fp8"


def test_record_names_omp_num_threads_where_the_environment_set_it() -> None:
    from bench.record import _numerics

    run = {"workload": "dense-small", "quantization": "fp8", "omp_num_threads_env": "1"}
    assert _numerics(run) == "dense-small, weights fp8, OMP_NUM_THREADS=1"
    assert _numerics({**run, "omp_num_threads_env": None}) == "dense-small, weights fp8"


def test_the_help_prints_every_option() -> None:
    # argparse formats help texts with %: a bare percent sign in one breaks --help alone.
    done = _throughput("--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--repeat-main" in done.stdout and "--warm-engine-requests" in done.stdout


def test_a_negative_warm_engine_is_refused_before_any_work(tmp_path: Path) -> None:
    done = _throughput("--warm-engine-requests", "-3", "--out", str(tmp_path))
    assert done.returncode == 2 and "--warm-engine-requests: got -3" in done.stderr, done.stderr[-2000:]
    assert not list(tmp_path.iterdir())


def test_a_variant_on_another_kv_cache_dtype_is_named_in_results() -> None:
    """--variant-kv-cache-dtype's run (FP8 weights over a bf16 cache against the FP8 cache, say)
    is told apart from the main run in RESULTS.md's row."""
    from bench.record import variant_changes

    assert variant_changes({"kv_cache_dtype": "auto", "flags": None}) == "KV auto"
    assert (
        variant_changes({"settings": "max_num_seqs=512", "kv_cache_dtype": "auto"})
        == "max_num_seqs=512 KV auto"
    )
    assert variant_changes({"settings": "max_num_seqs=512"}) == "max_num_seqs=512"


def test_decode_summary_takes_the_median_context_of_the_sampled_top_batch_steps() -> None:
    step_bytes = {"dense": 1000, "experts": 0, "num_experts": 0, "top_k": 0, "kv_per_token": 10}
    # Top-batch steps (batch >= 0.9 of the largest) with context sampled on some only (-1: not summed).
    steps = [(100, 0.010, 5000), (100, 0.030, -1), (95, 0.020, 7000), (100, 0.040, -1), (10, 0.001, 100)]
    fraction, summary = _decode_summary(steps, {"step_bytes": step_bytes}, 1e6)
    assert summary is not None
    assert summary["kv_tokens"] == 7000  # the median of 5000 and 7000, upper of the two
    assert summary["median_step_ms"] == 30.0  # of 10, 20, 30, 40 ms
    assert fraction == (1000 + 7000 * 10) / 1e6 / 0.030
    # No sampled step among the top batches: the largest sampled batch's steps give the context.
    steps = [(100, 0.010, -1), (100, 0.030, -1), (50, 0.005, 3000), (50, 0.005, 4000), (10, 0.001, 100)]
    _, summary = _decode_summary(steps, {"step_bytes": step_bytes}, 1e6)
    assert summary is not None and summary["kv_tokens"] == 4000
