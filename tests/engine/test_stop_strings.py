"""Stop strings judged token by token, as the engine accepts tokens, on a byte-fallback tokenizer
(Llama-2 / Mistral style): a character outside the vocabulary arrives one byte token at a time,
and its bytes decode to one replacement character each until the last one completes it."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer as RawTokenizer
from tokenizers import decoders, models, normalizers

from shardinfer.engine.output_processor import check_stop
from shardinfer.engine.request import Request, RequestStatus
from shardinfer.engine.sampling_params import SamplingParams
from shardinfer.engine.tokenizer import Tokenizer

TEXT = "ab中xy"  # 中 is three bytes, E4 B8 AD: three byte tokens


@pytest.fixture(scope="module")
def byte_fallback(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for ch in "abxy▁":
        vocab[ch] = len(vocab)
    raw = RawTokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    raw.normalizer = normalizers.Replace(" ", "▁")
    raw.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    out = tmp_path_factory.mktemp("byte-fallback")
    raw.save(str(Path(out) / "tokenizer.json"))
    return Tokenizer(out)


def _run(
    tok: Tokenizer, ids: list[int], params: SamplingParams
) -> tuple[int, RequestStatus | None, object, str]:
    """Accept `ids` one at a time as the engine does; (tokens kept, status, stop_reason, text)."""
    req = Request("r", [3], params, 1, len(ids))
    for n in range(1, len(ids) + 1):
        req.output_token_ids = ids[:n]
        status, reason, text = check_stop(req, tok, 1024, n)
        req.output_text = text
        if status is not None:
            return n, status, reason, text
    return len(ids), None, None, req.output_text


def test_tokenizer_splits_the_character_into_bytes(byte_fallback: Tokenizer) -> None:
    ids = byte_fallback.encode(TEXT)
    assert len(ids) == 7 and byte_fallback.decode(ids[:4]) == "ab\ufffd\ufffd"


@pytest.mark.parametrize(
    ("stop", "include", "text"),
    [(["中"], False, "ab"), (["b中"], False, "a"), (["b中"], True, "ab中"), (["zz", "中x"], False, "ab")],
)
def test_stop_string_completed_by_a_byte_token_stops_at_that_token(
    byte_fallback: Tokenizer, stop: list[str], include: bool, text: str
) -> None:
    ids = byte_fallback.encode(TEXT)
    # The stop string is complete once the token that finishes it is accepted: 中's last byte
    # (token 5), or x (token 6) for "中x"; nothing after it is kept.
    last = 6 if stop[-1].endswith("x") else 5
    params = SamplingParams(max_tokens=len(ids), stop=stop, include_stop_str_in_output=include)
    assert _run(byte_fallback, ids, params) == (last, RequestStatus.FINISHED_STOPPED, stop[-1], text)


def test_stop_string_completed_by_the_last_allowed_token_is_a_stop(byte_fallback: Tokenizer) -> None:
    ids = byte_fallback.encode(TEXT)[:5]
    params = SamplingParams(max_tokens=5, stop=["中"])
    assert _run(byte_fallback, ids, params) == (5, RequestStatus.FINISHED_STOPPED, "中", "ab")


@pytest.mark.parametrize("stop", [["ab"], ["ab", "yyyyy"]])
def test_stop_string_written_before_min_tokens_does_not_stop_later(
    byte_fallback: Tokenizer, stop: list[str]
) -> None:
    # As vLLM: stop strings are looked for from min_tokens on, in the text new since then, each
    # string on its own (a longer one beside it does not widen the window).
    ids = byte_fallback.encode("abxy")
    params = SamplingParams(max_tokens=4, min_tokens=3, stop=stop)
    assert _run(byte_fallback, ids, params) == (4, RequestStatus.FINISHED_LENGTH, None, "abxy")


@pytest.mark.parametrize(("include", "text"), [(False, "ab中"), (True, "ab中x")])
def test_stop_token_text_is_kept_only_with_include_stop_str_in_output(
    byte_fallback: Tokenizer, include: bool, text: str
) -> None:
    # As vLLM: include_stop_str_in_output keeps the text of the stop token that ended the sample.
    ids = byte_fallback.encode(TEXT)
    x = ids[5]
    params = SamplingParams(max_tokens=len(ids), stop_token_ids=[x], include_stop_str_in_output=include)
    assert _run(byte_fallback, ids, params) == (6, RequestStatus.FINISHED_STOPPED, x, text)
