"""lib.kv_pool and lib.prefix_cache: keys, reuse, eviction order, and a state machine over both."""

from __future__ import annotations

import hashlib
import re

import numpy as np
import pytest
import torch
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


class PoolAndCache(RuleBasedStateMachine):
    """Random acquire / commit / release on a small pool; the invariants hold after every step."""

    def __init__(self):
        super().__init__()
        self.pool = KVPool(12, 2, storage=False)
        self.cache = PrefixCache(self.pool, "lru")
        self.leases = []
        self.released = []

    def snapshot(self):
        return (list(self.pool.refs), list(self.pool._free), dict(self.cache.block_of), dict(self.cache.key_of),
                list(self.cache.evictable), self.cache.lookup_tokens, self.cache.hit_tokens, self.cache.evictions)

    def refused(self, call, error, match):
        before = self.snapshot()
        with pytest.raises(error, match=match):
            call()
        assert self.snapshot() == before, "a refused call changed the state"

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
        lease = self.leases.pop(i % len(self.leases))
        self.cache.release(lease)
        self.released.append(lease)

    @precondition(lambda self: self.released)
    @rule(i=st.integers(0, 100))
    def commit_or_release_after_release(self, i):
        """A released lease's blocks may belong to another request now: committing it would register them
        under its keys, and releasing it again would drop references it no longer holds."""
        lease = self.released[i % len(self.released)]
        self.refused(lambda: self.cache.commit(lease), ValueError, "^this lease was released already: commit")
        self.refused(lambda: self.cache.release(lease), ValueError, "^this lease was released already$")

    @rule(tokens=st.lists(st.integers(0, 2), max_size=6),
          bad=st.sampled_from([{"tenant": "a"}, ["a"], 7, ("a", 7), ("a", ("b",)), ("a", ["b"]), bytearray(b"a")]))
    def acquire_with_a_bad_extra(self, tokens, bad):
        self.refused(lambda: self.cache.acquire(tokens, bad), TypeError, "extra")

    @rule(tokens=st.lists(st.integers(0, 2), max_size=6), at=st.integers(0, 6),
          bad=st.sampled_from([-1, 1.0, 1.7, True, "1", None, 2 ** 63]))
    def acquire_with_a_bad_token(self, tokens, at, bad):
        tokens = tokens[:at] + [bad] + tokens[at:]
        self.refused(lambda: self.cache.acquire(tokens, ("a",)), (TypeError, ValueError), "token")
        self.refused(lambda: self.cache.lookup(tokens, ("a",)), (TypeError, ValueError), "token")

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


# ---------------------------------------------------------------------------- keys, by an oracle


@settings(max_examples=200, deadline=None)
@given(a=st.lists(st.integers(0, 2), max_size=12), b=st.lists(st.integers(0, 2), max_size=12),
       bs=st.integers(1, 4))
def test_block_keys_agree_exactly_when_the_whole_prefix_agrees(a, b, bs):
    ka, kb = block_keys(a, bs), block_keys(b, bs)
    assert len(ka) == len(a) // bs and len(kb) == len(b) // bs  # full blocks only
    for i in range(min(len(ka), len(kb))):
        same_prefix = a[: (i + 1) * bs] == b[: (i + 1) * bs]
        assert (ka[i] == kb[i]) == same_prefix, f"block {i} of {a} and {b}"


def test_keys_are_sha256_digests_and_do_not_depend_on_the_token_type():
    keys = block_keys([1, 2, 3, 4], 2)
    assert [len(k) for k in keys] == [32, 32] and keys[0] != keys[1]
    assert block_keys(torch.tensor([1, 2, 3, 4]), 2) == keys  # a tensor of token ids names the same prefix
    assert block_keys([12, 3], 2) != block_keys([1, 23], 2)  # token boundaries are part of the key
    assert block_keys([], 2) == [] and block_keys([1], 2) == []


def test_a_key_of_a_longer_block_is_not_a_key_of_shorter_ones():
    assert not set(block_keys([1, 2, 3, 4], 2)) & set(block_keys([1, 2, 3, 4], 1))
    assert not set(block_keys([1, 2], 1, ())) & set(block_keys([1, 2], 1, ("",)))


# ---------------------------------------------------------------------------- lookup, leases, counters


