"""The user docs against the code they describe: job-spec keys, CLI flags, exit codes, columns.

Each check reads both sides fresh: the keys and defaults from the config dataclasses (through
`jobs.spec.valid_keys`, the function that accepts or refuses a key), the flags from the argparse
parser the CLI builds, the exit and row error codes from `shardinfer/errors.py`, the columns from
the writer's Arrow schemas; and from the docs, their reference tables and synopses. A key, flag,
code or column added to one side only fails here, naming it.

Markdown is parsed plainly: a section runs from its heading to the next heading of the same or a
higher level; a table is a run of lines starting with `|`, cut at pipes that are not escaped.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import tomllib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from shardinfer import errors
from shardinfer.engine import sampling_params
from shardinfer.errors import ConfigError
from shardinfer.jobs.cli import build_parser
from shardinfer.jobs.spec import SECTIONS, parse_conf, resolve, valid_keys
from shardinfer.pipeline import row_limits
from shardinfer.pipeline.config import TYPED_SECTIONS
from shardinfer.writers import schema as out_schema

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# Measurement records, kept as measured: not part of the reference checked here.
RECORDS = ("performance.md", "quantization.md")
# Where a section's key table lives when not in jobs.md under its own heading.
KEY_TABLE_ELSEWHERE = {"ray": "cluster.md"}

Table = list[list[str]]


def read(name: str) -> str:
    return (ROOT / name if name == "README.md" else DOCS / name).read_text(encoding="utf-8")


def user_docs() -> list[str]:
    return ["README.md", *sorted(p.name for p in DOCS.glob("*.md") if p.name not in RECORDS)]


def section(text: str, title: str) -> str:
    """The body under the first heading whose text is `title`, up to the next heading as high."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"(#+)\s+(.*?)\s*$", line)
        if m and m.group(2) == title:
            level = len(m.group(1))
            body = []
            for nxt in lines[i + 1 :]:
                h = re.match(r"(#+)\s", nxt)
                if h and len(h.group(1)) <= level:
                    break
                body.append(nxt)
            return "\n".join(body)
    raise AssertionError(f"no heading {title!r}")


def split_row(line: str) -> list[str]:
    inner = line.strip()
    inner = inner[1:] if inner.startswith("|") else inner
    inner = inner[:-1] if inner.endswith("|") and not inner.endswith("\\|") else inner
    return [c.strip() for c in re.split(r"(?<!\\)\|", inner)]


def tables(text: str) -> list[Table]:
    """Each markdown table of `text`: its header row first, the separator row dropped."""
    found: list[Table] = []
    current: Table = []
    for line in [*text.splitlines(), ""]:
        if line.lstrip().startswith("|"):
            cells = split_row(line)
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                current.append(cells)
        elif current:
            found.append(current)
            current = []
    return found


def table_headed(text: str, first: str) -> Table:
    """The one table of `text` whose first header cell is `first`."""
    matches = [t for t in tables(text) if t[0][0] == first]
    assert len(matches) == 1, f"expected one table headed {first!r}, found {len(matches)}"
    return matches[0]


def spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def code_blocks(text: str, lang: str = "") -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


# ---- job spec keys --------------------------------------------------------------------------------


def key_table(sec: str) -> Table:
    if sec in KEY_TABLE_ELSEWHERE:
        text = read(KEY_TABLE_ELSEWHERE[sec])
        lead = f"`[{sec}]` keys"  # the line that introduces the table there
        assert lead in text, f"docs/{KEY_TABLE_ELSEWHERE[sec]} has no {lead!r} table"
        return tables(text[text.index(lead) :])[0]
    return table_headed(section(read("jobs.md"), f"`[{sec}]`"), "key")


def literal(text: str) -> Any:
    """A default written as a TOML value (`0.1`, `"stat"`, `{}`); raises ValueError when it is not one."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        raise ValueError(text) from None


def check_default(where: str, key: str, cell: str, default: Any) -> None:
    """A default cell holding one TOML value must equal the code's default; one in words ("required",
    "unset", "today (UTC)") stands for a value the code leaves empty and fills or asks for later."""
    found = spans(cell)
    if len(found) == 1 and cell == f"`{found[0]}`":
        try:
            value = literal(found[0])
        except ValueError:
            pass  # a pattern such as `manual__<UTC time>`: a value made up at run time
        else:
            assert value == default and type(value) is type(default), (
                f"{where}: {key} documented default {cell} but the code's is {default!r}"
            )
            return
    assert default in (None, ""), f"{where}: {key} documented default {cell!r} but the code's is {default!r}"


def test_every_section_has_a_reference_heading() -> None:
    text = read("jobs.md")
    for sec in SECTIONS:
        assert re.search(rf"^### `\[{sec}\]`", text, re.M), f"docs/jobs.md has no '### `[{sec}]`' heading"


@pytest.mark.parametrize("sec", [*TYPED_SECTIONS, "engine"])
def test_key_table_matches_code(sec: str) -> None:
    table = key_table(sec)
    header = table[0]
    keys = valid_keys(sec)
    documented = {}
    for row in table[1:]:
        names = spans(row[0])
        assert len(names) == 1, f"[{sec}] row {row[0]!r}: one key per row"
        assert names[0] not in documented, f"[{sec}].{names[0]} is documented twice"
        documented[names[0]] = row
    assert sorted(set(keys) - set(documented)) == [], f"[{sec}] keys the docs' table lacks"
    assert sorted(set(documented) - set(keys)) == [], f"[{sec}] keys the docs list but the code refuses"
    if "default" in header:
        col = header.index("default")
        for key, row in documented.items():
            check_default(f"[{sec}]", key, row[col], keys[key])


def test_sampling_keys_and_defaults() -> None:
    text = section(read("jobs.md"), "`[sampling]`")
    keys = valid_keys("sampling")
    named = set(spans(text))
    assert sorted(set(keys) - named) == [], "[sampling] keys docs/jobs.md does not name"
    table = table_headed(text, "key")
    col = table[0].index("default")
    for row in table[1:]:
        names = spans(row[0])
        assert spans(row[col]) or row[col] == "unset", f"[sampling] row {row[0]!r}: default {row[col]!r}"
        values: list[Any] = [literal(v) for v in spans(row[col])] or [None] * len(names)  # "unset"
        if len(values) == 1:
            values *= len(names)  # one value for every key of the row
        assert len(values) == len(names), (
            f"[sampling] row {row[0]!r}: {len(names)} keys, {len(values)} defaults"
        )
        for name, value in zip(names, values, strict=True):
            assert name in keys, f"sampling.{name} is documented but is not a [sampling] key"
            default = keys[name]
            assert value == default and type(value) is type(default), (
                f"sampling.{name}: documented default {value!r}, the code's is {default!r}"
            )


MINIMAL = {"model": {"path": "m"}, "input": {"path": "in"}, "output": {"path": "out"}}


def test_keys_of_other_tools_are_refused_as_documented() -> None:
    """The Keys intro names keys other tools use: each is refused, and not with the generic message,
    except the typo example, whose suggestion the docs quote."""
    intro = section(read("jobs.md"), "Keys").strip().split("\n\n", 1)[0]  # its first paragraph
    dotted = [s for s in spans(intro) if re.fullmatch(rf"(?:{'|'.join(SECTIONS)})\.\w+", s)]
    assert dotted, "the Keys intro names no key"
    suggestions = dict(re.findall(r"`(\w+\.\w+)`\s+→\s+\"(did you mean '\w+'\?)\"", intro))
    for key in dotted:
        with pytest.raises(ConfigError) as err:
            resolve(MINIMAL, confs=[parse_conf(f"{key}=1")])
        message = str(err.value)
        if key in suggestions:
            assert suggestions[key] in message, message
        else:
            assert not message.startswith("unknown key"), f"{key}: {message}"


def test_conf_examples_name_real_keys() -> None:
    for name in user_docs():
        for key in re.findall(r"--conf '?([a-z_]+\.[a-z_]+)\b", read(name)):
            sec, _, field = key.partition(".")
            if sec == "section":  # the placeholder of `--conf section.key=value`
                continue
            assert sec in SECTIONS and field in valid_keys(sec), f"{name}: --conf {key} is not a job key"


def test_toml_snippets_resolve() -> None:
    snippets = [(name, block) for name in user_docs() for block in code_blocks(read(name), "toml")]
    assert snippets
    for name, block in snippets:
        try:
            resolve(tomllib.loads(block))
        except ConfigError as exc:
            raise AssertionError(f"{name}: a TOML example does not resolve: {exc}\n{block}") from None


def test_per_row_limits_match_code() -> None:
    bounds = {
        "n": [row_limits.MAX_SAMPLES_PER_ROW],
        "top_k": [sampling_params.MAX_TOP_K],
        "logprobs": [sampling_params.MAX_TOP_LOGPROBS],
        "stop": [row_limits.MAX_STOP_STRINGS, row_limits.MAX_STOP_STRING_CHARS],
        "stop_token_ids": [row_limits.MAX_STOP_TOKEN_IDS],
        "structured_output": [row_limits.MAX_SCHEMA_CHARS, row_limits.MAX_NESTING_DEPTH],
        "messages": [row_limits.MAX_NESTING_DEPTH],
    }
    table = table_headed(section(read("jobs.md"), "Per-row limits"), "value")
    seen = set()
    for row in table[1:]:
        first = spans(row[0])[0]
        if first not in bounds:
            continue
        seen.add(first)
        words = re.sub(r"\([^)]*\)", "", row[1])  # asides such as "(use -1 for off)"
        numbers = [int(n.replace(",", "")) for n in re.findall(r"\d[\d,]*", words)]
        assert numbers == bounds[first], f"per-row limit of {first}: docs {numbers}, code {bounds[first]}"
    assert seen == set(bounds)


# ---- command line ---------------------------------------------------------------------------------


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {
        opt: a
        for a in parser._actions
        for opt in a.option_strings
        if opt.startswith("--") and not isinstance(a, argparse._HelpAction)
    }


def synopsis(text: str) -> dict[str, str]:
    """`shardinfer CMD ...` entries of the first code block that has them, continuation lines joined."""
    entries: dict[str, str] = {}
    last = ""
    block = next(b for b in code_blocks(text) if re.search(r"^shardinfer submit ", b, re.M))
    for line in block.splitlines():
        m = re.match(r"shardinfer (\w+)\s*(.*)", line)
        if m:
            last = m.group(1)
            entries[last] = m.group(2)
        elif last and line.startswith(" "):
            entries[last] += " " + line.strip()
    return {cmd: entry.split("#", 1)[0] for cmd, entry in entries.items()}


def synopsis_flags(entry: str) -> dict[str, bool]:
    """Each `--flag` of an entry -> whether it is shown required (outside any [...])."""
    found = {}
    for m in re.finditer(r"--[a-z][a-z-]*", entry):
        before = entry[: m.start()]
        found[m.group(0)] = before.count("[") == before.count("]")
    return found


def test_every_subcommand_has_a_section_and_a_synopsis() -> None:
    text = read("cli.md")
    entries = synopsis(text)
    for cmd in subparsers():
        section(text, cmd)
        assert cmd in entries, f"docs/cli.md's synopsis lacks `shardinfer {cmd}`"
    assert sorted(set(entries) - set(subparsers())) == []


@pytest.mark.parametrize("doc", ["cli.md", "README.md"])
def test_synopsis_flags_match_parser(doc: str) -> None:
    """docs/cli.md shows every flag of every subcommand; the README's shorter synopsis only real ones.
    Both: a flag outside brackets is required, one inside is optional, and `a|b` is its choices."""
    parsers = subparsers()
    entries = synopsis(read(doc))
    for cmd, entry in entries.items():
        real = flags(parsers[cmd])
        shown = synopsis_flags(entry)
        same_as = re.search(r"same flags as (\w+)", entry)
        if same_as:  # `generate`: submit's flags, then its own
            other = flags(parsers[same_as.group(1)])
            assert sorted(set(real) - set(shown)) == sorted(other), (
                f"{cmd}: not the same flags as {same_as.group(1)}"
            )
            shown |= synopsis_flags(entries[same_as.group(1)])
        assert sorted(set(shown) - set(real)) == [], f"{doc}: `shardinfer {cmd}` shows flags it does not take"
        if doc == "cli.md":
            assert sorted(set(real) - set(shown)) == [], f"{doc}: `shardinfer {cmd}` flags not shown"
        for flag, required in shown.items():
            assert real[flag].required == required, (
                f"{doc}: {cmd} {flag} shown {'required' * required or 'optional'}"
            )
            choices = re.search(rf"{flag} ([a-z]+(?:\|[a-z]+)+)\b(?!\[)", entry)
            allowed = real[flag].choices
            if choices and allowed is not None:
                assert choices.group(1).split("|") == list(allowed), f"{doc}: {cmd} {flag} choices"


# A flag the docs name only as a mistake the CLI recognises (`--set KEY=VALUE`: use --conf).
NOT_FLAGS = {"--set"}


def test_every_documented_flag_exists() -> None:
    text = read("cli.md")
    real = set(flags(build_parser())) | {f for p in subparsers().values() for f in flags(p)}
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*[a-z]", text))
    assert sorted(named - real - NOT_FLAGS) == [], "flags docs/cli.md names that no command takes"


def test_flag_tables_belong_to_their_command() -> None:
    """The `| flag | meaning |` tables under `## CMD`: each flag is CMD's, and a "(default X)" or
    "(the default)" matches the parser's default."""
    text = read("cli.md")
    for cmd, parser in subparsers().items():
        real = flags(parser)
        for table in tables(section(text, cmd)):
            if table[0][0] != "flag":
                continue
            for row in table[1:]:
                for m in re.finditer(r"`(--[a-z-]+)(?: ([^`]+))?`", row[0]):
                    flag, value = m.group(1), m.group(2)
                    assert flag in real, f"`{cmd}` table documents {flag}, which `{cmd}` does not take"
                    default = re.search(r"\(default `?([^`)]+)`?\)", row[1])
                    if default and row[0].count("`--") == 1:
                        assert str(real[flag].default) == default.group(1), f"{cmd} {flag} default"
                    if "(the default)" in row[1]:
                        assert real[flag].default == value, f"{cmd} {flag}: {value} is not the default"


