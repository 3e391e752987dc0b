"""Block manager: exact block ids, chained hashes, prefix hits and least-recently-freed eviction."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from shardinfer.engine.block_manager import HASH_SEED, BlockManager, chain_hashes
from shardinfer.engine.request import Request
from shardinfer.engine.sampling_params import SamplingParams


def _req(rid: str, tokens: list[int], **params) -> Request:
    return Request(rid, tokens, SamplingParams(**params), seed=0, max_tokens=8)


def _fill(bm: BlockManager, req: Request, num_tokens: int) -> None:
    """Admit `req` with no cached prefix, allocate blocks for `num_tokens` and register the full ones."""
    bm.admit(req, [])
    bm.allocate(req, num_tokens)
    bm.register_full_blocks(req, num_tokens)


def _blake(parent: int, tokens: list[int]) -> int:
    data = parent.to_bytes(8, "little") + np.asarray(tokens, dtype=np.int64).tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def test_chain_hashes_are_chained_and_only_cover_full_blocks() -> None:
    tokens = list(range(10))
    h = chain_hashes(tokens, 4)
    assert len(h) == 2
    assert h[0] == _blake(HASH_SEED, [0, 1, 2, 3])
    assert h[1] == _blake(h[0], [4, 5, 6, 7])
    # Same block content after a different prefix hashes differently.
    assert chain_hashes([9, 9, 9, 9, 4, 5, 6, 7], 4)[1] != h[1]


def test_allocate_takes_lowest_free_ids_in_order() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    a = _req("a", list(range(10)))
    bm.admit(a, [])
    bm.allocate(a, 10)
    assert a.block_table == [0, 1, 2]
    b = _req("b", list(range(5)))
    bm.admit(b, [])
    bm.allocate(b, 5)
    assert b.block_table == [3, 4]
    assert bm.num_free_blocks == 3


def test_prefix_hit_reuses_blocks_and_counts_refs() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    a = _req("a", list(range(10)))
    _fill(bm, a, 10)
    assert a.block_hashes == chain_hashes(list(range(10)), 4)
    b = _req("b", [*list(range(8)), 42, 43, 44])
    hit = bm.find_cached_prefix(b)
    assert hit == [0, 1]
    bm.admit(b, hit)
    assert b.num_computed_tokens == 8
    assert [bm.blocks[i].ref_count for i in (0, 1, 2)] == [2, 2, 1]
    bm.allocate(b, 11)
    assert b.block_table == [0, 1, 3]


def test_fully_cached_prompt_leaves_its_last_block_to_compute() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    a = _req("a", list(range(8)))
    _fill(bm, a, 8)
    assert bm.find_cached_prefix(_req("b", list(range(8)))) == [0]


def test_prompt_logprob_requests_do_not_use_cached_blocks() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    a = _req("a", list(range(8)))
    _fill(bm, a, 8)
    assert bm.find_cached_prefix(_req("b", list(range(9)), prompt_logprobs=0)) == []


def test_freed_blocks_stay_cached_and_are_evicted_least_recently_freed_first() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)
    a = _req("a", [1, 2, 3, 4])
    _fill(bm, a, 4)
    b = _req("b", [5, 6])
    _fill(bm, b, 2)
    assert (a.block_table, b.block_table) == ([0, 1], [2])
    bm.free_request(a)  # releases tail first: 1 then 0
    bm.free_request(b)
    assert list(bm.free) == [3, 1, 0, 2]
    # A request with a's prefix finds both blocks although they are free.
    again = _req("c", [1, 2, 3, 4, 7])
    assert bm.find_cached_prefix(again) == [0, 1]
    # New allocations evict in free order: 3 (never used), then 1, whose hash is dropped.
    d = _req("d", [9, 9, 9, 9])
    bm.admit(d, [])
    bm.allocate(d, 4)
    assert d.block_table == [3, 1]
    assert bm.find_cached_prefix(_req("e", [1, 2, 3, 4, 7])) == [0]
    assert bm.blocks[1].hash is None


def test_prefix_caching_off_never_hits() -> None:
    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=False)
    a = _req("a", [1, 2, 3, 4])
    _fill(bm, a, 4)
    assert bm.find_cached_prefix(_req("b", [1, 2, 3, 4, 5])) == []
    assert bm.cached == {}


def test_allocation_beyond_capacity_is_refused() -> None:
    bm = BlockManager(num_blocks=2, block_size=2)
    a = _req("a", [1, 2, 3, 4, 5])
    assert not bm.can_allocate(a, 5)
    with pytest.raises(RuntimeError, match="out of KV blocks"):
        bm.allocate(a, 5)


def test_release_before_frees_blocks_left_behind_by_a_sliding_window() -> None:
    bm = BlockManager(num_blocks=6, block_size=4)
    a = _req("a", list(range(18)))
    bm.admit(a, [])
    bm.allocate(a, 18)
    assert a.block_table == [0, 1, 2, 3, 4]
    bm.release_before(a, 9)  # positions 0-7 (blocks 0 and 1) will not be read again
    assert a.num_released_blocks == 2 and list(bm.free) == [5, 0, 1]
    bm.release_before(a, 5)  # never goes back
    assert a.num_released_blocks == 2
    bm.free_request(a)  # releases the rest once, tail first; released blocks are not freed twice
    assert list(bm.free) == [5, 0, 1, 4, 3, 2]
    assert all(b.ref_count == 0 for b in bm.blocks)


def test_generated_blocks_are_shared_only_where_the_prompt_ends_alike() -> None:
    """A block holding generated tokens may hold other KV bits than the same tokens as a prompt
    (generated rows may take another attention kernel), so a request whose prompt holds those
    tokens must not find it; the request itself (resumed after a preemption) and one with the same
    prompt still do."""
    bm = BlockManager(num_blocks=16, block_size=4, split_generated=True)
    a = _req("a", list(range(6)))
    a.output_token_ids = [50, 51, 52, 53, 54, 55]  # 12 tokens: block 1 holds the prompt's end
    _fill(bm, a, 12)
    assert a.block_hashes[0] == chain_hashes(list(range(6)), 4)[0]  # a prompt block hashes as before
    as_prompt = _req("b", [*range(6), 50, 51, 52, 53, 54, 55, 9])
    assert bm.find_cached_prefix(as_prompt) == a.block_table[:1]
    resumed = _req("a2", list(range(6)))
    resumed.output_token_ids = [50, 51, 52, 53, 54, 55, 56]
    assert bm.find_cached_prefix(resumed) == a.block_table[:3]


def test_generated_blocks_are_shared_as_prompt_blocks_where_one_kernel_computes_both() -> None:
    bm = BlockManager(num_blocks=16, block_size=4)
    a = _req("a", list(range(6)))
    a.output_token_ids = [50, 51, 52, 53, 54, 55]
    _fill(bm, a, 12)
    as_prompt = _req("b", [*range(6), 50, 51, 52, 53, 54, 55, 9])
    assert bm.find_cached_prefix(as_prompt) == a.block_table[:3]
