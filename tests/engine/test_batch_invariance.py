"""Batch invariance end to end: a row's tokens and logprobs never depend on its neighbours.

Runs on the CPU in CI at small counts; with -m gpu the same checks run on CUDA at the issue's
full counts (1000 completions, 64 rows, a batch of 1024, the largest decode CUDA graph) for a dense
and a DeepSeek model.
"""

from __future__ import annotations

import random

import pytest
import torch

from shardinfer import LLM, SamplingParams
from shardinfer.engine.cuda_graphs import BUCKETS

# The Triton MLA kernel needs qk_rope_head_dim >= 16 and a power-of-two kv_lora_rank.
DEEPSEEK = dict(qk_rope_head_dim=16, kv_lora_rank=64)


def _device_params(device: str) -> dict[str, int]:
    if device == "cuda":
        return {"completions": 1000, "rows": 64, "big_batch": BUCKETS[-1], "max_tokens": 32}
    return {"completions": 40, "rows": 12, "big_batch": 24, "max_tokens": 12}


def _llm(model_dir, device: str, **kwargs) -> LLM:
    dtype = "bfloat16" if device == "cuda" else "float32"
    return LLM(model_dir, device=device, dtype=dtype, **kwargs)


def _random_prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(2, 60))] for _ in range(n)]


def _check_one_prompt_many_times(llm: LLM, sizes: dict[str, int]) -> None:
    vocab = llm.llm_engine.model_config.vocab_size
    target = _random_prompts(1, vocab, 0)[0]
    p = SamplingParams(temperature=1.0, max_tokens=sizes["max_tokens"], seed=99, ignore_eos=True, logprobs=1)
    rng = random.Random(1)
    outputs = set()
    done = 0
    while done < sizes["completions"]:
        copies = min(rng.randint(1, 16), sizes["completions"] - done)
        others = _random_prompts(rng.randint(0, 48), vocab, rng.randrange(1 << 30))
        prompts = [target] * copies + others
        params = [p] * copies + [
            SamplingParams(
                temperature=rng.choice([0.0, 0.7, 1.2]),
                max_tokens=rng.randint(1, 40),
                seed=rng.randrange(1 << 30),
            )
            for _ in others
        ]
        order = list(range(len(prompts)))
        rng.shuffle(order)
        outs = llm.generate([prompts[i] for i in order], [params[i] for i in order])
        for pos, i in enumerate(order):
            if i < copies:
                c = outs[pos].outputs[0]
                outputs.add((tuple(c.token_ids), tuple(c.logprobs)))
        done += copies
    assert len(outputs) == 1


def _check_rows_alone_vs_batched(model_dir, device: str, sizes: dict[str, int], **engine) -> None:
    llm = _llm(model_dir, device, max_num_seqs=sizes["big_batch"], **engine)
    vocab = llm.llm_engine.model_config.vocab_size
    prompts = _random_prompts(sizes["rows"], vocab, 5)
    params = [
        SamplingParams(temperature=0.8, top_p=0.9, max_tokens=sizes["max_tokens"], seed=i, ignore_eos=True)
        for i in range(len(prompts))
    ]

    def key(outs) -> list[tuple]:
        return [(tuple(o.outputs[0].token_ids), tuple(o.outputs[0].logprobs)) for o in outs]

    alone = [key(llm.generate([pr], [pa]))[0] for pr, pa in zip(prompts, params, strict=True)]
    by8 = [
        k for i in range(0, len(prompts), 8) for k in key(llm.generate(prompts[i : i + 8], params[i : i + 8]))
    ]
    filler = _random_prompts(sizes["big_batch"] - len(prompts), vocab, 6)
    replayed = _record_graph_replays(llm)
    big = key(llm.generate(prompts + filler, params + [params[0]] * len(filler)))[: len(prompts)]
    assert by8 == alone and big == alone
    if device == "cuda":  # the big batch's decode steps ran in the graph of its full size
        assert (1, sizes["big_batch"]) in replayed
    tight = _llm(model_dir, device, num_kv_blocks=12, block_size=16, **engine)
    preempted = key(tight.generate(prompts, params))
    assert tight.llm_engine.scheduler.num_preemptions > 0
    assert preempted == alone


def _record_graph_replays(llm: LLM) -> set[tuple[int, int]]:
    """The (width, bucket) of every decode graph the engine replays from now on."""
    graphs = llm.llm_engine.runner.graphs
    replayed: set[tuple[int, int]] = set()
    if graphs is None:
        return replayed
    run = graphs.run

    def recording_run(*args, **kwargs):
        out = run(*args, **kwargs)
        replayed.add(graphs.last_key)
        return out

    graphs.run = recording_run
    return replayed


FAMILIES = [("qwen3", {}), ("deepseek_v3", DEEPSEEK)]


@pytest.mark.parametrize("family, overrides", FAMILIES, ids=[f for f, _ in FAMILIES])
def test_one_prompt_many_times_one_output_cpu(tiny_checkpoint, family, overrides) -> None:
    model_dir = tiny_checkpoint(family, **overrides)
    _check_one_prompt_many_times(_llm(model_dir, "cpu"), _device_params("cpu"))


@pytest.mark.parametrize("family, overrides", FAMILIES, ids=[f for f, _ in FAMILIES])
def test_rows_alone_in_batches_and_preempted_cpu(tiny_checkpoint, family, overrides) -> None:
    _check_rows_alone_vs_batched(tiny_checkpoint(family, **overrides), "cpu", _device_params("cpu"))


@pytest.mark.gpu
@pytest.mark.parametrize("family, overrides", FAMILIES, ids=[f for f, _ in FAMILIES])
def test_one_prompt_many_times_one_output_gpu(tiny_checkpoint, family, overrides) -> None:
    assert torch.cuda.is_available()
    _check_one_prompt_many_times(_llm(tiny_checkpoint(family, **overrides), "cuda"), _device_params("cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("family, overrides", FAMILIES, ids=[f for f, _ in FAMILIES])
def test_rows_alone_in_batches_and_preempted_gpu(tiny_checkpoint, family, overrides) -> None:
    assert torch.cuda.is_available()
    _check_rows_alone_vs_batched(tiny_checkpoint(family, **overrides), "cuda", _device_params("cuda"))


@pytest.mark.gpu
def test_fp8_cache_generated_rows_alone_in_batches_and_preempted_gpu(tiny_checkpoint, monkeypatch) -> None:
    """Two query heads per KV head of dim 128 on an FP8 cache: generated tokens' attention takes its
    own kernel (kernels/paged_attention_fma.py), prompt rows the chunk kernel, and a row still
    never depends on its batch, on CUDA graphs or on a preemption's recomputation."""
    from shardinfer.kernels import paged_attention, paged_attention_fma

    monkeypatch.setattr(paged_attention, "FMA_GENERATED_ROWS", True)
    calls = []
    overwrite = paged_attention_fma.overwrite_generated_rows

    def counted(*args, **kwargs):
        calls.append(1)
        return overwrite(*args, **kwargs)

    monkeypatch.setattr(paged_attention_fma, "overwrite_generated_rows", counted)
    model_dir = tiny_checkpoint("qwen3", head_dim=128)
    sizes = _device_params("cuda")
    _check_rows_alone_vs_batched(model_dir, "cuda", sizes, kv_cache_dtype="fp8")
    assert calls  # the generated rows did go through the FMA kernel
    _check_one_prompt_many_times(_llm(model_dir, "cuda", kv_cache_dtype="fp8"), sizes)