# ---- exit codes and row error codes --------------------------------------------------------------


def exit_codes() -> dict[str, int]:
    return {n: v for n, v in vars(errors).items() if n.startswith("EXIT_") and isinstance(v, int)}


def test_exit_code_table_matches_constants() -> None:
    table = table_headed(section(read("cli.md"), "Exit codes"), "code")
    meanings = {int(row[0]): row[1] for row in table[1:]}
    assert sorted(meanings) == sorted(exit_codes().values())
    for name, code in exit_codes().items():
        word = name.removeprefix("EXIT_").lower().replace("_", " ")  # EXIT_NO_INPUT -> "no input"
        if code not in (errors.EXIT_OK, errors.EXIT_FAILURE):  # "done" and "anything else"
            assert meanings[code].startswith(word), (
                f"exit {code} ({name}) is documented as {meanings[code]!r}"
            )


@pytest.mark.parametrize(("doc", "lead"), [("README.md", "Exit codes:"), ("architecture.md", "exit codes (")])
def test_exit_codes_in_prose(doc: str, lead: str) -> None:
    text = " ".join(read(doc).split())
    start = text.index(lead) + len(lead)
    end = text.index("anything else", start) if "anything else" in text[start:] else text.index(")", start)
    listed = [int(n) for n in re.findall(r"\b\d+\b", text[start:end])]
    assert sorted(listed) == sorted(exit_codes().values()), f"{doc}: exit codes {listed}"


