"""The harness helpers the integration tests share: local task files, a harness run, and the
harness's own transformers model as the reference. (A module of its own, not conftest.py: test
folders each have a conftest, and `from conftest import` would find whichever was imported first.)"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TASKS_DIR = Path(__file__).parent / "tasks"
TASKS = ["si_mc", "si_ppl", "si_gen"]
MAX_LENGTH = 32  # short windows, so every document is cut into several


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
