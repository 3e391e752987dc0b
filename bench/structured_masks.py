"""Grammar-mask cost per decode step for a batch of matchers (a measurement, not a test).

    python bench/structured_masks.py [--vocab 32000] [--batch 64] [--steps 40]

Trains a byte-level BPE of the asked size on Python sources of the standard library (so the
vocabulary looks like a real one: code, words, whitespace runs, punctuation), then walks `batch`
matchers through a JSON Schema, timing at each step:
  batched  StructuredOutputCompiler.fill_bitmasks for the whole batch (llguidance thread pool)
           over copies of the compiler's template; the serial and bool copies below share its
           lexer cache, so two runs in three find states another method has just built
  shared   the same batched call over copies of ONE private template that nothing else touches
           (the rows share one cache, behind one lock)
  pooled   copies of --templates templates taken in turn (default: one per mask thread), from a
           compiler of their own, whose fill gives each template's copies to one thread (what
           the engine's copies are)
  independent  the same batched call over matchers each compiled on its own: no lexer cache
           shared between rows (more work in all, but nothing for threads to contend on)
  serial   GrammarMatcher.fill_bitmask one row after another
  bool     GrammarMatcher.allowed_mask() per row (fill + unpack to a bool [V] tensor)
  apply    apply_bitmask on float32 [batch, V] logits (CPU)
"""

from __future__ import annotations

import argparse
import json
import sysconfig
import tempfile
import time
from pathlib import Path

import llguidance
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from shardinfer.engine.structured import (
    GrammarMatcher,
    StructuredOutputCompiler,
    allocate_bitmask,
    apply_bitmask,
    unpack_bitmask,
)

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
        "authors": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 4},
        "kind": {"enum": ["book", "article", "thesis"]},
        "score": {"type": "number"},
    },
    "required": ["title", "year", "authors", "kind"],
    "additionalProperties": False,
}


def stdlib_sources() -> list[str]:
    """The Python standard library's top-level modules: code, prose, whitespace, punctuation."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [f.read_text(errors="ignore") for f in sorted(stdlib.glob("*.py"))]


def train_tokenizer(vocab: int, out: Path) -> Path:
    text = stdlib_sources()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<|eos|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(text, trainer)
    path = out / "tokenizer.json"
    tok.save(str(path))
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--threads", type=int, default=None, help="llguidance threads (default: its own choice)")
    ap.add_argument(
        "--templates", type=int, default=None, help="templates for 'pooled' (default: one per thread)"
    )
    ap.add_argument("--out", default=None, help="folder for structured-masks-<vocab>-b<batch>.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = train_tokenizer(args.vocab, Path(tmp))
        tok_vocab = Tokenizer.from_file(str(path)).get_vocab_size()
        t0 = time.perf_counter()
        compiler = StructuredOutputCompiler(
            path, [0], tok_vocab, num_threads=args.threads, templates=args.templates
        )
        t_tok = time.perf_counter() - t0
        pooled_compiler = StructuredOutputCompiler(
            path, [0], tok_vocab, num_threads=args.threads, templates=args.templates
        )
    t0 = time.perf_counter()
    so_args = {"schema_type": "json", "schema": SCHEMA}
    compiler.compile(so_args)
    t_compile = time.perf_counter() - t0
    # Three copies of the batch walk the same tokens, one per method, so no method reads a mask
    # another one just computed for the same state.
    sets = {
        name: [compiler.matcher(so_args) for _ in range(args.batch)] for name in ("batched", "serial", "bool")
    }
    compiled = compiler.compile(so_args)
    template = llguidance.LLMatcher(compiler.tokenizer, compiled.grammar, log_level=0)
    t0 = time.perf_counter()
    sets["shared"] = [GrammarMatcher(compiled, template.deep_copy()) for _ in range(args.batch)]
    t_shared = time.perf_counter() - t0
    sets["pooled"] = [pooled_compiler.matcher(so_args) for _ in range(args.batch)]
    t0 = time.perf_counter()
    sets["independent"] = [compiled.new_matcher(independent=True) for _ in range(args.batch)]
    t_independent = time.perf_counter() - t0
    own_bitmask = allocate_bitmask(args.batch, compiler.vocab_size)
    shared_bitmask = allocate_bitmask(args.batch, compiler.vocab_size)
    pooled_bitmask = allocate_bitmask(args.batch, compiler.vocab_size)
    gen = torch.Generator().manual_seed(0)
    bitmask = allocate_bitmask(args.batch, compiler.vocab_size)
    single = allocate_bitmask(args.batch, compiler.vocab_size)
    logits = torch.randn(args.batch, compiler.vocab_size)
    times = {
        "batched": 0.0,
        "shared": 0.0,
        "pooled": 0.0,
        "independent": 0.0,
        "serial": 0.0,
        "bool": 0.0,
        "apply": 0.0,
    }
    rows = 0
    for step in range(args.steps):
        live = [i for i, m in enumerate(sets["batched"]) if not m.is_finished()]
        if not live:
            break
        rows += len(live)
        methods = {
            "batched": lambda live=live: compiler.fill_bitmasks(
                [(sets["batched"][i], i) for i in live], bitmask
            ),
            "shared": lambda live=live: compiler.fill_bitmasks(
                [(sets["shared"][i], i) for i in live], shared_bitmask
            ),
            "pooled": lambda live=live: pooled_compiler.fill_bitmasks(
                [(sets["pooled"][i], i) for i in live], pooled_bitmask
            ),
            "independent": lambda live=live: compiler.fill_bitmasks(
                [(sets["independent"][i], i) for i in live], own_bitmask
            ),
            "serial": lambda live=live: [sets["serial"][i].fill_bitmask(single, i) for i in live],
            "bool": lambda live=live: [sets["bool"][i].allowed_mask() for i in live],
            "apply": lambda: apply_bitmask(logits.clone(), bitmask),
        }
        # Matcher copies share llguidance's lexer cache, so whoever runs first at a new state pays
        # for building it: rotate the order so every method goes first equally often. The
        # shared, pooled and independent matchers share nothing with anyone, so their place in the order is moot.
        order = ["batched", "serial", "bool"]
        shift = step % 3
        for name in [*order[shift:], *order[:shift], "shared", "pooled", "independent", "apply"]:
            t0 = time.perf_counter()
            methods[name]()
            times[name] += time.perf_counter() - t0
        allowed = unpack_bitmask(bitmask, compiler.vocab_size)
        for i in live:  # a random walk stands in for the model
            choices = allowed[i].nonzero().flatten()
            token = int(choices[torch.randint(choices.numel(), (1,), generator=gen)])
            for matchers in sets.values():
                matchers[i].accept(token)
    steps = rows / args.batch
    report = {
        "vocab": compiler.vocab_size,
        "batch": args.batch,
        "steps": round(steps, 1),
        "tokenizer_build_s": round(t_tok, 3),
        "compile_ms": round(t_compile * 1e3, 2),
        "threads": args.threads,
        "templates": compiler.templates,
        # Building one sample's matcher: a template copy, or a grammar compiled for it alone.
        "shared_matcher_build_us": round(t_shared / args.batch * 1e6, 1),
        "independent_matcher_build_us": round(t_independent / args.batch * 1e6, 1),
    }
    for k, v in times.items():
        report[f"{k}_ms_per_step"] = round(v / steps * 1e3, 3)
        report[f"{k}_us_per_token"] = round(v / rows * 1e6, 1)
    print(json.dumps(report, indent=1))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"structured-masks-{args.vocab}-b{args.batch}.json").write_text(
            json.dumps(report, indent=1)
        )


if __name__ == "__main__":
    main()