def test_lookup_finds_the_longest_cached_prefix_without_taking_it():
    pool = KVPool(8, 2, storage=False)
    cache = PrefixCache(pool)
    lease = cache.acquire([1, 2, 3, 4, 5, 6, 7], ("w",))
    cache.commit(lease)
    refs = list(pool.refs)
    assert cache.lookup([1, 2, 3, 4, 5, 6, 7], ("w",)) == lease.blocks[:3]
    assert cache.lookup([1, 2, 3, 4, 9, 9], ("w",)) == lease.blocks[:2]  # stops at the first block that differs
    assert cache.lookup([1, 2, 3], ("w",)) == lease.blocks[:1]  # whole blocks only
    assert cache.lookup([1, 2, 3, 4], ("v",)) == []  # other weights
    assert cache.lookup([1, 2, 3, 4]) == []  # no extras is an extra of its own
    assert cache.lookup([9, 2, 3, 4], ("w",)) == []  # same second block, other past
    assert cache.lookup([9, 9], keys=block_keys([1, 2, 3, 4], 2, ("w",))) == lease.blocks[:2]  # keys given: used
    assert pool.refs == refs and cache.lookup_tokens == 7 and cache.hit_tokens == 0  # a lookup takes and counts nothing


def test_a_lease_says_what_the_request_holds():
    cache = PrefixCache(KVPool(8, 2, storage=False))
    first = cache.acquire((t for t in [1, 2, 3, 4, 5]), "w")  # any iterable of ints; a str is a one-part extra
    assert first.tokens == [1, 2, 3, 4, 5] and first.extra == ("w",)
    assert first.blocks == [0, 1, 2] and first.hit_tokens == 0 and first.committed == 0
    assert first.keys == block_keys([1, 2, 3, 4, 5], 2, ("w",)) and not first.released
    cache.commit(first)
    assert first.committed == 2  # its two full blocks are registered; the partial third is not
    second = cache.acquire([1, 2, 3, 4, 6, 7], ("w",))
    assert second.blocks[:2] == [0, 1] and second.hit_tokens == 4 and second.committed == 2
    assert second.blocks[2] not in first.blocks


def test_hit_rate_counts_tokens_over_every_request():
    cache = PrefixCache(KVPool(16, 4, storage=False))
    assert cache.hit_rate == 0.0  # no lookups yet
    cache.commit(cache.acquire(list(range(10))))  # 10 tokens, nothing cached
    cache.commit(cache.acquire(list(range(8)) + [50, 51]))  # 8 cached tokens of 10
    cache.commit(cache.acquire(list(range(4)) + [60] * 6))  # 4 of 10
    assert (cache.hit_tokens, cache.lookup_tokens) == (12, 30)
    assert cache.hit_rate == pytest.approx(12 / 30)


def test_a_refused_request_is_not_counted():
    cache = PrefixCache(KVPool(2, 2, storage=False))
    cache.commit(cache.acquire([1, 2, 3]))
    with pytest.raises(PoolExhausted):
        cache.acquire([1, 2, 3, 4, 5, 6])
    assert (cache.hit_tokens, cache.lookup_tokens) == (0, 3)


def test_hits_that_are_evictable_are_not_counted_as_room():
    """Three cached, unreferenced blocks are hits of a six-token prompt that needs three more blocks; the pool
    has one free block and nothing else to evict once the hits are taken, so the request is refused whole."""
    pool = KVPool(4, 1, storage=False)
    cache = PrefixCache(pool)
    a = cache.acquire([1, 2, 3])
    cache.commit(a)
    cache.release(a)
    before = (list(pool.refs), pool.free_count, dict(cache.block_of), list(cache.evictable), cache.evictions)
    with pytest.raises(PoolExhausted, match="needs 3 new blocks; 1 are free and 0 evictable of 4"):
        cache.acquire([1, 2, 3, 4, 5, 6])
    assert (list(pool.refs), pool.free_count, dict(cache.block_of), list(cache.evictable), cache.evictions) == before
    fits = cache.acquire([1, 2, 3, 4])  # three hits and the one free block
    assert fits.hit_tokens == 3 and cache.evictions == 0


