"""The harness runs offline on local task files; tiny checkpoints are built once per session."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TASKS_DIR = Path(__file__).parent / "tasks"
TASKS = ["si_mc", "si_ppl", "si_gen"]
MAX_LENGTH = 32  # short windows, so every document is cut into several


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import torch

    from shardinfer.testing.tiny_checkpoint import make_tiny_checkpoint

    torch.set_num_threads(1)
    base = tmp_path_factory.mktemp("eval-models")
    return {
        "dense": make_tiny_checkpoint(base / "qwen3", "qwen3", num_hidden_layers=1),
        "deepseek_v3": make_tiny_checkpoint(base / "dsv3", "deepseek_v3"),
    }


def run_harness(
    model: Any, model_args: dict[str, Any] | None = None, tasks: list[str] = TASKS, chat: bool = False
) -> dict[str, Any]:
    import lm_eval
    from lm_eval.tasks import TaskManager

    # Only the local tasks are indexed: indexing the harness's built-in tasks takes minutes.
    manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=False)
    return dict(
        lm_eval.simple_evaluate(
            model=model,
            model_args=model_args,
            tasks=tasks,
            task_manager=manager,
            apply_chat_template=chat,
            log_samples=True,
            bootstrap_iters=0,
            device="cpu",
        )
    )


def hf_reference(model_dir: Path, tasks: list[str] = TASKS, chat: bool = False) -> dict[str, Any]:
    """The harness's own transformers model on the checkpoint, float32 on CPU.

    The tokenizer is handed over built from tokenizer.json: transformers' AutoTokenizer would pick
    the model family's tokenizer class, which re-splits digits, so the two sides would score
    different tokens.
    """
    import transformers

    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(model_dir / "tokenizer.json"),
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|eos|>",
    )
    tok.chat_template = json.loads((model_dir / "tokenizer_config.json").read_text())["chat_template"]
    args = {"pretrained": str(model_dir), "dtype": "float32", "max_length": MAX_LENGTH, "tokenizer": tok}
    return run_harness("hf", args, tasks, chat)


@pytest.fixture(scope="session")
def harness_runs(tiny_models: dict[str, Path]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """family -> (shardinfer's run, transformers' run) of the three local tasks."""
    from shardinfer.integrations.lm_eval import ShardinferLM

    runs = {}
    for family, model_dir in tiny_models.items():
        ours = run_harness(ShardinferLM(str(model_dir), device="cpu", dtype="float32", max_length=MAX_LENGTH))
        runs[family] = (ours, hf_reference(model_dir))
    return runs
