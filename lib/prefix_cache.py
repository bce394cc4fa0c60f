"""A prefix cache over a paged KV pool: exact reuse of the KV of a shared token prefix.

Keys. Only full blocks are cached. Block i of a request has the key

    key_i = sha256(key_{i-1} | tokens of block i),    key_{-1} = sha256(extra)

chained from the first block, so a key names the whole prefix up to the end of its block, not only the
block's own tokens: two requests share block i only if they agree on every token before it. ``extra``
holds what else decides the KV besides the tokens: the weights version, an adapter, the tenant's salt.
Any difference there gives different keys, and nothing is reused.

Both parts are encoded so that different inputs never give the same bytes. A token id is an integer in
[0, 2^63), written as 8 bytes: a block of ``block_size`` tokens is always ``8 block_size`` bytes, so
token boundaries are fixed, and the values themselves are hashed (from a list, a numpy array or a torch
tensor alike). Floats and bools are refused: a token 1.7 must not key like token 1. ``extra`` is a str,
bytes, or a tuple of them, with None for a part that is absent (no adapter): each part is written as a
type tag, its length and its bytes, after the number of parts, so "ab", ("a", "b") and ("ab", None)
differ, and a str alone keys like the tuple holding it. Anything else (a dict, a list, a number) is
refused rather than turned into text: the text of a dict is not its content, and two tenants' salts
must never meet in one key.

Lookup walks the chain from the first block and stops at the first key not cached: the longest cached
prefix, in whole blocks. The map from key to block is a hash map (as in vLLM); a radix tree over tokens
finds the same prefixes and can share partial blocks, at the price of splitting nodes.

Lifetimes. A request holds a reference on every block it uses. When it finishes, its blocks lose that
reference; a block nobody holds stays in the pool with its content, evictable, as long as it is cached;
an uncached one is freed at once. When an allocation needs more blocks than are free, evictable blocks
are evicted: the least recently released first (``policy="lru"``) or the first cached first
(``policy="fifo"``). A finished request's blocks are released tail first, so a prefix's last blocks go
before its first ones and what stays cached is still a prefix. A lease belongs to the cache that gave it:
any other cache refuses to commit or release it, and changes nothing (over another pool its block
numbers name other blocks; over the same pool, its blocks' keys and evictability are the first cache's).

Chapters: 5.
"""

from __future__ import annotations

import hashlib
import heapq
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from lib.kv_pool import KVPool, PoolExhausted, integer_ids

TOKEN_LIMIT = 2 ** 63  # token ids are integers in [0, TOKEN_LIMIT): they fit 8 bytes


def extra_parts(extra) -> tuple:
    """``extra`` as the tuple of its parts, each checked to be a str, bytes or None (see the module)."""
    parts = (extra,) if isinstance(extra, (str, bytes)) else extra
    if not isinstance(parts, tuple):
        raise TypeError(f"extra must be a str, bytes or a tuple of them (None for an absent part), got "
                        f"{type(extra).__name__} {extra!r}: name each part, e.g. ('weights-v1', None, 'tenant-a')")
    for i, part in enumerate(parts):
        if part is not None and not isinstance(part, (str, bytes)):
            raise TypeError(f"part {i} of extra is {type(part).__name__} {part!r}: each part must be a str, bytes or "
                            f"None; write it as a str that says what it is")
    return parts


def extra_digest(extra) -> bytes:
    """sha256 of ``extra``'s parts, each as a type tag, its length (8 bytes) and its bytes, after their count:
    the root of a request's key chain."""
    parts = extra_parts(extra)
    h = hashlib.sha256(b"lib.prefix_cache extra")
    h.update(len(parts).to_bytes(8, "little"))
    for part in parts:
        if part is None:
            h.update(b"n")
            continue
        data = part.encode("utf-8", "surrogatepass") if isinstance(part, str) else part
        h.update(b"s" if isinstance(part, str) else b"b")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.digest()


def token_ids(tokens) -> list[int]:
    """``tokens`` (a list, tuple or iterable of ints, or a one-dimensional integer numpy array or torch
    tensor) as a list of ints, each checked to lie in [0, ``TOKEN_LIMIT``)."""
    return integer_ids(tokens, "token", TOKEN_LIMIT)


