"""SamplingParams refuses a value of the wrong kind with a ValueError naming field, value and kind."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from shardinfer import SamplingParams
from shardinfer.engine.sampling_params import MAX_N


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": "0.5"}, "SamplingParams.temperature='0.5': must be a finite number"),
        ({"temperature": None}, r"SamplingParams.temperature=None: must be a finite number \(leave it unset"),
        ({"temperature": True}, "SamplingParams.temperature=True: must be a finite number"),
        ({"temperature": float("nan")}, "SamplingParams.temperature=nan: must be a finite number"),
        ({"temperature": float("inf")}, "SamplingParams.temperature=inf: must be a finite number"),
        ({"top_p": "1"}, "SamplingParams.top_p='1': must be a finite number"),
        ({"top_k": "5"}, "SamplingParams.top_k='5': must be an integer"),
        ({"top_k": 1.5}, "SamplingParams.top_k=1.5: must be an integer"),
        ({"top_k": 0.0}, "SamplingParams.top_k=0.0: must be an integer"),  # not "off" in disguise
        ({"top_k": False}, "SamplingParams.top_k=False: must be an integer"),
        ({"max_tokens": "10"}, "SamplingParams.max_tokens='10': must be an integer, or None"),
        ({"max_tokens": 1.5}, "SamplingParams.max_tokens=1.5: must be an integer"),
        ({"max_tokens": True}, "SamplingParams.max_tokens=True: must be an integer"),
        ({"n": "2"}, "SamplingParams.n='2': must be an integer"),
        ({"n": 2.0}, r"SamplingParams.n=2.0: must be an integer"),
        ({"logprobs": "3"}, "SamplingParams.logprobs='3': must be an integer, or None"),
        ({"logprobs": 2.5}, "SamplingParams.logprobs=2.5: must be an integer"),
        ({"logprobs": True}, "SamplingParams.logprobs=True: must be an integer"),
        ({"prompt_logprobs": 1.0}, "SamplingParams.prompt_logprobs=1.0: must be an integer"),
        ({"seed": "abc"}, "SamplingParams.seed='abc': must be an integer, or None"),
        ({"seed": "7"}, "SamplingParams.seed='7': must be an integer"),
        ({"seed": 1.5}, "SamplingParams.seed=1.5: must be an integer"),
        ({"stop": 5}, "SamplingParams.stop=5: must be a list of strings"),
        ({"stop": ["a", 3]}, r"SamplingParams.stop=\['a', 3\]: must be a list of strings"),
        ({"stop_token_ids": ["a"]}, r"SamplingParams.stop_token_ids=\['a'\]: must be a list of integers"),
        ({"stop_token_ids": [1.0]}, r"SamplingParams.stop_token_ids=\[1.0\]: must be a list of integers"),
        ({"stop_token_ids": 5}, "SamplingParams.stop_token_ids=5: must be a list of integers"),
        ({"ignore_eos": "no"}, "SamplingParams.ignore_eos='no': must be True or False"),
        ({"ignore_eos": 1}, "SamplingParams.ignore_eos=1: must be True or False"),
        ({"skip_special_tokens": None}, "SamplingParams.skip_special_tokens=None: must be True or False"),
        ({"n": 200_000}, f"SamplingParams.n=200000 is above the limit of {MAX_N} samples per request"),
        ({"n": 10**9}, f"SamplingParams.n=1000000000 is above the limit of {MAX_N}"),
    ],
)
def test_values_of_the_wrong_kind_name_field_value_and_kind(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_a_huge_bad_value_is_cut_short_in_the_message() -> None:
    cut = r"^SamplingParams.stop=\['x', .{0,120}\.\.\.: must be a list"
    with pytest.raises(ValueError, match=cut) as info:
        SamplingParams(stop=["x"] * 100_000 + [1])
    assert len(str(info.value)) < 200


def test_numpy_numbers_and_ints_for_floats_are_accepted_as_python_numbers() -> None:
    p = SamplingParams(
        temperature=1,
        top_p=np.float32(0.5),
        top_k=np.int64(5),
        max_tokens=np.int32(7),
        n=np.int64(MAX_N),
        seed=np.uint64(2**62),
        logprobs=np.int8(3),
        stop=("a", "b"),
        stop_token_ids=(np.int64(3), 4),
        ignore_eos=True,
    )
    values = (p.temperature, p.top_p, p.top_k, p.max_tokens, p.n, p.seed, p.logprobs)
    assert values == (1, 0.5, 5, 7, MAX_N, 2**62, 3)
    assert [type(v) for v in values] == [int, float, int, int, int, int, int]
    assert p.stop == ["a", "b"] and p.stop_token_ids == [3, 4] and type(p.stop_token_ids[0]) is int
    # Python numbers: the JSON dict (fingerprints, the rank wire) holds numbers, not their str()
    data = p.to_json_dict()
    assert data["max_tokens"] == 7 and data["temperature"] == 1 and data["stop_token_ids"] == [3, 4]
    assert SamplingParams(**json.loads(json.dumps(data))) == p


def test_the_accepted_spellings_stay_accepted() -> None:
    assert SamplingParams(stop="\n").stop == ["\n"]
    assert SamplingParams(stop=None, stop_token_ids=None).stop == []
    assert SamplingParams(top_k=0).top_k == -1
    assert SamplingParams(max_tokens=None, seed=None, logprobs=None).max_tokens is None
    assert SamplingParams(temperature=0, logprobs=0).greedy
    assert SamplingParams(n=np.int64(2)) == SamplingParams(n=2)


def test_fields_cannot_be_assigned_after_construction_and_replace_validates() -> None:
    p = SamplingParams(n=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.n = 0  # type: ignore[misc]
    assert p.n == 2
    with pytest.raises(ValueError, match=r"SamplingParams\.n=0 is invalid: must be >= 1"):
        p.replace(n=0)
    with pytest.raises(ValueError, match=r"SamplingParams\.max_tokens=1\.5: must be an integer"):
        p.replace(max_tokens=1.5)
    assert p.replace(n=3).n == 3 and p.n == 2


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("max_new_tokens", "did you mean 'max_tokens'"),
        ("num_return_sequences", "did you mean 'n'"),
        ("temprature", "did you mean 'temperature'"),
        ("do_sample", "use temperature=0.0 for greedy"),
        ("zzz", "its fields are temperature, top_p"),
    ],
)
def test_unknown_field_names_the_field_meant(name: str, hint: str) -> None:
    with pytest.raises(TypeError, match=rf"^SamplingParams has no field '{name}'[:;] .*{hint}"):
        SamplingParams(**{name: 1})
    with pytest.raises(TypeError, match=rf"no field '{name}'"):
        SamplingParams().replace(**{name: 1})
