"""What the driver and its rank processes send each other: one JSON object per line.

Plain JSON, never pickle: a rank process is our own, but its pipe carries only data we can
check. Requests travel as token ids and SamplingParams' JSON dict; outputs as RequestOutput's
fields, the (id, logprob) pairs restored to tuples on arrival.
"""

from __future__ import annotations

import dataclasses
import json
from typing import IO, Any

from shardinfer import errors
from shardinfer.engine.outputs import CompletionOutput, RequestOutput
from shardinfer.engine.sampling_params import SamplingParams


def send(stream: IO[str], message: dict[str, Any]) -> None:
    stream.write(json.dumps(message, separators=(",", ":")) + "\n")
    stream.flush()


def params_from_dict(data: dict[str, Any]) -> SamplingParams:
    return SamplingParams(**data)


def output_to_dict(out: RequestOutput) -> dict[str, Any]:
    return dataclasses.asdict(out)


def _pairs(rows: list[list[list[Any]]] | None) -> list[list[tuple[int, float]]] | None:
    return None if rows is None else [[(int(i), float(v)) for i, v in row] for row in rows]


def output_from_dict(data: dict[str, Any]) -> RequestOutput:
    completions = []
    for c in data["outputs"]:
        c = dict(c)
        c["top_logprobs"] = _pairs(c["top_logprobs"])
        completions.append(CompletionOutput(**c))
    prompt_top = data.get("prompt_top_logprobs")
    fields = {
        **data,
        "outputs": completions,
        "prompt_top_logprobs": None
        if prompt_top is None
        else [None if row is None else [(int(i), float(v)) for i, v in row] for row in prompt_top],
    }
    return RequestOutput(**fields)


def refusal(reply: dict[str, Any]) -> ValueError:
    """A rank's refusal of a request as the ValueError its engine raised: the same RequestError
    class where it was one (so a job records the row with its error code), else a ValueError."""
    cls = getattr(errors, str(reply.get("kind")), None)
    if isinstance(cls, type) and issubclass(cls, ValueError):
        return cls(reply["refused"])
    return ValueError(reply["refused"])
