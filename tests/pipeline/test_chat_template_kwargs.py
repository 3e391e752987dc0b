"""`input.chat_template_kwargs` reaches the chat template of every row, and the fingerprint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tokenizers import Tokenizer as RawTokenizer

from shardinfer.engine.tokenizer import Tokenizer
from shardinfer.pipeline.config import InputSection, JobConfig
from shardinfer.pipeline.fingerprint import compute_fingerprint
from shardinfer.pipeline.rows import RowPreparer

THINKING_TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>"
    "{% if enable_thinking is defined and enable_thinking is false %}no thinking{% endif %}{% endif %}"
)


def _thinking_model(model_dir: Path, tmp_path: Path) -> Path:
    out = tmp_path / "tok"
    out.mkdir()
    shutil.copy(model_dir / "tokenizer.json", out / "tokenizer.json")
    cfg = json.loads((model_dir / "tokenizer_config.json").read_text())
    cfg["chat_template"] = THINKING_TEMPLATE
    (out / "tokenizer_config.json").write_text(json.dumps(cfg))
    return out


def test_chat_template_kwargs_reach_the_template(model_dir: Path, tmp_path: Path) -> None:
    tok_dir = _thinking_model(model_dir, tmp_path)
    raw = RawTokenizer.from_file(str(tok_dir / "tokenizer.json"))
    row = {"messages": [{"role": "user", "content": "hi"}], "__row_index": 0}
    prompts = {}
    for kwargs in ({}, {"enable_thinking": False}):
        section = InputSection(path="x", messages_column="messages", chat_template_kwargs=kwargs)
        prep = RowPreparer(Tokenizer(tok_dir), 64, {"max_tokens": 4}, section, job_seed=1)
        prompts[bool(kwargs)] = prep.prepare(0, 0, 0, dict(row)).prompt_ids
    assert prompts[False] == raw.encode("<|user|>hi<|end|><|assistant|>", add_special_tokens=False).ids
    assert (
        prompts[True] == raw.encode("<|user|>hi<|end|><|assistant|>no thinking", add_special_tokens=False).ids
    )


def test_chat_template_kwargs_are_part_of_the_fingerprint(model_dir: Path) -> None:
    def fingerprint(**inp: object) -> dict:
        cfg = JobConfig.from_dict(
            {
                "input": {"path": "in", "messages_column": "messages", **inp},
                "model": {"path": str(model_dir), "device": "cpu", "dtype": "float32"},
                "output": {"path": "out"},
            }
        )
        return compute_fingerprint(cfg, {}, 1)

    plain = fingerprint()
    assert "chat_template_kwargs" not in plain["input.rows"]  # jobs without it keep their fingerprint
    off = fingerprint(chat_template_kwargs={"enable_thinking": False})
    on = fingerprint(chat_template_kwargs={"enable_thinking": True})
    assert len({plain["hash"], off["hash"], on["hash"]}) == 3