def block_keys(tokens, block_size: int, extra=()) -> list[bytes]:
    """The chained keys of the full blocks of ``tokens`` under ``extra`` (see the module)."""
    if type(block_size) is not int or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    return _chain(token_ids(tokens), block_size, extra)


def _chain(ids: list[int], block_size: int, extra) -> list[bytes]:
    """The keys of checked token ids ``ids``."""
    data = np.asarray(ids, dtype="<i8").tobytes()
    width = 8 * block_size
    keys, parent = [], extra_digest(extra)
    for i in range(len(ids) // block_size):
        parent = hashlib.sha256(parent + data[i * width:(i + 1) * width]).digest()
        keys.append(parent)
    return keys


@dataclass
class Lease:
    """The blocks one request holds, in order, and how many of its tokens came from the cache. ``cache`` is
    the cache that gave it (``acquire``), over its pool: only that cache commits, releases or grows it."""

    tokens: list
    extra: tuple
    blocks: list[int]
    hit_tokens: int
    committed: int = 0  # leading blocks whose keys are registered
    keys: list[bytes] = field(default_factory=list)
    released: bool = False
    cache: PrefixCache | None = field(default=None, repr=False, compare=False)

    @property
    def pool(self) -> KVPool | None:
        """The pool its blocks belong to."""
        return None if self.cache is None else self.cache.pool


class PrefixCache:
    def __init__(self, pool: KVPool, policy: str = "lru"):
        if policy not in ("lru", "fifo"):
            raise ValueError(f"policy must be 'lru' or 'fifo', got {policy!r}")
        self.pool, self.policy = pool, policy
        self.block_of: dict[bytes, int] = {}  # key -> block
        self.key_of: dict[int, bytes] = {}  # block -> key
        self.evictable: OrderedDict[int, None] = OrderedDict()
        self.cached_order: dict[int, int] = {}  # block -> when it was first cached (fifo)
        self._fifo: list[tuple[int, int]] = []  # (cached_order, block) of evictable blocks; stale entries skipped
        self._clock = 0
        self.lookup_tokens = 0
        self.hit_tokens = 0
        self.evictions = 0

    # ------------------------------------------------------------------ lookup
    def lookup(self, tokens, extra=(), *, keys=None) -> list[int]:
        """Blocks of the longest cached prefix of ``tokens`` (whole blocks), without taking them.
        ``keys``: the tokens' block keys, when the caller has them already."""
        out = []
        for key in keys if keys is not None else block_keys(tokens, self.pool.block_size, extra):
            b = self.block_of.get(key)
            if b is None:
                break
            out.append(b)
        return out

    # ------------------------------------------------------------------ a request's life
    def acquire(self, tokens, extra=()) -> Lease:
        """Take the cached prefix of ``tokens`` and allocate blocks for the rest (evicting if needed).

        All or nothing: if the pool cannot hold the request, ``PoolExhausted`` is raised and nothing
        changes. At least one token is always left to compute, so a fully cached prompt still yields logits.
        """
        tokens = token_ids(tokens)
        extra = extra_parts(extra)
        bs = self.pool.block_size
        keys = _chain(tokens, bs, extra)
        hits = self.lookup(tokens, extra, keys=keys)
        if hits and len(hits) * bs >= len(tokens):  # keep the last token to compute
            hits = hits[:-1]
        need = self.pool.blocks_for(len(tokens)) - len(hits)
        evictable_after = len(self.evictable) - sum(1 for b in hits if b in self.evictable)
        if need > self.pool.free_count + evictable_after:
            raise PoolExhausted(
                f"a request of {len(tokens)} tokens needs {need} new blocks; {self.pool.free_count} are free and "
                f"{evictable_after} evictable of {self.pool.num_blocks}: release requests or make the pool bigger")
        for b in hits:  # take the hits first, so that eviction cannot take them
            self.evictable.pop(b, None)
            self.pool.incref([b])
        if need > self.pool.free_count:
            self._evict(need - self.pool.free_count)
        blocks = hits + self.pool.allocate(need)
        self.lookup_tokens += len(tokens)
        self.hit_tokens += len(hits) * bs
        return Lease(tokens, extra, blocks, len(hits) * bs, committed=len(hits), keys=keys, cache=self)

    def _own(self, lease: Lease) -> None:
        """Refuse a lease this cache did not give: its block numbers mean nothing here (another pool), or
        their references and keys are another cache's to keep (the same pool)."""
        if not isinstance(lease, Lease):
            raise TypeError(f"expected a Lease from this cache's acquire, got {type(lease).__name__} {lease!r}")
        if lease.cache is not self:
            where = ("no cache" if lease.cache is None else
                     "another PrefixCache over the same pool" if lease.cache.pool is self.pool else
                     "another PrefixCache over another pool")
            raise ValueError(f"this lease was given by {where}, not by this cache: commit, release and grow a lease "
                             "through the cache whose acquire gave it (lease.cache); nothing changed")

    def commit(self, lease: Lease) -> None:
        """Register the request's full blocks (their KV now computed) under their keys."""
        self._own(lease)
        if lease.released:  # its uncached blocks are free again: registering them would serve another's KV
            raise ValueError("this lease was released already: commit a request's blocks before releasing it")
        for i in range(lease.committed, len(lease.keys)):
            key, b = lease.keys[i], lease.blocks[i]
            if key in self.block_of:  # computed twice (two requests raced): keep the first copy
                continue
            self.block_of[key] = b
            self.key_of[b] = key
            self._clock += 1
            self.cached_order[b] = self._clock
        lease.committed = len(lease.keys)

    def release(self, lease: Lease) -> None:
        """The request is done: drop its references, tail first."""
        self._own(lease)
        if lease.released:
            raise ValueError("this lease was released already")
        lease.released = True
        for b in reversed(lease.blocks):
            if self.pool.decref([b]):
                if b in self.key_of:
                    self.evictable[b] = None  # most recent at the end
                    if self.policy == "fifo":
                        heapq.heappush(self._fifo, (self.cached_order[b], b))
                else:
                    self.pool.free([b])

    # ------------------------------------------------------------------ eviction
    def _evict(self, n: int) -> None:
        for _ in range(n):
            if self.policy == "lru":
                b, _ = self.evictable.popitem(last=False)
            else:
                while True:  # the first cached of the evictable blocks; entries of blocks taken since are stale
                    order, b = heapq.heappop(self._fifo)
                    if b in self.evictable and self.cached_order[b] == order:
                        break
                del self.evictable[b]
            key = self.key_of.pop(b)
            del self.block_of[key]
            del self.cached_order[b]
            self.pool.free([b])
            self.evictions += 1

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0


def replay(prompts, num_blocks: int, block_size: int, *, policy: str = "lru", live: int = 1, extra=()) -> dict:
    """Run ``prompts`` (token lists) through a cache of ``num_blocks`` blocks, in order, with at most ``live``
    requests running at once: a request runs from its arrival until ``live`` more requests have arrived
    (turned away or not), holding (pinning) its blocks meanwhile. Returns the token hit rate, hits,
    lookups, requests turned away because the pinned blocks left no room, and evictions."""
    if not isinstance(live, int) or live < 1:
        raise ValueError(f"live must be a positive int (requests running at once), got {live!r}")
    pool = KVPool(num_blocks, block_size, storage=False)
    cache = PrefixCache(pool, policy)
    running, rejected = [], 0
    for i, tokens in enumerate(prompts):
        while running and running[0][0] <= i - live:  # arrived `live` requests ago: finished
            cache.release(running.pop(0)[1])
        try:
            lease = cache.acquire(tokens, extra)
        except PoolExhausted:
            rejected += 1
            continue
        cache.commit(lease)  # its KV is computed
        running.append((i, lease))
    return {"hit_rate": cache.hit_rate, "hit_tokens": cache.hit_tokens, "lookup_tokens": cache.lookup_tokens,
            "rejected": rejected, "evictions": cache.evictions}
