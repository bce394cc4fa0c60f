"""lib.kv_pool: storage layout, all-or-nothing allocation, and reference counts through a block's life."""

from __future__ import annotations

import pytest
import torch

from lib.kv_pool import KVPool, PoolExhausted


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


def test_negative_allocation_is_refused():
    with pytest.raises(ValueError, match="cannot allocate -1 blocks"):
        KVPool(2, 1, storage=False).allocate(-1)


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


def test_a_block_listed_twice_loses_two_references():
    pool = KVPool(2, 1, storage=False)
    [b] = pool.allocate(1)
    pool.incref([b])
    assert pool.decref([b, b]) == [b]
    assert pool.refs[b] == 0


def test_dropping_a_reference_nobody_holds_is_refused_and_changes_nothing():
    pool = KVPool(3, 1, storage=False)
    a, b = pool.allocate(2)
    pool.decref([a])  # a: allocated, 0 references
    before = state(pool)
    with pytest.raises(ValueError, match="^block 0 holds 0 references, fewer than the 1 to drop: a request drops each "
                       "reference it took once$"):
        pool.decref([b, a])  # b must keep its reference: nothing changes
    with pytest.raises(ValueError, match="block 1 holds 1 references, fewer than the 2 to drop"):
        pool.decref([b, b])
    with pytest.raises(ValueError, match="block 2 holds 0 references"):
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