def test_eviction_makes_room_only_for_what_is_missing():
    pool = KVPool(4, 1, storage=False)
    cache = PrefixCache(pool)
    a = cache.acquire([1, 2, 3])
    cache.commit(a)
    cache.release(a)
    cache.acquire([7])  # the free block is enough: nothing evicted
    assert cache.evictions == 0 and len(cache.evictable) == 3
    cache.acquire([8, 9])  # two more: evicts two, the least recently released (a's tail first)
    assert cache.evictions == 2 and list(cache.evictable) == [a.blocks[0]]
    assert cache.lookup([1, 2, 3]) == [a.blocks[0]]


def test_two_requests_that_computed_the_same_prefix_keep_the_first_copy_and_register_the_rest():
    pool = KVPool(8, 2, storage=False)
    cache = PrefixCache(pool)
    a = cache.acquire([1, 2, 3, 4])
    b = cache.acquire([1, 2, 5, 6])  # before a committed: computes [1, 2] again
    assert b.hit_tokens == 0 and b.blocks[0] != a.blocks[0]
    cache.commit(a)
    cache.commit(b)
    assert cache.lookup([1, 2, 5, 6, 0]) == [a.blocks[0], b.blocks[1]]  # the first copy of [1, 2], then b's own
    assert b.blocks[0] not in cache.key_of
    cache.release(b)
    assert pool.is_free(b.blocks[0]) and b.blocks[1] in cache.evictable  # the duplicate goes back at once


def test_a_lease_is_released_once_and_committed_before_it_is_released():
    pool = KVPool(4, 2, storage=False)
    cache = PrefixCache(pool)
    lease = cache.acquire([1, 2, 3])
    cache.release(lease)  # never committed: its blocks are freed at once
    assert lease.released and pool.free_count == 4 and not cache.evictable
    with pytest.raises(ValueError, match="^this lease was released already$"):
        cache.release(lease)
    with pytest.raises(ValueError, match="^this lease was released already: commit a request's blocks before releasing it$"):
        cache.commit(lease)
    assert not cache.block_of and pool.free_count == 4


def test_policy_must_be_lru_or_fifo():
    with pytest.raises(ValueError, match="policy must be 'lru' or 'fifo', got 'random'"):
        PrefixCache(KVPool(2, 1, storage=False), "random")


# ---------------------------------------------------------------------------- eviction orders, worked by hand


def _two_prompts_then_reuse(policy):
    """bs 1, 4 blocks. A=[1,2] and B=[5,6] are cached and released (tail first); [1,2,3] then reuses A's two
    blocks and needs one more, so one of B's is evicted; finally [9,9] needs two blocks."""
    pool = KVPool(4, 1, storage=False)
    cache = PrefixCache(pool, policy)
    a = cache.acquire([1, 2])
    cache.commit(a)
    cache.release(a)
    b = cache.acquire([5, 6])
    cache.commit(b)
    cache.release(b)
    reuse = cache.acquire([1, 2, 3])
    assert reuse.blocks[:2] == a.blocks and reuse.hit_tokens == 2
    first_evicted = [x for x in b.blocks if x not in cache.key_of]
    cache.commit(reuse)
    cache.release(reuse)
    survivors_before = set(cache.key_of)
    cache.acquire([9, 9])
    second_evicted = sorted(survivors_before - set(cache.key_of))
    return a, b, reuse, first_evicted, second_evicted, cache


def test_lru_evicts_the_least_recently_released():
    a, b, reuse, first, second, cache = _two_prompts_then_reuse("lru")
    # released in the order a1 a0 b1 b0; a0 a1 were taken again, so b1 (released before b0) goes first
    assert first == [b.blocks[1]]
    # now released in the order b0, then reuse's tail first: r2 a1 a0. The two oldest: b0 and r2.
    assert second == sorted([b.blocks[0], reuse.blocks[2]])
    assert cache.lookup([1, 2, 3]) == a.blocks  # the recently used prefix survives
    assert cache.evictions == 3


def test_fifo_evicts_the_first_cached_whatever_was_used_since():
    a, b, reuse, first, second, cache = _two_prompts_then_reuse("fifo")
    # cached in the order a0 a1 b0 b1 r2; a0 a1 are held when the first eviction comes: b0 is the oldest left
    assert first == [b.blocks[0]]
    # then a0 and a1: first cached, even though they were just used
    assert second == sorted(a.blocks)
    assert cache.lookup([1, 2, 3]) == [] and cache.lookup([5, 6]) == []  # b1 stays, but its prefix b0 is gone
    assert set(cache.key_of) == {b.blocks[1], reuse.blocks[2]}
    assert cache.evictions == 3


