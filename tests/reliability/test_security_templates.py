"""A checkpoint's chat template that recurses without end or asks for gigantic text: each such row
fails alone with a template_error that says which limit it went past, and the job goes on."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pipeline_kit import cli, committed_rows, standard_job

RUNAWAY = {
    "macro": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursed too deeply"),
    "recursive-loop": ("{% for m in [1] recursive %}{{ loop([1]) }}{% endfor %}", "recursed too deeply"),
    "json-indent": ("{{ [[1]] | tojson(indent=10**9) }}", "indent by a few spaces"),
    "repeated-string": ("{{ (['x' * 1000000] * 1000) | join }}", "'*' would build"),
    "lipsum": ("{{ lipsum(1000, false, 10000, 100000) }}", "lipsum"),
}


def test_runaway_templates_cost_their_rows_only(tmp_path: Path, model_dir: Path) -> None:
    model = shutil.copytree(model_dir, tmp_path / "model")
    branches = "".join(
        f"{{% {'if' if i == 0 else 'elif'} messages[0].content == {name!r} %}}{source}"
        for i, (name, (source, _)) in enumerate(RUNAWAY.items())
    )
    template = (
        branches + "{% else %}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% endif %}"
    )
    tok_config = json.loads((model / "tokenizer_config.json").read_text())
    tok_config["chat_template"] = template
    (model / "tokenizer_config.json").write_text(json.dumps(tok_config))
    (tmp_path / "in").mkdir()
    contents = [*RUNAWAY, "fox engine"]
    lines = [json.dumps({"id": c, "messages": [{"role": "user", "content": c}]}) for c in contents]
    (tmp_path / "in" / "a.jsonl").write_text("\n".join(lines) + "\n")
    job, out = standard_job(
        tmp_path,
        model,
        str(tmp_path / "in"),
        job={"max_error_fraction": 0.9},
        input={"prompt_column": "", "messages_column": "messages", "passthrough_columns": []},
    )
    result = cli("submit", str(job), timeout=300)
    assert result.returncode == 0, result.stderr
    got = {r["row_id"]: r for r in committed_rows(str(out))}
    assert [(c, got[c]["status"], got[c]["error_code"]) for c in contents] == [
        *[(name, "error", "template_error") for name in RUNAWAY],
        ("fox engine", "ok", None),
    ]
    for name, (_, message) in RUNAWAY.items():
        assert message in got[name]["error_message"], got[name]["error_message"]
