"""The KV a scheduler hands out, behind one small protocol: the engine's blocks, or the simulator's tokens.

The scheduler (``lib.engine.scheduler``) touches KV memory only through these verbs, on a request ``x``:

- ``cached(x)``: tokens of ``x``'s prefill (``x.tokens[:x.target]``) already held for reuse, looked up
  without taking them;
- ``admit(x)``: reserve room for every token ``x`` is to prefill, taking its cached prefix; the tokens
  found cached, or None (nothing changed) when there is no room;
- ``room(x)``: tokens of KV ``x`` has room for now; ``grow(x)``: room for one more block, False
  (nothing changed) when none is left;
- ``commit(x)``: its prompt's KV is complete (a prefix cache may now share it); ``release(x)``: give
  back all it holds.

``BlockKV`` is the engine's: the paged pool (``lib.kv_pool``) under the prefix cache (``lib.prefix_cache``),
a lease of blocks per request. ``TokenKV`` is the simulator's: the same accounting in blocks of one token up
to a capacity (or none), with no prefix cache, no block ids and no token ids; its numbers are what a
``BlockKV`` of one-token blocks without prefix caching would hold.

Chapters: 6, 8.
"""

from __future__ import annotations

from lib.kv_pool import KVPool, PoolExhausted
from lib.prefix_cache import Lease, PrefixCache, block_keys


class EngineCache(PrefixCache):
    """The prefix cache, able to give a running request one more block (evicting a cached one if none is
    free)."""

    def grow(self, lease: Lease) -> None:
        """Append one new block to ``lease``; ``PoolExhausted`` (nothing changed) if none is free or evictable."""
        self._own(lease)
        if not self.pool.free_count:
            if not self.evictable:
                raise PoolExhausted("no block is free or evictable")
            self._evict(1)
        lease.blocks += self.pool.allocate(1)


class BlockKV:
    """The engine's KV (see the module): blocks of ``pool`` leased through the prefix cache; a request's
    lease is ``x.lease`` (the runner reads its blocks). ``prefix_caching`` off: committed blocks are never
    shared, and ``cached`` is 0."""

    def __init__(self, pool: KVPool, *, prefix_caching: bool = True, extra: tuple = ()):
        self.pool, self.cache = pool, EngineCache(pool)
        self.block_size, self.prefix_caching, self.extra = pool.block_size, prefix_caching, extra

    def cached(self, x) -> int:
        if not self.prefix_caching:
            return 0
        if x.keys_for != x.target:  # its block keys, computed once per prefill
            x.keys = block_keys(x.tokens[: x.target], self.block_size, self.extra)
            x.keys_for = x.target
        return len(self.cache.lookup(None, keys=x.keys)) * self.block_size

    def admit(self, x) -> int | None:
        try:
            x.lease = self.cache.acquire(x.tokens[: x.target], self.extra)
        except PoolExhausted:
            return None
        return x.lease.hit_tokens

    def room(self, x) -> int:
        return len(x.lease.blocks) * self.block_size

    def grow(self, x) -> bool:
        try:
            self.cache.grow(x.lease)
        except PoolExhausted:
            return False
        return True

    def commit(self, x) -> None:
        if self.prefix_caching:
            self.cache.commit(x.lease)

    def release(self, x) -> None:
        if x.lease is not None:
            self.cache.release(x.lease)
            x.lease = None


class TokenLease:
    """What a request holds in a ``TokenKV``: a number of tokens."""

    __slots__ = ("tokens",)
    hit_tokens = 0

    def __init__(self, tokens: int):
        self.tokens = tokens


class TokenKV:
    """The simulator's KV (see the module): tokens held, at most ``capacity`` (None: unbounded)."""

    block_size = 1

    def __init__(self, capacity: int | None = None):
        self.capacity, self.used = capacity, 0

    def _fits(self, tokens: int) -> bool:
        return self.capacity is None or self.used + tokens <= self.capacity

    def cached(self, x) -> int:
        return 0

    def admit(self, x) -> int | None:
        if not self._fits(x.target):
            return None
        x.lease = TokenLease(x.target)
        self.used += x.target
        return 0

    def room(self, x) -> int:
        return x.lease.tokens

    def grow(self, x) -> bool:
        if not self._fits(1):
            return False
        x.lease.tokens += 1
        self.used += 1
        return True

    def commit(self, x) -> None:
        pass

    def release(self, x) -> None:
        if x.lease is not None:
            self.used -= x.lease.tokens
            x.lease = None
