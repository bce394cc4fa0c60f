"""lib.costs: the formulas the chapters compute with."""

from __future__ import annotations

import pytest

from lib import costs


def test_linear_layer_counts():
    assert costs.linear_flops(1, 4096, 4096) == 2 * 4096 * 4096
    assert costs.linear_bytes(128, 4096, 4096, 2) == 2 * (128 * 4096 * 2 + 4096 * 4096)
    assert costs.intensity(10, 4) == 2.5
    with pytest.raises(ValueError, match="positive byte count"):
        costs.intensity(1, 0)


def test_kv_bytes_of_the_seed_and_a_model():
    # seed: B=8, L=4096, 8 KV heads of 128, bf16 -> 128 MiB per layer
    assert costs.kv_step_bytes(8, 4096, 8, 128, 2) == 128 * 2**20
    m = costs.LLAMA3_8B
    per_token = costs.kv_cache_bytes(m["layers"], 1, 1, m["kv_heads"], m["head_dim"], 2)
    assert per_token == 32 * 2 * 8 * 128 * 2  # 128 KiB per token
    assert costs.kv_cache_bytes(32, 8, 4096, 8, 128) == 32 * costs.kv_step_bytes(8, 4096, 8, 128)
    assert m["heads"] * m["head_dim"] == m["hidden"]
    with pytest.raises(ValueError, match="H_kv must be a non-negative int"):
        costs.kv_step_bytes(1, 1, -1, 128)


def test_roofline_terms():
    roof = costs.Roofline(P_flops=1e15, BW_Bps=4e12, t_launch_s=2e-6)
    assert roof.ridge == 250
    assert roof.bound(1e6, 4e9) == "memory" and roof.time(1e6, 4e9) == pytest.approx(1e-3)
    assert roof.bound(1e15, 1) == "compute"
    assert roof.bound(1, 1, kernels=3) == "launch" and roof.time(1, 1, 3) == pytest.approx(6e-6)
    with pytest.raises(ValueError):
        costs.Roofline.from_ceilings({}, "lazy")


def test_matches_rounds_like_the_seed():
    assert costs.matches(33.554, "33.55")
    assert not costs.matches(33.6, "33.55")
    assert costs.matches(1.04, "1")


# ---------------------------------------------------------------------------- linear layers, by hand


def test_the_seed_worked_numbers():
    """K = N = 4096, b = 2. M = 1: F = 2*4096^2 = 33,554,432; Q = 2(4096 + 4096^2 + 4096) = 33,570,816.
    M = 128: F = 4,294,967,296; Q = 2(128*4096*2 + 4096^2) = 35,651,584; I = 120.47."""
    assert costs.linear_flops(1, 4096, 4096) == 33_554_432
    assert costs.linear_bytes(1, 4096, 4096) == 33_570_816  # b = 2 by default
    assert costs.linear_flops(128, 4096, 4096) == 4_294_967_296
    assert costs.linear_bytes(128, 4096, 4096, 2) == 35_651_584
    assert costs.matches(costs.intensity(4_294_967_296, 35_651_584), "120.47")
    assert costs.matches(costs.linear_flops(1, 4096, 4096) / 1e6, "33.55")
    assert costs.matches(costs.linear_bytes(128, 4096, 4096) / 1e6, "35.65")


def test_each_dimension_has_its_own_place():
    # M=2, K=3, N=5, b=4: F = 2*2*3*5 = 60; Q = 4(2*3 + 3*5 + 2*5) = 4*31 = 124
    assert costs.linear_flops(2, 3, 5) == 60
    assert costs.linear_bytes(2, 3, 5, 4) == 124
    assert costs.linear_bytes(2, 3, 5, 1) == 31
    assert costs.linear_bytes(1, 1, 1) == 6  # three one-element tensors of 2 bytes


def test_empty_dimensions_are_allowed():
    assert costs.linear_flops(0, 4096, 4096) == 0
    assert costs.linear_bytes(0, 8, 8, 2) == 128  # only the weight
    assert costs.kv_step_bytes(0, 4096, 8, 128) == 0
    assert costs.kv_cache_bytes(0, 1, 1, 8, 128) == 0


@pytest.mark.parametrize("fn, args", [
    (costs.linear_flops, {"M": 1, "K": 2, "N": 3}),
    (costs.linear_bytes, {"M": 1, "K": 2, "N": 3, "b": 2}),
    (costs.kv_step_bytes, {"B": 1, "L": 2, "H_kv": 3, "d": 4, "b": 2}),
    (costs.kv_cache_bytes, {"layers": 2, "B": 1, "T": 2, "H_kv": 3, "d": 4, "b": 2}),
])
@pytest.mark.parametrize("bad", [-1, 1.5, True, None])
def test_every_dimension_is_checked(fn, args, bad):
    for name in args:
        with pytest.raises(ValueError, match=f"^{name} must be a non-negative int, got {bad!r}$"):
            fn(**dict(args, **{name: bad}))


# ---------------------------------------------------------------------------- the KV cache, by hand


def test_kv_bytes_by_hand():
    # B=2, L=3, H_kv=5, d=7, b=4: K and V = 2 * 2*3*5*7 elements of 4 bytes = 1680 bytes
    assert costs.kv_step_bytes(2, 3, 5, 7, 4) == 1680
    assert costs.kv_step_bytes(1, 1, 1, 1) == 4  # one token of one head of one element: K and V, 2 bytes each
    assert costs.kv_cache_bytes(3, 2, 3, 5, 7, 4) == 3 * 1680
    assert costs.kv_cache_bytes(3, 2, 3, 5, 7, 1) == 3 * 420  # fp8: a quarter of fp32


