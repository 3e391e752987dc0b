"""A small byte-level BPE tokenizer trained here, and a seeded random walk through a grammar.

The walk stands in for a model: at each step it draws one of the tokens the matcher allows, so
whatever comes out was shaped by the mask alone. Checking the decoded text with an independent
validator (jsonschema, re.fullmatch, ast) tests the whole chain schema -> grammar -> token mask.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from shardinfer.engine.structured import GrammarMatcher, StructuredOutputCompiler

EOS = "<|eos|>"
PAD = "<|pad|>"  # a second special token: a grammar must never allow it
EXTRA_IDS = 37  # the model's logits are wider than the tokenizer (padded embedding), not a multiple of 32


def _corpus() -> list[str]:
    rng = random.Random(1234)
    words = [
        "name",
        "age",
        "city",
        "tags",
        "id",
        "score",
        "red",
        "green",
        "blue",
        "alpha",
        "beta",
        "true",
        "false",
        "null",
        "hello",
        "world",
        "items",
        "value",
        "ok",
        "error",
    ]
    lines = []
    for _ in range(300):
        obj = {
            rng.choice(words): rng.choice(
                [
                    rng.randint(-500, 500),
                    rng.choice(words),
                    None,
                    True,
                    [rng.randint(0, 9) for _ in range(rng.randint(0, 3))],
                    {"x": rng.random()},
                ]
            )
            for _ in range(rng.randint(1, 4))
        }
        lines.append(json.dumps(obj))
        lines.append(f"{rng.randint(1, 99)} {rng.choice('+-*/')} ({rng.randint(1, 9)} - {rng.randint(1, 9)})")
        lines.append(
            f"{rng.choice(words)}@{rng.choice(words)}.com {rng.randint(100, 999)}-{rng.randint(1000, 9999)}"
        )
    return lines


@pytest.fixture(scope="session")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


@pytest.fixture(scope="session")
def hf_tokenizer(tokenizer_path: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tokenizer_path))


@pytest.fixture(scope="session")
def eos_id(hf_tokenizer: Tokenizer) -> int:
    return int(hf_tokenizer.token_to_id(EOS))


@pytest.fixture(scope="session")
def pad_id(hf_tokenizer: Tokenizer) -> int:
    return int(hf_tokenizer.token_to_id(PAD))


@pytest.fixture(scope="session")
def tok_vocab(hf_tokenizer: Tokenizer) -> int:
    return int(hf_tokenizer.get_vocab_size(with_added_tokens=True))


@pytest.fixture(scope="session")
def compiler(tokenizer_path: Path, eos_id: int, tok_vocab: int) -> StructuredOutputCompiler:
    return StructuredOutputCompiler(tokenizer_path, [eos_id], tok_vocab + EXTRA_IDS)


Walk = Callable[[GrammarMatcher, int], list[int]]


@pytest.fixture(scope="session")
def random_walk(eos_id: int) -> Walk:
    """walk(matcher, seed, eos_bias) -> accepted token ids (eos included when it was drawn).

    Where the grammar may end, eos is taken with probability eos_bias (so walks terminate);
    otherwise a token is drawn uniformly from the allowed ones.
    """

    def walk(matcher: GrammarMatcher, seed: int, eos_bias: float = 0.6, max_tokens: int = 200) -> list[int]:
        gen = torch.Generator().manual_seed(seed)
        tokens: list[int] = []
        while not matcher.is_finished() and len(tokens) < max_tokens:
            allowed = matcher.allowed_mask()
            candidates = allowed.nonzero().flatten()
            assert candidates.numel() > 0, "a live matcher must allow at least one token"
            if bool(allowed[eos_id]) and torch.rand(1, generator=gen).item() < eos_bias:
                token = eos_id
            else:
                token = int(candidates[torch.randint(candidates.numel(), (1,), generator=gen)].item())
            matcher.accept(token)
            tokens.append(token)
        return tokens

    return walk


@pytest.fixture(scope="session")
def decode(hf_tokenizer: Tokenizer, eos_id: int) -> Callable[[list[int]], str]:
    def dec(tokens: list[int]) -> str:
        return str(hf_tokenizer.decode([t for t in tokens if t != eos_id], skip_special_tokens=False))

    return dec
