"""Batch, chunking and prefix-cache invariance of the DeepSeek-V3 model through the paged latent
cache: a sequence's logits must be bitwise the same however it is batched, chunked or restored."""

from __future__ import annotations

import torch
from deepseek_helpers import PagedRunner, deepseek_checkpoint, load_model

TARGET = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43]
OTHERS = [[2, 71, 82, 81, 82, 84, 59], [1, 41, 42], list(range(100, 127))]
DECODE = [7, 77, 177]


def _run_alone(model_dir_regime: str) -> list[torch.Tensor]:
    runner = PagedRunner(load_model(deepseek_checkpoint(model_dir_regime)), seed=1)
    out = [runner.step([("t", TARGET)])[0]]
    out += [runner.step([("t", [tok])])[0] for tok in DECODE]
    return out


def test_batching_does_not_change_a_sequences_logits() -> None:
    alone = _run_alone("group_limited")
    runner = PagedRunner(load_model(deepseek_checkpoint("group_limited")), seed=2)
    batch = [(f"o{i}", p) for i, p in enumerate(OTHERS)]
    outs = runner.step([batch[0], ("t", TARGET), *batch[1:]])
    assert torch.equal(outs[1], alone[0])
    for step, tok in enumerate(DECODE, start=1):
        # Decode next to another request's prefill chunk and other decodes.
        mixed = [(f"o{i}", [5 + i]) for i in range(2)] + [("t", [tok]), ("late", OTHERS[2][: 3 + step])]
        assert torch.equal(runner.step(mixed)[2], alone[step])


def test_chunked_prefill_and_prefix_sharing_are_bitwise_identical() -> None:
    alone = _run_alone("qlora_yarn_mscale")
    model = load_model(deepseek_checkpoint("qlora_yarn_mscale"))
    # Chunked prefill: 5 + 1 + 7 tokens, the last chunk batched with another request.
    runner = PagedRunner(model, seed=3)
    first = runner.step([("t", TARGET[:5])])[0]
    second = runner.step([("t", TARGET[5:6])])[0]
    third = runner.step([("x", OTHERS[0]), ("t", TARGET[6:])])[1]
    assert torch.equal(torch.cat([first, second, third]), alone[0])
    # Prefix sharing: a second request reuses the first 8 tokens' cache blocks (block size 4) and
    # prefills only its own tail.
    runner.share_prefix("t", "u", 8)
    tail = runner.step([("u", TARGET[8:])])[0]
    assert torch.equal(tail, alone[0][8:])
    for step, tok in enumerate(DECODE, start=1):
        assert torch.equal(runner.step([("u", [tok])])[0], alone[step])
