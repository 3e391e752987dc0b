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
  than `max_chars` (or an integer with more than `MAX_INT_BITS` bits), `*` and `+` counted by items
  and by the text they hold (a list repeating one long string is as much text as its copies), `%`
  by its widths, `(key)` forms and `*` arguments included; `~` concatenation and every captured
  block and the output itself are joined by a `concat` that counts characters first;
- `lipsum`, the `format` filter and `str.expandtabs`, which build text in one call, are checked
  before they run;
- an integer argument above `max_chars` to any call or filter is refused before the call: it is
  how `center`, `indent`, `ljust`, `batch`, `slice` and format widths would allocate unbounded text.

The budget is per render (it lives on the render's jinja Context), so one compiled template is
safe to render from several threads. Subclass `BudgetedSandbox` to add filters and globals.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from jinja2 import nodes, pass_context
from jinja2.exceptions import TemplateRuntimeError
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import generate_lorem_ipsum
from jinja2.visitor import NodeTransformer

MAX_INT_BITS = 4096  # a `**` result larger than this is refused: no template needs such numbers
_COUNTING_FILTER = "budget-counted"  # not an identifier: templates cannot name it themselves
_CONCAT_FILTER = "budget-concat"
# A printf conversion's optional `(key)`, flags, width and precision, the numbers captured.
_PRINTF_NUMBER = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\d+)?(?:\.(\d+))?")

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
        # Calls that build text the argument checks do not see: a printf format's `(key)` widths and
        # `*` arguments, and lorem ipsum generated in one call.
        self.filters["format"] = _bounded_format(self.filters["format"], self.budget.max_chars)
        self.globals["lipsum"] = _bounded_lipsum(self.budget.max_chars)

    def _generate(self, source: nodes.Template, *args: Any, **kwargs: Any) -> str:
        """Rewrite the parsed template before it is compiled: loops count their steps, `~` counts
        its characters."""
        _Budgeting().visit(source)
        return str(super()._generate(source, *args, **kwargs))

    def concat(self, chunks: Iterable[str]) -> str:  # type: ignore[override]
        """The join jinja uses for the output and for every captured block, counting first."""
        return _join_within(chunks, self.budget.max_chars)

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        _check_expandtabs(__obj, args, kwargs, __self.budget.max_chars)  # its text grows by tab size per tab
        _meter(__context).step()
        _check_numbers(args, kwargs, __self.budget.max_chars, getattr(__obj, "__name__", "a call"))
        result = super().call(__context, __obj, *args, **kwargs)
        _check_size(result, __self.budget.max_chars)
        return result

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        limit = self.budget.max_chars
        if operator in ("*", "+"):
            # By text as well as by items: a list repeating one long string is a few items but as
            # much text as all its copies.
            _check_built_weight(operator, left, right, limit)
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
            _check_printf(left, right, limit)
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


def _weight(value: Any, limit: int) -> int:
    """The characters and leaf items `value` holds, counting an item as often as it occurs (a list of
    one string repeated is as long as text as its copies would be); counting stops just past `limit`."""
    total = 0
    pending = [value]
    while pending and total <= limit:
        item = pending.pop()
        if isinstance(item, str | bytes | bytearray):
            total += len(item)
        elif isinstance(item, Mapping):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
        else:
            total += 1
    return total


def _bounded_lipsum(max_chars: int) -> Any:
    """jinja's `lipsum` global, refusing more words than fit the size budget: generating them is one
    call, so the time budget, which counts calls, never sees it run."""

    def lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
        words = n * max if isinstance(n, int) and isinstance(max, int) else 0
        if words > max_chars // _LONGEST_LIPSUM_WORD:
            raise TemplateBudgetExceeded(
                f"lipsum(n={n}, max={max}) asks for {words} words, more than the template size limit "
                f"of {max_chars} characters holds"
            )
        return generate_lorem_ipsum(n, html, min, max)

    return lipsum


# The most characters one lorem-ipsum word takes, with its separator and punctuation.
_LONGEST_LIPSUM_WORD = 16


def _check_expandtabs(function: Any, args: tuple[Any, ...], kwargs: dict[str, Any], limit: int) -> None:
    text = getattr(function, "__self__", None)
    if getattr(function, "__name__", None) != "expandtabs" or not isinstance(text, str):
        return
    tabsize = args[0] if args else kwargs.get("tabsize", 8)
    if isinstance(tabsize, int) and text.count("\t") * tabsize > limit:
        raise TemplateBudgetExceeded(f"expandtabs({tabsize}) would build more than {limit} characters")


def _check_printf(fmt: str, arguments: Any, limit: int) -> None:
    """Refuses a printf-style format whose widths or precisions, written in it or taken from its
    arguments by `*`, would build a text longer than `limit`."""
    for match in _PRINTF_NUMBER.finditer(fmt):
        for number in match.groups():
            if number is not None and int(number) > limit:
                raise TemplateBudgetExceeded(f"the format {match.group(0)!r} asks for a width above {limit}")
    for value in arguments if isinstance(arguments, tuple) else ():
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > limit:
            raise TemplateBudgetExceeded(f"'%' was given {value}, above the template size limit of {limit}")


def _bounded_format(format_filter: Any, limit: int) -> Any:
    """jinja's `format` filter (printf-style) with the widths of `%` checked."""

    def printf_format(value: Any, *args: Any, **kwargs: Any) -> str:
        if isinstance(value, str):
            _check_printf(value, args, limit)
        return str(format_filter(value, *args, **kwargs))

    return printf_format


def _check_built_weight(operator: str, left: Any, right: Any, limit: int) -> None:
    sized = (str, bytes, bytearray, list, tuple)
    if operator == "+":
        if isinstance(left, sized) and isinstance(right, sized):
            weight = _weight(left, limit) + _weight(right, limit)
            if weight > limit:
                raise TemplateBudgetExceeded(f"'+' would build {weight}+ characters and items, above {limit}")
        return
    for seq, times in ((left, right), (right, left)):
        if isinstance(seq, sized) and isinstance(times, int) and times > 1:
            weight = _weight(seq, limit // times + 1) * times
            if weight > limit:
                raise TemplateBudgetExceeded(f"'*' would build {weight}+ characters and items, above {limit}")
