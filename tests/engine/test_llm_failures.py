"""LLM after a failed call, and the inputs of generate/chat that are refused before any work.

A call that fails (a refused prompt, an exception inside a step, Ctrl-C) must leave the LLM as
it was: the next call's outputs equal those of a call on an untouched LLM.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from shardinfer import LLM, SamplingParams
from shardinfer.engine.chat_messages import MessageError
from shardinfer.engine.chat_template import ChatTemplateError
from shardinfer.errors import GrammarError, ModelLoadError, PromptTooLong

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=1)
PROMPTS = ["Hello there", "Count: one two", [5, 6, 7, 8]]


@pytest.fixture(scope="module")
def llm(qwen3_dir: Path) -> LLM:
    return LLM(qwen3_dir, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def reference(qwen3_dir: Path) -> list[tuple[list[int], list[float]]]:
    outs = LLM(qwen3_dir, device="cpu", dtype="float32").generate(PROMPTS, GREEDY, use_tqdm=False)
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs]


def _results(llm: LLM) -> list[tuple[list[int], list[float]]]:
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs]


@pytest.mark.parametrize("failure", [KeyboardInterrupt, RuntimeError])
def test_a_call_that_fails_mid_run_leaves_the_llm_usable(
    llm: LLM,
    reference: list[tuple[list[int], list[float]]],
    monkeypatch: pytest.MonkeyPatch,
    failure: type[BaseException],
) -> None:
    engine = llm.llm_engine
    real_step = engine.step
    calls = [0]

    def failing_step() -> list:  # type: ignore[type-arg]
        calls[0] += 1
        if calls[0] == 3:  # after two real steps: requests are running, with KV cache held
            raise failure("interrupted")
        return real_step()

    monkeypatch.setattr(engine, "step", failing_step)
    with pytest.raises(failure):
        llm.generate([*PROMPTS, "another one"], GREEDY, use_tqdm=False)
    monkeypatch.undo()
    assert not engine.has_unfinished() and not engine.requests
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks - _cached_blocks(llm)
    assert _results(llm) == reference


def _cached_blocks(llm: LLM) -> int:
    """Blocks held only by the prefix cache (free to reuse, not counted as free)."""
    manager = llm.llm_engine.block_manager
    return manager.num_blocks - manager.num_free_blocks if not llm.llm_engine.requests else 0


def test_a_refused_request_in_a_batch_queues_nothing(
    llm: LLM, reference: list[tuple[list[int], list[float]]]
) -> None:
    with pytest.raises(ValueError, match=r"stop_token_ids holds 100000, outside the vocabulary"):
        llm.generate(PROMPTS, [GREEDY, GREEDY, GREEDY.replace(stop_token_ids=[100000])], use_tqdm=False)
    assert not llm.llm_engine.requests
    assert _results(llm) == reference


def test_prompt_logprobs_of_a_one_token_prompt_are_none(llm: LLM) -> None:
    out = llm.generate([[5]], SamplingParams(max_tokens=2, prompt_logprobs=0), use_tqdm=False)[0]
    assert out.prompt_logprobs == [None]
    assert len(out.outputs[0].token_ids) >= 1


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"max_tokens": 3}, r"sampling_params is a dict .*: give a SamplingParams"),
        ("greedy", r"sampling_params is a str"),
        ([SamplingParams(), {"max_tokens": 3}], r"sampling_params\[1\] is a dict"),
    ],
)
def test_sampling_params_of_the_wrong_type_are_named(llm: LLM, params: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        llm.generate(["a", "b"], params, use_tqdm=False)  # type: ignore[arg-type]


def test_an_unsatisfiable_regex_is_refused_before_any_work(llm: LLM) -> None:
    steps = llm.llm_engine.counters["steps"]
    so = {"schema_type": "regex", "schema": "[^\\x00-\\x{10FFFF}]"}
    with pytest.raises(GrammarError, match="invalid regex schema: no output can match it"):
        llm.generate(["Hi"], SamplingParams(max_tokens=4, structured_output=so), use_tqdm=False)
    assert llm.llm_engine.counters["steps"] == steps and not llm.llm_engine.requests


def test_chat_content_parts_render_as_their_text(llm: LLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=1)
    parts = llm.chat(
        [{"role": "user", "content": [{"type": "text", "text": "hi"}, "there"]}], params, use_tqdm=False
    )[0]
    plain = llm.chat([{"role": "user", "content": "hi\nthere"}], params, use_tqdm=False)[0]
    assert parts.prompt_token_ids == plain.prompt_token_ids


@pytest.mark.parametrize(
    ("messages", "error", "message"),
    [
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            MessageError,
            "content part 0 has type 'image_url'",
        ),
        ([{"role": "user", "content": None}], MessageError, "has no content"),
        ([{"role": 3, "content": "hi"}], MessageError, "string 'role'"),
        ({"role": "user", "content": "hi"}, ValueError, "give one conversation"),
        ("hello", ValueError, "give one conversation"),
        (
            [[{"role": "user", "content": "ok"}], [{"role": "user", "content": None}]],
            MessageError,
            "conversation 1: message 0",
        ),
    ],
)
def test_chat_messages_are_checked_as_a_jobs_are(
    llm: LLM, messages: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        llm.chat(messages, SamplingParams(max_tokens=1), use_tqdm=False)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("template", "kwargs", "message"),
    [
        ("{{ messages[0]['content'] + 1 }}", None, "failed to render these messages: TypeError"),
        ("{{ 1 / 0 }}", None, "ZeroDivisionError"),
        (
            "{% for m in messages %}{{ m.content }}{% endfor %}",
            {"messages": 1},
            "sets 'messages', which the render",
        ),
        (
            "{% for m in messages %}{{ m.content }}{% endfor %}",
            "x",
            "chat_template_kwargs='x' must be a dict",
        ),
    ],
)
def test_chat_template_failures_are_chat_template_errors(
    llm: LLM, template: str, kwargs: object, message: str
) -> None:
    with pytest.raises(ChatTemplateError, match=message):
        llm.chat(
            [{"role": "user", "content": "hi"}],
            SamplingParams(max_tokens=1),
            use_tqdm=False,
            chat_template=template,
            chat_template_kwargs=kwargs,
        )  # type: ignore[arg-type]


def test_a_template_rendering_nothing_is_refused(llm: LLM) -> None:
    with pytest.raises(ValueError, match="conversation 0: the chat template rendered it as an empty prompt"):
        llm.chat(
            [{"role": "user", "content": "hi"}],
            SamplingParams(max_tokens=1),
            use_tqdm=False,
            chat_template="{# nothing #}",
        )


def test_a_kv_cache_that_caps_max_model_len_is_named(
    qwen3_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="shardinfer.engine.llm_engine"):
        small = LLM(qwen3_dir, device="cpu", num_kv_blocks=2, max_model_len=256)
    assert small.llm_engine.max_model_len == 32
    assert "max_model_len is 32, not 256: the KV cache holds 2 blocks of 16 tokens" in caplog.text
    with pytest.raises(
        PromptTooLong,
        match=r"prompt 0: prompt has 40 tokens; max_model_len=32 .*give the KV "
        r"cache more than its 2 blocks of 16 tokens \(num_kv_blocks",
    ):
        small.generate([list(range(3, 43))], SamplingParams(max_tokens=1), use_tqdm=False)


def test_bad_checkpoint_files_are_named(qwen3_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(qwen3_dir, model)
    (model / "generation_config.json").write_text('{"temperature": -1}')
    llm = LLM(model, device="cpu")
    with pytest.raises(
        ValueError,
        match=r"temperature=-1 .*generation_config.json', the checkpoint's sampling "
        "defaults: fix the file, or pass SamplingParams explicitly",
    ):
        llm.generate(["x"], use_tqdm=False)
    assert llm.generate(["x"], SamplingParams(max_tokens=1), use_tqdm=False)[0].outputs[0].token_ids
    (model / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match=r"tokenizer_config.json' is not valid JSON"):
        LLM(model, device="cpu")


def test_a_model_path_that_is_a_file_is_named(qwen3_dir: Path) -> None:
    with pytest.raises(
        ModelLoadError,
        match=r"model.safetensors' is a file, not a model directory: pass the "
        "directory holding it",
    ):
        LLM(qwen3_dir / "model.safetensors", device="cpu")