# ---------------------------------------------------------------------------- replay, worked by hand


def test_replay_lru_and_fifo_worked_by_hand():
    """bs 1, 4 blocks, one request at a time (the default): [1,2], [3,4], [1,2,7], [3,4].

    The third request hits [1,2] and needs one block: LRU evicts the block of [3,4]'s 4 (its tail, released
    first), FIFO the block of 3 (cached first). The fourth then finds [3] under LRU (hit 1 token, evicts 7's
    block) and nothing under FIFO (evicts the blocks of 1 and 2, cached first)."""
    prompts = [[1, 2], [3, 4], [1, 2, 7], [3, 4]]
    lru = prefix_cache.replay(prompts, 4, 1)
    assert lru == {"hit_rate": 3 / 9, "hit_tokens": 3, "lookup_tokens": 9, "rejected": 0, "evictions": 2}
    fifo = prefix_cache.replay(prompts, 4, 1, policy="fifo")
    assert fifo == {"hit_rate": 2 / 9, "hit_tokens": 2, "lookup_tokens": 9, "rejected": 0, "evictions": 3}


def test_replay_live_requests_finish_exactly_live_arrivals_later():
    prompts = [[1, 2], [3, 4], [1, 2, 7], [3, 4]]
    # two at a time: [1,2] still runs when [3,4] arrives and finishes when [1,2,7] arrives (two arrivals later);
    # [3,4] still runs then, so [1,2,7] has its 2 hits but no block for 7: refused (and not counted).
    # [3,4] finishes when the last [3,4] arrives, which hits [3] (its last token is computed) and evicts one block.
    two = prefix_cache.replay(prompts, 4, 1, live=2)
    assert two == {"hit_rate": 1 / 6, "hit_tokens": 1, "lookup_tokens": 6, "rejected": 1, "evictions": 1}
    with pytest.raises(ValueError, match="live must be a positive int"):
        prefix_cache.replay(prompts, 4, 1, live=1.5)


def test_replay_salts_every_request_and_refuses_a_salt_acquire_refuses():
    """One salt for every prompt gives the same hits as none; a dict salt is refused as acquire refuses it."""
    prompts = [[1, 2], [3, 4], [1, 2, 7], [3, 4]]
    assert prefix_cache.replay(prompts, 4, 1, extra=("weights-v1", None))["hit_tokens"] == 3
    with pytest.raises(TypeError, match="^extra must be a str, bytes or a tuple of them"):
        prefix_cache.replay(prompts, 4, 1, extra={"tenant": "A"})


# ---------------------------------------------------------------------------- what a key takes, and refuses


def test_a_dict_salt_is_refused_so_two_tenants_never_share_keys():
    """Found: a dict salt {"tenant": "A"} was hashed as the text of its keys, ('tenant',), so tenants A and B
    had the same keys and B hit A's blocks: the leak the salt is there to close."""
    cache = PrefixCache(KVPool(16, 2, storage=False))
    for salt in ({"tenant": "A"}, {"tenant": "B"}):
        with pytest.raises(TypeError, match="^extra must be a str, bytes or a tuple of them .* got dict "):
            cache.acquire([1, 2, 3, 4, 5], salt)
        with pytest.raises(TypeError, match="got dict"):
            block_keys([1, 2, 3, 4], 2, salt)
    a = cache.acquire([1, 2, 3, 4, 5], ("tenant", "A"))
    cache.commit(a)
    cache.release(a)
    assert cache.acquire([1, 2, 3, 4, 5], ("tenant", "B")).hit_tokens == 0
    assert cache.acquire([1, 2, 3, 4, 5], ("tenant", "A")).hit_tokens == 4
    assert (cache.lookup_tokens, cache.hit_tokens) == (15, 4)  # three requests; the refused ones counted nothing


@pytest.mark.parametrize("bad, message", [
    (["a", "b"], "got list"), ({"a"}, "got set"), (7, "got int"), (None, "got NoneType"), (b"a".decode, "got "),
    (("a", 1), "^part 1 of extra is int 1: each part must be a str, bytes or None"),
    (("a", ("b",)), "^part 1 of extra is tuple"), (("a", bytearray(b"b")), "^part 1 of extra is bytearray"),
    ((np.array([1, 2]),), "^part 0 of extra is ndarray"), (("a", 1.0), "^part 1 of extra is float"),
])
def test_extra_is_only_str_bytes_or_a_tuple_of_them(bad, message):
    with pytest.raises(TypeError, match=message):
        block_keys([1, 2], 1, bad)
    with pytest.raises(TypeError, match=message):
        PrefixCache(KVPool(4, 1, storage=False)).acquire([1, 2], bad)