def test_row_error_codes_match_constants() -> None:
    code_side = {v for n, v in vars(errors).items() if n.isupper() and isinstance(v, str) and v == n.lower()}
    table = table_headed(section(read("jobs.md"), "Rows that cannot be generated"), "`error_code`")
    documented = {code for row in table[1:] for code in spans(row[0])}
    assert documented == code_side


# ---- output columns -------------------------------------------------------------------------------


def doc_type(t: pa.DataType) -> str:
    """An Arrow type as the docs write it: list<int32>, list<struct>."""
    text = str(t).replace("item: ", "")
    text = re.sub(r"\bfloat\b", "float32", re.sub(r"\bdouble\b", "float64", text))  # Arrow's C names
    return re.sub(r"struct<[^<>]*>", "struct", text)


def check_columns(table: Table, fields: list[pa.Field], what: str) -> None:
    header = table[0]
    rows = table[1:]
    assert [spans(r[0])[0] for r in rows] == [f.name for f in fields], f"{what}: columns or their order"
    for row, f in zip(rows, fields, strict=True):
        assert row[header.index("type")] == doc_type(f.type), f"{what}.{f.name}: type"
        if "null?" in header:
            assert (row[header.index("null?")] == "never") == (not f.nullable), f"{what}.{f.name}: null?"


