"""BudgetedSandbox: ordinary templates render exactly as in jinja's own sandbox; runaway ones stop."""

from __future__ import annotations

from typing import Any

import pytest
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from shardinfer.engine.template_budget import BudgetedSandbox, RenderBudget, TemplateBudgetExceeded

MESSAGES = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hi", "tags": ["a", "b"]},
    {"role": "assistant", "content": "hello", "children": [{"role": "tool", "content": "t"}]},
]

ORDINARY = [
    "{% for m in messages %}<{{ m.role }}>{{ m.content ~ '!' }}{% if loop.last %}|{% endif %}{% endfor %}",
    "{% for m in messages if m.role != 'system' %}{{ loop.index }}/{{ loop.length }}:{{ m.content }}{% else %}-{% endfor %}",
    "{% for m in messages recursive %}{{ m.role }}{% if m.children %}[{{ loop(m.children) }}]{% endif %}{% endfor %}",
    "{{ messages|map(attribute='role')|join(',') }} {{ messages|selectattr('role', 'equalto', 'user')|list|length }}",
    "{% macro show(m) %}{{ m.role|upper }}={{ m.content|center(9) }}{% endmacro %}{% for m in messages %}{{ show(m) }}{% endfor %}",
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + m.content|length %}{% endfor %}{{ ns.n }}",
    "{% set block %}{% for t in messages[1].tags %}{{ t * 2 }}{% endfor %}{% endset %}{{ block ~ block }}",
    "{{ '%-5s|%03d' % ('ab', 7) }} {{ '{:>6}'.format('x') }} {{ 2 ** 10 }} {{ [1, 2] + [3] }} {{ range(3)|list }}",
    "{% for k, v in messages[0]|dictsort %}{{ k }}={{ v }};{% endfor %}{{ messages|length * 'ab' }}",
]


@pytest.mark.parametrize("source", ORDINARY)
def test_ordinary_templates_render_as_in_the_plain_sandbox(source: str) -> None:
    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(source)
    budgeted = BudgetedSandbox(trim_blocks=True, lstrip_blocks=True).from_string(source)
    assert budgeted.render(messages=MESSAGES) == plain.render(messages=MESSAGES)


SMALL = RenderBudget(seconds=60.0, max_steps=10_000, max_chars=100_000)


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}", "loop steps"),
        ("{% for m in messages %}{% for i in range(100000) %}{% endfor %}{% endfor %}", "loop steps"),
        (
            "{% for x in [1] recursive %}{% for i in range(5000) %}{% endfor %}{{ loop([1]) }}{% endfor %}",
            "loop steps",
        ),
        ("{{ 'x' * 10**9 }}", "'\\*' would build"),
        ("{{ [0] * 10**9 }}", "'\\*' would build"),
        ("{{ 7 ** 100000 }}", "'\\*\\*' would build"),
        (
            "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
            "longer than",
        ),
        (
            "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
            "'\\+' would build",
        ),
        ("{% set big = 'y' * 90000 %}{% for i in range(50) %}{{ big }}{% endfor %}", "longer than"),
        (
            "{% set big = 'y' * 90000 %}{% set s %}{% for i in range(50) %}{{ big }}{% endfor %}{% endset %}",
            "longer than",
        ),
        ("{{ 'x'|center(10**9) }}", "above the template size limit"),
        ("{{ 'x'.ljust(10**9) }}", "above the template size limit"),
        ("{{ [1, 2]|slice(10**9)|list }}", "above the template size limit"),
        ("{{ '{:>1000000000}'.format('x') }}", "asks for a width"),
        ("{{ '%1000000000d' % 3 }}", "asks for a width"),
    ],
)
def test_runaway_templates_stop_within_the_budget(source: str, reason: str) -> None:
    template = BudgetedSandbox(budget=SMALL).from_string(source)
    with pytest.raises(TemplateBudgetExceeded, match=reason):
        template.render(messages=MESSAGES)


def test_the_deadline_stops_a_render_whatever_its_step_count() -> None:
    # A zero-second budget: the first counted step is past the deadline.
    template = BudgetedSandbox(budget=RenderBudget(seconds=0.0)).from_string(
        "{% for i in range(3) %}{% endfor %}"
    )
    with pytest.raises(TemplateBudgetExceeded, match=r"more than 0\.0s"):
        template.render()


def test_each_render_gets_a_fresh_budget() -> None:
    template = BudgetedSandbox(budget=RenderBudget(max_steps=100)).from_string(
        "{% for i in range(60) %}{% endfor %}ok"
    )
    assert [template.render() for _ in range(5)] == ["ok"] * 5


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.__class__.__base__ }}",
        "{{ cycler.__init__.__globals__ }}",
        "{{ messages.append(1) }}",
    ],
)
def test_the_sandbox_still_refuses_escapes(source: str) -> None:
    with pytest.raises(SecurityError):
        BudgetedSandbox().from_string(source).render(messages=list(MESSAGES), cycler=_Cycler())


class _Cycler:
    def __init__(self) -> None:
        self.items: list[Any] = []
