"""Hostile model directories and job settings: never run their code, never retry what cannot succeed.

- a damaged safetensors file exits 78 (fix the job), under `local` and `local[N]`, never 75;
- a pickle checkpoint is refused and never unpickled; a config asking for remote code never runs it;
- a chat template that escapes the sandbox, loops without bound, recurses without end or asks for
  gigantic text costs its rows a `template_error` (naming the limit), not the job;
- a `[sampling]` section above the per-row limits exits 78 before any work.
"""

from __future__ import annotations

import json
import pickle
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))

from pipeline_kit import cli, committed_rows, standard_job, tiny_model, write_shards


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_shards(tmp_path_factory.mktemp("shards"), files=1, rows=4)


def _copy_model(model: Path, to: Path) -> Path:
    shutil.copytree(model, to)
    return to


class _TouchesMarker:
    """Unpickling this runs `open(marker, 'w')`: the marker appears only if someone unpickled it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("master", ["local", "local[2]"])
def test_damaged_safetensors_exits_78_not_75(tmp_path: Path, model: Path, shards: Path, master: str) -> None:
    damaged = _copy_model(model, tmp_path / "model")
    weights = damaged / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8:40] = b"x" * 32  # the header's JSON: no longer parseable
    weights.write_bytes(bytes(data))
    job, _ = standard_job(tmp_path, damaged, str(shards))
    result = cli("submit", "--master", master, str(job), timeout=300)
    assert result.returncode == 78, result.stderr
    assert "model.safetensors is not a readable safetensors file" in result.stderr


def test_a_pickle_checkpoint_is_refused_unread(tmp_path: Path, model: Path, shards: Path) -> None:
    pickled = _copy_model(model, tmp_path / "model")
    (pickled / "model.safetensors").unlink()
    marker = tmp_path / "unpickled"
    (pickled / "pytorch_model.bin").write_bytes(pickle.dumps(_TouchesMarker(marker)))
    job, out = standard_job(tmp_path, pickled, str(shards))
    for command in ("validate", "submit"):
        result = cli(command, str(job))
        assert result.returncode == 78, result.stderr
        assert "safetensors" in result.stderr
    assert not marker.exists() and not out.exists()


def test_remote_code_is_never_run(tmp_path: Path, model: Path, shards: Path) -> None:
    remote = _copy_model(model, tmp_path / "model")
    marker = tmp_path / "remote-code-ran"
    (remote / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (remote / "tokenization_evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    config = json.loads((remote / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
    config["trust_remote_code"] = True
    (remote / "config.json").write_text(json.dumps(config))
    tok_config = json.loads((remote / "tokenizer_config.json").read_text())
    tok_config["auto_map"] = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
    (remote / "tokenizer_config.json").write_text(json.dumps(tok_config))
    job, out = standard_job(tmp_path, remote, str(shards))
    result = cli("submit", str(job))
    assert result.returncode == 0, result.stderr  # the architecture is a known one: it runs, as itself
    assert len(committed_rows(str(out))) == 4
    assert not marker.exists()


ESCAPES = {
    "escape": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "globals": "{{ cycler.__init__.__globals__.os.system('touch MARKER') }}",
    "loops": "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    "bomb": "{{ 'x' * 10**10 }}",
}
# Templates that recurse without end or ask for gigantic text, each with what its error must say.
RUNAWAY = {
    "macro": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursed too deeply"),
    "recursive-loop": ("{% for m in [1] recursive %}{{ loop([1]) }}{% endfor %}", "recursed too deeply"),
    "json-indent": ("{{ [[1]] | tojson(indent=10**9) }}", "indent by a few spaces"),
    "repeated-string": ("{{ (['x' * 1000000] * 1000) | join }}", "'*' would build"),
    "lipsum": ("{{ lipsum(1000, false, 10000, 100000) }}", "lipsum"),
}


def _rows_under_template(
    tmp_path: Path, model: Path, branches: dict[str, str], plain: list[str]
) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """Run a messages job on a copy of `model` whose chat template renders `branches[content]` for a
    message of that content and the plain conversation otherwise, one row per branch and per
    `plain` text; returns the rows' contents in input order and the committed rows by row id."""
    templated = _copy_model(model, tmp_path / "model")
    chosen = "".join(
        f"{{% {'if' if i == 0 else 'elif'} messages[0].content == {name!r} %}}{source}"
        for i, (name, source) in enumerate(branches.items())
    )
    template = (
        chosen + "{% else %}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% endif %}"
    )
    tok_config = json.loads((templated / "tokenizer_config.json").read_text())
    tok_config["chat_template"] = template
    (templated / "tokenizer_config.json").write_text(json.dumps(tok_config))
    (tmp_path / "in").mkdir()
    contents = [*branches, *plain]
    lines = [json.dumps({"id": c, "messages": [{"role": "user", "content": c}]}) for c in contents]
    (tmp_path / "in" / "a.jsonl").write_text("\n".join(lines) + "\n")
    job, out = standard_job(
        tmp_path,
        templated,
        str(tmp_path / "in"),
        job={"max_error_fraction": 0.9},
        input={"prompt_column": "", "messages_column": "messages", "passthrough_columns": []},
    )
    result = cli("submit", str(job), timeout=300)
    assert result.returncode == 0, result.stderr
    return contents, {r["row_id"]: r for r in committed_rows(str(out))}


def test_hostile_templates_cost_their_rows_only(tmp_path: Path, model: Path) -> None:
    marker = tmp_path / "template-escaped"
    branches = {name: source.replace("MARKER", str(marker)) for name, source in ESCAPES.items()}
    contents, got = _rows_under_template(tmp_path, model, branches, ["fox engine", "shard split"])
    assert [(c, got[c]["status"], got[c]["error_code"]) for c in contents] == [
        *[(name, "error", "template_error") for name in ESCAPES],
        ("fox engine", "ok", None),
        ("shard split", "ok", None),
    ]
    assert "loop steps" in got["loops"]["error_message"] or "to render" in got["loops"]["error_message"]
    assert not marker.exists()


def test_runaway_templates_cost_their_rows_only(tmp_path: Path, model: Path) -> None:
    """A template that recurses without end or asks for gigantic text fails its row alone with a
    template_error that says which limit it went past, and the job goes on."""
    branches = {name: source for name, (source, _) in RUNAWAY.items()}
    contents, got = _rows_under_template(tmp_path, model, branches, ["fox engine"])
    assert [(c, got[c]["status"], got[c]["error_code"]) for c in contents] == [
        *[(name, "error", "template_error") for name in RUNAWAY],
        ("fox engine", "ok", None),
    ]
    for name, (_, message) in RUNAWAY.items():
        assert message in got[name]["error_message"], got[name]["error_message"]


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("sampling.n", "1000000000", "above the limit of 1024"),
        ("sampling.top_k", "1000000000000", "top_k=1000000000000 is above"),
        ("sampling.stop_token_ids", str(list(range(2000))).replace(" ", ""), "stop_token_ids has 2000 ids"),
    ],
)
def test_sampling_above_the_limits_exits_78(
    tmp_path: Path, model: Path, shards: Path, key: str, value: str, message: str
) -> None:
    job, out = standard_job(tmp_path, model, str(shards))
    result = cli("submit", "--conf", f"{key}={value}", str(job))
    assert result.returncode == 78, result.stderr
    assert message in result.stderr
    assert not (out / "_SUCCESS").exists()
