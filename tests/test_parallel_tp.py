"""lib.parallel.tp (chapter 10): the shards of the decoder's weights put back together give the whole
model's; TP = 2 and 4 ranks on gloo give the unsharded decode logits with two all-reduces per layer; a
shard that reduces wrongly (residual added on every rank, a reduction skipped) gives other logits."""

from __future__ import annotations

import pytest
import torch

from lib import models
from lib.models import Llama, ModelConfig, check_logits
from lib.parallel import dist, tp

CFG = ModelConfig(vocab=97, hidden=64, layers=2, heads=8, kv_heads=4, head_dim=16, mlp=128)
# one step of request 0 alone, then two of both, in pages of 2 tokens: contexts of 1 to 3 tokens, up to 2 pages
STEPS, SEED, LEAD, PAGE = 2, 3, 1, 2
TOL = models.LOGITS_TOLERANCE[("float32", "cpu")]


class ResidualOnEveryRank(tp.TPShard):
    """Wrong: every rank adds the residual to its partial sum before the reduction, which counts it TP times."""

    def _reduce_add(self, x, part, group):
        return super()._reduce_add(torch.zeros_like(x), x + part, group)


class SkipsFirstReduction(tp.TPShard):
    """Wrong: the first reduction (layer 0's attention output, first step) is left out on every rank."""

    def _reduce_add(self, x, part, group):
        if self.all_reduces == 0:
            self.all_reduces += 1
            return x + part
        return super()._reduce_add(x, part, group)


BUILDS = {"shard": tp.shard, "residual_on_every_rank": ResidualOnEveryRank, "skips_first_reduction": SkipsFirstReduction}


def rank_all_builds(rank, world, names):
    """One rank's ``check_rank`` for each build named, in one process (one spawn for all of them); the
    wrong builds run one step fewer (their first steps already show the error)."""
    return {n: tp.check_rank(rank, world, CFG, STEPS if n == "shard" else STEPS - 1, SEED, "float32",
                             build=BUILDS[n], lead=LEAD, block_size=PAGE) for n in names}


@pytest.fixture(scope="module")
def reference():
    return tp.reference_logits(CFG, STEPS, SEED, "float32", lead=LEAD, block_size=PAGE)


def _same_logits(what, got, want):
    assert len(got) == len(want)
    for t, (g, w) in enumerate(zip(got, want)):
        check_logits(f"{what}, step {t}", g, w, "float32", "cpu")


# ---------------------------------------------------------------------------- sharding by hand, in one process
def test_shards_put_back_together_give_the_whole_weights():
    m = Llama.random(CFG, seed=1)
    d, world = CFG.head_dim, 4
    shards = [tp.shard(m, r, world) for r in range(world)]
    hq, hkv, f = CFG.heads // world, CFG.kv_heads // world, CFG.mlp // world
    assert shards[0].cfg == ModelConfig(vocab=97, hidden=64, layers=2, heads=hq, kv_heads=hkv, head_dim=16, mlp=f)
    assert all(s.full == CFG for s in shards)
    for li, L in enumerate(m.layers):
        parts = [s.layers[li] for s in shards]
        for p in parts:
            assert p["wqkv"].shape == (CFG.hidden, (hq + 2 * hkv) * d) and p["wgu"].shape == (CFG.hidden, 2 * f)
        q = torch.cat([p["wqkv"][:, : hq * d] for p in parts], 1)
        k = torch.cat([p["wqkv"][:, hq * d: (hq + hkv) * d] for p in parts], 1)
        v = torch.cat([p["wqkv"][:, (hq + hkv) * d:] for p in parts], 1)
        assert torch.equal(torch.cat([q, k, v], 1), L["wqkv"])
        assert torch.equal(torch.cat([p["wo"] for p in parts], 0), L["wo"])
        gate = torch.cat([p["wgu"].chunk(2, dim=1)[0] for p in parts], 1)
        up = torch.cat([p["wgu"].chunk(2, dim=1)[1] for p in parts], 1)
        assert torch.equal(torch.cat([gate, up], 1), L["wgu"])
        assert torch.equal(torch.cat([p["wd"] for p in parts], 0), L["wd"])
        for p in parts:  # the norms are replicated
            assert torch.equal(p["attn_norm"], L["attn_norm"]) and torch.equal(p["mlp_norm"], L["mlp_norm"])
    for s in shards:  # embedding, final norm and output head replicated
        assert torch.equal(s.local.weights.embed, m.weights.embed) and torch.equal(s.local.weights.head, m.weights.head)
        assert torch.equal(s.local.weights.norm, m.weights.norm)
    pool = shards[0].new_pool(3, 4)
    assert pool.k.shape == (CFG.layers, 3, hkv, 4, d)