def test_output_columns_match_schema() -> None:
    text = read("output-schema.md")
    full = out_schema.output_schema(top_logprobs=True, prompt_logprobs=True)
    base = [full.field(n) for n in out_schema.BASE_COLUMNS]
    optional = [full.field(n) for n in out_schema.OPTIONAL_COLUMNS]
    assert [f.name for f in full] == [*out_schema.BASE_COLUMNS, *out_schema.OPTIONAL_COLUMNS]
    generate = [t for t in tables(section(text, "One row per (input row, sample)")) if t[0][0] == "column"]
    assert len(generate) == 2, "expected the fixed and the optional column tables"
    check_columns(generate[0], base, "output")
    check_columns(generate[1], optional, "optional output")
    check_columns(
        table_headed(section(text, "Score jobs"), "column"), list(out_schema.score_output_schema()), "score"
    )
    written = re.search(r"`OUTPUT_SCHEMA_VERSION = (\d+)`", text)
    assert written and int(written.group(1)) == out_schema.OUTPUT_SCHEMA_VERSION


def test_numerics_keys_are_the_fingerprints() -> None:
    from shardinfer.pipeline.fingerprint import NUMERICS_ENGINE_KEYS

    text = " ".join(section(read("jobs.md"), "`[engine]`").split())
    listed = re.search(r"((?:`\w+`(?:, | and ))+`\w+`) are numerics", text)
    assert listed, "docs/jobs.md's [engine] no longer says which keys are numerics"
    assert sorted(spans(listed.group(1))) == sorted(NUMERICS_ENGINE_KEYS)


