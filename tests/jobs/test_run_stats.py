"""The run summary's speculative-decoding section, combined over the run's engines."""

from __future__ import annotations

from shardinfer.jobs.split_driver import RunStats


def test_summary_reports_speculative_acceptance_weighted_by_drafts() -> None:
    stats = RunStats()
    stats.add({"engine_stats": {"generated_tokens": 100.0, "draft_tokens": 60.0, "accepted_draft_tokens": 45.0,
                                "mean_draft_depth": 3.0, "draft_acceptance_p1": 0.9, "draft_acceptance_p2": 0.7}},
              worker="0")
    stats.add({"engine_stats": {"generated_tokens": 50.0, "draft_tokens": 20.0, "accepted_draft_tokens": 5.0,
                                "mean_draft_depth": 1.0, "draft_acceptance_p1": 0.25}}, worker="1")
    spec = stats.summary(10.0, 2)["speculative"]
    assert spec == {"draft_tokens": 80, "accepted_draft_tokens": 50, "acceptance_rate": 0.625,
                    "mean_draft_depth": 2.0,
                    "acceptance_p1": round((0.9 * 60 + 0.25 * 20) / 80, 4),  # 0.7375
                    "acceptance_p2": 0.7}


def test_summary_has_no_speculative_section_without_drafts() -> None:
    stats = RunStats()
    stats.add({"engine_stats": {"generated_tokens": 10.0, "draft_tokens": 0.0}})
    assert "speculative" not in stats.summary(1.0, 1)


def test_summary_reports_the_budgets_choices_also_where_speculation_switched_off() -> None:
    stats = RunStats()
    stats.add({"engine_stats": {"generated_tokens": 100.0, "draft_tokens": 60.0, "accepted_draft_tokens": 30.0,
                                "mean_draft_depth": 1.5, "mean_draft_tokens_per_step": 6.0,
                                "speculation_off_share": 0.25}}, worker="0")
    # This engine's budget never drafted: verification cost more than it saved.
    stats.add({"engine_stats": {"generated_tokens": 80.0, "draft_tokens": 0.0, "accepted_draft_tokens": 0.0,
                                "mean_draft_depth": 0.0, "mean_draft_tokens_per_step": 0.0,
                                "speculation_off_share": 1.0, "draft_probe_steps": 3.0}}, worker="1")
    spec = stats.summary(10.0, 2)["speculative"]
    assert spec == {"draft_tokens": 60, "accepted_draft_tokens": 30, "acceptance_rate": 0.5,
                    "mean_draft_depth": 1.5, "probe_steps": 3,
                    "mean_draft_tokens_per_step": 3.0,  # (6 + 0) / 2
                    "speculation_off_share": 0.625}  # (0.25 + 1) / 2
    off = RunStats()
    off.add({"engine_stats": {"generated_tokens": 80.0, "draft_tokens": 0.0, "mean_draft_tokens_per_step": 0.0,
                              "speculation_off_share": 1.0}})
    assert off.summary(1.0, 1)["speculative"] == {"draft_tokens": 0, "accepted_draft_tokens": 0,
                                                  "acceptance_rate": 0.0, "mean_draft_tokens_per_step": 0.0,
                                                  "speculation_off_share": 1.0}


def test_summary_reports_the_slowest_engine_start_and_what_was_compiled_ahead() -> None:
    import io

    from shardinfer.jobs.progress import Reporter

    stats = RunStats()
    stats.add({"engine_stats": {"generated_tokens": 10.0, "engine_start_s": 12.5, "compiled_ahead_variants": 40.0,
                                "compiled_ahead_s": 3.25}}, worker="0")
    stats.add({"engine_stats": {"generated_tokens": 10.0, "engine_start_s": 14.0, "compiled_ahead_variants": 38.0,
                                "compiled_ahead_s": 3.5}}, worker="1")
    summary = stats.summary(10.0, 2)
    assert (summary["engine_start_s"], summary["kernels_compiled_ahead"], summary["kernels_compiled_ahead_s"]) == (
        14.0, 40, 3.5)
    out = io.StringIO()
    Reporter(run_id="r", stream=io.StringIO()).summary({**summary, "run_id": "r"}, out=out)
    assert "engine start   14.0 s (40 kernel variants compiled or loaded ahead in 3.5 s)" in out.getvalue()
    cpu = RunStats()
    cpu.add({"engine_stats": {"generated_tokens": 10.0, "engine_start_s": 0.5}})
    assert "kernels_compiled_ahead" not in cpu.summary(1.0, 1)
