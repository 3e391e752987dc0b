"""Paged KV block allocation with automatic prefix caching.

Every full block of a request gets a chained hash, h_i = H(h_{i-1}, tokens of block i), seeded
with a fixed constant so the same prefix hashes alike in every run and process. A freed block
keeps its hash and contents until it is reused, so a later request with the same prefix finds
it again. Free blocks are reused least-recently-freed first:

    free queue (oldest freed first)  ->  popped for new allocations (evicting their hash)
    hash -> block id                 ->  looked up for prefix hits (a hit on a free block
                                         takes it out of the free queue)

Where attention computes generated tokens' rows with another kernel than prompt rows
(kernels/paged_attention_fma.py; `split_generated`), the same tokens can hold other KV bits as a
prompt than as a generation, so a block holding any generated token also hashes where its
request's prompt ends. Such a block is found
again by its own request (after a preemption) and by requests whose prompt ends at the same
position, never by a request that holds those tokens in its prompt.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from shardinfer.engine.request import Request

HASH_SEED = 0x5EED_5EED_5EED_5EED


def block_hash(parent: int, token_ids: list[int], prompt_end: int | None = None) -> int:
    """Chained 64-bit hash of one full block; stable across processes (no Python hash()).
    prompt_end: where the request's prompt ends, for a block holding generated tokens."""
    data = parent.to_bytes(8, "little") + np.asarray(token_ids, dtype=np.int64).tobytes()
    if prompt_end is not None:
        data += b"prompt_end" + prompt_end.to_bytes(8, "little")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def request_block_hash(
    parent: int, request: Request, start: int, block_size: int, split_generated: bool = False
) -> int:
    """block_hash of the request's block starting at token `start`; with split_generated, a block
    holding generated tokens names the prompt's end (module docstring: why)."""
    end = start + block_size
    prompt_end = request.num_prompt_tokens if split_generated and end > request.num_prompt_tokens else None
    return block_hash(parent, request.token_slice(start, end), prompt_end)


def chain_hashes(token_ids: list[int], block_size: int) -> list[int]:
    """Hashes of every full block of token_ids."""
    hashes: list[int] = []
    parent = HASH_SEED
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = block_hash(parent, token_ids[start : start + block_size])
        hashes.append(parent)
    return hashes


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        split_generated: bool = False,
    ) -> None:
        """split_generated: generated tokens' attention may round apart from prompt tokens', so
        blocks holding them are shared only where the prompt ends alike (module docstring)."""
        if num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks}: the KV cache needs at least one block")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.split_generated = split_generated
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[int, int] = {}  # block hash -> block id
        self.hit_tokens = 0
        self.queried_tokens = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- prefix cache ---------------------------------------------------------------------------
    def find_cached_prefix(self, request: Request) -> list[int]:
        """Block ids holding the longest cached prefix of the request's tokens.

        At least one token is always left to compute (its logits give the next token), so a
        fully cached sequence gives up its last block. A request that wants prompt logprobs needs
        the logits of every position from the one scoring its next unscored prompt token, so only
        the tokens before that position may come from the cache.
        """
        if not self.enable_prefix_caching:
            return []
        num_tokens = request.num_tokens
        if request.wants_prompt_logprobs and not request.prompt_logprobs_done:
            num_tokens = min(num_tokens, len(request.prompt_logprobs))
        bs = self.block_size
        hit: list[int] = []
        parent = HASH_SEED
        # Hash block by block and stop at the first miss: later blocks cannot hit.
        for start in range(0, num_tokens - bs + 1, bs):
            parent = request_block_hash(parent, request, start, bs, self.split_generated)
            block_id = self.cached.get(parent)
            if block_id is None:
                break
            hit.append(block_id)
        if hit and len(hit) * bs >= num_tokens:
            hit.pop()
        return hit

    # -- allocation -----------------------------------------------------------------------------
    def can_allocate(self, request: Request, num_tokens: int, cached: list[int] | None = None) -> bool:
        """Whether the request can hold KV for num_tokens tokens (counting a cached prefix)."""
        have = len(request.block_table) if request.block_table else len(cached or [])
        # Cached blocks sitting in the free queue are taken out of it, not allocated anew.
        revived = sum(1 for b in (cached or []) if self.blocks[b].ref_count == 0)
        return self.blocks_needed(num_tokens) - have <= self.num_free_blocks - revived

    def admit(self, request: Request, cached: list[int]) -> None:
        """Attach a cached prefix to a request that holds no blocks yet."""
        if request.block_table:
            raise RuntimeError(f"request {request.request_id} already holds blocks")
        for block_id in cached:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free[block_id]
            block.ref_count += 1
        request.block_table = list(cached)
        request.block_hashes = [self.blocks[b].hash for b in cached]  # type: ignore[misc]
        request.num_computed_tokens = len(cached) * self.block_size
        self.queried_tokens += request.num_tokens
        self.hit_tokens += request.num_computed_tokens

    def allocate(self, request: Request, num_tokens: int) -> None:
        """Grow the request's block table to hold num_tokens tokens. Call can_allocate first."""
        need = self.blocks_needed(num_tokens) - len(request.block_table)
        if need > self.num_free_blocks:
            raise RuntimeError(f"out of KV blocks: need {need}, {self.num_free_blocks} free")
        for _ in range(need):
            block_id, _ = self.free.popitem(last=False)
            block = self.blocks[block_id]
            if block.hash is not None:  # evict its cached identity
                if self.cached.get(block.hash) == block_id:
                    del self.cached[block.hash]
                block.hash = None
            block.ref_count = 1
            request.block_table.append(block_id)

    def register_full_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Give every newly completed full block its chained hash so later requests can reuse it."""
        if not self.enable_prefix_caching:
            return
        if num_computed_tokens // self.block_size <= len(request.block_hashes):
            return  # no block newly full (the common case: called for every request every step)
        # A block holding a token still being sampled cannot be hashed yet; it is caught up later.
        full = min(num_computed_tokens, request.num_resolved_tokens) // self.block_size
        if full <= len(request.block_hashes):
            return
        parent = request.block_hashes[-1] if request.block_hashes else HASH_SEED
        for i in range(len(request.block_hashes), full):
            parent = request_block_hash(
                parent, request, i * self.block_size, self.block_size, self.split_generated
            )
            request.block_hashes.append(parent)
            block = self.blocks[request.block_table[i]]
            if block.hash is None and parent not in self.cached:
                block.hash = parent
                self.cached[parent] = block.block_id

    def free_request(self, request: Request) -> None:
        """Release the request's blocks; the last reference puts a block at the free queue's tail.

        Blocks are released tail first, so a prefix's later blocks are evicted before its head.
        """
        for block_id in reversed(request.block_table[request.num_released_blocks :]):
            self._release(block_id)
        request.block_table = []
        request.block_hashes = []
        request.num_released_blocks = 0

    def release_before(self, request: Request, position: int) -> None:
        """Release the request's blocks that lie wholly before `position` (sliding-window attention
        will never read them again). Their ids stay in the block table; attention masks them."""
        end = min(position // self.block_size, len(request.block_table))
        for i in range(request.num_released_blocks, end):
            self._release(request.block_table[i])
        request.num_released_blocks = max(request.num_released_blocks, end)

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free[block_id] = None

    @property
    def prefix_hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0
