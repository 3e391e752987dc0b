"""Job spec resolution: layers and precedence, key checking with suggestions, types, placeholders."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest

from shardinfer.errors import ConfigError, UsageError
from shardinfer.jobs.spec import load_properties, load_toml, parse_conf, resolve

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


def test_a_misspelt_placeholder_is_refused() -> None:
    with pytest.raises(
        ConfigError,
        match=r"\{date\} in path 'out/\{date\}' is not a placeholder \(did you mean "
        r"\{ds\}\?\)",
    ):
        resolve(BASE, confs=[parse_conf("output.path=out/{date}")])
    with pytest.raises(ConfigError, match=r"\{runid\} .* \(did you mean \{run_id\}\?\)"):
        resolve(BASE, confs=[parse_conf("output.path=out/{runid}")])
    kept = resolve(BASE, confs=[parse_conf("input.path=in/{a,b}/*.parquet")]).config
    assert kept.input.path == "in/{a,b}/*.parquet"  # not a placeholder: left alone


def test_a_wrong_stop_token_ids_value_is_shown() -> None:
    with pytest.raises(ConfigError, match=r"sampling\.stop_token_ids=5"):  # the value, not "a value"
        resolve(BASE, confs=[parse_conf("sampling.stop_token_ids=5")])


@pytest.mark.parametrize("extra", [[], ["sampling.prompt_logprobs=1"]])
def test_a_job_generating_no_tokens_is_refused(extra: list[str]) -> None:
    # With prompt logprobs, max_tokens=0 is a valid engine request (what score jobs send); a
    # generate job of them would write rows of empty text, so the spec says how to score instead.
    with pytest.raises(ConfigError, match=r"sampling\.max_tokens=0 generates nothing.*job\.task = \"score\""):
        resolve(BASE, confs=[parse_conf(c) for c in ["sampling.max_tokens=0", *extra]])


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


@pytest.mark.parametrize(
    ("job_file_stop", "conf", "expected"),
    [
        ("\n", None, ["\n"]),
        ("Q:, A:", None, ["Q:, A:"]),
        (" ", None, [" "]),
        (["Q:", "A:"], None, ["Q:", "A:"]),
        (None, 'sampling.stop="\\n"', ["\n"]),
        (None, "sampling.stop=Q:, A:", ["Q:, A:"]),
        (None, 'sampling.stop=["Q:", "A:"]', ["Q:", "A:"]),
    ],
)
def test_a_stop_string_is_one_stop_string(job_file_stop: Any, conf: str | None, expected: list[str]) -> None:
    """As OpenAI's and vLLM's `stop`: a string is kept whole, never split on commas nor stripped."""
    sampling = {"stop": job_file_stop} if job_file_stop is not None else {}
    spec = resolve({**BASE, "sampling": sampling}, confs=[parse_conf(conf)] if conf else [])
    assert spec.config.sampling["stop"] == expected
    # The column lists still read a string as comma-separated names.
    columns = resolve(BASE, confs=[parse_conf("input.passthrough_columns=a, b")]).config
    assert columns.input.passthrough_columns == ["a", "b"]


@pytest.mark.parametrize("key", ["input.override_columns", "input.passthrough_columns"])
def test_column_lists_hold_names_only(key: str) -> None:
    with pytest.raises(ConfigError, match=rf"{key}=\[1\]: 1 is not a column name") as info:
        resolve(BASE, confs=[parse_conf(f"{key}=[1]")])
    assert info.value.exit_code == 78
    with pytest.raises(ConfigError, match=rf"{key}=\{{"):
        resolve({**BASE, "input": {"path": "in", key.split(".")[1]: {"a": 1}}})


def test_timeline_path_is_checked_when_the_spec_is_resolved(tmp_path: Path) -> None:
    for path, match in (
        (tmp_path / "no-such-dir" / "t.jsonl", "which does not exist: create the directory"),
        (tmp_path, "is a directory: name a file in it"),
        (tmp_path / "file" / "t.jsonl", "which is not a directory"),
    ):
        (tmp_path / "file").write_text("")
        with pytest.raises(ConfigError, match=r"job\.timeline_path=.*" + match) as info:
            resolve(BASE, confs=[parse_conf(f"job.timeline_path={path}")])
        assert info.value.exit_code == 78
    good = resolve(BASE, confs=[parse_conf(f"job.timeline_path={tmp_path / 't.jsonl'}")]).config
    assert good.job.timeline_path == str(tmp_path / "t.jsonl") and not (tmp_path / "t.jsonl").exists()
    # Into the job's own local output location, which the job creates before a worker ends.
    out = tmp_path / "out"
    into_output = {**BASE, "output": {"path": str(out)}, "job": {"timeline_path": str(out / "t.jsonl")}}
    assert resolve(into_output).config.job.timeline_path == str(out / "t.jsonl")


def test_job_and_properties_files_that_are_not_text(tmp_path: Path) -> None:
    binary = tmp_path / "prompts.parquet"
    binary.write_bytes(b"PAR1\x15\x04\x15\xe4\x01\xff\x00")
    with pytest.raises(ConfigError, match=r"job file '.*prompts\.parquet' is not a text file \(byte 0xe4"):
        load_toml(binary)
    with pytest.raises(ConfigError, match=r"properties file '.*prompts\.parquet' is not a text file"):
        load_properties(binary)
    with pytest.raises(UsageError, match=r"job file '.*' is a directory: give the file itself"):
        load_toml(tmp_path)
    with pytest.raises(UsageError, match=r"properties file '.*' is a directory"):
        load_properties(tmp_path)


@pytest.mark.parametrize(
    ("task", "column"),
    [
        ("generate", "text"),
        ("generate", "status"),
        ("generate", "row_id"),
        ("generate", "top_logprobs"),
        ("score", "logprob_sum"),
    ],
)
def test_passthrough_named_like_an_output_column_is_refused_up_front(task: str, column: str) -> None:
    """Found from the names, before `_job.json` is written (whose fingerprint the fix would change)."""
    job: dict[str, Any] = {**BASE, "job": {"task": task}, "sampling": {}}
    if task == "score":
        job["input"] = {"path": "in", "context_column": "q", "continuations_column": "c"}
    with pytest.raises(
        ConfigError,
        match=rf"input\.passthrough_columns names '{column}', which is an output "
        rf"column: rename it in input\.query \(SELECT \*, {column} AS input_{column}",
    ):
        resolve(job, confs=[parse_conf(f"input.passthrough_columns={column},topic")])
    with pytest.raises(ConfigError, match=r"names 'topic' more than once"):
        resolve(BASE, confs=[parse_conf("input.passthrough_columns=topic,topic")])
    assert resolve(
        job, confs=[parse_conf("input.passthrough_columns=topic")]
    ).config.input.passthrough_columns


@pytest.mark.parametrize(
    ("conf", "match"),
    [
        ("engine.dtype=bfloat16", r"engine\.dtype is not an \[engine\] key: set it as model\.dtype"),
        ("engine.model=/m", r"engine\.model is not an \[engine\] key: set it as model\.path"),
        ("engine.device=cpu", r"engine\.device is not an \[engine\] key: set it as model\.device"),
        ("engine.seed=1", r"engine\.seed is not a job setting: use job\.seed"),
    ],
)
def test_engine_keys_that_belong_elsewhere_name_their_place(conf: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        resolve(BASE, confs=[parse_conf(conf)])


def test_ds_may_be_a_toml_date() -> None:
    import tomllib

    job_file = tomllib.loads(
        '[job]\nds = 2024-05-06\n[model]\npath = "m"\n[input]\npath = "in"\n[output]\npath = "out/{ds}"\n'
    )
    spec = resolve(job_file, run_id="r")
    assert spec.config.job.ds == "2024-05-06" and spec.config.output.path == "out/2024-05-06"
    with pytest.raises(
        ConfigError, match=r"job\.ds=datetime\.datetime\(.*expected str"
    ):  # a time is not a date
        resolve({**job_file, "job": {"ds": datetime.datetime(2024, 5, 6, 1, 2)}})


def test_keys_a_job_would_ignore_are_refused() -> None:
    score = {
        **BASE,
        "job": {"task": "score"},
        "input": {"path": "in", "context_column": "q", "continuations_column": "c"},
    }
    with pytest.raises(
        ConfigError,
        match=r"a score job samples nothing .* \[sampling\] temperature, top_p would "
        "have no effect: remove them",
    ):
        resolve(score)
    assert resolve({**score, "sampling": {}}).config.job.task == "score"
    windowed = {**score, "sampling": {}, "job": {"task": "score", "rolling_window_tokens": 64}}
    with pytest.raises(
        ConfigError,
        match=r"job\.rolling_window_tokens=64 only applies to documents "
        r"\(input\.document_column\).*remove it",
    ):
        resolve(windowed)
    documents = {**windowed, "input": {"path": "in", "document_column": "text"}}
    assert resolve(documents).config.job.rolling_window_tokens == 64
    with pytest.raises(ConfigError, match=r"input\.chat_template_kwargs are variables of the chat template"):
        resolve(BASE, confs=[parse_conf("input.chat_template_kwargs={enable_thinking = false}")])
    chat = resolve(
        BASE,
        confs=[
            parse_conf("input.messages_column=messages"),
            parse_conf("input.prompt_column="),
            parse_conf("input.chat_template_kwargs={enable_thinking = false}"),
        ],
    ).config
    assert chat.input.chat_template_kwargs == {"enable_thinking": False}


def test_one_entry_of_a_table_key_says_to_give_the_table() -> None:
    with pytest.raises(
        ConfigError,
        match=r"output\.storage_options is set as a whole table, e\.g\. --conf "
        r"'output\.storage_options=\{key = \"\.\.\.\"\}'",
    ) as refused:
        resolve(BASE, confs=[parse_conf("output.storage_options.key=s3cr3t")])
    assert "s3cr3t" not in str(refused.value)  # a credential is never quoted back


@pytest.mark.parametrize(
    ("conf", "match"),
    [
        # Unquoted items: TOML cannot read them, and they were taken as the one stop string "[a, b]".
        (
            "sampling.stop=[a, b]",
            r"sampling\.stop: '\[a, b\]' is not valid TOML \(Invalid value \(at character 2\)\)",
        ),
        ('sampling.stop=["a", "b"', r"sampling\.stop: .* is not valid TOML \(Unclosed array"),
        ('input.passthrough_columns=["a"', r"input\.passthrough_columns: .* is not valid TOML"),
        # A table of options may hold a secret: the error never quotes it.
        ('input.storage_options={key = "SECRET"', r"input\.storage_options: the value is not valid TOML"),
    ],
)
def test_a_list_or_table_that_is_not_toml_is_refused(conf: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        resolve(BASE, confs=[parse_conf(conf)])
    assert info.value.exit_code == 78 and "SECRET" not in str(info.value)


def test_bracketed_words_and_typed_lists_stay_as_written(tmp_path: Path) -> None:
    # A stop string in brackets with no comma or quote is one stop string, as before.
    spec = resolve(BASE, confs=[parse_conf("sampling.stop=[INST]")])
    assert spec.config.sampling["stop"] == ["[INST]"]
    # A TOML properties file types its values itself: a quoted "[a, b]" is a string.
    props = tmp_path / "p.toml"
    props.write_text('[sampling]\nstop = "[a, b]"\n')
    assert resolve(BASE, properties=load_properties(props)).config.sampling["stop"] == ["[a, b]"]


def test_a_properties_file_may_be_a_pipe(tmp_path: Path) -> None:
    # `--properties-file <(...)` names a pipe, which is not a regular file: it was "does not exist".
    import os
    import threading

    fifo = tmp_path / "props"
    os.mkfifo(fifo)
    # A daemon: when the pipe is never opened for reading, its write blocks without holding up the run.
    threading.Thread(target=lambda: fifo.write_text("sampling.top_p=0.4\n"), daemon=True).start()
    items = load_properties(fifo)
    assert resolve(BASE, properties=items).config.sampling["top_p"] == 0.4


@pytest.mark.parametrize(
    ("conf", "match"),
    [
        # The nearest valid name misled: job.master was "did you mean 'start_over'?".
        ("job.master=local[2]", r"job\.master is not a job setting: .* --master local\[N\]"),
        ("job.num_workers=2", r"--master local\[N\], or --master ray with ray\.num_workers"),
        ("engine.tensor_parallel_size=2", r"tensor parallelism is not supported"),
        ("sampling.do_sample=true", r"temperature = 0 decodes greedily"),
        ("output.overwrite=true", r"job\.start_over = true"),
    ],
)
def test_keys_of_other_tools_say_what_a_job_does_instead(conf: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        resolve(BASE, confs=[parse_conf(conf)])
    assert info.value.exit_code == 78 and "did you mean" not in str(info.value)


def test_a_bad_key_of_the_properties_file_says_so(tmp_path: Path) -> None:
    # The command line shows --conf and names the job file; the properties file went unnamed.
    props = tmp_path / "defaults.conf"
    props.write_text("sampling.temprature=0.5\n")
    with pytest.raises(ConfigError, match=r"did you mean 'temperature'\?.* \(set in the properties file\)$"):
        resolve(BASE, properties=load_properties(props))
    props.write_text("job.seed=abc\n")
    with pytest.raises(
        ConfigError, match=r"job\.seed='abc' has the wrong type.* \(set in the properties file\)$"
    ):
        resolve(BASE, properties=load_properties(props))


def test_run_id_flag_and_conf_run_id_must_agree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Both on one command line with other values: the output folder ({run_id}) would be a guess.
    with pytest.raises(UsageError, match=r"--run-id 'scheduled__a'.*job\.run_id='manual_b'"):
        resolve(BASE, confs=[parse_conf("job.run_id=manual_b")], run_id="scheduled__a")
    # The same value twice is one run id; a job file's run_id is a default the flag overrides.
    same = resolve(BASE, confs=[parse_conf("job.run_id=20240101")], run_id="20240101")
    assert same.config.job.run_id == "20240101" and same.config.output.path.endswith("/20240101")
    from_file = resolve({**BASE, "job": {"run_id": "file"}}, run_id="flag")
    assert (from_file.config.job.run_id, from_file.sources["job.run_id"]) == ("flag", "--run-id")
    # Through the command line: exit 64 with both values named, before anything is opened.
    from shardinfer.jobs.cli import main

    job = tmp_path / "job.toml"
    job.write_text('[model]\npath = "m"\n[input]\npath = "in"\n[output]\npath = "out"\n')
    assert main(["submit", "--run-id", "a", "--conf", "job.run_id=b", str(job)]) == 64
    assert "--run-id 'a' and --conf job.run_id='b' disagree" in capsys.readouterr().err


def test_name_flag_and_conf_name_must_agree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # --conf job.name silently won over --name: {name} in output.path then picked a folder the
    # scheduler that passed --name never named.
    with pytest.raises(UsageError, match=r"--name 'nightly' and --conf job\.name='adhoc' disagree"):
        resolve(BASE, confs=[parse_conf("job.name=adhoc")], name="nightly")
    same = resolve(BASE, confs=[parse_conf("job.name=nightly")], name="nightly")
    assert same.config.job.name == "nightly"
    # A job file's or a properties file's name is a default the flag overrides, as for --run-id.
    props = tmp_path / "defaults.conf"
    props.write_text("job.name=from_props\n")
    flag = resolve({**BASE, "job": {"name": "file"}}, properties=load_properties(props), name="flag")
    assert (flag.config.job.name, flag.sources["job.name"]) == ("flag", "--name")
    from shardinfer.jobs.cli import main

    job = tmp_path / "job.toml"
    job.write_text('[model]\npath = "m"\n[input]\npath = "in"\n[output]\npath = "out"\n')
    assert main(["validate", "--name", "a", "--conf", "job.name=b", str(job)]) == 64
    assert "--name 'a' and --conf job.name='b' disagree" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--name", "--run-id"])
def test_an_empty_name_or_run_id_flag_is_a_usage_error(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `--run-id "$RUN_ID"` with the variable unset was taken as no flag: a made-up run id, and so
    # another output folder ({run_id}) on every retry.
    from shardinfer.jobs.cli import main

    job = tmp_path / "job.toml"
    job.write_text('[model]\npath = "m"\n[input]\npath = "in"\n[output]\npath = "out/{name}/{run_id}"\n')
    assert main(["submit", "--dry-run", flag, "", str(job)]) == 64
    assert f"{flag} is empty" in capsys.readouterr().err


def test_prompt_and_messages_columns_together_say_how_to_drop_one() -> None:
    # A job file's prompt_column with a --conf messages_column: the fix is to empty one of them.
    both = {**BASE, "input": {**BASE["input"], "prompt_column": "q"}}
    with pytest.raises(
        ConfigError, match=r"are both set.*--conf input\.prompt_column= or --conf input\.messages_column="
    ):
        resolve(both, confs=[parse_conf("input.messages_column=m")])
    emptied = resolve(both, confs=[parse_conf("input.messages_column=m"), parse_conf("input.prompt_column=")])
    assert (emptied.config.input.prompt_column, emptied.config.input.messages_column) == ("", "m")
