"""A jinja2 sandbox whose every render has a budget: time, loop steps and the size of what it builds.

A chat template is code from a checkpoint, rendered once per row on the preparation thread. The
plain sandbox stops it reaching Python internals but not from running forever: two nested
`range(100000)` loops are ten billion steps, `'x' * 10**10` or a string doubled forty times
exhausts memory, and one such row stalls the whole job. Here each render gets a `RenderBudget`;
going past any part of it raises `TemplateBudgetExceeded` (a jinja `TemplateError`, so callers
that turn template errors into a row's `template_error` need nothing more).

How each part is enforced, without threads or signals (rendering runs on whatever thread asks):
- every `{% for %}` is rewritten at compile time to iterate through a counting filter, and every
  call (functions, methods, macros, recursive `loop(...)`) counts too; each count checks the
  step limit and the deadline, so no loop nesting or recursion escapes them;
- `*`, `**`, `+` and `%` are intercepted and refused before they build a string or list longer
  than `max_chars` (or an integer with more than `MAX_INT_BITS` bits); `~` concatenation and every
  captured block and the output itself are joined by a `concat` that counts characters first;
- an integer argument above `max_chars` to any call or filter is refused before the call: it is
  how `center`, `indent`, `ljust`, `batch`, `slice` and format widths would allocate unbounded text.

The budget is per render (it lives on the render's jinja Context), so one compiled template is
safe to render from several threads. Subclass `BudgetedSandbox` to add filters and globals.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from jinja2 import nodes, pass_context
from jinja2.exceptions import TemplateRuntimeError
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

MAX_INT_BITS = 4096  # a `**` result larger than this is refused: no template needs such numbers
_COUNTING_FILTER = "budget-counted"  # not an identifier: templates cannot name it themselves
_CONCAT_FILTER = "budget-concat"
_PRINTF_NUMBER = re.compile(r"%[#0\- +]*(\d+)?(?:\.(\d+))?")
_FORMAT_NUMBER = re.compile(r"\{[^{}]*:[^{}\d]*(\d+)(?:\.(\d+))?[^{}]*\}")


class TemplateBudgetExceeded(TemplateRuntimeError):
    """A render went past its RenderBudget; the message says which part and how to proceed."""


@dataclass(frozen=True)
class RenderBudget:
    """Limits of one render. Real chat templates use a tiny fraction of each."""

    seconds: float = 2.0
    max_steps: int = 1_000_000  # loop iterations plus calls
    max_chars: int = 4_000_000  # of any string or list the template builds, and of its output


class _Meter:
    """Counts one render's steps against its budget."""

    def __init__(self, budget: RenderBudget) -> None:
        self.budget = budget
        self.steps = 0
        self.deadline = time.monotonic() + budget.seconds

    def step(self) -> None:
        self.steps += 1
        if self.steps > self.budget.max_steps:
            raise TemplateBudgetExceeded(
                f"the chat template took more than {self.budget.max_steps} loop steps and calls for one "
                "conversation; it loops without bound on this input"
            )
        if time.monotonic() > self.deadline:
            raise TemplateBudgetExceeded(
                f"the chat template took more than {self.budget.seconds}s to render one conversation"
            )


