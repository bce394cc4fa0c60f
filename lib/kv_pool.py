"""A paged KV pool: a fixed number of blocks of ``block_size`` tokens, per layer, for K and V.

Storage is one tensor for K and one for V of shape [layers, num_blocks, H_kv, block_size, d]: per layer,
the layout ``lib.kernels.decode_attention`` reads. Blocks are handed out by number and carry a reference
count: the number of requests holding them. The pool itself only knows free blocks and counts; which
blocks hold reusable content, and when to give them back, is the prefix cache's business
(``lib.prefix_cache``).

Allocation is all or nothing: asking for more blocks than are free raises ``PoolExhausted`` and changes
nothing. Every call that names blocks (``incref``, ``decref``, ``free``, ``is_free``) checks them first
and changes nothing if one is wrong: each must be an integer (not a float, not a bool), a block of this
pool (0 to ``num_blocks - 1``: a negative number would otherwise name a block from the end) and named
once per call (a block freed twice in one call would sit twice in the free list and go to two requests).

``integer_ids`` is that check for any ids: the prefix cache and the model use it for token ids.

Chapters: 5.
"""

from __future__ import annotations

import numbers
from collections import deque

import numpy as np
import torch


class PoolExhausted(RuntimeError):
    """Raised when an allocation asks for more blocks than the pool has free."""


def integer_ids(values, what: str, limit: int, within: str = "") -> list[int]:
    """``values`` as a list of Python ints, each checked to be an integer in [0, ``limit``).

    ``values``: a list, tuple or other iterable of ints (numpy integers included), or a one-dimensional
    numpy array or torch tensor of an integer type (a tensor on a GPU is read back). Floats are refused even
    when whole (a 1.7 must not become 1), and so are bools. ``what`` names one id in the messages
    ("token", "block"), ``within`` what the range is ("the vocabulary")."""
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{what} ids must be integers, got the {type(values).__name__} {values!r}: pass a list of ints")
    if isinstance(values, torch.Tensor):
        if values.dtype.is_floating_point or values.dtype.is_complex or values.dtype == torch.bool:
            raise TypeError(f"{what} ids must be integers, got a tensor of {values.dtype}: convert it with .long() only "
                            "if its values are whole ids")
        values = values.detach().cpu().numpy()
    if isinstance(values, np.ndarray):
        if values.dtype.kind not in "iu":
            raise TypeError(f"{what} ids must be integers, got an array of {values.dtype}: pass an integer array")
        if values.ndim != 1:
            raise ValueError(f"{what} ids must be one-dimensional, got an array of shape {values.shape}")
        ids = values.tolist()
    else:
        try:
            ids = list(values)
        except TypeError:
            raise TypeError(f"{what} ids must be a list, tuple or one-dimensional array of ints, got "
                            f"{type(values).__name__} {values!r}") from None
        for i, v in enumerate(ids):
            if not _is_int(v):
                raise TypeError(f"{what} ids must be integers, but {what} {i} is {v!r} ({type(v).__name__}): pass "
                                "ints (a float or a bool is never taken for an id)")
        ids = [int(v) for v in ids]
    if ids:
        lo, hi = min(ids), max(ids)
        if lo < 0 or hi >= limit:
            i, v = next((i, v) for i, v in enumerate(ids) if not 0 <= v < limit)
            raise ValueError(f"{what} {i} is {v}, outside {within or 'the range of ' + what + ' ids'}: ids are 0 to "
                             f"{limit - 1}")
    return ids


class KVPool:
    def __init__(self, num_blocks: int, block_size: int, *, layers: int = 1, kv_heads: int = 1, head_dim: int = 16,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", storage: bool = True):
        for name, v in (("num_blocks", num_blocks), ("block_size", block_size), ("layers", layers),
                        ("kv_heads", kv_heads), ("head_dim", head_dim)):
            if not _is_int(v) or v < 1:
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
        """``blocks`` as a list of ints, each checked to be a block number of this pool and named once."""
        if isinstance(blocks, (str, bytes)) or not hasattr(blocks, "__iter__"):
            raise TypeError(f"blocks must be a list of block numbers, got {type(blocks).__name__} {blocks!r}")
        blocks = list(blocks.tolist() if isinstance(blocks, (np.ndarray, torch.Tensor)) else blocks)
        for b in blocks:
            if not _is_int(b):
                raise TypeError(f"block numbers must be ints, got {b!r} ({type(b).__name__}) in {blocks}")
        blocks = [int(b) for b in blocks]
        for b in blocks:
            if not 0 <= b < self.num_blocks:
                raise ValueError(f"block {b} is not in this pool: its blocks are numbered 0 to {self.num_blocks - 1}")
        if len(set(blocks)) != len(blocks):
            raise ValueError(f"blocks {blocks} name a block twice: name each block once per call (a block freed twice "
                             "would be handed to two requests)")
        return blocks

    def blocks_for(self, tokens: int) -> int:
        """Blocks needed to hold ``tokens`` tokens."""
        _count(tokens, "tokens")
        return -(-tokens // self.block_size)

    def allocate(self, n: int) -> list[int]:
        """``n`` free blocks, each with reference count 1; all or nothing."""
        _count(n, "blocks to allocate")
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
        """Drop one reference from each block; returns those now unreferenced (still allocated), in the
        order given. All or nothing."""
        blocks = self._blocks(blocks)
        for b in blocks:
            if self.refs[b] < 1:  # a free block holds none
                raise ValueError(f"block {b} holds no reference to drop: a request drops each reference it took once")
        zero = []
        for b in blocks:
            self.refs[b] -= 1
            if self.refs[b] == 0:
                zero.append(b)
        return zero

    def free(self, blocks) -> None:
        """Return unreferenced blocks to the free list; all or nothing."""
        blocks = self._blocks(blocks)
        for b in blocks:
            if self._is_free[b] or self.refs[b] != 0:
                raise ValueError(f"block {b} cannot be freed: it is free already or still referenced ({self.refs[b]})")
        for b in blocks:
            self._is_free[b] = True
            self._free.append(b)


def _count(n, what: str) -> None:
    """Refuse ``n`` unless it is a non-negative int."""
    if not _is_int(n) or n < 0:
        raise ValueError(f"{what} must be a non-negative int, got {n!r}")


def _is_int(v) -> bool:
    """An int or a numpy integer; not a bool, not a float however whole."""
    return type(v) is int or (isinstance(v, numbers.Integral) and not isinstance(v, bool))
