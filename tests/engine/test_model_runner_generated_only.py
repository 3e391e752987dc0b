"""Steps made only of generated tokens' rows: the host marks them (build_host_batch), and where
generated rows take their own attention kernel, only such steps replay a decode graph
(ModelRunner.decode_width), since a graph then launches that kernel alone."""

from __future__ import annotations

from shardinfer.engine.model_runner import ModelRunner, build_host_batch
from shardinfer.engine.request import Request
from shardinfer.engine.sampling_params import SamplingParams
from shardinfer.engine.scheduler import ScheduledBatch

BLOCK = 4


def _request(prompt: int, outputs: int, computed: int) -> Request:
    r = Request(str(prompt), list(range(1, prompt + 1)), SamplingParams(max_tokens=8), seed=0, max_tokens=8)
    r.output_token_ids = [7] * outputs
    r.num_computed_tokens = computed
    r.block_table = list(range(-(-(prompt + outputs) // BLOCK)))
    return r


def _batch(*reqs: tuple[Request, int]) -> ScheduledBatch:
    return ScheduledBatch([r for r, _ in reqs], [n for _, n in reqs])


DECODE = (6, 2, 7)  # prompt 6, two outputs, the newest to compute: position 7
FIRST_DECODE = (6, 1, 6)  # the first generated token, at the prompt's length
PROMPT_END = (6, 0, 5)  # the prompt's last token alone (the rest from the prefix cache)


def test_the_host_marks_steps_whose_rows_are_all_generated() -> None:
    decode = _batch((_request(*DECODE), 1), (_request(*FIRST_DECODE), 1))
    host = build_host_batch(decode, BLOCK, prompt_lens=True)
    assert host.prompt_lens is not None and host.prompt_lens.tolist() == [6, 6]
    assert host.positions.tolist() == [7, 6]
    assert host.generated_only

    mixed = _batch((_request(*DECODE), 1), (_request(*PROMPT_END), 1))
    assert not build_host_batch(mixed, BLOCK, prompt_lens=True).generated_only
    # A chunk crossing the prompt's end: its first row is a prompt row.
    across = _batch((_request(6, 2, 4), 4))
    assert not build_host_batch(across, BLOCK, prompt_lens=True).generated_only
    # Without prompt lengths nothing is claimed.
    plain = build_host_batch(decode, BLOCK)
    assert plain.prompt_lens is None and not plain.generated_only


def test_a_prompts_last_token_runs_eager_only_where_graphs_hold_generated_rows_alone() -> None:
    decode = _batch((_request(*DECODE), 1), (_request(*FIRST_DECODE), 1))
    mixed = _batch((_request(*DECODE), 1), (_request(*PROMPT_END), 1))
    assert ModelRunner.decode_width(decode) == 1
    assert ModelRunner.decode_width(decode, generated_only=True) == 1
    assert ModelRunner.decode_width(mixed) == 1
    assert ModelRunner.decode_width(mixed, generated_only=True) == 0
