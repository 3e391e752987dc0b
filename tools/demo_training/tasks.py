"""Synthetic chat tasks whose answers can be checked exactly.

Each task is a (kind, user prompt, reference answer) triple produced by a seeded `random.Random`, so the
same seed always yields the same tasks. Answers are short and canonical (one correct string per prompt),
which lets an evaluator score greedy generations by exact match after stripping whitespace.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

KINDS = ("add", "sub", "mul", "reverse", "sort_words", "sort_numbers", "json")

# Short common words: most are single BPE tokens, so sorting them is about order, not spelling.
WORDS = (
    "apple",
    "river",
    "stone",
    "cloud",
    "tiger",
    "maple",
    "ocean",
    "pearl",
    "lemon",
    "house",
    "brick",
    "candle",
    "forest",
    "garden",
    "island",
    "jacket",
    "kettle",
    "ladder",
    "mirror",
    "needle",
    "orange",
    "pencil",
    "rabbit",
    "saddle",
    "table",
    "violin",
    "window",
    "yellow",
    "zebra",
    "anchor",
    "basket",
    "copper",
    "desert",
    "engine",
    "falcon",
    "guitar",
    "hammer",
    "insect",
    "jungle",
    "kitten",
    "lizard",
    "meadow",
    "night",
    "olive",
    "piano",
    "queen",
    "robot",
    "silver",
    "tomato",
    "umbrella",
    "valley",
    "walnut",
    "yogurt",
    "bread",
    "chair",
    "dragon",
    "eagle",
    "flame",
    "grape",
    "honey",
)
NAMES = (
    "Alice",
    "Bruno",
    "Chen",
    "Dana",
    "Emil",
    "Fatima",
    "Goran",
    "Hana",
    "Ivan",
    "Julia",
    "Kofi",
    "Lena",
    "Marco",
    "Nina",
    "Omar",
    "Priya",
    "Quinn",
    "Rosa",
    "Sven",
    "Tara",
    "Umar",
    "Vera",
    "Wei",
    "Yusuf",
    "Zoe",
)
CITIES = (
    "Paris",
    "Lagos",
    "Lima",
    "Oslo",
    "Tokyo",
    "Cairo",
    "Quito",
    "Seoul",
    "Dublin",
    "Madrid",
    "Nairobi",
    "Berlin",
    "Hanoi",
    "Austin",
    "Perth",
    "Riga",
    "Porto",
    "Delhi",
    "Accra",
    "Boston",
)
LETTERS = "abcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True)
class Task:
    """One checkable task: the user's message and the single correct assistant reply."""

    kind: str
    prompt: str
    answer: str

    def messages(self, with_answer: bool) -> list[dict[str, str]]:
        msgs = [{"role": "user", "content": self.prompt}]
        if with_answer:
            msgs.append({"role": "assistant", "content": self.answer})
        return msgs


def _number(rng: random.Random, max_digits: int) -> int:
    digits = rng.randint(1, max_digits)
    return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


def _arith(rng: random.Random, kind: str) -> Task:
    if kind == "add":
        a, b = _number(rng, 4), _number(rng, 4)
        return Task(kind, f"What is {a} + {b}?", str(a + b))
    if kind == "sub":
        a, b = _number(rng, 4), _number(rng, 4)
        a, b = max(a, b), min(a, b)
        return Task(kind, f"What is {a} - {b}?", str(a - b))
    a, b = _number(rng, 3), _number(rng, 1)
    return Task(kind, f"What is {a} * {b}?", str(a * b))


def _reverse(rng: random.Random) -> Task:
    # Letters are spaced so that each is its own token; reversal is then a copy task, not a spelling task.
    letters = [rng.choice(LETTERS) for _ in range(rng.randint(3, 8))]
    return Task("reverse", f"Reverse the letters: {' '.join(letters)}", " ".join(reversed(letters)))


def _sort_words(rng: random.Random) -> Task:
    words = rng.sample(WORDS, rng.randint(3, 6))
    return Task("sort_words", f"Sort these words alphabetically: {' '.join(words)}", " ".join(sorted(words)))


def _sort_numbers(rng: random.Random) -> Task:
    nums = rng.sample(range(100), rng.randint(3, 6))
    shown = " ".join(str(n) for n in nums)
    return Task(
        "sort_numbers",
        f"Sort these numbers in ascending order: {shown}",
        " ".join(str(n) for n in sorted(nums)),
    )


_JSON_TEMPLATES = (
    "My name is {name}, I am {age} years old and I live in {city}.",
    "{name} lives in {city} and is {age} years old.",
    "Meet {name} from {city}, age {age}.",
    "At {age}, {name} moved to {city}.",
    "{city} is home to {name}, who turned {age} this year.",
)


def _json(rng: random.Random) -> Task:
    name, city, age = rng.choice(NAMES), rng.choice(CITIES), rng.randint(18, 90)
    text = rng.choice(_JSON_TEMPLATES).format(name=name, city=city, age=age)
    answer = json.dumps({"name": name, "age": age, "city": city})
    return Task("json", f"Extract name, age and city as JSON: {text}", answer)


def make_task(rng: random.Random, kind: str) -> Task:
    if kind in ("add", "sub", "mul"):
        return _arith(rng, kind)
    if kind == "reverse":
        return _reverse(rng)
    if kind == "sort_words":
        return _sort_words(rng)
    if kind == "sort_numbers":
        return _sort_numbers(rng)
    if kind == "json":
        return _json(rng)
    raise ValueError(f"unknown task kind {kind!r}; expected one of {KINDS}")


def eval_tasks(seed: int, count: int) -> list[Task]:
    """A fixed, balanced list of held-out tasks: kinds in rotation, prompts unique."""
    rng = random.Random(f"eval-{seed}")
    seen: set[str] = set()
    out: list[Task] = []
    while len(out) < count:
        task = make_task(rng, KINDS[len(out) % len(KINDS)])
        if task.prompt not in seen:
            seen.add(task.prompt)
            out.append(task)
    return out


def train_tasks(seed: int, count: int, exclude: set[str]) -> list[Task]:
    """Training tasks from another stream of the same generators, minus any prompt held out for eval."""
    rng = random.Random(f"train-{seed}")
    out: list[Task] = []
    while len(out) < count:
        task = make_task(rng, rng.choice(KINDS))
        if task.prompt not in exclude:
            out.append(task)
    return out


def is_correct(task: Task, generated: str) -> bool:
    return generated.strip() == task.answer
