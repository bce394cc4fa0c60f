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
