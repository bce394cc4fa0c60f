"""lib.kv_pool: storage layout, all-or-nothing allocation, and reference counts through a block's life."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from lib.kv_pool import KVPool, PoolExhausted, integer_ids


def state(pool):
    return list(pool.refs), pool.free_count, [pool.is_free(b) for b in range(pool.num_blocks)]


# ---------------------------------------------------------------------------- storage


def test_default_storage_is_one_layer_one_head_of_16_in_float32_on_the_cpu():
    pool = KVPool(5, 4)
    for t in (pool.k, pool.v):
        assert t.shape == (1, 5, 1, 4, 16)  # [layers, num_blocks, H_kv, block_size, d]
        assert t.dtype == torch.float32 and t.device.type == "cpu"
        assert not t.any()  # zeros, not uninitialized memory


def test_storage_layout_follows_the_model_and_k_and_v_are_separate():
    pool = KVPool(3, 2, layers=4, kv_heads=8, head_dim=128, dtype=torch.float16)
    assert pool.k.shape == pool.v.shape == (4, 3, 8, 2, 128)
    assert pool.k.dtype == pool.v.dtype == torch.float16
    pool.k[2, 1, 7, 1, 127] = 1.0  # layer 2, block 1, head 7, slot 1, last dimension
    assert pool.v.count_nonzero() == 0 and pool.k.count_nonzero() == 1


def test_storage_lies_on_the_device_asked_for():
    pool = KVPool(2, 2, device="meta")  # a device other than the default CPU, with no memory behind it
    assert pool.k.device.type == pool.v.device.type == "meta"


def test_a_pool_without_storage_only_counts():
    pool = KVPool(3, 2, storage=False)
    assert pool.k is None and pool.v is None
    assert pool.allocate(2) == [0, 1]


@pytest.mark.parametrize("arg", ["num_blocks", "block_size", "layers", "kv_heads", "head_dim"])
@pytest.mark.parametrize("bad", [0, -1, 2.0, "4"])
def test_every_dimension_must_be_a_positive_int(arg, bad):
    kw = {"num_blocks": 4, "block_size": 2, arg: bad}
    with pytest.raises(ValueError, match=f"^{arg} must be a positive int, got {bad!r}$"):
        KVPool(kw.pop("num_blocks"), kw.pop("block_size"), storage=False, **kw)


def test_the_smallest_pool_is_one_block_of_one_token():
    pool = KVPool(1, 1, layers=1, kv_heads=1, head_dim=1)
    assert pool.k.shape == (1, 1, 1, 1, 1) and pool.allocate(1) == [0]


# ---------------------------------------------------------------------------- allocation


@pytest.mark.parametrize("tokens, blocks", [(0, 0), (1, 1), (15, 1), (16, 1), (17, 2), (32, 2), (33, 3)])
def test_blocks_for_rounds_up_to_whole_blocks(tokens, blocks):
    assert KVPool(4, 16, storage=False).blocks_for(tokens) == blocks


def test_allocation_hands_out_distinct_blocks_each_held_once():
    pool = KVPool(6, 4, storage=False)
    assert pool.free_count == 6 and all(pool.is_free(b) for b in range(6))
    first = pool.allocate(2)
    second = pool.allocate(3)
    assert first == [0, 1] and second == [2, 3, 4]  # a fresh pool hands blocks out in order
    assert pool.free_count == 1
    assert pool.refs == [1, 1, 1, 1, 1, 0]
    assert [pool.is_free(b) for b in range(6)] == [False] * 5 + [True]


def test_freed_blocks_are_reused_after_the_never_used_ones():
    pool = KVPool(4, 1, storage=False)
    a = pool.allocate(2)  # [0, 1]
    assert pool.decref([a[0]]) == [a[0]]
    pool.free([a[0]])
    assert pool.allocate(3) == [2, 3, 0]  # the free list is first in, first out


def test_allocating_nothing_is_allowed_and_changes_nothing():
    pool = KVPool(2, 1, storage=False)
    before = state(pool)
    assert pool.allocate(0) == []
    assert state(pool) == before


@pytest.mark.parametrize("bad", [-1, 1.5, 2.0, True, "2", None])
def test_allocating_anything_but_a_count_is_refused(bad):
    pool = KVPool(2, 1, storage=False)
    before = state(pool)
    with pytest.raises(ValueError, match=f"^blocks to allocate must be a non-negative int, got {re.escape(repr(bad))}$"):
        pool.allocate(bad)
    assert state(pool) == before


@pytest.mark.parametrize("bad", [-1, 2.0, True, "16"])
def test_blocks_for_takes_a_token_count(bad):
    with pytest.raises(ValueError, match="^tokens must be a non-negative int"):
        KVPool(4, 16, storage=False).blocks_for(bad)


def test_numpy_integers_are_counts_and_block_numbers():
    pool = KVPool(4, 2, storage=False)
    assert pool.blocks_for(np.int64(5)) == 3
    blocks = pool.allocate(np.int32(2))
    assert blocks == [0, 1]
    pool.incref(np.array(blocks))
    assert pool.decref(torch.tensor(blocks)) == [] and pool.decref([np.int64(0), np.int16(1)]) == [0, 1]
    pool.free(np.array([1, 0], dtype=np.uint8))
    assert pool.free_count == 4 and all(type(b) is int for b in pool.allocate(4))


def test_exhaustion_is_all_or_nothing_and_says_what_to_do():
    pool = KVPool(4, 8, storage=False)
    pool.allocate(3)
    before = state(pool)
    with pytest.raises(PoolExhausted) as e:
        pool.allocate(2)
    assert str(e.value).startswith("asked for 2 blocks of 8 tokens but 1 of 4 are free: ")
    assert "release finished requests" in str(e.value) and "make the pool bigger" in str(e.value)
    assert state(pool) == before
    assert pool.allocate(1) == [3]  # exactly what is left can still be had
    with pytest.raises(PoolExhausted, match="0 of 4 are free"):
        pool.allocate(1)
    assert issubclass(PoolExhausted, RuntimeError)


# ---------------------------------------------------------------------------- reference counts


def test_a_block_lives_through_allocate_share_release_free():
    """Worked by hand: one request allocates a block, a second shares it, both finish, the block is freed."""
    pool = KVPool(3, 2, storage=False)
    [b] = pool.allocate(1)
    assert pool.refs[b] == 1
    pool.incref([b])  # a second request shares it
    assert pool.refs[b] == 2
    assert pool.decref([b]) == []  # the first finishes: still held by the second
    assert pool.refs[b] == 1 and not pool.is_free(b)
    assert pool.decref([b]) == [b]  # the second finishes: unreferenced, but still allocated (its content kept)
    assert pool.refs[b] == 0 and not pool.is_free(b) and pool.free_count == 2
    pool.free([b])
    assert pool.is_free(b) and pool.free_count == 3


def test_decref_returns_the_blocks_that_reach_zero_in_order():
    pool = KVPool(4, 1, storage=False)
    blocks = pool.allocate(4)
    pool.incref([blocks[1], blocks[2]])
    assert pool.decref([blocks[3], blocks[2], blocks[1], blocks[0]]) == [blocks[3], blocks[0]]
    assert pool.refs == [0, 1, 1, 0]
    assert pool.decref([blocks[1], blocks[2]]) == [blocks[1], blocks[2]]


@pytest.mark.parametrize("op", ["incref", "decref", "free"])
def test_a_block_named_twice_in_one_call_is_refused_and_changes_nothing(op):
    """Each call names each block once: a request holds a block once, and a block freed twice in one call
    would sit twice in the free list."""
    pool = KVPool(4, 1, storage=False)
    a, b = pool.allocate(2)
    pool.incref([b])
    pool.decref([a])  # a: allocated, no references; b: two
    before = state(pool)
    with pytest.raises(ValueError, match=r"^blocks \[1, 0, 1\] name a block twice: name each block once per call \(a "
                       r"block freed twice would be handed to two requests\)$"):
        getattr(pool, op)([b, a, b])
    assert state(pool) == before


def test_dropping_a_reference_nobody_holds_is_refused_and_changes_nothing():
    pool = KVPool(3, 1, storage=False)
    a, b = pool.allocate(2)
    pool.decref([a])  # a: allocated, 0 references
    before = state(pool)
    with pytest.raises(ValueError, match="^block 0 holds no reference to drop: a request drops each reference it "
                       "took once$"):
        pool.decref([b, a])  # b must keep its reference: nothing changes
    with pytest.raises(ValueError, match="^block 2 holds no reference to drop"):
        pool.decref([2])  # a free block
    assert state(pool) == before


def test_a_free_block_cannot_be_shared():
    pool = KVPool(3, 1, storage=False)
    [a] = pool.allocate(1)
    before = state(pool)
    with pytest.raises(ValueError, match="block 1 is free: allocate it before taking a reference"):
        pool.incref([a, 1])
    assert state(pool) == before  # a did not gain a reference either


def test_only_allocated_unreferenced_blocks_can_be_freed():
    pool = KVPool(3, 1, storage=False)
    a, b = pool.allocate(2)
    pool.decref([a])
    before = state(pool)
    with pytest.raises(ValueError, match=r"block 1 cannot be freed: it is free already or still referenced \(1\)"):
        pool.free([a, b])
    assert state(pool) == before  # a was not freed either
    with pytest.raises(ValueError, match=r"block 2 cannot be freed: it is free already or still referenced \(0\)"):
        pool.free([2])
    pool.free([a])
    with pytest.raises(ValueError, match="block 0 cannot be freed"):
        pool.free([a])  # twice


def test_a_block_freed_twice_in_one_call_is_refused():
    """Otherwise the free list would hold it twice and two requests would get the same block."""
    pool = KVPool(3, 1, storage=False)
    a, _ = pool.allocate(2)
    pool.decref([a])
    with pytest.raises(ValueError, match="name a block twice"):
        pool.free([a, a])
    assert pool.free_count == 1 and not pool.is_free(a)
    pool.free([a])
    assert sorted(pool.allocate(2)) == [0, 2]  # each block handed out once
    with pytest.raises(PoolExhausted):
        pool.allocate(1)


@pytest.mark.parametrize("bad", [-1, 3, 100])
def test_block_numbers_outside_the_pool_are_refused(bad):
    pool = KVPool(3, 1, storage=False)
    pool.allocate(3)
    pool.decref([2])
    before = state(pool)
    for op in (pool.incref, pool.decref, pool.free):
        with pytest.raises(ValueError, match=f"block {bad} is not in this pool: its blocks are numbered 0 to 2"):
            op([bad])
    with pytest.raises(ValueError, match="not in this pool"):
        pool.is_free(bad)
    assert state(pool) == before  # -1 did not touch the last block


@pytest.mark.parametrize("bad", [1.0, 0.5, True, False, "1", None, torch.tensor(1), [1]])
def test_block_numbers_must_be_ints(bad):
    """A float is never rounded (1.0 is not block 1) and a bool is not a block number (True would be 1)."""
    pool = KVPool(3, 1, storage=False)
    pool.allocate(3)
    pool.decref([0, 1])
    before = state(pool)
    for op in (pool.incref, pool.decref, pool.free):
        with pytest.raises(TypeError, match=f"^block numbers must be ints, got {re.escape(repr(bad))} "
                           f"\\({type(bad).__name__}\\) in "):
            op([2, bad])
    with pytest.raises(TypeError, match="block numbers must be ints"):
        pool.is_free(bad)
    for not_a_list in (2, "12", None):
        with pytest.raises(TypeError, match=f"^blocks must be a list of block numbers, got {type(not_a_list).__name__} "):
            pool.free(not_a_list)
    assert state(pool) == before


def test_freeing_block_minus_one_cannot_hand_a_block_in_use_to_a_new_owner():
    """Worked by hand: in a pool of 4 all held, block 3 is in use. If free([-1]) were taken as block 3 (the
    last, counted from the end), the next allocation would hand block 3 to a second owner."""
    pool = KVPool(4, 1, storage=False)
    pool.allocate(4)
    pool.decref([0])
    with pytest.raises(ValueError, match="block -1 is not in this pool"):
        pool.free([-1])
    pool.free([0])
    assert pool.allocate(1) == [0]  # the one block actually freed
    with pytest.raises(PoolExhausted):
        pool.allocate(1)  # and nothing else: block 3 stays with its owner
    assert pool.refs == [1, 1, 1, 1]


def test_freeing_a_block_twice_in_one_call_cannot_give_it_to_two_requests():
    """Worked by hand: with free([0, 0]) accepted, allocate(5) on a pool of 4 would return [1, 2, 3, 0, 0]."""
    pool = KVPool(4, 1, storage=False)
    pool.allocate(1)
    pool.decref([0])
    with pytest.raises(ValueError, match="name a block twice"):
        pool.free([0, 0])
    pool.free([0])
    with pytest.raises(PoolExhausted, match="asked for 5 blocks of 1 tokens but 4 of 4 are free"):
        pool.allocate(5)
    assert pool.allocate(4) == [1, 2, 3, 0]


# ---------------------------------------------------------------------------- integer ids


@pytest.mark.parametrize("make", [list, tuple, iter, np.array, lambda t: np.array(t, dtype=np.uint8), torch.tensor,
                                  lambda t: torch.tensor(t, dtype=torch.int32), lambda t: [np.int64(t[0]), np.int8(t[1]), t[2]]])
def test_integer_ids_from_lists_numpy_and_torch_alike(make):
    out = integer_ids(make([3, 0, 9]), "token", 10)
    assert out == [3, 0, 9] and all(type(t) is int for t in out)


def test_integer_ids_of_nothing_is_an_empty_list():
    assert integer_ids([], "token", 1) == [] and integer_ids(np.array([], dtype=np.int64), "token", 1) == []


@pytest.mark.parametrize("bad, index, value", [([0, 10], 1, 10), ([-1], 0, -1), (np.array([1, 2, 11]), 2, 11),
                                               (torch.tensor([5, -3]), 1, -3), ([2 ** 70], 0, 2 ** 70),
                                               (np.array([2 ** 64 - 1], dtype=np.uint64), 0, 2 ** 64 - 1)])
def test_integer_ids_outside_the_range_are_refused_by_position(bad, index, value):
    with pytest.raises(ValueError, match=f"^token {index} is {value}, outside the vocabulary: ids are 0 to 9$"):
        integer_ids(bad, "token", 10, "the vocabulary")
    with pytest.raises(ValueError, match=f"^block {index} is {value}, outside the range of block ids: ids are 0 to 9$"):
        integer_ids(bad, "block", 10)


@pytest.mark.parametrize("bad, message", [
    ([1, 1.7], "but token 1 is 1.7 \\(float\\): pass ints \\(a float or a bool is never taken for an id\\)$"),
    ([1.0], "but token 0 is 1.0 \\(float\\)"),
    ([True, 2], "but token 0 is True \\(bool\\)"), ([1, "2"], "but token 1 is '2' \\(str\\)"),
    ([torch.tensor(1)], "but token 0 is tensor\\(1\\)"),
    (np.array([1.0, 2.0]), "got an array of float64"), (np.array([True]), "got an array of bool"),
    (torch.tensor([1.7]), "got a tensor of torch.float32: convert it with .long\\(\\) only if its values are whole ids$"),
    (torch.tensor([True]), "got a tensor of torch.bool"),
    ("12", "got the str '12'"), (b"12", "got the bytes b'12'"),
    (12, "must be a list, tuple or one-dimensional array of ints, got int 12$"),
])
def test_integer_ids_refuse_what_is_not_an_integer(bad, message):
    with pytest.raises(TypeError, match="^token ids must be "):
        integer_ids(bad, "token", 100)
    with pytest.raises(TypeError, match=message):
        integer_ids(bad, "token", 100)


@pytest.mark.parametrize("bad", [np.array([[1, 2]]), torch.tensor([[1, 2]]), np.array(3)])
def test_integer_ids_are_one_dimensional(bad):
    with pytest.raises(ValueError, match="^token ids must be one-dimensional, got an array of shape"):
        integer_ids(bad, "token", 100)


# ---------------------------------------------------------------------------- a state machine, against a model


class PoolAgainstAModel(RuleBasedStateMachine):
    """Random allocations, references and frees, with bad block numbers mixed in, against a plain model of
    the pool: the free list (first in, first out) and each block's count. A refused call changes nothing."""

    N = 6

    def __init__(self):
        super().__init__()
        self.pool = KVPool(self.N, 1, storage=False)
        self.free_list = list(range(self.N))
        self.refs = [0] * self.N

    def refused(self, call, error):
        before = state(self.pool)
        with pytest.raises(error):
            call()
        assert state(self.pool) == before, "a refused call changed the pool"

    @rule(n=st.integers(0, 8))
    def allocate(self, n):
        if n > len(self.free_list):
            return self.refused(lambda: self.pool.allocate(n), PoolExhausted)
        got, self.free_list = self.free_list[:n], self.free_list[n:]
        assert self.pool.allocate(n) == got
        for b in got:
            self.refs[b] = 1

    @rule(blocks=st.sets(st.integers(0, N - 1)))
    def incref(self, blocks):
        blocks = sorted(blocks)
        if any(b in self.free_list for b in blocks):
            return self.refused(lambda: self.pool.incref(blocks), ValueError)
        self.pool.incref(blocks)
        for b in blocks:
            self.refs[b] += 1

    @rule(blocks=st.sets(st.integers(0, N - 1)))
    def decref(self, blocks):
        blocks = sorted(blocks)
        if any(self.refs[b] == 0 for b in blocks):
            return self.refused(lambda: self.pool.decref(blocks), ValueError)
        for b in blocks:
            self.refs[b] -= 1
        assert self.pool.decref(blocks) == [b for b in blocks if self.refs[b] == 0]

    @rule(blocks=st.sets(st.integers(0, N - 1)))
    def free(self, blocks):
        blocks = sorted(blocks)
        if any(b in self.free_list or self.refs[b] for b in blocks):
            return self.refused(lambda: self.pool.free(blocks), ValueError)
        self.pool.free(blocks)
        self.free_list += blocks

    @rule(op=st.sampled_from(["incref", "decref", "free"]), good=st.lists(st.integers(0, N - 1), max_size=3),
          bad=st.sampled_from([-1, -N, N, N + 7, "dup", 1.0, True, None]))
    def bad_block(self, op, good, bad):
        """Negative, out of range, named twice, or not an int: refused, whatever else the call names."""
        good = sorted(set(good))
        if bad == "dup":
            if not good:
                return
            blocks, error = good + good[:1], ValueError
        else:
            blocks, error = good + [bad], (ValueError if type(bad) is int else TypeError)
        self.refused(lambda: getattr(self.pool, op)(blocks), error)

    @precondition(lambda self: self.free_list)
    @rule()
    def allocate_bad_count(self):
        self.refused(lambda: self.pool.allocate(-1), ValueError)
        self.refused(lambda: self.pool.allocate(1.0), ValueError)

    @invariant()
    def matches_the_model(self):
        assert self.pool.refs == self.refs
        assert list(self.pool._free) == self.free_list
        assert self.pool.free_count == len(self.free_list)
        assert [self.pool.is_free(b) for b in range(self.N)] == [b in self.free_list for b in range(self.N)]
        assert len(set(self.free_list)) == len(self.free_list), "a block sits twice in the free list"


PoolAgainstAModel.TestCase.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
TestPoolAgainstAModel = PoolAgainstAModel.TestCase
