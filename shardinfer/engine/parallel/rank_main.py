"""One expert-parallel rank: `python -m shardinfer.engine.parallel.rank_main RANK`, its spec the first line on stdin.

The rank joins the group, builds its engine (its expert slots only, engine/parallel/sharding.py)
and serves the driver (ranks.py) over stdin/stdout, one JSON object a line:

    {"op": "add", "id", "ids", "params", "prompt_logprobs_from"}
                                           -> {"ok": true} or {"refused", "kind"}: queue a request
    {"op": "abort", "id"}                  -> {"outputs": [...]}
    {"op": "step"}                         -> {"outputs": [...], "rows": [...]}: one forward, real or
                                              idle, and the rows its experts computed per MoE layer
    {"op": "stats"}                        -> {"stats": {...}, "expert_rows": [...], "expert_tokens": [[...]]}
    {"op": "place", "physical_to_logical"} -> {"ok": true}: move expert weights to a new placement
    {"op": "exit"}                         leave the group and exit

Every rank gets every "step": a rank with requests runs engine.step(), one without runs its MoE
layers' exchanges with no rows (`idle_forward`), so all ranks meet in the same collectives. The
engine's own output goes to stderr; stdout carries only the replies.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import IO, Any

import torch

from shardinfer.engine.parallel import wire
from shardinfer.engine.parallel.expert_moves import move_experts
from shardinfer.engine.parallel.group import ExpertParallelGroup, init_process_group, set_current_group
from shardinfer.engine.parallel.placement import ExpertPlacement


def _counts(table: dict[int, torch.Tensor]) -> list[list[int]]:
    return [table[layer].tolist() for layer in sorted(table) if layer >= 0]


def serve(spec: dict[str, Any], rank: int, replies: IO[str]) -> None:
    from shardinfer.engine.llm_engine import LLMEngine

    size = int(spec["size"])
    placement = ExpertPlacement(int(spec["num_logical"]), size, tuple(spec["physical_to_logical"]))
    init_process_group(rank, size, spec["address"], int(spec["port"]), float(spec["timeout_s"]))
    group = ExpertParallelGroup(rank, size, placement)
    set_current_group(group)
    engine = LLMEngine(spec["model"], **spec["engine"])
    runner = engine.runner
    wire.send(
        replies,
        {
            "ready": True,
            "max_model_len": engine.max_model_len,
            "length_fix": engine.length_fix,
            "max_model_len_asked": engine.max_model_len_asked,
        },
    )
    for line in sys.stdin:
        msg = json.loads(line)
        op = msg["op"]
        if op == "add":
            try:
                engine.add_request(
                    msg["id"], msg["ids"], wire.params_from_dict(msg["params"]), msg["prompt_logprobs_from"]
                )
            except ValueError as exc:  # refused: the engine goes on, the driver raises it for the caller
                wire.send(replies, {"refused": str(exc), "kind": type(exc).__name__})
            else:
                wire.send(replies, {"ok": True})
        elif op == "abort":
            out = engine.abort(msg["id"])
            wire.send(replies, {"outputs": [] if out is None else [wire.output_to_dict(out)]})
        elif op == "step":
            outputs = []
            before = group.forwards
            if engine.has_unfinished():
                outputs = engine.step()
            if group.forwards == before:  # no forward of its own this step: meet the others idle
                runner.idle_forward()
            wire.send(
                replies, {"outputs": [wire.output_to_dict(o) for o in outputs], "rows": group.forward_rows}
            )
        elif op == "stats":
            rows = [group.expert_rows[layer] for layer in sorted(group.expert_rows) if layer >= 0]
            wire.send(
                replies,
                {"stats": engine.stats(), "expert_rows": rows, "expert_tokens": _counts(group.expert_tokens)},
            )
        elif op == "place":  # between steps, on every rank at once: the weights move by collectives
            move_experts(
                runner.model,
                group,
                ExpertPlacement(placement.num_logical, size, tuple(msg["physical_to_logical"])),
            )
            wire.send(replies, {"ok": True})
        elif op == "exit":
            break
        else:
            raise ValueError(f"unknown rank operation {op!r}")


def main() -> None:
    rank = int(sys.argv[1])
    # Replies go to the original stdout; anything the engine prints goes to stderr.
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    spec = json.loads(sys.stdin.readline())  # the driver's first line; its operations follow
    try:
        serve(spec, rank, replies)
    except BaseException as exc:  # report, then exit non-zero: the driver names this rank
        traceback.print_exc()
        wire.send(replies, {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
        raise SystemExit(1) from exc
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
