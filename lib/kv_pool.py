"""A paged KV pool: a fixed number of blocks of ``block_size`` tokens, per layer, for K and V.

Storage is one tensor for K and one for V of shape [layers, num_blocks, H_kv, block_size, d]: per layer,
the layout ``lib.kernels.decode_attention`` reads. Blocks are handed out by number and carry a reference
count: the number of requests holding them. The pool itself only knows free blocks and counts; which
blocks hold reusable content, and when to give them back, is the prefix cache's business
(``lib.prefix_cache``).

Allocation is all or nothing: asking for more blocks than are free raises ``PoolExhausted`` and changes
nothing.

Chapters: 5.
"""

from __future__ import annotations

from collections import Counter, deque

import torch


class PoolExhausted(RuntimeError):
    """Raised when an allocation asks for more blocks than the pool has free."""


class KVPool:
    def __init__(self, num_blocks: int, block_size: int, *, layers: int = 1, kv_heads: int = 1, head_dim: int = 16,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", storage: bool = True):
        for name, v in (("num_blocks", num_blocks), ("block_size", block_size), ("layers", layers),
                        ("kv_heads", kv_heads), ("head_dim", head_dim)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.refs = [0] * num_blocks
        self._free = deque(range(num_blocks))
        self._is_free = [True] * num_blocks
        shape = (layers, num_blocks, kv_heads, block_size, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device) if storage else None
        self.v = torch.zeros(shape, dtype=dtype, device=device) if storage else None

    @property
    def free_count(self) -> int:
        return len(self._free)

    def is_free(self, block: int) -> bool:
        return self._is_free[self._blocks([block])[0]]

    def _blocks(self, blocks) -> list[int]:
        """``blocks`` as a list, each checked to be a block number of this pool (a negative number would
        otherwise name a block from the end)."""
        blocks = list(blocks)
        for b in blocks:
            if not 0 <= b < self.num_blocks:
                raise ValueError(f"block {b} is not in this pool: its blocks are numbered 0 to {self.num_blocks - 1}")
        return blocks

    def blocks_for(self, tokens: int) -> int:
        """Blocks needed to hold ``tokens`` tokens."""
        return -(-tokens // self.block_size)

    def allocate(self, n: int) -> list[int]:
        """``n`` free blocks, each with reference count 1; all or nothing."""
        if n < 0:
            raise ValueError(f"cannot allocate {n} blocks")
        if n > len(self._free):
            raise PoolExhausted(
                f"asked for {n} blocks of {self.block_size} tokens but {len(self._free)} of {self.num_blocks} are "
                f"free: release finished requests, evict cached blocks, or make the pool bigger")
        blocks = [self._free.popleft() for _ in range(n)]
        for b in blocks:
            self._is_free[b] = False
            self.refs[b] = 1
        return blocks

    def incref(self, blocks) -> None:
        """Take one more reference on each block; all or nothing."""
        blocks = self._blocks(blocks)
        for b in blocks:
            if self._is_free[b]:
                raise ValueError(f"block {b} is free: allocate it before taking a reference")
        for b in blocks:
            self.refs[b] += 1

    def decref(self, blocks) -> list[int]:
        """Drop one reference from each block (a block listed twice loses two); returns those now
        unreferenced (still allocated). All or nothing."""
        blocks = self._blocks(blocks)
        for b, n in Counter(blocks).items():
            if self.refs[b] < n:  # a free block holds none
                raise ValueError(f"block {b} holds {self.refs[b]} references, fewer than the {n} to drop: "
                                 "a request drops each reference it took once")
        zero = []
        for b in blocks:
            self.refs[b] -= 1
            if self.refs[b] == 0:
                zero.append(b)
        return zero

    def free(self, blocks) -> None:
        """Return unreferenced blocks to the free list; all or nothing."""
        blocks = self._blocks(blocks)
        if len(set(blocks)) != len(blocks):
            raise ValueError(f"blocks {blocks} name a block twice: a block is freed once, or two requests would get it")
        for b in blocks:
            if self._is_free[b] or self.refs[b] != 0:
                raise ValueError(f"block {b} cannot be freed: it is free already or still referenced ({self.refs[b]})")
        for b in blocks:
            self._is_free[b] = True
            self._free.append(b)
