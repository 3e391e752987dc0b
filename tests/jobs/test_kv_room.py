"""A job refuses a KV cache too small for one sequence of max_model_len, before it writes anything.

The LLM API runs on with the shorter limit; a job may not, since where its rows are cut would
depend on the machine's memory, which the fingerprint does not hold."""

from __future__ import annotations

from pathlib import Path

from pipeline_kit import cli, committed_rows, standard_job


def test_a_kv_cache_below_max_model_len_is_refused_and_the_fix_runs(
    tmp_path: Path, model_dir: Path, shards: Path
) -> None:
    # 3 blocks of 16 tokens; the tiny model has 512 positions and no max_model_len is set.
    job, out = standard_job(tmp_path, model_dir, str(shards), engine={"num_kv_blocks": 3, "max_num_seqs": 2})
    refused = cli("submit", str(job))
    assert refused.returncode == 78, refused.stderr
    assert (
        "the KV cache holds 48 tokens of one sequence, less than max_model_len=512 (the model's "
        "max_position_embeddings, as engine.max_model_len is unset)"
    ) in refused.stderr
    assert "Set engine.max_model_len=48 or lower" in refused.stderr
    assert not list(out.glob("part-*")) and not (out / "_SUCCESS").exists()
    fixed = cli("submit", "--conf", "engine.max_model_len=48", str(job))  # the fix the error names
    assert fixed.returncode == 0, fixed.stderr
    assert len(committed_rows(str(out))) == 24
