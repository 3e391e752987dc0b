"""Offline training text and the tokenizer: Python standard-library source plus chat-formatted tasks.

The stdlib directory is found at run time through `sysconfig`, so the corpus is whatever Python runs the
script; which files are held out is decided by a hash of each file's relative path, so the split does not
depend on listing order or on which other files exist.
"""

from __future__ import annotations

import functools
import hashlib
import sysconfig
from collections.abc import Iterable, Iterator
from pathlib import Path

from jinja2 import Template
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (BOS, EOS, PAD, *ROLE_TOKENS)

# Each message is its role marker, its content and EOS; generation stops at EOS after the assistant turn.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' }}{{ message['content'] }}{{ eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

MAX_FILE_BYTES = 300_000  # a few generated tables are huge and teach nothing


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_held_out(rel_path: str, one_in: int = 50) -> bool:
    digest = hashlib.sha256(f"heldout:{rel_path}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % one_in == 0


def stdlib_files(root: Path | None = None) -> list[tuple[str, str]]:
    """(relative path, text) of every readable stdlib .py file, sorted by path; site-packages excluded."""
    root = root or stdlib_dir()
    out: list[tuple[str, str]] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if "site-packages" in rel or "dist-packages" in rel:
            continue
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                continue
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if text.strip():
            out.append((rel, text))
    return out


@functools.lru_cache(maxsize=1)
def _template() -> Template:
    # Compiling is the slow part; rendering hundreds of thousands of chats reuses one compiled template.
    return ImmutableSandboxedEnvironment().from_string(CHAT_TEMPLATE)


def render_chat(messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    return _template().render(
        messages=messages, add_generation_prompt=add_generation_prompt, bos_token=BOS, eos_token=EOS
    )


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE; digits are split one per token so arithmetic sees place values."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_chunks(texts), trainer=trainer)
    for i, name in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(name) != i:
            raise RuntimeError(f"special token {name} got id {tok.token_to_id(name)}, expected {i}")
    return tok


def _chunks(texts: Iterable[str], size: int = 1 << 16) -> Iterator[str]:
    # Long files are fed in pieces so the trainer's batches stay balanced across threads.
    for text in texts:
        for start in range(0, len(text), size):
            yield text[start : start + size]


def tokenizer_config(model_max_length: int) -> dict[str, object]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(i): {
                "content": t,
                "special": True,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "single_word": False,
            }
            for i, t in enumerate(SPECIAL_TOKENS)
        },
    }