def test_bad_tensor_parallel_sizes_are_refused():
    m = Llama.random(CFG, seed=1)
    with pytest.raises(ValueError, match=r"heads = 8 is not divisible by the tensor-parallel size 3.*one of \[1, 2, 4\]"):
        tp.shard(m, 0, 3)
    with pytest.raises(ValueError, match=r"kv_heads = 4 is not divisible by the tensor-parallel size 8"):
        tp.shard(m, 0, 8)
    odd_mlp = Llama.random(ModelConfig(vocab=97, hidden=64, layers=1, heads=8, kv_heads=4, head_dim=16, mlp=130))
    with pytest.raises(ValueError, match=r"mlp = 130 is not divisible by the tensor-parallel size 4.*one of \[1, 2\]"):
        tp.shard(odd_mlp, 0, 4)
    for world in (0, -2, 2.0, True):
        with pytest.raises(ValueError, match="positive int"):
            tp.shard(m, 0, world)
    for rank in (2, -1, 0.0):
        with pytest.raises(ValueError, match=r"not a rank of a group of 2"):
            tp.shard(m, rank, 2)
    with pytest.raises(TypeError, match="Llama"):
        tp.shard(object(), 0, 2)


def test_decode_refuses_a_wrong_pool_and_a_missing_group():
    m = Llama.random(CFG, seed=1)
    s = tp.shard(m, 1, 2)
    lens, table = torch.tensor([1], dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match="make the pool with this shard's new_pool"):
        s.decode([5], m.new_pool(2, 4), table, lens)  # the whole model's pool: 4 KV heads, not 2
    with pytest.raises(RuntimeError, match="process group"):
        s.decode([5], s.new_pool(2, 4), table, lens)
    assert s.all_reduces == 0
    with pytest.raises(ValueError, match="dtype_name"):
        tp.reference_logits(CFG, 1, 0, "float64")
    with pytest.raises(ValueError, match="steps must be an int >= 1"):
        tp.decode_steps(m, 0, 0)


def test_one_rank_is_the_whole_model(reference):
    """With one rank the shard holds everything, the reductions are the identity, and decode gives the
    whole model's logits (no process group needed)."""
    s = tp.shard(Llama.random(CFG, seed=SEED), 0, 1)
    _same_logits("TP = 1", tp.decode_steps(s, STEPS, SEED, lead=LEAD, block_size=PAGE), reference)
    assert s.all_reduces == tp.REDUCTIONS_PER_LAYER * CFG.layers * (LEAD + STEPS)


# ---------------------------------------------------------------------------- ranks on gloo
@pytest.fixture(scope="module")
def tp2():
    return dist.run(rank_all_builds, 2, tuple(BUILDS))


@pytest.mark.parametrize("world", [2, 4])
def test_tensor_parallel_decode_gives_the_unsharded_logits(world, reference, tp2):
    """Every rank's logits equal the unsharded decode's within the float32 tolerance, the ranks' logits are
    identical (the reduced residual stream is the same everywhere), and each rank issued two all-reduces
    per layer per step."""
    out = [r["shard"] for r in (tp2 if world == 2 else dist.run(rank_all_builds, world, ("shard",)))]
    assert len(out) == world
    assert len(reference) == LEAD + STEPS
    for rank, r in enumerate(out):
        _same_logits(f"TP = {world}, rank {rank}", r["logits"], reference)
        assert r["all_reduces"] == 2 * CFG.layers * (LEAD + STEPS)
        for a, b in zip(r["logits"], out[0]["logits"]):
            assert torch.equal(a, b), f"rank {rank} of {world} computed other logits than rank 0"


@pytest.mark.parametrize("build", ["residual_on_every_rank", "skips_first_reduction"])
def test_a_wrong_reduction_gives_other_logits(build, reference, tp2):
    """The comparison above catches a shard that adds the residual on every rank before the reduction (the
    residual, of the embedding's scale, is then counted twice) or leaves a reduction out: its logits miss
    the unsharded ones by far more than the tolerance, on every rank."""
    for rank, r in enumerate(tp2):
        got = r[build]["logits"]
        assert len(got) == LEAD + STEPS - 1
        err = max(float((g - w).abs().max()) / float(w.abs().max()) for g, w in zip(got, reference))
        assert err > 100 * TOL, f"{build}, rank {rank}: logits within {err:.3g} of the unsharded ones"
        with pytest.raises(AssertionError, match="computes something else"):
            _same_logits(build, got, reference[: len(got)])
