"""Top-p sampling without sorting (lib.kernels.sampling) in Triton's interpreter: the kept set against the
sorted cumulative sum in float64, the draw against the float64 oracle on the same uniforms, the seeded draw
against the probabilities, hand-worked sets and ties."""

import pytest
import torch

from lib.kernels import sampling as S


def _sorted_set(logits, p, T):
    """The smallest set of the most probable tokens with probability >= p, by sorting in float64 (with the
    tokens tied at its last value): a bool mask."""
    x = logits.double() / T
    srt, order = x.softmax(-1).sort(-1, descending=True)
    k = (srt.cumsum(-1) < p).sum(-1).clamp(max=logits.shape[1] - 1)
    tau = logits.gather(-1, order.gather(-1, k[:, None]))
    return logits >= tau


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("B,V,p,T,scale", [(1, 1000, 0.9, 1.0, 1.0), (3, 5000, 0.5, 0.7, 3.0), (2, 300, 1.0, 1.3, 2.0),
                                         (2, 700, 0.01, 1.0, 1.0), (4, 2049, 0.95, 0.5, 0.3)])
def test_kept_set_and_draw_match_float64(dtype, B, V, p, T, scale):
    g = torch.Generator().manual_seed(V + B)
    logits = (torch.randn(B, V, generator=g) * scale).to(dtype)
    kept = S.top_p_mask(logits, p, T)
    assert torch.equal(kept, _sorted_set(logits, p, T))
    u = torch.rand(B, V, generator=g)
    token = S.top_p_sample(logits, p, T, uniform=u)
    assert torch.equal(token, S.top_p_reference(logits, p, T, u))
    assert bool(kept.gather(1, token[:, None]).all())


def test_hand_worked_sets():
    # probabilities 0.5, 0.25, 0.125, 0.125 (logits log 4, log 2, 0, 0):
    # p = 0.5 keeps one token, 0.6 two, 0.8 all four (the two tied at the last kept value)
    logits = torch.tensor([[0.0, 2.0, 1.0, 0.0]]) * torch.log(torch.tensor(2.0))
    assert S.top_p_mask(logits, 0.5).tolist() == [[False, True, False, False]]
    assert S.top_p_mask(logits, 0.6).tolist() == [[False, True, True, False]]
    assert S.top_p_mask(logits, 0.8).tolist() == [[True, True, True, True]]
    # temperature 0.5 squares and renormalises: 16/21, 4/21, 1/21, 1/21: p = 0.7 keeps one, 0.9 two
    assert S.top_p_mask(logits, 0.7, 0.5).sum().item() == 1
    assert S.top_p_mask(logits, 0.9, 0.5).sum().item() == 2


def test_negative_logits_and_masked_tokens():
    # all logits negative, two of them -inf (a vocabulary padded with masked entries): never kept nor drawn
    logits = torch.tensor([[-3.0, -1.0, float("-inf"), -2.0, float("-inf"), -1.5]])
    kept = S.top_p_mask(logits, 1.0)
    assert kept.tolist() == [[True, True, False, True, False, True]]
    draws = S.top_p_sample(logits.repeat(16, 1), 1.0, seed=4, block_n=16).tolist()
    assert set(draws) <= {0, 1, 3, 5} and len(set(draws)) > 1


def test_per_request_top_p_and_temperature():
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(3, 800, generator=g) * 2
    p, T = torch.tensor([0.3, 0.9, 1.0]), torch.tensor([1.0, 0.5, 2.0])
    kept = S.top_p_mask(logits, p, T)
    for r in range(3):
        assert torch.equal(kept[r], _sorted_set(logits[r:r + 1], float(p[r]), float(T[r]))[0])


def test_seeded_draws():
    # two equally likely tokens, 48 requests: about half draw each (at least 12 of 48, four standard
    # deviations); the same seed draws the same tokens, another seed others
    logits = torch.zeros(48, 2, dtype=torch.float16)
    a = S.top_p_sample(logits, 1.0, seed=1, block_n=16)
    assert 12 <= int(a.sum()) <= 36
    assert torch.equal(a, S.top_p_sample(logits, 1.0, seed=torch.tensor([1]), block_n=16))
    assert not torch.equal(a, S.top_p_sample(logits, 1.0, seed=2, block_n=16))
    # probabilities 0.8 and 0.2 at p = 0.75: only the first is ever drawn
    logits = torch.tensor([[0.8, 0.2]]).log().repeat(48, 1).half()
    assert S.top_p_sample(logits, 0.75, seed=3, block_n=16).tolist() == [0] * 48


def test_the_torch_path_keeps_the_same_set():
    # top_p_torch draws from the same set (its draws fall inside the kernels' set)
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(16, 300, generator=g) * 3
    p, T = torch.full((16,), 0.8), torch.full((16,), 0.9)
    kept = S.top_p_mask(logits, p, T)
    for _ in range(5):
        assert bool(kept.gather(1, S.top_p_torch(logits, p, T)[:, None]).all())


def test_keys_order_like_the_values():
    v = torch.tensor([float("-inf"), -2.5, -1.0, -0.0, 0.0, 1e-3, 1.0, 3.0, float("inf")])
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        k = S.keys(v.to(dt))
        assert bool((k[1:] >= k[:-1]).all()) and int(k[3]) < int(k[4])