def test_extras_are_hashed_canonically():
    """Length-prefixed and tagged: splitting, joining, or retyping a part gives another key; a str alone is the
    one-part tuple."""
    def key(extra):
        return block_keys([1], 1, extra)[0]

    assert key("ab") == key(("ab",)) and key(b"ab") == key((b"ab",))
    distinct = ["ab", ("a", "b"), ("ab", ""), ("", "ab"), ("ab", None), (None, "ab"), b"ab", ("a", b"b"), (), ("",),
                (None,), (b"",), (None, None), ("a,b",), ("('a', 'b')",), ("a|b",), ("\u00e9",), ("e\u0301",),
                ("\ud800",), ("\ud800\udc00",), ("\U00010000",)]  # a lone surrogate is a str too
    keys = [key(e) for e in distinct]
    assert len(set(keys)) == len(distinct)


def test_extra_digest_is_the_root_of_the_chain():
    """key_0 = sha256(extra digest | the first block's ids as 8-byte little-endian integers), worked by hand."""
    root = hashlib.sha256(b"lib.prefix_cache extra")
    root.update((3).to_bytes(8, "little"))
    root.update(b"s" + (3).to_bytes(8, "little") + "w\u00e9".encode())
    root.update(b"n")
    root.update(b"b" + (2).to_bytes(8, "little") + b"\x00\xff")
    assert prefix_cache.extra_digest(("w\u00e9", None, b"\x00\xff")) == root.digest()
    first = hashlib.sha256(root.digest() + (7).to_bytes(8, "little") + (2 ** 40).to_bytes(8, "little")).digest()
    second = hashlib.sha256(first + (0).to_bytes(8, "little") + (1).to_bytes(8, "little")).digest()
    assert block_keys([7, 2 ** 40, 0, 1, 5], 2, ("w\u00e9", None, b"\x00\xff")) == [first, second]


@pytest.mark.parametrize("make", [list, np.array, torch.tensor, lambda t: torch.tensor(t, dtype=torch.int32),
                                  lambda t: np.array(t, dtype=np.uint16), tuple])
def test_token_arrays_key_by_every_value(make):
    """Found: numpy or torch arrays of 2,000 ids differing in one gave the same keys. The values are hashed, so
    the keys agree up to the block holding the difference and differ from it on, whatever holds the ids."""
    base = [(i * 7919) % 1000 for i in range(2000)]
    other = list(base)
    other[1234] += 1
    a, b = block_keys(make(base), 16, "t"), block_keys(make(other), 16, "t")
    assert a == block_keys(base, 16, "t")  # lists, tuples, numpy and torch name the same prefix
    assert len(a) == 125 and a[:77] == b[:77] and not set(a[77:]) & set(b[77:])  # 1234 // 16 == 77


@pytest.mark.parametrize("bad, message", [
    ([1, 1.7], "^token ids must be integers, but token 1 is 1.7 \\(float\\)"),
    ([1.0, 2], "but token 0 is 1.0"), ([True, 1], "but token 0 is True \\(bool\\)"),
    ([1, -1], "^token 1 is -1, outside the range of token ids: ids are 0 to 9223372036854775807$"),
    ([2 ** 63], "^token 0 is 9223372036854775808, outside"), (np.array([0.5, 1.0]), "got an array of float64"),
    (torch.tensor([1.7, 1.0]), "got a tensor of torch.float32"), (torch.tensor([[1, 2]]), "one-dimensional"),
    ("1234", "got the str '1234'"), (np.array([1, -2]), "token 1 is -2"),
])
def test_token_ids_are_integers_in_range(bad, message):
    """Found: token 1.7 keyed like token 1. A float (whole or not), a bool, a negative id or one past 8 bytes
    is refused, from a list, numpy or torch alike."""
    with pytest.raises((TypeError, ValueError), match=message):
        block_keys(bad, 1)
    cache = PrefixCache(KVPool(8, 1, storage=False))
    with pytest.raises((TypeError, ValueError), match=message):
        cache.acquire(bad)
    assert cache.lookup_tokens == 0 and cache.pool.free_count == 8