# ---- the README's Python API ----------------------------------------------------------------------


def paragraph(text: str, lead: str) -> str:
    """The paragraph of `text` that starts with `lead`."""
    matches = [p for p in re.split(r"\n\s*\n", text) if p.startswith(lead)]
    assert len(matches) == 1, f"expected one paragraph starting {lead!r}"
    return matches[0]


def test_readme_names_every_llm_keyword_and_sampling_field() -> None:
    from shardinfer.engine.config import EngineConfig
    from shardinfer.engine.sampling_params import SamplingParams

    readme = read("README.md")
    keywords = set(spans(paragraph(readme, "`LLM` keywords:")))
    engine = {f.name for f in dataclasses.fields(EngineConfig)} - {"model"}  # LLM's first argument
    assert sorted(engine - keywords) == [], "LLM keywords the README does not name"
    fields = set(spans(paragraph(readme, "`SamplingParams`:")))
    assert sorted(set(SamplingParams.field_names()) - fields) == [], (
        "SamplingParams fields the README does not name"
    )


def test_readme_names_every_output_field() -> None:
    from shardinfer.engine.outputs import CompletionOutput, RequestOutput

    text = paragraph(read("README.md"), "Outputs:")
    for prefix, cls in (("o", RequestOutput), ("c", CompletionOutput)):
        named = set(re.findall(rf"`{prefix}\.(\w+)`", text))
        fields = {f.name for f in dataclasses.fields(cls)}
        properties = {n for n, v in vars(cls).items() if isinstance(v, property)}
        assert sorted(fields - named) == [], f"{cls.__name__} fields the README does not name"
        assert sorted(named - fields - properties) == [], f"README names {cls.__name__} attributes it lacks"


# ---- what the docs cite ---------------------------------------------------------------------------


def test_cited_files_and_tests_exist() -> None:
    """Every repository path and test name a user doc cites is there (a rename leaves no stale pointer)."""
    test_source = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "tests").rglob("*.py"))
    package = ROOT / "shardinfer"
    for name in user_docs():
        text = read(name)
        for path in set(re.findall(r"`((?:tests|shardinfer|bench|examples|tools)/[\w./*-]+)`", text)):
            assert list(ROOT.glob(path.rstrip("/"))), f"{name} cites {path}, which does not exist"
        # Package-relative module paths (`engine/heap.py`, `models/registry.py`, `jobs/unstarted.py`).
        for path in set(re.findall(r"`(?:\w+/)+\w+\.py`", text)):
            rel = path.strip("`")
            if rel.split("/")[0] in ("tests", "shardinfer", "bench", "examples", "tools"):
                continue
            assert (package / rel).exists() or (package / "engine" / rel).exists(), f"{name} cites {rel}"
        for test in set(re.findall(r"`(test_\w+)`", text)):
            assert re.search(rf"def {test}\b", test_source), f"{name} cites {test}, which no test defines"


def test_package_maps_name_every_package() -> None:
    """docs/architecture.md's and the README's package tables list every subpackage and top-level
    module of shardinfer (the entry points `__init__`/`__main__` aside), and nothing else."""
    package = ROOT / "shardinfer"
    real = {p.name for p in package.iterdir() if p.is_dir() and any(p.glob("*.py"))}  # engine/: no __init__
    real |= {p.stem for p in package.glob("*.py") if not p.stem.startswith("__")}
    for doc, header in (("architecture.md", "package"), ("README.md", "package")):
        table = table_headed(read(doc), header)
        named = {Path(s.rstrip("/")).stem for row in table[1:] for s in spans(row[0])}
        assert named == real, f"{doc}: package table names {sorted(named ^ real)} wrongly"