def test_bad_inputs():
    with pytest.raises(ValueError, match="top_p"):
        S.top_p_sample(torch.zeros(1, 4), 0.0)
    with pytest.raises(ValueError, match="temperature"):
        S.top_p_sample(torch.zeros(1, 4), 0.9, 0.0)
    with pytest.raises(ValueError, match="2-D"):
        S.top_p_sample(torch.zeros(4), 0.9)
    with pytest.raises(ValueError, match="shape"):
        S.top_p_sample(torch.zeros(2, 4), torch.tensor([0.9]))
    with pytest.raises(ValueError, match="uniform"):
        S.top_p_sample(torch.zeros(2, 4), 0.9, uniform=torch.rand(2, 5))


# ------------------------------------------------------------------ values the draw is undefined for
@pytest.mark.parametrize("name,values,shown", [
    ("top_p", [0.9, 0.0], r"top_p\[1\] = 0.0 is not in \(0, 1\]"),
    ("top_p", [1.5, 0.9], r"top_p\[0\] = 1.5 is not in \(0, 1\]"),
    ("top_p", [0.9, float("nan")], r"top_p\[1\] = nan is not in \(0, 1\]"),
    ("top_p", [-0.5, 0.9], r"top_p\[0\] = -0.5 is not in"),
    ("temperature", [1.0, 0.0], r"temperature\[1\] = 0.0 is not a finite number > 0.*greedy.*argmax"),
    ("temperature", [-1.0, 1.0], r"temperature\[0\] = -1.0 is not a finite number > 0"),
    ("temperature", [float("nan"), 1.0], r"temperature\[0\] = nan is not"),
    ("temperature", [1.0, float("inf")], r"temperature\[1\] = inf is not"),
])
def test_per_request_values_outside_their_domain_are_refused(name, values, shown):
    """top_p in (0, 1], temperature finite and > 0 (0 is greedy: the engine takes the argmax for it): a tensor
    holding anything else is refused, on the CPU by default and with check=True."""
    logits = torch.randn(2, 40, generator=torch.Generator().manual_seed(0))
    kw = {name: torch.tensor(values)}
    for fn in (S.top_p_sample, S.top_p_mask):
        for check in (None, True):
            with pytest.raises(ValueError, match=shown):
                fn(logits, **kw, check=check)


def test_scalars_outside_their_domain_are_refused():
    logits = torch.zeros(1, 4)
    for bad in (float("inf"), float("nan"), -1.0, True, "1.0"):
        with pytest.raises(ValueError, match=r"temperature must be a finite number > 0"):
            S.top_p_sample(logits, 0.9, bad)
    for bad in (float("nan"), 1.01, -0.1, True):
        with pytest.raises(ValueError, match=r"top_p must be a number in \(0, 1\]"):
            S.top_p_mask(logits, bad)


@pytest.mark.parametrize("where,value,shown", [
    ((1, 3), float("nan"), r"logits\[1, 3\] is NaN"),
    ((0, 0), float("inf"), r"logits\[0, 0\] is \+inf"),
    ((1, slice(None)), float("-inf"), r"logits\[1\] is -inf everywhere.*leave at least one token finite"),
])
def test_logits_the_softmax_is_undefined_for_are_refused(where, value, shown):
    """A NaN would make the kept set the whole vocabulary, a row all -inf would draw token 0: refused (a few
    -inf, masked tokens, are fine: test_negative_logits_and_masked_tokens)."""
    logits = torch.randn(2, 40, generator=torch.Generator().manual_seed(1))
    logits[where] = value
    for fn in (S.top_p_sample, S.top_p_mask):
        with pytest.raises(ValueError, match=shown):
            fn(logits, 0.9)
    with pytest.raises(ValueError, match=shown):
        S.top_p_sample(logits.half(), 0.9, check=True)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's arithmetic on a NaN temperature
def test_values_are_read_only_where_check_asks(monkeypatch):
    """check=False reads no value (the caller vouches, as inside a CUDA graph: a draw on bad values means
    nothing but reads and writes nothing outside its tensors); check=True where values cannot be read (meta
    tensors, a graph capture) is refused; None reads them on the CPU."""
    logits = torch.randn(2, 40, generator=torch.Generator().manual_seed(0)).half()
    seen = []
    real = S._check_values
    monkeypatch.setattr(S, "_check_values", lambda *a: seen.append(a) or real(*a))
    assert S.top_p_sample(logits, 0.9, torch.tensor([1.0, float("nan")]), check=False).shape == (2,)
    assert seen == []
    S.top_p_sample(logits, 0.9)
    assert len(seen) == 1
    with pytest.raises(ValueError, match="check=True.*meta tensors hold no values"):
        S.top_p_sample(torch.zeros(2, 8, device="meta"), 0.9, seed=torch.zeros(1, dtype=torch.int64, device="meta"),
                       check=True)


def test_empty_batches_and_vocabularies():
    """No rows: no token (nothing launched); rows of no columns: nothing to draw from, refused."""
    assert S.top_p_sample(torch.zeros(0, 50), 0.9).tolist() == []
    assert S.top_p_sample(torch.zeros(0, 50), torch.zeros(0), torch.zeros(0)).dtype == torch.int64
    assert S.top_p_mask(torch.zeros(0, 50), 0.9).shape == (0, 50)
    for fn in (S.top_p_sample, S.top_p_mask):
        with pytest.raises(ValueError, match=r"logits \(2, 0\) has no columns"):
            fn(torch.zeros(2, 0), 0.9)


def test_block_n_is_checked_not_replaced():
    for bad in (0, 8, 24, True, 32.0):
        with pytest.raises(ValueError, match=rf"block_n must be a power of two >= 16.*got {bad!r}"):
            S.top_p_sample(torch.zeros(1, 40), 0.9, block_n=bad)
        with pytest.raises(ValueError, match="block_n must be a power of two >= 16"):
            S.top_p_mask(torch.zeros(1, 40), 0.9, block_n=bad)
