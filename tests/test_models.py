"""lib.models: the one decoder against a float64 oracle written out here (dense attention, no pool); a
prefill after a cached prefix against a full recompute; a step of prefill chunks and decodes together
against the requests run alone; every configuration (fused, compiled, quantized) against the eager
parts; bad token ids refused (float32, CPU)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lib import models
from lib.models import CONFIGS, Llama, batch, layers
from lib.prefix_cache import PrefixCache


@pytest.fixture(scope="module")
def model():
    return Llama.random(CONFIGS["tiny"], seed=0)


def test_same_seed_same_weights():
    a, b = Llama.random(CONFIGS["tiny"], seed=3), Llama.random(CONFIGS["tiny"], seed=3)
    assert torch.equal(a.weights.head, b.weights.head)
    assert not torch.equal(a.weights.head, Llama.random(CONFIGS["tiny"], seed=4).weights.head)


@pytest.fixture(scope="module")
def strong():
    """The tiny model with its layer products ten times larger (standard deviation 0.2): the layers then move
    the logits by as much as the embedding does, so a wrong layer cannot hide under the tolerance."""
    m = Llama.random(CONFIGS["tiny"], seed=1)
    for L in m.weights.layers:
        for p in ("wqkv", "wo", "wgu", "wd"):
            L[p].mul_(10)
    return m


def oracle(m: Llama, tokens: list[int]) -> torch.Tensor:
    """The logits [n, vocab] of ``tokens`` (positions 0 .. n-1) in float64, written from Llama's definition:
    RMSNorm, RoPE on pairs (x_i, x_{i + d/2}), causal grouped-query attention head by head over dense K and
    V, a SwiGLU MLP, residual adds."""
    c, w = m.cfg, m.weights
    n, D, Hq, Hkv = len(tokens), c.head_dim, c.heads, c.kv_heads

    def rms(v, g):
        return v / torch.sqrt((v * v).mean(-1, keepdim=True) + c.eps) * g.double()

    inv = torch.tensor([c.rope_theta ** (-2 * i / D) for i in range(D // 2)], dtype=torch.float64)
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]

    def rot(v):
        a, b = v[..., : D // 2], v[..., D // 2:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)

    x = w.embed.double()[torch.tensor(tokens)]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    for L in w.layers:
        qkv = rms(x, L["attn_norm"]) @ L["wqkv"].double()
        q = rot(qkv[:, : Hq * D].reshape(n, Hq, D))
        k = rot(qkv[:, Hq * D: (Hq + Hkv) * D].reshape(n, Hkv, D))
        v = qkv[:, (Hq + Hkv) * D:].reshape(n, Hkv, D)
        out = torch.empty(n, Hq, D, dtype=torch.float64)
        for h in range(Hq):
            kv = h // (Hq // Hkv)
            s = (q[:, h] @ k[:, kv].T / math.sqrt(D)).masked_fill(~causal, float("-inf"))
            out[:, h] = s.softmax(-1) @ v[:, kv]
        x = x + out.reshape(n, -1) @ L["wo"].double()
        g, u = (rms(x, L["mlp_norm"]) @ L["wgu"].double()).chunk(2, -1)
        x = x + (g * torch.sigmoid(g) * u) @ L["wd"].double()
    return rms(x, w.norm) @ w.head.double()


def close(got, want, rel=2e-5):
    return float((got.double() - want).abs().max()) <= rel * float(want.abs().max())


def test_prefill_and_decode_against_the_float64_oracle(strong):
    model = strong
    gen = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, model.cfg.vocab, (13,), generator=gen).tolist()
    want = oracle(model, tokens)
    pool = model.new_pool(16, 4)
    blocks = pool.allocate(4)
    assert close(model.prefill(tokens[:10], pool, blocks, 0), want[:10])
    table = torch.tensor([blocks], dtype=torch.int32)
    for p in range(10, 13):  # three decode steps, each after the last
        got = model.decode([tokens[p]], pool, table, torch.tensor([p + 1], dtype=torch.int32))
        assert close(got, want[p: p + 1])


def test_the_oracle_sees_a_wrong_model(strong):
    """The oracle is strict enough to catch a model that drops RoPE's rotation of K (a real bug class)."""
    model = strong
    tokens = list(range(9))
    pool = model.new_pool(8, 4)
    good = model.prefill(tokens, pool, pool.allocate(3), 0)
    class NoKRotation(layers.EagerRotary):
        def __call__(self, qkv, k_rows, v_rows, state, heads, kv_heads, head_dim):
            cos, sin, rows = state
            qkv = qkv.view(-1, heads + 2 * kv_heads, head_dim)
            k_rows.index_copy_(0, rows, qkv[:, heads: heads + kv_heads].reshape(-1, head_dim))
            v_rows.index_copy_(0, rows, qkv[:, heads + kv_heads:].reshape(-1, head_dim))
            return layers.rope(qkv[:, :heads], cos, sin)

    wrong = model.with_parts(models.EAGER.replace(rotary=NoKRotation()))
    pool = model.new_pool(8, 4)
    assert close(good, oracle(model, tokens)) and not close(wrong.prefill(tokens, pool, pool.allocate(3), 0),
                                                            oracle(model, tokens), rel=1e-3)


