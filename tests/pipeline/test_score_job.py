"""Score jobs end to end through the CLI, checked against transformers on the same checkpoint.

The reference scores are computed here from a float64 log-softmax of transformers' logits over
the full context + continuation, with the split point computed independently of the code under
test (the context's tokens are a prefix of the whole's for these texts); the rolling windows come
from lm-evaluation-harness's own window functions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from pipeline_kit import _toml, cli, cli_env, job_toml

from shardinfer.engine.tokenizer import Tokenizer

CONTEXT = "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with"
ROWS = [
    {
        "id": "r0",
        "ctx": CONTEXT,
        "choices": [" a single step.", " a thousand dogs.", " Parquet", " fox"],
        "k": 0,
    },
    {"id": "r1", "ctx": "What is the capital of France?", "choices": [" Paris.", " London"], "k": 1},
    {"id": "r2", "ctx": "def add(a, b):", "choices": ["\n    return a + b"], "k": 2},
]
DOCUMENT = (
    "Parquet shards stream through a reader into the engine; outputs are committed exactly once. "
    "Hello, world! How are you today? I am fine, thank you."
)


@pytest.fixture(scope="module")
def hf(model_dir: Path) -> Any:
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def _hf_scores(hf: Any, context_ids: list[int], cont_ids: list[int]) -> tuple[list[float], bool]:
    with torch.no_grad():
        logits = hf(torch.tensor([context_ids + cont_ids])).logits[0].double()
    lps = torch.log_softmax(logits[len(context_ids) - 1 : -1], dim=-1)
    target = torch.tensor(cont_ids)
    values = lps.gather(1, target[:, None])[:, 0].tolist()
    return values, bool((lps.argmax(-1) == target).all())


def _write_input(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    path = tmp_path / "input.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _score_job(tmp_path: Path, model_dir: Path, input_path: Path, name: str = "job", **sections: Any) -> Path:
    """A score job file (no prompt column, no sampling section) writing to tmp_path/out-{name}."""
    spec: dict[str, dict[str, Any]] = {
        "job": {"task": "score", "split_rows": 4, "max_inflight_requests": 8},
        "input": {"path": str(input_path), "id_column": "id"},
        "model": {"path": str(model_dir), "device": "cpu", "dtype": "float32"},
        "engine": {"num_kv_blocks": 128, "max_num_seqs": 8},
        "output": {"path": str(tmp_path / f"out-{name}")},
    }
    for section, body in sections.items():
        spec[section] = {**spec[section], **body}
    job = tmp_path / f"{name}.toml"
    job.write_text(
        "\n".join(f"[{k}]\n" + "".join(f"{n} = {_toml(v)}\n" for n, v in b.items()) for k, b in spec.items())
    )
    return job


def _submit(job: Path) -> int:
    """Run `shardinfer submit` in this process (a subprocess only where a kill is part of the test)."""
    from shardinfer.jobs.cli import main

    return main(["submit", str(job)])


def _rows_by_key(out: Path) -> dict[tuple[str, int], dict[str, Any]]:
    from shardinfer.writers.output_store import OutputStore

    table = OutputStore(str(out)).read_committed_table()
    return {(r["row_id"], r["continuation_index"]): r for r in table.to_pylist()}


def test_pair_scores_match_transformers_and_share_the_context(
    tmp_path: Path, model_dir: Path, hf: Any
) -> None:
    tok = Tokenizer(model_dir)
    job = _score_job(
        tmp_path,
        model_dir,
        _write_input(tmp_path, ROWS),
        job={"split_rows": 2},
        input={"context_column": "ctx", "continuations_column": "choices", "passthrough_columns": ["k"]},
    )
    assert _submit(job) == 0
    out = tmp_path / "out-job"
    got = _rows_by_key(out)
    assert len(got) == 7
    hits = queried = 0
    for row in ROWS:
        choices = row["choices"]
        ctx_ids = tok.encode(row["ctx"])
        for j, choice in enumerate(choices):
            whole = tok.encode(row["ctx"] + choice)
            assert whole[: len(ctx_ids)] == ctx_ids  # these texts split cleanly at the boundary
            cont_ids = whole[len(ctx_ids) :]
            want, greedy = _hf_scores(hf, ctx_ids, cont_ids)
            rec = got[(row["id"], j)]
            assert rec["status"] == "ok" and rec["k"] == row["k"]
            assert rec["token_ids"] == cont_ids
            assert rec["num_tokens"] == len(cont_ids)
            assert rec["num_bytes"] == len(choice.encode())
            assert rec["is_greedy"] == greedy
            assert rec["prompt_tokens"] == len(whole)
            assert rec["windows"] is None
            assert max(abs(a - b) for a, b in zip(rec["token_logprobs"], want, strict=True)) < 1e-4
            assert abs(rec["logprob_sum"] - sum(want)) < 1e-4
            queried += len(whole)
            if j > 0:  # a follower finds the context's full blocks (all but the last position's)
                hits += (len(ctx_ids) - 1) // 16 * 16
    success = json.loads((out / "_SUCCESS").read_text())
    assert success["summary"]["prefix_cache_hit_rate"] == round(hits / queried, 4)
    assert hits > 0


def test_rolling_document_matches_transformers_over_the_harness_windows(
    tmp_path: Path, model_dir: Path, hf: Any
) -> None:
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    tok = Tokenizer(model_dir)
    rows = [{"id": "d0", "doc": DOCUMENT}, {"id": "d1", "doc": "Hello"}]
    job = _score_job(
        tmp_path,
        model_dir,
        _write_input(tmp_path, rows),
        job={"rolling_window_tokens": 12},
        input={"document_column": "doc"},
    )
    assert _submit(job) == 0
    got = _rows_by_key(tmp_path / "out-job")
    bos = tok.bos_token_id
    for row in rows:
        tokens = tok.encode(row["doc"])
        windows = [make_disjoint_window(w) for w in get_rolling_token_windows(tokens, bos, 12, 1)]
        want = [v for ctx, cont in windows for v in _hf_scores(hf, ctx, cont)[0]]
        rec = got[(row["id"], 0)]
        assert rec["num_tokens"] == len(tokens) and rec["token_ids"] == tokens
        assert rec["num_bytes"] == len(row["doc"].encode())
        assert [(w["num_tokens"], w["context_tokens"]) for w in rec["windows"]] == [
            (len(cont), len(ctx)) for ctx, cont in windows
        ]
        assert max(abs(a - b) for a, b in zip(rec["token_logprobs"], want, strict=True)) < 1e-4
        assert abs(rec["logprob_sum"] - sum(want)) < 1e-4
    assert len(got[("d0", 0)]["windows"]) > 2


def _harness_windows(tokens: list[int], prefix: int, window: int) -> list[tuple[list[int], list[int]]]:
    """(context, continuation) of each rolling window, by the rule of lm-evaluation-harness's hf
    model spelled out: the document after the prefix token is predicted in chunks of `window`
    tokens, and each chunk's window is the last `window` + 1 tokens of the text up to its end (the
    model reads all but the last)."""
    text = [prefix, *tokens]
    out = []
    for start in range(0, len(tokens), window):
        end = min(start + window, len(tokens))  # predicts text[start + 1 .. end]
        span = text[max(0, end - window) : end + 1]
        out.append((span[: len(span) - (end - start)], span[len(span) - (end - start) :]))
    return out


def _check_document(
    rec: dict[str, Any], hf: Any, tokens: list[int], windows: list[tuple[list[int], list[int]]]
) -> None:
    want = [v for ctx, cont in windows for v in _hf_scores(hf, ctx, cont)[0]]
    assert rec["status"] == "ok" and rec["token_ids"] == tokens
    assert [(w["num_tokens"], w["context_tokens"]) for w in rec["windows"]] == [
        (len(cont), len(ctx)) for ctx, cont in windows
    ]
    assert max(abs(a - b) for a, b in zip(rec["token_logprobs"], want, strict=True)) < 1e-4


def test_the_longest_window_takes_every_position_as_the_harness_does(
    tmp_path: Path, model_dir: Path, hf: Any
) -> None:
    """rolling_window_tokens = 0 with max_model_len = 16: windows of 16 input positions, spans of
    17 tokens whose last one is scored but never fed (lm-evaluation-harness's hf model with
    max_length = 16)."""
    tok = Tokenizer(model_dir)
    rows = [{"id": "d0", "doc": DOCUMENT}]
    job = _score_job(
        tmp_path,
        model_dir,
        _write_input(tmp_path, rows),
        input={"document_column": "doc"},
        engine={"num_kv_blocks": 128, "max_num_seqs": 8, "max_model_len": 16},
    )
    assert _submit(job) == 0
    rec = _rows_by_key(tmp_path / "out-job")[("d0", 0)]
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    tokens = tok.encode(DOCUMENT)
    windows = _harness_windows(tokens, tok.bos_token_id, 16)
    assert windows == [
        make_disjoint_window(w) for w in get_rolling_token_windows(tokens, tok.bos_token_id, 16, 1)
    ]
    assert len(windows) > 3 and max(len(ctx) + len(cont) for ctx, cont in windows) == 17
    _check_document(rec, hf, tokens, windows)


def test_a_span_of_max_model_len_plus_one_tokens_is_scored(tmp_path: Path, model_dir: Path, hf: Any) -> None:
    """Context and continuation of max_model_len + 1 tokens are scored; one more is a row error."""
    tok = Tokenizer(model_dir)
    context = " ".join(["fox"] * 5)
    rows = [
        {"id": "fits", "ctx": context, "choices": [" do"]},
        {"id": "over", "ctx": context, "choices": [" dog"]},
    ]
    ctx_ids = tok.encode(context)
    fits = tok.encode(context + " do")
    assert fits[: len(ctx_ids)] == ctx_ids
    assert (len(fits), len(tok.encode(context + " dog"))) == (17, 18)
    job = _score_job(
        tmp_path,
        model_dir,
        _write_input(tmp_path, rows),
        job={"max_error_fraction": 1.0},
        input={"context_column": "ctx", "continuations_column": "choices"},
        engine={"num_kv_blocks": 128, "max_num_seqs": 8, "max_model_len": 16},
    )
    assert _submit(job) == 0
    got = _rows_by_key(tmp_path / "out-job")
    want, greedy = _hf_scores(hf, ctx_ids, fits[len(ctx_ids) :])
    rec = got[("fits", 0)]
    assert rec["status"] == "ok" and rec["prompt_tokens"] == 17 and rec["is_greedy"] == greedy
    assert max(abs(a - b) for a, b in zip(rec["token_logprobs"], want, strict=True)) < 1e-4
    over = got[("over", 0)]
    assert over["error_code"] == "prompt_too_long"
    assert "have 18 tokens; the engine scores at most 17 (max_model_len=16)" in over["error_message"]


def _plan_before_the_span_rule(job: Path) -> None:
    """Plan the job as the version before the span rule did: the same fingerprint components but
    that rule, which it did not record."""
    import hashlib

    from shardinfer.jobs.spec import load_toml, resolve
    from shardinfer.pipeline.job import open_job, write_plan

    planned = open_job(resolve(load_toml(str(job))).config)
    older = json.loads(json.dumps(planned.fingerprint))
    del older["score"]["span_rule"], older["hash"]
    canonical = json.dumps(older, sort_keys=True, separators=(",", ":"), default=str)
    planned.fingerprint = {**older, "hash": hashlib.sha256(canonical.encode()).hexdigest()}
    write_plan(planned, "older")


def test_a_job_planned_before_the_span_rule_is_told_only_what_the_user_changed(
    tmp_path: Path, model_dir: Path
) -> None:
    # Its fingerprint lacks the span rule today's has; the refusal of another setting names that
    # setting alone, not the rule the older version did not record.
    from shardinfer.errors import FingerprintMismatch
    from shardinfer.jobs.spec import load_toml, parse_conf, resolve
    from shardinfer.pipeline.job import open_job

    rows = [{"id": "d0", "doc": DOCUMENT}]
    job = _score_job(tmp_path, model_dir, _write_input(tmp_path, rows), input={"document_column": "doc"})
    _plan_before_the_span_rule(job)
    changed = resolve(load_toml(str(job)), confs=[parse_conf("job.rolling_window_tokens=8")]).config
    with pytest.raises(FingerprintMismatch) as info:
        open_job(changed)
    message = str(info.value)
    assert "rolling_window_tokens: 0 -> 8" in message and "span_rule" not in message


def test_a_job_planned_with_shorter_spans_keeps_them(tmp_path: Path, model_dir: Path, hf: Any) -> None:
    """A score job planned when a span was fed whole and one token sampled after it (windows of
    max_model_len - 2 positions, spans of max_model_len - 1 tokens) stored a fingerprint naming no
    span rule. Resumed now, it goes on with the windows and limits it was planned with, so its
    splits never mix two window lengths."""
    tok = Tokenizer(model_dir)
    rows = [{"id": "d0", "doc": DOCUMENT}, {"id": "d1", "doc": DOCUMENT[40:]}]
    engine = {"num_kv_blocks": 128, "max_num_seqs": 8, "max_model_len": 16}
    job = _score_job(
        tmp_path,
        model_dir,
        _write_input(tmp_path, rows),
        job={"split_rows": 1},
        input={"document_column": "doc"},
        engine=engine,
    )
    _plan_before_the_span_rule(job)
    assert _submit(job) == 0
    got = _rows_by_key(tmp_path / "out-job")
    for row in rows:
        tokens = tok.encode(row["doc"])
        _check_document(got[(row["id"], 0)], hf, tokens, _harness_windows(tokens, tok.bos_token_id, 14))
    # The same job in a new location is planned under today's rule: windows of 16 positions.
    fresh = _score_job(
        tmp_path,
        model_dir,
        _write_input(tmp_path, rows),
        name="fresh",
        job={"split_rows": 1},
        input={"document_column": "doc"},
        engine=engine,
    )
    assert _submit(fresh) == 0
    tokens = tok.encode(DOCUMENT)
    _check_document(
        _rows_by_key(tmp_path / "out-fresh")[("d0", 0)],
        hf,
        tokens,
        _harness_windows(tokens, tok.bos_token_id, 16),
    )


def test_bad_rows_become_error_records(tmp_path: Path, model_dir: Path) -> None:
    rows = [
        {"id": "ok", "ctx": "Hello,", "choices": [" world", " fox"]},
        {"id": "null", "ctx": None, "choices": [" world", " fox"]},
        {"id": "empty", "ctx": "Hello", "choices": []},
        {"id": "blank", "ctx": " \n ", "choices": ["Hello", " world"]},
        {"id": "long", "ctx": "fox " * 200, "choices": [" dog"]},
    ]
    job = _score_job(
        tmp_path,
        model_dir,
        _write_input(tmp_path, rows),
        job={"max_error_fraction": 1.0},
        input={"context_column": "ctx", "continuations_column": "choices"},
        engine={"num_kv_blocks": 128, "max_num_seqs": 8, "max_model_len": 128},
    )
    assert _submit(job) == 0
    got = _rows_by_key(tmp_path / "out-job")
    assert [got[("ok", j)]["status"] for j in (0, 1)] == ["ok", "ok"]
    assert [got[("null", j)]["error_code"] for j in (0, 1)] == ["empty_prompt"] * 2  # a record per choice
    assert got[("empty", 0)]["error_code"] == "invalid_row"
    for j in (0, 1):  # a context of only whitespace is named as such, on every record of its row
        assert got[("blank", j)]["error_code"] == "empty_prompt"
        assert got[("blank", j)]["error_message"].startswith("column 'ctx' holds only whitespace")
    assert got[("long", 0)]["error_code"] == "prompt_too_long"
    assert "max_model_len" in got[("long", 0)]["error_message"]


def test_a_nan_id_is_a_missing_id_not_the_id_nan(tmp_path: Path, model_dir: Path) -> None:
    """A float id column with NaN (pandas' missing value) gives an error record under file:row, as a
    null id does; scored under the id "nan", every such row would share one id."""
    rows = [
        {"id": 1.0, "ctx": "Hello,", "choices": [" world"]},
        {"id": float("nan"), "ctx": "Hello,", "choices": [" fox"]},
        {"id": 3.0, "ctx": "Hello,", "choices": [" dog"]},
    ]
    job = _score_job(
        tmp_path,
        model_dir,
        _write_input(tmp_path, rows),
        job={"max_error_fraction": 1.0},
        input={"context_column": "ctx", "continuations_column": "choices"},
    )
    assert _submit(job) == 0
    got = _rows_by_key(tmp_path / "out-job")
    assert sorted(row_id for row_id, _ in got) == ["0:1", "1.0", "3.0"]
    assert got[("1.0", 0)]["status"] == got[("3.0", 0)]["status"] == "ok"
    assert got[("0:1", 0)]["error_code"] == "invalid_row"
    assert "id_column 'id' is NaN" in got[("0:1", 0)]["error_message"]


def test_rows_the_reader_cannot_decode_are_invalid_rows(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [
        '{"id": "ok", "ctx": "Hello,", "choices": [" world"]}',
        '{"id": "mixed", "ctx": "Hello", "choices": [", world", 5]}',  # a number among the strings
        "{not json",
    ]
    path = tmp_path / "input.jsonl"
    path.write_text("\n".join(lines) + "\n")
    job = _score_job(
        tmp_path,
        model_dir,
        path,
        job={"max_error_fraction": 1.0},
        input={"context_column": "ctx", "continuations_column": "choices"},
    )
    assert _submit(job) == 0
    got = {row_id: row for (row_id, _), row in _rows_by_key(tmp_path / "out-job").items()}
    assert got["ok"]["status"] == "ok"
    bad = [row for row_id, row in got.items() if row_id != "ok"]
    assert len(bad) == 2 and all(row["error_code"] == "invalid_row" for row in bad)
    # The line that is not JSON is named by the reader; the mixed list by the reader (its line) or, where
    # the reader keeps the column as JSON text, by its continuation: named either way, never "is null".
    assert "input.jsonl line 3" in got["0:2"]["error_message"]
    mixed = got["mixed"]["error_message"]
    assert "input.jsonl line 2" in mixed or "continuation 1 is int" in mixed
    assert all("is null" not in row["error_message"] for row in bad)
    summary = capsys.readouterr().out  # a score job's summary speaks of the tokens it read
    read = sum(row["prompt_tokens"] or 0 for row in got.values())
    assert (
        f"tokens given   {read} " in summary
        and "tokens out" not in summary
        and "cut by length" not in summary
    )


def test_resume_after_a_kill_and_fingerprint_of_score_columns(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One continuation per row, given as a plain string (a string column).
    rows = [
        {"id": f"r{i}", "ctx": f"Hello number {i}:", "choices": [" fox", " dog", " seed"][i % 3]}
        for i in range(4)
    ]
    input_path = _write_input(tmp_path, rows)
    sections: dict[str, Any] = {
        "job": {"split_rows": 1},
        "input": {"context_column": "ctx", "continuations_column": "choices"},
    }
    fresh = _score_job(tmp_path, model_dir, input_path, "fresh", **sections)
    assert _submit(fresh) == 0
    killed = _score_job(tmp_path, model_dir, input_path, "killed", **sections)
    once = tmp_path / "crashed-once"
    env = cli_env(
        SHARDINFER_TEST_CRASH_AT="after_commit",
        SHARDINFER_TEST_CRASH_SPLIT="1",
        SHARDINFER_TEST_CRASH_ONCE=str(once),
    )
    assert cli("submit", str(killed), env=env).returncode == -9
    assert _submit(killed) == 0
    assert committed_rows_score(tmp_path / "out-killed") == committed_rows_score(tmp_path / "out-fresh")
    # Another context column is another dataset: resuming into this output is refused.
    swapped = dict(sections, input={"context_column": "id", "continuations_column": "choices"})
    other = _score_job(tmp_path, model_dir, input_path, "killed", **swapped)
    assert _submit(other) == 78
    assert "score.context_column" in capsys.readouterr().err


def committed_rows_score(out: Path) -> list[dict[str, Any]]:
    return sorted(_rows_by_key(out).values(), key=lambda r: (r["row_id"], r["continuation_index"]))


def test_generation_and_score_keys_do_not_mix(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardinfer.jobs.cli import main

    input_path = _write_input(tmp_path, ROWS)
    job = tmp_path / "mixed.toml"
    job.write_text(job_toml(model_dir, str(input_path), str(tmp_path / "o"), input={"context_column": "ctx"}))
    assert main(["validate", str(job)]) == 78
    assert "input.context_column only applies to score jobs" in capsys.readouterr().err


@pytest.mark.parametrize("query", [None, "SELECT * FROM input", "SELECT id, ctx, choices FROM input"])
def test_jsonl_choices_of_mixed_shapes_are_lists_not_text(
    tmp_path: Path, model_dir: Path, hf: Any, query: str | None
) -> None:
    # One line's list mixes a number into the strings, so the reader keeps the column as JSON
    # text; every other line's list must still be scored choice by choice, not as its JSON text,
    # also where input.query passes the column through.
    lines = [
        {"id": "ok", "ctx": "Hello,", "choices": [" world", " fox"]},
        {"id": "one", "ctx": "Hello,", "choices": [" world"]},
        {"id": "mixed", "ctx": "Hello,", "choices": [" world", 5]},
        {"id": "nested", "ctx": "Hello,", "choices": [[" world"]]},
    ]
    path = tmp_path / "input.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    job = _score_job(
        tmp_path,
        model_dir,
        path,
        job={"max_error_fraction": 1.0},
        input={
            "context_column": "ctx",
            "continuations_column": "choices",
            **({"query": query} if query else {}),
        },
    )
    assert _submit(job) == 0
    got = _rows_by_key(tmp_path / "out-job")
    tok = Tokenizer(model_dir)
    ctx_ids = tok.encode("Hello,")
    for key, choice in [(("ok", 0), " world"), (("ok", 1), " fox"), (("one", 0), " world")]:
        cont_ids = tok.encode("Hello," + choice)[len(ctx_ids) :]
        want, _ = _hf_scores(hf, ctx_ids, cont_ids)
        assert got[key]["status"] == "ok" and got[key]["token_ids"] == cont_ids
        assert abs(got[key]["logprob_sum"] - sum(want)) < 1e-4
    assert len(got) == 5  # two records for "ok", one for each other row
    assert got[("mixed", 0)]["error_code"] == "invalid_row"
    assert "continuation 1 is int" in got[("mixed", 0)]["error_message"]
    assert "continuation 0 is list" in got[("nested", 0)]["error_message"]
