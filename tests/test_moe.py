"""MoE routing (lib.moe): top-k, the permutation into expert order and back, against hand-worked cases and the
float64 oracles."""

import math

import pytest
import torch

from lib import moe


def test_permute_hand_worked():
    # token 0 -> experts 2, 0; token 1 -> 0, 3; token 2 -> 2, 1. Flattened ids [2, 0, 0, 3, 2, 1]; sorted
    # stably by expert: pairs 1, 2 (expert 0), 5 (expert 1), 0, 4 (expert 2), 3 (expert 3)
    x = torch.tensor([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]])
    ids = torch.tensor([[2, 0], [0, 3], [2, 1]])
    xs, offsets, order = moe.permute(x, ids, E=4)
    assert order.tolist() == [1, 2, 5, 0, 4, 3]
    assert offsets.tolist() == [0, 2, 3, 5, 6]
    assert offsets.dtype == torch.int32
    assert xs[:, 0].tolist() == [1.0, 2.0, 3.0, 1.0, 3.0, 2.0]  # rows of tokens 0, 1, 2, 0, 2, 1


def test_permute_empty_and_unused_experts():
    x = torch.arange(4.0).reshape(2, 2)
    ids = torch.tensor([[4], [4]])  # every token to expert 4 of 6: experts 0-3 and 5 empty
    _, offsets, order = moe.permute(x, ids, E=6)
    assert offsets.tolist() == [0, 0, 0, 0, 0, 2, 2]
    assert order.tolist() == [0, 1]


def test_unpermute_inverts_permute_and_weights():
    # experts as scalings: expert e multiplies by (e + 1), so token t's output is x[t] * sum_j w_tj (e_tj + 1)
    x = torch.tensor([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]])
    ids = torch.tensor([[2, 0], [0, 3], [2, 1]])
    weights = torch.tensor([[0.75, 0.25], [0.5, 0.5], [0.1, 0.9]])
    xs, offsets, order = moe.permute(x, ids, E=4)
    scale = (ids.reshape(-1)[order] + 1).float()
    y = moe.unpermute(xs * scale[:, None], order, weights)
    expect = [1 * (0.75 * 3 + 0.25 * 1), 2 * (0.5 * 1 + 0.5 * 4), 3 * (0.1 * 3 + 0.9 * 2)]
    assert y[:, 0].tolist() == pytest.approx(expect)
    assert y[:, 1].tolist() == pytest.approx([10 * e for e in expect])


def test_top_k_hand_worked():
    # scores ln 1, ln 2, ln 3, ln 4: softmax 0.1, 0.2, 0.3, 0.4; the best two renormalized: 4/7, 3/7
    logits = torch.log(torch.tensor([[1.0, 2.0, 3.0, 4.0]]))
    w, ids = moe.top_k(logits, 2)
    assert ids.tolist() == [[3, 2]]
    assert w[0].tolist() == pytest.approx([4 / 7, 3 / 7])
    assert w.dtype == torch.float32


def test_top_k_matches_reference_on_random_scores():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(50, 16, generator=g)
    w, ids = moe.top_k(logits, 4)
    w_ref, ids_ref = moe.top_k_reference(logits, 4)
    assert torch.equal(ids, ids_ref)
    assert torch.allclose(w.double(), w_ref, atol=1e-6)
    assert torch.allclose(w.sum(-1), torch.ones(50))


def test_whole_layer_matches_reference():
    g = torch.Generator().manual_seed(2)
    n, K, N, E, k = 20, 8, 6, 5, 2
    x, router, w = torch.randn(n, K, generator=g), torch.randn(K, E, generator=g), torch.randn(E, K, N, generator=g)
    weights, ids = moe.top_k(x @ router, k)
    xs, offsets, order = moe.permute(x, ids, E)
    ys = torch.cat([xs[offsets[e]:offsets[e + 1]] @ w[e] for e in range(E)])
    y = moe.unpermute(ys, order, weights)
    ref = moe.moe_reference(x, lambda xt, e: xt @ w[e].double(), ids, weights)
    assert torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-5)
    # and the oracle is not trivially equal: a wrong expert changes it
    wrong = ids.clone()
    wrong[0, 0] = (wrong[0, 0] + 1) % E
    wrong[0, 0] = wrong[0, 0] if wrong[0, 0] != wrong[0, 1] else (wrong[0, 0] + 1) % E
    assert not torch.allclose(moe.moe_reference(x, lambda xt, e: xt @ w[e].double(), wrong, weights, tokens=[0]), ref[:1])


@pytest.mark.parametrize("bad", [0, 5, 2.0])
def test_top_k_refuses_bad_k(bad):
    with pytest.raises(ValueError, match="between 1 and E"):
        moe.top_k(torch.zeros(3, 4), bad)


def test_shape_errors_are_clear():
    with pytest.raises(ValueError, match="same n"):
        moe.permute(torch.zeros(3, 2), torch.zeros(2, 1, dtype=torch.long), E=2)
    with pytest.raises(ValueError, match="ys"):
        moe.unpermute(torch.zeros(5, 2), torch.arange(6), torch.ones(3, 2))


def test_reference_weights_sum_to_one():
    w, _ = moe.top_k_reference(torch.randn(7, 9), 3)
    assert all(math.isclose(float(s), 1.0) for s in w.sum(-1))


def test_swiglu_and_expert_mlp_hand_worked():
    # gate 0 -> silu 0; gate large -> silu ~ gate: [0, 10 | 3, 2] -> [0 * 3, silu(10) * 2]
    h = torch.tensor([[0.0, 10.0, 3.0, 2.0]])
    out = moe.swiglu(h)
    assert out[0, 0] == 0.0 and out[0, 1] == pytest.approx(2 * 10 / (1 + math.exp(-10)))
    # one expert, K = 1, I = 1: x -> silu(a x) (b x) c
    a, b, c, x = 2.0, 3.0, 0.5, 1.5
    run = moe.expert_mlp(torch.tensor([[[a, b]]]), torch.tensor([[[c]]]))
    silu = a * x / (1 + math.exp(-a * x))
    assert float(run(torch.tensor([x], dtype=torch.float64), 0)[0]) == pytest.approx(silu * b * x * c)
    with pytest.raises(ValueError, match="2 I"):
        moe.swiglu(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="w_up"):
        moe.expert_mlp(torch.zeros(1, 2, 4), torch.zeros(1, 3, 2))
