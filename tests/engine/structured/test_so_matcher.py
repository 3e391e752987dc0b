"""GrammarMatcher state: masks, rollback, reset, fork, violations, batched filling, bitmask helpers."""

from __future__ import annotations

import pytest
import torch

from shardinfer.engine.structured import (
    GrammarViolation,
    StructuredOutputCompiler,
    allocate_bitmask,
    apply_bitmask,
    unpack_bitmask,
)

SCHEMA = {
    "schema_type": "json",
    "schema": {
        "type": "object",
        "properties": {
            "k": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "maxItems": 3},
            "s": {"enum": ["x", "yy"]},
        },
        "required": ["k", "s"],
        "additionalProperties": False,
    },
}


def _walk_with_masks(matcher, random_walk_fn, seed):
    """Replays a seeded walk, recording the mask before each token and after the last one."""
    tokens = random_walk_fn(matcher.fork(), seed)
    masks = []
    for t in tokens:
        masks.append(matcher.allowed_mask())
        matcher.accept(t)
    masks.append(matcher.allowed_mask())
    return tokens, masks


def test_mask_shape_extra_ids_special_tokens_and_eos(compiler, random_walk, eos_id, pad_id, tok_vocab):
    m = compiler.matcher(SCHEMA)
    tokens, masks = _walk_with_masks(m, random_walk, seed=3)
    assert m.is_finished()
    replay = compiler.matcher(SCHEMA)
    for t, mask in zip(tokens, masks, strict=False):
        assert mask.dtype == torch.bool and mask.shape == (compiler.vocab_size,)
        assert compiler.vocab_size > tok_vocab
        assert not mask[tok_vocab:].any()  # ids the model has but the tokenizer lacks: never
        assert not mask[pad_id]  # a special token other than eos: never
        assert bool(mask[eos_id]) == replay.can_finish()  # eos exactly where the text may end
        assert mask[t]
        replay.accept(t)
    # The start is forced ('{"k":['), so every allowed first token spells a prefix of it.
    first = [compiler.tokenizer.decode_str([int(t)]) for t in masks[0].nonzero().flatten()]
    assert first and all('{"k":['.startswith(text) for text in first), first


def test_rollback_restores_the_exact_mask(compiler, random_walk):
    m = compiler.matcher(SCHEMA)
    tokens, masks = _walk_with_masks(m, random_walk, seed=5)
    assert len(tokens) > 6
    for n in (1, 2, len(tokens) - 3, len(tokens)):
        probe = m.fork()
        probe.rollback(n)
        assert probe.num_accepted == len(tokens) - n
        assert probe.allowed_mask().equal(masks[len(tokens) - n]), n
        assert not probe.is_finished()
        # Re-accepting the same tokens brings back the same state, eos included.
        for t in tokens[len(tokens) - n :]:
            probe.accept(t)
        assert probe.is_finished() and probe.allowed_mask().equal(masks[-1])
    with pytest.raises(ValueError, match="only"):
        m.rollback(len(tokens) + 1)


def test_reset_returns_to_the_start(compiler, random_walk):
    m = compiler.matcher(SCHEMA)
    start = m.allowed_mask()
    random_walk(m, 1)
    m.reset()
    assert m.num_accepted == 0 and not m.is_finished() and m.allowed_mask().equal(start)


def test_fork_is_independent(compiler):
    so_args = {"schema_type": "regex", "schema": "(ab|cd)e"}
    m = compiler.matcher(so_args)
    a, c = compiler.tokenizer.tokenize_str("a")[0], compiler.tokenizer.tokenize_str("c")[0]
    start = m.allowed_mask()
    child = m.fork()
    child.accept(a)
    assert m.allowed_mask().equal(start)  # the parent did not move
    m.accept(c)
    fresh_a, fresh_c = compiler.matcher(so_args), compiler.matcher(so_args)
    fresh_a.accept(a)
    fresh_c.accept(c)
    assert child.allowed_mask().equal(fresh_a.allowed_mask())
    assert m.allowed_mask().equal(fresh_c.allowed_mask())
    assert not child.allowed_mask().equal(m.allowed_mask())
    grandchild = child.fork()
    assert grandchild.num_accepted == 1 and grandchild.allowed_mask().equal(child.allowed_mask())


def test_disallowed_token_raises_and_validate_does_not_move(compiler, eos_id, tok_vocab):
    m = compiler.matcher({"schema_type": "regex", "schema": "ab"})
    a, b = compiler.tokenizer.tokenize_str("a")[0], compiler.tokenizer.tokenize_str("b")[0]
    assert m.validate([a, b, eos_id]) == 3
    assert m.validate([a, a, b]) == 1
    assert m.validate([tok_vocab + 1]) == 0
    assert m.num_accepted == 0
    with pytest.raises(GrammarViolation, match="outside the vocabulary"):
        m.accept(compiler.vocab_size)
    with pytest.raises(GrammarViolation, match="not allowed"):
        m.accept(eos_id)  # the empty text does not match "ab"
    with pytest.raises(GrammarViolation, match="error state"):
        m.allowed_mask()


def test_can_finish_versus_is_finished(compiler, eos_id):
    m = compiler.matcher({"schema_type": "regex", "schema": "a+"})
    a = compiler.tokenizer.tokenize_str("a")[0]
    assert not m.can_finish()
    m.accept(a)
    assert m.can_finish() and not m.is_finished()  # more "a"s may follow
    m.accept(eos_id)
    assert m.is_finished()
    closed = compiler.matcher({"schema_type": "regex", "schema": "a"})
    closed.accept(a)
    assert closed.is_finished()  # nothing can follow, so it is done without an eos
    only = closed.allowed_mask()
    assert only.sum() == 1 and only[eos_id]