def test_token_ids_in_a_lease_are_ints_from_any_container():
    cache = PrefixCache(KVPool(8, 2, storage=False))
    for tokens in ([5, 6, 7], np.array([5, 6, 7]), torch.tensor([5, 6, 7], dtype=torch.int16)):
        lease = cache.acquire(tokens)
        assert lease.tokens == [5, 6, 7] and all(type(t) is int for t in lease.tokens)
        assert lease.keys == block_keys([5, 6, 7], 2)


@pytest.mark.parametrize("bad", [0, -1, 1.0, True, "2", None])
def test_block_size_of_the_keys_is_a_positive_int(bad):
    with pytest.raises(ValueError, match=f"^block_size must be a positive int, got {re.escape(repr(bad))}$"):
        block_keys([1, 2], bad)


@settings(max_examples=200, deadline=None)
@given(a=st.lists(st.integers(0, 2), max_size=8), b=st.lists(st.integers(0, 2), max_size=8), bs=st.integers(1, 3),
       ea=st.lists(st.sampled_from(["", "a", "b", "ab", b"a", b"", None]), max_size=3),
       eb=st.lists(st.sampled_from(["", "a", "b", "ab", b"a", b"", None]), max_size=3))
def test_keys_agree_exactly_when_the_prefix_and_the_extra_agree(a, b, bs, ea, eb):
    """An oracle: block i's keys are equal if and only if the tokens up to the end of block i and the extras'
    parts are equal (a str is never equal to bytes)."""
    ka, kb = block_keys(a, bs, tuple(ea)), block_keys(b, bs, tuple(eb))
    same_extra = len(ea) == len(eb) and all(type(x) is type(y) and x == y for x, y in zip(ea, eb))
    for i in range(min(len(ka), len(kb))):
        assert (ka[i] == kb[i]) == (same_extra and a[: (i + 1) * bs] == b[: (i + 1) * bs])


def _state(pool, cache):
    return (list(pool.refs), list(pool._free), dict(cache.block_of), list(cache.evictable), cache.evictions)


def test_a_lease_is_refused_by_every_cache_but_the_one_that_gave_it():
    """Released through a second cache over the same pool, a lease's blocks would be freed while the first cache
    still maps their keys (it would serve them to the next request as hits); through a cache over another
    pool, its block numbers would drop the references of that pool's own requests. Both are refused, and
    neither cache nor pool changes; the lease's own cache then takes it as if nothing had happened."""
    pool, other_pool = KVPool(8, 4, storage=False), KVPool(8, 4, storage=False)
    mine, same_pool, other = PrefixCache(pool), PrefixCache(pool), PrefixCache(other_pool)
    lease = mine.acquire(list(range(9)))  # two full blocks and a partial one
    mine.commit(lease)
    theirs = other.acquire([50] * 9)  # the other pool's request holds the same block numbers
    assert lease.blocks == theirs.blocks == [0, 1, 2] and lease.cache is mine and lease.pool is pool
    for cache, where in ((same_pool, "another PrefixCache over the same pool"),
                         (other, "another PrefixCache over another pool")):
        before = _state(pool, mine), _state(pool, same_pool), _state(other_pool, other)
        for call in (cache.commit, cache.release, cache.commit):
            with pytest.raises(ValueError, match=f"^this lease was given by {where}, not by this cache: commit, "
                                                 "release and grow a lease through the cache whose acquire gave it"):
                call(lease)
        assert (_state(pool, mine), _state(pool, same_pool), _state(other_pool, other)) == before
        assert not lease.released
    assert other_pool.refs[:3] == [1, 1, 1]  # the other pool's request keeps its blocks
    later = mine.acquire([100] * 8)  # another request: two free blocks, none of the lease's
    assert later.blocks == [3, 4] and later.hit_tokens == 0
    shared = mine.acquire(list(range(8)) + [99])  # the lease's two full blocks, still held by it: shared
    assert shared.blocks[:2] == [0, 1] and shared.hit_tokens == 8 and pool.refs[:3] == [2, 2, 1]
    mine.release(lease)
    assert pool.refs[:3] == [1, 1, 0] and pool.is_free(2)  # its partial block was never cached: freed
    with pytest.raises(TypeError, match="expected a Lease"):
        mine.release(lease.blocks)
