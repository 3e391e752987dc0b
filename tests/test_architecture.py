"""Every import inside shardinfer points down the package map of docs/architecture.md.

    jobs -> integrations -> pipeline -> testing -> {readers, writers, engine} -> kernels -> ground floor

A module may import its own component and any component below it; siblings (readers, writers,
engine) do not import each other. The ground floor (errors, redaction, splits, storage) is importable from
everywhere and imports only what GROUND allows. Every import statement counts,
including those inside functions and under TYPE_CHECKING: a lazy import is still a dependency.
The checker is first run on a small made-up package with bad imports, to see that it catches them.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "shardinfer"

# Components above the ground floor, by height: a module may import components of lower rank.
RANK = {
    "kernels": 1,
    "engine": 2,
    "readers": 2,
    "writers": 2,
    "testing": 3,  # test helpers may build on the stages; the pipeline calls its fault injection
    "pipeline": 4,
    "integrations": 5,
    "jobs": 6,
}
# Ground-floor components and what each of them may import (besides itself).
GROUND: dict[str, set[str]] = {
    "errors": set(),
    "redaction": set(),
    "splits": set(),
    "storage": {"errors"},
}
# Entry points on top of everything: `python -m shardinfer` and the lazy public facade.
TOP = {"__main__", "__init__"}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1 and path.parent != root:
        parts = parts[:-1]
    return ".".join(parts)


def imported_modules(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import of the package in `path`'s source."""
    package = root.name
    name = module_name(path, root)
    is_package = path.name == "__init__.py"
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                # `from shardinfer.x import y` imports module x.y when y is a submodule.
                sub = root.parent.joinpath(*f"{base}.{alias.name}".split("."))
                is_module = sub.with_suffix(".py").is_file() or (sub / "__init__.py").is_file()
                found.append((node.lineno, f"{base}.{alias.name}" if is_module else base))
    return [(line, mod) for line, mod in found if mod == package or mod.startswith(package + ".")]


def component(module: str) -> str:
    """'shardinfer.pipeline.job' -> 'pipeline'; 'shardinfer.errors' -> 'errors'; 'shardinfer' -> '__init__'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def allowed(importer: str, imported: str) -> bool:
    if importer == imported or importer in TOP:
        return True
    if imported in TOP:  # the facade and the entry point are for users, never for the package
        return False
    if importer in GROUND:
        return imported in GROUND[importer]
    return imported in GROUND or RANK[imported] < RANK[importer]


def violations(root: Path) -> list[str]:
    known = set(RANK) | set(GROUND) | TOP
    problems = []
    for path in sorted(root.rglob("*.py")):
        importer = component(module_name(path, root)) if path.parent != root else path.stem
        if importer not in known:
            problems.append(f"{path.relative_to(root.parent)}: {importer!r} is not on the package map")
            continue
        for line, module in imported_modules(path, root):
            imported = component(module)
            if imported not in known:
                problems.append(
                    f"{path.relative_to(root.parent)}:{line}: imports {module}, not on the package map"
                )
            elif not allowed(importer, imported):
                problems.append(
                    f"{path.relative_to(root.parent)}:{line}: {importer} may not import {module} ({imported})"
                )
    return problems


def test_the_package_imports_only_downwards() -> None:
    problems = violations(PACKAGE)
    assert not problems, (
        "imports against the package map (docs/architecture.md); move the shared piece down "
        "to a lower layer instead:\n" + "\n".join(problems)
    )


def test_every_component_is_on_the_map() -> None:
    top_level = {p.stem for p in PACKAGE.glob("*.py")} | {p.name for p in PACKAGE.iterdir() if p.is_dir()}
    top_level -= {"__pycache__"}
    assert top_level <= set(RANK) | set(GROUND) | TOP, top_level - (set(RANK) | set(GROUND) | TOP)


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, source in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)


def test_the_checker_catches_bad_imports(tmp_path: Path) -> None:
    root = tmp_path / "shardinfer"
    _write(
        root,
        {
            "__init__.py": "",
            "errors.py": "import shardinfer.splits\n",  # the ground floor's own rules
            "splits.py": "",
            "storage.py": "from shardinfer import errors\n",  # allowed
            "kernels/__init__.py": "",
            "kernels/ops.py": "def f():\n    from shardinfer.engine import llm\n",  # upward, lazily
            "engine/__init__.py": "",
            "engine/llm.py": "from ..kernels import ops\nfrom . import sampler\n",  # relative, allowed
            "engine/sampler.py": "from shardinfer.readers.spec import X\n",  # sibling
            "readers/__init__.py": "",
            "readers/spec.py": "from shardinfer.splits import Split\n",  # allowed
            "writers/__init__.py": "",
            "writers/out.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from shardinfer.pipeline.job import J\n"  # upward, type-only
            ),
            "pipeline/__init__.py": "",
            "pipeline/job.py": "from shardinfer import LLM\nfrom shardinfer.writers import out\n",
            "jobs/__init__.py": "",
            "jobs/cli.py": "import shardinfer.pipeline.job\nimport shardinfer.gadgets\n",
            "gadgets.py": "",
        },
    )
    assert violations(root) == [
        "shardinfer/engine/sampler.py:1: engine may not import shardinfer.readers.spec (readers)",
        "shardinfer/errors.py:1: errors may not import shardinfer.splits (splits)",
        "shardinfer/gadgets.py: 'gadgets' is not on the package map",
        "shardinfer/jobs/cli.py:2: imports shardinfer.gadgets, not on the package map",
        "shardinfer/kernels/ops.py:2: kernels may not import shardinfer.engine.llm (engine)",
        "shardinfer/pipeline/job.py:1: pipeline may not import shardinfer (__init__)",
        "shardinfer/writers/out.py:3: writers may not import shardinfer.pipeline.job (pipeline)",
    ]