def test_a_step_of_a_prefill_chunk_and_a_decode_is_the_requests_alone(strong):
    """One StepBatch: request A's chunk of positions 5-9 (0-4 cached) in rows 0-4, request B's decode at
    position 7 in row 5; the logits are each request's own, from the oracle."""
    model = strong
    gen = torch.Generator().manual_seed(3)
    ta = torch.randint(0, model.cfg.vocab, (10,), generator=gen).tolist()
    tb = torch.randint(0, model.cfg.vocab, (8,), generator=gen).tolist()
    pool = model.new_pool(16, 4)
    ba, bb = pool.allocate(3), pool.allocate(2)
    model.prefill(ta[:5], pool, ba, 0)
    model.prefill(tb[:7], pool, bb, 0)
    pos = torch.tensor(list(range(5, 10)) + [7])
    blocks = torch.tensor([ba[p // 4] for p in range(5, 10)] + [bb[1]])
    seg = batch.Segment(0, 5, batch.page_rows(torch.tensor(ba), model.cfg.kv_heads), 10)
    table = torch.tensor([bb + [bb[0]]], dtype=torch.int32)  # a row as wide as the pages a request may hold
    step = batch.StepBatch(torch.tensor(ta[5:] + [tb[7]]), pos, [seg], (5, table, torch.tensor([8], dtype=torch.int32)),
                           blocks, pos % 4)
    got = model.forward(step, pool)
    assert close(got[:5], oracle(model, ta)[5:]) and close(got[5:], oracle(model, tb)[7:])


@pytest.mark.parametrize("parts", ["fused", "compiled", "int8", "int4"])
def test_every_configuration_is_the_same_decoder(model, parts):
    """The fused parts (Triton's interpreter) and the compiled ones give the eager logits; the quantized ones
    give the logits of the eager decoder on the weights they effectively use (quantized, then dequantized)."""
    gen = torch.Generator().manual_seed(5)
    m = Llama.random(CONFIGS["tiny"], seed=2)
    cfg = m.cfg
    pools = [m.new_pool(8, 4) for _ in range(2)]
    for p in pools:
        p.k.normal_(generator=gen), p.v.normal_(generator=gen)
    pools[1].k.copy_(pools[0].k), pools[1].v.copy_(pools[0].v)
    table = torch.tensor([[0, 1], [2, 3], [4, 5]], dtype=torch.int32)
    lens = torch.tensor([7, 1, 5], dtype=torch.int32)
    tokens = torch.randint(0, cfg.vocab, (3,), generator=gen)
    chosen = {"fused": models.FUSED, "compiled": models.compiled(backend="aot_eager"),
              "int8": models.quantized("int8"), "int4": models.quantized("int4", 32)}[parts]
    other = m.with_parts(chosen)
    ref = (models.dequantized(m, parts, 32).with_parts(models.EAGER) if parts.startswith("int") else m)
    want = ref.decode(tokens, pools[0], table, lens)
    got = other(tokens, pools[1], table, lens)
    assert float((got - want).abs().max()) <= 1e-4 * float(want.abs().max())
    assert torch.allclose(pools[1].k, pools[0].k, atol=1e-5) and torch.allclose(pools[1].v, pools[0].v, atol=1e-5)
    assert torch.equal(other.greedy(tokens, pools[1], table, lens), got.argmax(-1))
    assert other.weights is m.weights  # the same weights, not a copy


def test_parts_that_cannot_work_together_are_refused(model):
    with pytest.raises(ValueError, match="FusedNorm"):
        models.EAGER.replace(linear=layers.Skinny())
    with pytest.raises(ValueError, match="method for each"):
        models.EAGER.replace(linear={"wqkv": layers.Dense()})
    with pytest.raises(ValueError, match="fmt must be"):
        models.quantized("int3")
    pool = model.new_pool(4, 4)
    with pytest.raises(ValueError, match="prefill segments runs on EagerRotary"):
        model.with_parts(models.FUSED).prefill([1, 2, 3], pool, pool.allocate(1), 0)
    with pytest.raises(TypeError, match="Parts"):
        Llama(model.cfg, model.weights, "fused")


def test_layer_weight_bytes_by_hand():
    """tiny: per layer wqkv 64 x (4 + 2 x 2) x 16 = 8192, wo 64 x 64 = 4096, wgu 64 x 192 = 12288, wd 96 x 64
    = 6144 weights: 30720, two layers 61440; float32: 245760 bytes. int8: a byte per weight plus a float32
    scale per output column: 61440 + 4 x 2 x (128 + 64 + 192 + 64) = 65024."""
    m = Llama.random(CONFIGS["tiny"])
    assert m.layer_weight_bytes() == 245760
    assert m.with_parts(models.quantized("int8")).layer_weight_bytes() == 65024


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


def test_the_8b_products_by_hand():
    """Llama-3-8B: QKV 4096 -> (32 + 2 x 8) x 128 = 6144, O 4096 -> 4096, gate-up 4096 -> 2 x 14336 = 28672,
    down 14336 -> 4096."""
    assert models.LLAMA3_8B.product_shapes() == {"qkv": [4096, 6144], "o": [4096, 4096], "gate_up": [4096, 28672],
                                                 "down": [14336, 4096]}
