"""Scheduler: token budget, decode first, chunked prefill, sequence cap, preemption order."""

from __future__ import annotations

from shardinfer.engine.block_manager import BlockManager
from shardinfer.engine.request import Request, RequestStatus
from shardinfer.engine.sampling_params import SamplingParams
from shardinfer.engine.scheduler import Scheduler


def _req(rid: str, n: int) -> Request:
    return Request(rid, list(range(100, 100 + n)), SamplingParams(), seed=0, max_tokens=8)


def _ids(batch) -> list[tuple[str, int]]:
    return [(r.request_id, n) for r, n in zip(batch.requests, batch.num_new_tokens, strict=True)]


def _finish_step(s: Scheduler, batch, new_token: int = 1) -> None:
    s.after_step(batch)
    for r in batch.requests:  # every request whose prefill completed gets one sampled token
        if r.num_computed_tokens == r.num_tokens:
            r.output_token_ids.append(new_token)


def test_budget_chunks_prefill_and_decode_goes_first() -> None:
    s = Scheduler(BlockManager(64, 4), max_num_seqs=8, max_num_batched_tokens=10)
    a, b = _req("a", 6), _req("b", 9)
    s.add(a)
    s.add(b)
    first = s.schedule()
    assert _ids(first) == [("a", 6), ("b", 4)]
    _finish_step(s, first)
    second = s.schedule()  # a decodes (1 token) before b's prefill continues (5 left)
    assert _ids(second) == [("a", 1), ("b", 5)]
    _finish_step(s, second)
    assert _ids(s.schedule()) == [("a", 1), ("b", 1)]


def test_max_num_seqs_caps_running_requests() -> None:
    s = Scheduler(BlockManager(64, 4), max_num_seqs=2, max_num_batched_tokens=100)
    for rid in "abc":
        s.add(_req(rid, 3))
    assert [r.request_id for r in s.schedule().requests] == ["a", "b"]
    assert [r.request_id for r in s.waiting] == ["c"]


def test_preemption_takes_the_newest_running_request() -> None:
    # 4 blocks of 2 tokens: a (4 tokens) and b (4 tokens) take 2 blocks each; a's decode at
    # position 4 needs a third block, so b, the newest, is preempted and requeued first.
    s = Scheduler(BlockManager(4, 2), max_num_seqs=4, max_num_batched_tokens=100)
    a, b = _req("a", 4), _req("b", 4)
    s.add(a)
    s.add(b)
    first = s.schedule()
    _finish_step(s, first)
    assert (a.block_table, b.block_table) == ([0, 1], [2, 3])
    second = s.schedule()
    assert _ids(second) == [("a", 1)]
    assert second.preempted == [b]
    assert b.status is RequestStatus.WAITING and b.num_computed_tokens == 0 and b.block_table == []
    assert list(s.waiting) == [b]
    assert a.block_table[:2] == [0, 1] and len(a.block_table) == 3


def test_finish_releases_blocks() -> None:
    bm = BlockManager(8, 4)
    s = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=100)
    a = _req("a", 5)
    s.add(a)
    _finish_step(s, s.schedule())
    assert bm.num_free_blocks == 6
    s.finish(a)
    assert bm.num_free_blocks == 8 and not s.has_unfinished()


def test_admission_batch_waits_for_enough_free_slots_while_decoding() -> None:
    s = Scheduler(BlockManager(64, 4), max_num_seqs=4, max_num_batched_tokens=100, admission_batch=2)
    for rid in "abcdef":
        s.add(_req(rid, 3))
    first = s.schedule()
    assert [r.request_id for r in first.requests] == ["a", "b", "c", "d"]
    _finish_step(s, first)
    s.finish(s.running[0])  # one slot frees up: not enough to admit while others decode
    assert [r.request_id for r in s.schedule().requests] == ["b", "c", "d"]
    s.finish(s.running[0])  # two free slots: e and f join
    assert [r.request_id for r in s.schedule().requests] == ["c", "d", "e", "f"]
