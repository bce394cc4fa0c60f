"""lib.model: prefill after a cached prefix gives the logits of a full recompute (float32, CPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lib.model import CONFIGS, TinyLlama
from lib.prefix_cache import PrefixCache


@pytest.fixture(scope="module")
def model():
    return TinyLlama(CONFIGS["tiny"], seed=0)


def test_same_seed_same_weights():
    a, b = TinyLlama(CONFIGS["tiny"], seed=3), TinyLlama(CONFIGS["tiny"], seed=3)
    assert torch.equal(a.head, b.head) and not torch.equal(a.head, TinyLlama(CONFIGS["tiny"], seed=4).head)


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("n,start", [(9, 4), (37, 16), (37, 1), (40, 32)])
def test_prefill_after_a_prefix_matches_full_recompute(model, block_size, n, start):
    gen = torch.Generator().manual_seed(n * 100 + start)
    tokens = torch.randint(0, model.cfg.vocab, (n,), generator=gen).tolist()
    pool = model.new_pool(64, block_size)
    blocks = pool.allocate(pool.blocks_for(n))
    full = model.prefill(tokens, pool, blocks, 0)
    other = model.new_pool(64, block_size)
    blocks2 = other.allocate(other.blocks_for(n))
    model.prefill(tokens[:start], other, blocks2, 0)  # the prefix, computed alone
    tail = model.prefill(tokens, other, blocks2, start)  # then only the rest
    assert torch.allclose(tail, full[start:], rtol=1e-5, atol=1e-5), (tail - full[start:]).abs().max()


def test_reuse_through_the_prefix_cache(model):
    """A second request with the same system prompt computes only its own tokens and gets the same logits."""
    bs = 4
    pool = model.new_pool(32, bs)
    cache = PrefixCache(pool)
    system = list(range(10, 30))  # 20 tokens: 5 full blocks
    first = cache.acquire(system + [1, 2, 3])
    model.prefill(first.tokens, pool, first.blocks, first.hit_tokens)
    cache.commit(first)
    cache.release(first)
    second = cache.acquire(system + [7, 8, 9, 10, 11])
    assert second.hit_tokens == 20
    reused = model.prefill(second.tokens, pool, second.blocks, second.hit_tokens)
    fresh_pool = model.new_pool(32, bs)
    fresh = model.prefill(second.tokens, fresh_pool, fresh_pool.allocate(7), 0)
    assert torch.allclose(reused, fresh[20:], rtol=1e-5, atol=1e-5)


def test_sizes_and_bad_input(model):
    assert 1.0e9 < CONFIGS["1b"].params() < 1.3e9
    assert CONFIGS["1b"].flops_per_token(0) < CONFIGS["1b"].flops_per_token(1000)
    pool = model.new_pool(4, 4)
    with pytest.raises(ValueError, match="need 3 blocks"):
        model.prefill(list(range(10)), pool, pool.allocate(2), 0)
    with pytest.raises(ValueError, match="start must be"):
        model.prefill([1, 2], pool, [0, 1], 2)


def test_batched_decode_matches_prefill(model):
    """A decode step for three requests of different lengths, through the decode-attention kernel
    (interpreted on the CPU), gives the logits prefill computes for each request's last token."""
    bs = 4
    pool = model.new_pool(64, bs)
    gen = torch.Generator().manual_seed(21)
    lengths = [1, 6, 13]
    table = torch.zeros(3, 4, dtype=torch.int32)
    prompts, want = [], []
    for b, n in enumerate(lengths):
        tokens = torch.randint(0, model.cfg.vocab, (n,), generator=gen).tolist()
        blocks = pool.allocate(pool.blocks_for(n))
        table[b, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        if n > 1:
            model.prefill(tokens[:-1], pool, blocks, 0)  # the context is in the cache
        ref_pool = model.new_pool(8, bs)
        want.append(model.prefill(tokens, ref_pool, ref_pool.allocate(ref_pool.blocks_for(n)), 0)[-1])
        prompts.append(tokens)
    logits = model.decode([p[-1] for p in prompts], pool, table, torch.tensor(lengths, dtype=torch.int32))
    assert torch.allclose(logits, torch.stack(want), rtol=1e-4, atol=1e-4), (logits - torch.stack(want)).abs().max()
    with pytest.raises(ValueError, match="at least 1"):
        model.decode([1], pool, table[:1], torch.tensor([0], dtype=torch.int32))


def test_last_only_and_tensor_inputs_give_the_same_logits(model):
    tokens = list(range(3, 40))
    pool = model.new_pool(16, 4)
    blocks = pool.allocate(pool.blocks_for(len(tokens)))
    full = model.prefill(tokens, pool, blocks, 0)
    last = model.prefill(torch.tensor(tokens), pool, torch.tensor(blocks), 20, last_only=True)
    assert last.shape == (1, model.cfg.vocab)
    assert torch.allclose(last, full[-1:], rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------- token ids outside the vocabulary


@pytest.mark.parametrize("bad, error, message", [
    ([5, -1, 7], ValueError, "^token 1 is -1, outside the vocabulary: ids are 0 to 96$"),
    ([5, 97], ValueError, "^token 1 is 97, outside the vocabulary: ids are 0 to 96$"),
    (torch.tensor([3, 4, -1]), ValueError, "^token 2 is -1, outside the vocabulary"),
    (torch.tensor([1000], dtype=torch.int32), ValueError, "^token 0 is 1000, outside the vocabulary"),
    (np.array([1, 2, 200]), ValueError, "^token 2 is 200, outside the vocabulary"),
    ([1, 1.7], TypeError, "^token ids must be integers, but token 1 is 1.7"),
    ([2.0, 1], TypeError, "but token 0 is 2.0"), ([True, 1], TypeError, "but token 0 is True"),
    (torch.tensor([1.0, 2.0]), TypeError, "^token ids must be integers, got a tensor of torch.float32$"),
    (torch.tensor([True]), TypeError, "got a tensor of torch.bool"),
    (torch.tensor([[1, 2]]), ValueError, "^token ids must be one-dimensional, got a tensor of shape \\(1, 2\\)$"),
])
def test_prefill_refuses_what_is_not_a_token_of_the_vocabulary(model, bad, error, message):
    """Found: token -1 was embedded as token 96 (the last row). Every id outside [0, vocab), a float or a
    bool is an error naming the token, and the pool is left as it was."""
    pool = model.new_pool(4, 4)
    blocks = pool.allocate(1)
    k, v = pool.k.clone(), pool.v.clone()
    with pytest.raises(error, match=message):
        model.prefill(bad, pool, blocks, 0)
    with pytest.raises(error, match=message):
        model.prefill(bad, pool, blocks, 0, check=True)
    assert torch.equal(pool.k, k) and torch.equal(pool.v, v)


def test_decode_refuses_token_ids_outside_the_vocabulary_checked_or_not(model):
    """Ids on the host are checked whatever ``check`` says: the check costs no device synchronisation."""
    pool = model.new_pool(4, 4)
    table = torch.tensor([pool.allocate(1)], dtype=torch.int32)
    lens = torch.tensor([1], dtype=torch.int32)
    k = pool.k.clone()
    for bad in ([-1], [model.cfg.vocab], torch.tensor([-1])):
        for check in (True, False):
            with pytest.raises(ValueError, match="^token 0 is .*, outside the vocabulary: ids are 0 to 96$"):
                model.decode(bad, pool, table, lens, check=check)
    with pytest.raises(TypeError, match="but token 0 is 3.0"):
        model.decode([3.0], pool, table, lens)
    assert torch.equal(pool.k, k)


def test_decode_takes_one_token_length_and_row_per_request(model):
    pool = model.new_pool(4, 4)
    table = torch.tensor([pool.allocate(1), pool.allocate(1)], dtype=torch.int32)
    with pytest.raises(ValueError, match="^a decode step takes one token, one length and one block-table row per "
                       "request: got 1 tokens, 2 lengths and 2 rows$"):
        model.decode([3], pool, table, torch.tensor([1, 1], dtype=torch.int32))


def test_the_first_and_last_ids_of_the_vocabulary_are_tokens(model):
    """The edges are in: 0 and vocab - 1, as a list, a numpy array or a tensor of any integer type, give the
    same logits."""
    tokens = [0, model.cfg.vocab - 1, 5]
    pool = model.new_pool(4, 4)
    blocks = pool.allocate(1)
    want = model.prefill(tokens, pool, blocks, 0)
    for same in (np.array(tokens), np.array(tokens, dtype=np.uint8), torch.tensor(tokens, dtype=torch.int32),
                 tuple(tokens)):
        assert torch.equal(model.prefill(same, pool, blocks, 0), want)
