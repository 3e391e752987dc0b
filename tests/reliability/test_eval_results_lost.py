"""`status` on a finished eval whose results.json was deleted afterwards: the results are gone,
so the eval is damaged, not done with a results file to read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TASKS_DIR = Path(__file__).resolve().parents[1] / "integrations" / "tasks"


def test_status_of_an_eval_without_its_results_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("lm_eval")
    from shardinfer.jobs.cli import main
    from shardinfer.testing.tiny_checkpoint import make_tiny_checkpoint

    model = make_tiny_checkpoint(tmp_path / "qwen3", "qwen3", num_hidden_layers=1)
    out = tmp_path / "eval"
    argv = ["eval", "--model", str(model), "--include-path", str(TASKS_DIR), "--tasks", "si_ppl",
            "--device", "cpu", "--dtype", "float32", "--output", str(out)]  # fmt: skip
    assert main(argv) == 0
    (out / "results.json").unlink()
    capsys.readouterr()
    assert main(["status", "--json", str(out)]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["state"] == "damaged" and found["results_file"] is None
    assert any(p.startswith("results.json is missing") for p in found["problems"]), found["problems"]
