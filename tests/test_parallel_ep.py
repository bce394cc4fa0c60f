"""lib.parallel.ep: the expert-parallel MoE layer on gloo (CPU, grouped GEMM in Triton's interpreter)
against the float64 oracle of the whole layer, its row counts and bytes against the routing computed
here, and the routing helpers by hand."""

from __future__ import annotations

import pytest
import torch

from lib import moe
from lib.parallel import dist, ep

E, k, K, INTER = 8, 2, 32, 16  # INTER: the experts' intermediate size I


def expected(world, n_per_rank, seed, bias=None):
    """Per rank: the oracle's outputs, the routing ids, and the rows and bytes the layer should report."""
    w_router, w_up, w_down, xs = ep.check_inputs(world, E, k, K, INTER, n_per_rank, seed, bias)
    oracle = moe.expert_mlp(w_up, w_down)
    refs, ids_all = [], []
    for x in xs:
        weights, ids = moe.top_k(x @ w_router, k)
        refs.append(moe.moe_reference(x, oracle, ids, weights) if len(x) else torch.zeros(0, K, dtype=torch.float64))
        ids_all.append(ids)
    local = E // world
    # sent[s, r]: rows rank s sends to rank r
    sent = torch.stack([torch.bincount(ids.reshape(-1) // local, minlength=world) for ids in ids_all])
    rows = sent.sum(0)
    row_bytes = K * 4
    nbytes = [int(sent[r].sum() - sent[r, r] + sent[:, r].sum() - sent[r, r]) * row_bytes for r in range(world)]
    return refs, ids_all, rows, nbytes


def check(world, n_per_rank, seed, bias=None):
    res = dist.run(ep.check_rank, world, E, k, K, INTER, n_per_rank, seed, bias)
    refs, ids_all, rows, nbytes = expected(world, n_per_rank, seed, bias)
    for r, ((out, got_rows, got_bytes), ref) in enumerate(zip(res, refs)):
        assert out.shape == ref.shape and out.dtype == torch.float32
        scale = float(ref.abs().max()) if ref.numel() else 1.0
        assert torch.allclose(out.double(), ref, rtol=1e-4, atol=1e-4 * scale), f"rank {r}"
        assert got_rows == int(rows[r]), f"rank {r}"
        assert got_bytes == nbytes[r], f"rank {r}"
    all_ids = torch.cat(ids_all)
    assert sum(r[1] for r in res) == all_ids.shape[0] * k
    assert torch.equal(ep.rank_loads(all_ids, E, world), rows)
    return res, all_ids, rows


def test_world_2_matches_the_whole_layer():
    _, _, rows = check(2, (5, 3), seed=0)
    assert rows.sum() == 16


def test_world_4_hot_expert_loads_its_rank():
    hot = 5  # owned by rank 2 (experts 4 and 5)
    bias = [0.0] * E
    bias[hot] = 60.0  # far above the scores' spread (about 6): every token picks it
    _, all_ids, rows = check(4, 3, seed=1, bias=bias)
    assert (all_ids == hot).any(dim=1).all()
    assert all(rows[2] > rows[r] for r in (0, 1, 3))


def test_rank_without_tokens_and_expert_without_rows():
    cold = 3  # a very negative score: no token picks it
    bias = [0.0] * E
    bias[cold] = -60.0
    res, all_ids, rows = check(2, (6, 0), seed=2, bias=bias)
    assert res[1][0].shape == (0, K)
    assert not (all_ids == cold).any()


def test_world_1_needs_no_process_group():
    w_router, w_up, w_down, (x,) = ep.check_inputs(1, E, k, K, INTER, 4, 3)
    layer = ep.EPMoE(w_router, w_up, w_down, 0, 1, k)
    weights, ids = moe.top_k(x @ w_router, k)
    ref = moe.moe_reference(x, moe.expert_mlp(w_up, w_down), ids, weights)
    assert torch.allclose(layer(x).double(), ref, rtol=1e-4, atol=1e-4 * float(ref.abs().max()))
    assert (layer.last_rows_received, layer.last_bytes_sent) == (8, 0)


def test_layer_rejects_bad_input():
    w_router, w_up, w_down, (x,) = ep.check_inputs(1, E, k, K, INTER, 2, 0)
    with pytest.raises(ValueError, match="split evenly"):
        ep.EPMoE(w_router, w_up, w_down, 0, 3, k)
    with pytest.raises(ValueError, match="rank"):
        ep.EPMoE(w_router, w_up, w_down, 2, 2, k)
    with pytest.raises(ValueError, match="k = 9"):
        ep.EPMoE(w_router, w_up, w_down, 0, 2, 9)
    with pytest.raises(ValueError, match="w_up"):
        ep.EPMoE(w_router, w_up[:, :, :-1], w_down, 0, 2, k)
    layer = ep.EPMoE(w_router, w_up, w_down, 0, 2, k)
    with pytest.raises(ValueError, match="tokens"):
        layer(x[:, :-1])
    with pytest.raises(ValueError, match="dtype"):
        layer(x.double())
    with pytest.raises(RuntimeError, match="process group"):
        layer(x)


def test_rank_loads_hand_worked():
    # E = 8 over 4 ranks: rank r owns experts 2r, 2r + 1
    ids = torch.tensor([[0, 5], [1, 4], [7, 5], [5, 0]])
    # experts 0, 1, 0 -> rank 0: 3; experts 5, 4, 5, 5 -> rank 2: 4; expert 7 -> rank 3: 1; rank 1: none
    assert ep.rank_loads(ids, 8, 4).tolist() == [3, 0, 4, 1]
    # over 2 ranks (experts 0-3 and 4-7)
    assert ep.rank_loads(ids, 8, 2).tolist() == [3, 5]
    assert ep.rank_loads(torch.empty(0, 2, dtype=torch.long), 8, 2).tolist() == [0, 0]
    with pytest.raises(ValueError, match="split evenly"):
        ep.rank_loads(ids, 8, 3)
    with pytest.raises(ValueError, match=r"\[0, E = 6\)"):
        ep.rank_loads(ids, 6, 2)
    with pytest.raises(ValueError, match="integer"):
        ep.rank_loads(ids.float(), 8, 2)


def test_dirichlet_routing():
    ids = ep.dirichlet_routing(500, 8, 3, 1.0, seed=4)
    assert ids.shape == (500, 3) and ids.dtype == torch.int64
    assert ((ids >= 0) & (ids < 8)).all()
    assert all(len(set(row)) == 3 for row in ids.tolist())
    assert torch.equal(ids, ep.dirichlet_routing(500, 8, 3, 1.0, seed=4))
    assert not torch.equal(ids, ep.dirichlet_routing(500, 8, 3, 1.0, seed=5))

    def skew(concentration):
        loads = torch.bincount(ep.dirichlet_routing(2000, 8, 2, concentration, seed=0).reshape(-1), minlength=8)
        return float(loads.max() / loads.float().mean())
    assert skew(0.1) > 3.0 > 1.3 > skew(100.0)  # 4 at most: every token on one expert
    assert ep.dirichlet_routing(0, 8, 2, 1.0, seed=0).shape == (0, 2)
    assert ep.dirichlet_routing(10, 8, 8, 0.01, seed=0).shape == (10, 8)  # k = E even with near-zero popularities
    for bad in (dict(concentration=0.0), dict(concentration=float("nan")), dict(k=9), dict(n=-1), dict(E=0)):
        args = dict(n=10, E=8, k=2, concentration=1.0, seed=0) | bad
        with pytest.raises(ValueError):
            ep.dirichlet_routing(**args)