def test_llama3_8b_kv_cache_by_hand():
    """32 layers x K and V x 8 heads x 128 x 2 bytes = 131,072 bytes (128 KiB) per token; 8k tokens: 1 GiB."""
    m = costs.LLAMA3_8B
    args = (m["layers"], 1, 8192, m["kv_heads"], m["head_dim"])
    assert costs.kv_cache_bytes(*args) == 2**30
    assert costs.kv_cache_bytes(*args, b=1) == 2**29  # an fp8 cache holds twice the tokens


def test_llama3_8b_layers_add_up_to_its_published_size():
    """Its linear layers and its two vocabulary matrices (embedding, LM head) hold 8.03 billion parameters."""
    m = costs.LLAMA3_8B
    per_layer = sum(k * n for k, n in m["linears"].values())
    assert per_layer == 4096 * (6144 + 4096 + 28672 + 14336)
    total = m["layers"] * per_layer + 2 * m["vocab"] * m["hidden"]
    assert costs.matches(total / 1e9, "8.03")
    assert m["linears"]["qkv"] == (m["hidden"], (m["heads"] + 2 * m["kv_heads"]) * m["head_dim"])


# ---------------------------------------------------------------------------- intensity and the ridge


def test_intensity_needs_a_positive_byte_count():
    assert costs.intensity(5, 1) == 5.0 and costs.intensity(3, 0.5) == 6.0 and costs.intensity(0, 7) == 0.0
    for q in (0, -1):
        with pytest.raises(ValueError, match=f"intensity needs a positive byte count, got {q}"):
            costs.intensity(1, q)


def test_ridge_batch_by_hand():
    # I ~ 2M/b meets P/BW = 1e15/4e12 = 250 at M = 250 b / 2
    assert costs.ridge_M(2, 1e15, 4e12) == 250
    assert costs.ridge_M(1, 1e15, 4e12) == 125
    assert costs.ridge_M(2, 0.5, 0.25) == 2  # small rates are rates too
    for P, BW in ((0, 1e12), (-1, 1e12), (1e15, 0), (1e15, -1)):
        with pytest.raises(ValueError, match=f"P and BW must be positive, got {P} and {BW}"):
            costs.ridge_M(2, P, BW)


# ---------------------------------------------------------------------------- the roofline


CEILINGS = {"bf16_tflops": 800.0, "copy_bw_GBps": 4000.0, "launch_graph_us": 1.0, "launch_eager_us": 4.0}


def test_roofline_from_chapter_0_ceilings():
    graph = costs.Roofline.from_ceilings(CEILINGS)  # a CUDA graph's launch cost by default
    assert graph == costs.Roofline(800e12, 4000e9, 1e-6)
    assert graph.ridge == 200  # 800 TFLOP/s over 4 TB/s
    assert costs.Roofline.from_ceilings(CEILINGS, "graph") == graph
    assert costs.Roofline.from_ceilings(CEILINGS, "eager") == costs.Roofline(800e12, 4000e9, 4e-6)
    with pytest.raises(ValueError, match="launch must be 'graph' or 'eager', got 'lazy'"):
        costs.Roofline.from_ceilings(CEILINGS, "lazy")


def test_roofline_time_is_the_largest_term():
    roof = costs.Roofline(P_flops=1e15, BW_Bps=4e12, t_launch_s=2e-6)
    assert roof.time(1e15, 1) == pytest.approx(1.0)  # compute: one second of FLOPs
    assert roof.time(1, 4e12) == pytest.approx(1.0)  # memory: one second of bytes
    assert roof.time(0, 1e7) == pytest.approx(2.5e-6)  # one kernel (the default) costs 2 us: the bytes take longer
    assert roof.time(0, 1e7, kernels=2) == pytest.approx(4e-6)
    assert roof.time(0, 0, 0) == 0
    assert costs.Roofline(1e15, 4e12).time(0, 0, 100) == 0  # no launch cost given: none counted


@pytest.mark.parametrize("args", [(-1, 0, 0), (0, -1, 0), (0, 0, -1)])
def test_roofline_time_refuses_negative_work(args):
    with pytest.raises(ValueError, match="flops, bytes and kernels must be non-negative, got "
                       + ", ".join(str(a) for a in args)):
        costs.Roofline(1e15, 4e12, 2e-6).time(*args)


def test_roofline_bound_switches_at_the_ridge():
    """P = 1024, BW = 4: ridge 256 FLOP/byte. With 8 bytes, 2048 FLOPs sit exactly on the ridge (2 s each):
    a point at the ridge counts as compute bound (I >= P/BW); one FLOP fewer is memory bound."""
    roof = costs.Roofline(1024.0, 4.0)
    assert roof.bound(2048, 8) == "compute"
    assert roof.bound(2047, 8) == "memory"
    assert roof.bound(2049, 8) == "compute"
    assert roof.time(2048, 8) == 2.0


def test_roofline_bound_names_launch_when_the_host_dominates():
    roof = costs.Roofline(P_flops=1e15, BW_Bps=4e12, t_launch_s=2e-6)
    assert roof.bound(0, 1e7) == "memory"  # 2.5 us of bytes beat one 2 us launch (the default)
    assert roof.bound(0, 1e7, kernels=2) == "launch"
    assert roof.bound(0, 8e6) == "memory"  # a tie between bytes and launch goes to the device
    assert roof.bound(4e9, 0, kernels=2) == "compute"  # 4 us of FLOPs


def test_matches_more_cases():
    assert costs.matches(1.4, "1") and not costs.matches(1.6, "1")  # "1" has no decimals
    assert costs.matches(120.466, "120.47") and not costs.matches(120.46, "120.47")
    assert costs.matches(0.3361, "0.336") and not costs.matches(0.3366, "0.336")
    assert costs.matches(35, "35") and not costs.matches(35, "35.1")