def test_batched_fill_matches_single_masks(compiler, random_walk):
    schemas = [
        SCHEMA,
        {"schema_type": "regex", "schema": r"[a-z]{2,9}"},
        {"schema_type": "ebnf", "schema": 'root ::= "(" [0-9]+ ")"'},
    ]
    matchers = []
    for i in range(9):
        m = compiler.matcher(schemas[i % 3])
        walked = random_walk(m.fork(), i, eos_bias=0.0, max_tokens=i % 4)  # stop at various depths
        for t in walked:
            m.accept(t)
        matchers.append(m)
    bitmask = allocate_bitmask(12, compiler.vocab_size)
    rows = [0, 2, 3, 5, 6, 7, 8, 10, 11]  # rows 1, 4 and 9 carry no grammar
    compiler.fill_bitmasks(list(zip(matchers, rows, strict=True)), bitmask)
    allowed = unpack_bitmask(bitmask, compiler.vocab_size)
    for m, row in zip(matchers, rows, strict=True):
        assert allowed[row].equal(m.allowed_mask())
        single = allocate_bitmask(1, compiler.vocab_size)
        m.fill_bitmask(single, 0)
        assert single[0].equal(bitmask[row])
    for row in (1, 4, 9):
        assert (bitmask[row] == -1).all()


def test_independent_matchers_give_the_masks_of_copies(compiler, tokenizer_path, eos_id, random_walk):
    """Matchers built per sample (no lexer cache shared with the template) walk the same grammar:
    the same mask at every step of a walk, batched and alone, and each starts fresh."""
    independent = StructuredOutputCompiler(
        tokenizer_path, [eos_id], compiler.vocab_size, independent_matchers=True
    )
    schemas = [SCHEMA, {"schema_type": "regex", "schema": r"[a-z]{2,9}"}]
    for seed in range(4):
        so_args = schemas[seed % 2]
        tokens, masks = _walk_with_masks(compiler.matcher(so_args), random_walk, seed)
        m = independent.matcher(so_args)
        assert m.ll_matcher is not independent.matcher(so_args).ll_matcher
        bitmask = allocate_bitmask(2, compiler.vocab_size)
        for t, want in zip([*tokens, None], masks, strict=True):
            assert m.allowed_mask().equal(want)
            independent.fill_bitmasks([(m, 1)], bitmask)
            assert unpack_bitmask(bitmask, compiler.vocab_size)[1].equal(want)
            if t is not None:
                m.accept(t)
        assert m.num_accepted == len(tokens)


def test_fill_rejects_wrong_bitmask(compiler):
    m = compiler.matcher({"schema_type": "regex", "schema": "a"})
    with pytest.raises(ValueError, match="int32"):
        m.fill_bitmask(torch.zeros(1, 3, dtype=torch.int32), 0)
    with pytest.raises(ValueError, match="row=4"):
        compiler.fill_bitmasks([(m, 4)], allocate_bitmask(2, compiler.vocab_size))


def test_unpack_bitmask_matches_bit_arithmetic():
    gen = torch.Generator().manual_seed(0)
    words = torch.randint(-(2**31), 2**31 - 1, (3, 4), generator=gen, dtype=torch.int64).to(torch.int32)
    vocab = 4 * 32 - 5
    got = unpack_bitmask(words, vocab)
    for b in range(3):
        for t in range(vocab):
            word = int(words[b, t // 32]) & 0xFFFFFFFF
            assert bool(got[b, t]) == bool((word >> (t % 32)) & 1)


def test_apply_bitmask_sets_disallowed_to_minus_inf(compiler):
    vocab = compiler.vocab_size
    matchers = [compiler.matcher({"schema_type": "regex", "schema": p}) for p in ("[0-9]+", "yes|no")]
    bitmask = allocate_bitmask(2, vocab)
    compiler.fill_bitmasks([(matchers[0], 0), (matchers[1], 1)], bitmask)
    logits = torch.randn(3, vocab, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    expected = logits.clone()
    for row, m in enumerate(matchers):
        expected[row][~m.allowed_mask()] = float("-inf")
    full = torch.cat([bitmask, allocate_bitmask(1, vocab)])  # row 2: no grammar
    assert apply_bitmask(logits.clone(), full).equal(expected)
    # Masking only the grammar rows gives the same result.
    assert apply_bitmask(logits.clone(), bitmask, rows=torch.tensor([0, 1])).equal(expected)
    with pytest.raises(ValueError, match="rows"):
        apply_bitmask(logits.clone(), bitmask)


def test_draft_masks_match_masks_after_each_draft_prefix(compiler, random_walk):
    m = compiler.matcher(SCHEMA)
    for t in random_walk(m.fork(), 8, eos_bias=0.0, max_tokens=2):
        m.accept(t)
    draft = random_walk(m.fork(), 9, eos_bias=0.0, max_tokens=5)
    assert len(draft) == 5
    bitmask = allocate_bitmask(8, compiler.vocab_size)
    compiler.fill_bitmasks_with_drafts([(m, 1, draft)], bitmask)
    assert m.num_accepted == 2 and m.validate(draft) == 5  # the matcher did not move
    probe = m.fork()
    allowed = unpack_bitmask(bitmask, compiler.vocab_size)
    for i in range(len(draft) + 1):
        assert allowed[1 + i].equal(probe.allowed_mask()), i
        if i < len(draft):
            probe.accept(draft[i])
    assert (bitmask[0] == -1).all() and (bitmask[7] == -1).all()
    with pytest.raises(ValueError, match="do not fit"):
        compiler.fill_bitmasks_with_drafts([(m, 3, draft)], bitmask)