class _BudgetedContext(Context):
    """A render's context, carrying that render's meter (a Context is created per render)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        budget = getattr(self.environment, "budget", RenderBudget())
        self.meter = _Meter(budget)


def _meter(context: Context) -> _Meter:
    meter = getattr(context, "meter", None)
    if not isinstance(meter, _Meter):  # a context built by hand, outside a render
        meter = _Meter(RenderBudget())
        context.meter = meter  # type: ignore[attr-defined]
    return meter


class BudgetedSandbox(ImmutableSandboxedEnvironment):
    """ImmutableSandboxedEnvironment with a RenderBudget on every render (see the module docstring)."""

    context_class = _BudgetedContext
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, *args: Any, budget: RenderBudget | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.budget = budget or RenderBudget()
        self.filters[_COUNTING_FILTER] = _counted
        self.filters[_CONCAT_FILTER] = _bounded_concat
        for name, function in list(self.filters.items()):
            if name not in (_COUNTING_FILTER, _CONCAT_FILTER):
                self.filters[name] = _checked_filter(function, self.budget)

    def _generate(self, source: nodes.Template, *args: Any, **kwargs: Any) -> str:
        """Rewrite the parsed template before it is compiled: loops count their steps, `~` counts
        its characters."""
        _Budgeting().visit(source)
        return str(super()._generate(source, *args, **kwargs))

    def concat(self, chunks: Iterable[str]) -> str:  # type: ignore[override]
        """The join jinja uses for the output and for every captured block, counting first."""
        return _join_within(chunks, self.budget.max_chars)

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        _meter(__context).step()
        _check_numbers(args, kwargs, __self.budget.max_chars, getattr(__obj, "__name__", "a call"))
        result = super().call(__context, __obj, *args, **kwargs)
        _check_size(result, __self.budget.max_chars)
        return result

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        limit = self.budget.max_chars
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if (
                    isinstance(seq, str | list | tuple)
                    and isinstance(times, int)
                    and len(seq) * times > limit
                ):
                    raise TemplateBudgetExceeded(f"'*' would build {len(seq) * times} items, above {limit}")
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
                bits = right * math.log2(abs(left))
                if bits > MAX_INT_BITS:
                    raise TemplateBudgetExceeded(
                        f"'**' would build a {bits:.0f}-bit number, above {MAX_INT_BITS}"
                    )
        elif operator == "%" and isinstance(left, str):
            _check_format_widths(left, _PRINTF_NUMBER, limit)
        elif operator == "+" and _sized(left) and _sized(right) and len(left) + len(right) > limit:
            raise TemplateBudgetExceeded(f"'+' would build {len(left) + len(right)} items, above {limit}")
        result = self.binop_table[operator](left, right)
        _check_size(result, limit)
        return result

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """`str.format` reached from a template: its literal widths are checked before formatting
        (widths taken from arguments are checked by `call`, as every argument is)."""
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt, limit = value.__self__, self.budget.max_chars

        def checked(*args: Any, **kwargs: Any) -> str:
            _check_format_widths(fmt, _FORMAT_NUMBER, limit)
            return wrapped(*args, **kwargs)

        return checked


class _Budgeting(NodeTransformer):
    """The compile-time rewrite: each loop's iterable goes through the counting filter, each `~`
    through the counting join."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = nodes.Filter(node.iter, _COUNTING_FILTER, [], [], None, None, lineno=node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return _as_filter(node)


def _sized(value: Any) -> bool:
    return isinstance(value, str | list | tuple)


def _as_filter(concat: nodes.Concat) -> nodes.Filter:
    items = nodes.List(concat.nodes, lineno=concat.lineno)
    return nodes.Filter(items, _CONCAT_FILTER, [], [], None, None, lineno=concat.lineno)


@pass_context
def _counted(context: Context, iterable: Any) -> Iterator[Any]:
    meter = _meter(context)
    for item in iterable:
        meter.step()
        yield item


@pass_context
def _bounded_concat(context: Context, items: list[Any]) -> str:
    return _join_within(
        (str(item) for item in items), getattr(context.environment, "budget", RenderBudget()).max_chars
    )


def _join_within(chunks: Iterable[str], limit: int) -> str:
    parts: list[str] = []
    total = 0
    for chunk in chunks:
        total += len(chunk)
        if total > limit:
            raise TemplateBudgetExceeded(f"the chat template built a text longer than {limit} characters")
        parts.append(chunk)
    return "".join(parts)


def _checked_filter(function: Any, budget: RenderBudget) -> Any:
    """`function` refusing integer arguments above the size limit (see the module docstring)."""

    # jinja passes the context, environment or eval context before the value when the filter
    # asks for it (a `jinja_pass_arg` marker); the value itself may be any size.
    passed = 2 if hasattr(function, "jinja_pass_arg") else 1

    def checked(*args: Any, **kwargs: Any) -> Any:
        _check_numbers(args[passed:], kwargs, budget.max_chars, getattr(function, "__name__", "a filter"))
        result = function(*args, **kwargs)
        _check_size(result, budget.max_chars)
        return result

    if passed == 2:
        checked.jinja_pass_arg = function.jinja_pass_arg  # type: ignore[attr-defined]
    checked.__name__ = getattr(function, "__name__", "filter")
    return checked


def _check_numbers(args: tuple[Any, ...], kwargs: dict[str, Any], limit: int, what: str) -> None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > limit:
            raise TemplateBudgetExceeded(
                f"{what} was given {value}, above the template size limit of {limit}"
            )


def _check_size(value: Any, limit: int) -> None:
    if isinstance(value, str | list | tuple | dict) and len(value) > limit:
        raise TemplateBudgetExceeded(f"the chat template built a value of {len(value)} items, above {limit}")


def _check_format_widths(fmt: str, pattern: re.Pattern[str], limit: int) -> None:
    for match in pattern.finditer(fmt):
        for number in match.groups():
            if number is not None and int(number) > limit:
                raise TemplateBudgetExceeded(f"the format {match.group(0)!r} asks for a width above {limit}")
