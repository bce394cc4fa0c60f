"""lib.kv_pool and lib.prefix_cache: keys, reuse, eviction order, and a state machine over both."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from lib import prefix_cache
from lib.kv_pool import KVPool, PoolExhausted
from lib.prefix_cache import PrefixCache, block_keys


def test_seed_example_shares_three_tokens():
    """[A,B,C,D] and [A,B,C,E]: three tokens of reusable prefix (block size 1)."""
    a, b = block_keys([1, 2, 3, 4], 1), block_keys([1, 2, 3, 5], 1)
    assert sum(x == y for x, y in zip(a, b)) == 3
    cache = PrefixCache(KVPool(16, 1, storage=False))
    first = cache.acquire([1, 2, 3, 4])
    cache.commit(first)
    second = cache.acquire([1, 2, 3, 5])
    assert second.hit_tokens == 3 and second.blocks[:3] == first.blocks[:3]


def test_keys_chain_the_whole_prefix_and_the_extras():
    assert block_keys([1, 2, 9, 9], 2)[1] != block_keys([3, 4, 9, 9], 2)[1]  # same block, different past
    assert block_keys([5, 6, 7], 2) == block_keys([5, 6, 8], 2)  # only full blocks have keys
    base = block_keys([1, 2, 3, 4], 2, ("w1", None, "salt-a"))
    assert base == block_keys([1, 2, 3, 4], 2, ("w1", None, "salt-a"))
    for other in (("w2", None, "salt-a"), ("w1", "lora-x", "salt-a"), ("w1", None, "salt-b")):
        assert not set(base) & set(block_keys([1, 2, 3, 4], 2, other))


def test_any_difference_in_the_extras_reuses_nothing():
    cache = PrefixCache(KVPool(32, 4, storage=False))
    lease = cache.acquire(list(range(20)), ("w1", "base", "tenant-a"))
    cache.commit(lease)
    assert cache.acquire(list(range(20)), ("w1", "base", "tenant-a")).hit_tokens == 16
    for extra in (("w2", "base", "tenant-a"), ("w1", "lora", "tenant-a"), ("w1", "base", "tenant-b")):
        assert cache.acquire(list(range(20)), extra).hit_tokens == 0


def test_a_prefix_shorter_than_a_block_reuses_nothing():
    cache = PrefixCache(KVPool(32, 16, storage=False))
    cache.commit(cache.acquire(list(range(15)) + [100] * 20))
    assert cache.acquire(list(range(15)) + [200] * 20).hit_tokens == 0
    assert cache.acquire(list(range(15)) + [100] * 20).hit_tokens == 32


def test_fully_cached_prompt_keeps_one_token_to_compute():
    cache = PrefixCache(KVPool(8, 4, storage=False))
    cache.commit(cache.acquire(list(range(8))))
    again = cache.acquire(list(range(8)))
    assert again.hit_tokens == 4  # the last block is recomputed, so the step has a token to produce logits


def test_failed_allocation_changes_nothing():
    pool = KVPool(4, 2, storage=False)
    cache = PrefixCache(pool)
    held = cache.acquire([1, 2, 3, 4, 5, 6])  # 3 blocks
    cache.commit(held)
    before = (list(pool.refs), pool.free_count, dict(cache.block_of), list(cache.evictable))
    with pytest.raises(PoolExhausted, match="needs 2 new blocks"):
        cache.acquire([9, 9, 9, 9])
    assert (list(pool.refs), pool.free_count, dict(cache.block_of), list(cache.evictable)) == before
    with pytest.raises(PoolExhausted, match="1 of 4 are free"):
        pool.allocate(2)


def test_lru_evicts_tail_first_and_least_recent_first():
    pool = KVPool(6, 1, storage=False)
    cache = PrefixCache(pool, "lru")
    a = cache.acquire([1, 2, 3])
    cache.commit(a)
    cache.release(a)  # evictable, tail first: 3, 2, 1 (in blocks)
    b = cache.acquire([7, 8, 9])
    cache.commit(b)
    cache.release(b)
    order = list(cache.evictable)
    assert order == [a.blocks[2], a.blocks[1], a.blocks[0], b.blocks[2], b.blocks[1], b.blocks[0]]
    hit = cache.acquire([1, 2, 5])  # takes 1, 2 from the cache; needs one more block: evicts a's tail
    assert hit.hit_tokens == 2 and a.blocks[2] not in cache.key_of
    cache.release(hit)
    assert list(cache.evictable)[-2:] == [a.blocks[1], a.blocks[0]]  # recently used: evicted last


def test_fifo_evicts_first_cached_first():
    pool = KVPool(4, 1, storage=False)
    cache = PrefixCache(pool, "fifo")
    a = cache.acquire([1, 2])
    cache.commit(a)
    cache.release(a)
    b = cache.acquire([5, 6])
    cache.commit(b)
    cache.release(b)
    reuse = cache.acquire([1, 2, 3])  # hits a's first block; a is used again but stays oldest
    cache.release(reuse)
    cache.acquire([8, 8, 8, 8])  # needs every block: evicts all
    assert not cache.key_of


class PoolAndCache(RuleBasedStateMachine):
    """Random acquire / commit / release on a small pool; the invariants hold after every step."""

    def __init__(self):
        super().__init__()
        self.pool = KVPool(12, 2, storage=False)
        self.cache = PrefixCache(self.pool, "lru")
        self.leases = []

    @rule(tokens=st.lists(st.integers(0, 2), min_size=1, max_size=9), salt=st.sampled_from(["a", "b"]))
    def acquire(self, tokens, salt):
        before = (list(self.pool.refs), self.pool.free_count, dict(self.cache.block_of), list(self.cache.evictable))
        try:
            lease = self.cache.acquire(tokens, (salt,))
        except PoolExhausted:
            after = (list(self.pool.refs), self.pool.free_count, dict(self.cache.block_of), list(self.cache.evictable))
            assert after == before, "a failed allocation changed the state"
            return
        for i, b in enumerate(lease.blocks[: lease.hit_tokens // self.pool.block_size]):
            assert self.cache.key_of[b] == lease.keys[i], "a hit block lost its key"
        self.leases.append(lease)

    @precondition(lambda self: self.leases)
    @rule(i=st.integers(0, 100))
    def commit(self, i):
        self.cache.commit(self.leases[i % len(self.leases)])

    @precondition(lambda self: self.leases)
    @rule(i=st.integers(0, 100))
    def release(self, i):
        self.cache.release(self.leases.pop(i % len(self.leases)))

    @invariant()
    def counts_add_up(self):
        held = {}
        for lease in self.leases:
            for b in lease.blocks:
                held[b] = held.get(b, 0) + 1
        for b in range(self.pool.num_blocks):
            assert self.pool.refs[b] == held.get(b, 0), f"block {b}: refs {self.pool.refs[b]}, held {held.get(b, 0)}"
            states = [self.pool.is_free(b), b in self.cache.evictable, held.get(b, 0) > 0]
            assert sum(states) == 1, f"block {b} is in {states} (free, evictable, held)"
        for lease in self.leases:
            assert len(set(lease.blocks)) == len(lease.blocks), "a request holds a block twice"
        assert self.pool.free_count + len(self.cache.evictable) + len(held) == self.pool.num_blocks
        for key, b in self.cache.block_of.items():
            assert self.cache.key_of[b] == key


PoolAndCache.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestPoolAndCache = PoolAndCache.TestCase


class _FifoByScan(PrefixCache):
    """FIFO eviction the obvious way (scan for the first cached evictable block), to check the heap."""

    def _evict(self, n):
        for _ in range(n):
            b = min(self.evictable, key=self.cached_order.__getitem__)
            del self.evictable[b]
            del self.block_of[self.key_of.pop(b)]
            del self.cached_order[b]
            self.pool.free([b])
            self.evictions += 1


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=10), st.booleans()), max_size=40))
def test_fifo_heap_evicts_what_a_scan_evicts(ops):
    caches = [PrefixCache(KVPool(10, 2, storage=False), "fifo"), _FifoByScan(KVPool(10, 2, storage=False), "fifo")]
    held = [[], []]
    for tokens, finish_oldest in ops:
        for c, h in zip(caches, held):
            if finish_oldest and h:
                c.release(h.pop(0))
            try:
                lease = c.acquire(tokens)
            except PoolExhausted:
                continue
            c.commit(lease)
            h.append(lease)
        assert caches[0].block_of == caches[1].block_of and caches[0].evictions == caches[1].evictions


def test_replay_running_requests_pin_their_blocks():
    prompts = [[i] * 8 for i in range(6)]  # 6 different prompts of 2 blocks of 4
    one = prefix_cache.replay(prompts, 4, 4, live=1)
    assert one["rejected"] == 0 and one["evictions"] == 8  # requests 2 to 5 each evict a finished one
    three = prefix_cache.replay(prompts, 4, 4, live=3)  # two requests fill the pool; the third has no room
    assert three["rejected"] == 2 and three["evictions"] == 4  # requests 2 and 5 find 4 pinned blocks
    again = prefix_cache.replay(prompts[:2] * 2, 8, 4, live=1)
    assert again["hit_tokens"] == 2 * 4  # the second round hits each prompt's first block (the last token is computed)
    with pytest.raises(ValueError, match="live"):
        prefix_cache.replay(prompts, 4, 4, live=0)
