"""Chapter 10's predictions: collectives, the tensor-parallel step and the expert-parallel layer, on
hand-worked cases and on chapter 7's reference data."""

import pytest
import torch

from lib.bench import ceilings, results
from lib.experiments import decode_step, decode_step_analysis
from lib.experiments import parallelism as px


def test_bus_factors_and_a_collective_by_hand():
    assert px.bus_factor("all_reduce", 2) == 1.0 and px.bus_factor("all_reduce", 4) == 1.5
    assert px.bus_factor("all_to_all", 4) == 0.75 and px.bus_factor("all_to_all", 1) == 0.0
    # 1 MB all-reduced over 2 ranks at 100 GB/s of bus bandwidth: 10 us of latency + 1e6 / 1e5 us
    assert px.collective_us("all_reduce", 1e6, 2, 10.0, 100.0) == pytest.approx(20.0)
    assert px.collective_us("all_to_all", 1e6, 4, 10.0, 100.0) == pytest.approx(17.5)
    assert px.collective_us("all_reduce", 1e6, 1, 10.0, 100.0) == 0.0  # one rank moves nothing
    with pytest.raises(ValueError, match="kind"):
        px.bus_factor("broadcast", 2)
    with pytest.raises(ValueError, match="busbw"):
        px.collective_us("all_reduce", 1.0, 2, 1.0, 0.0)


def test_the_fit_recovers_a_line_and_refuses_what_is_not_one():
    rows = [{"bytes": b, "us": px.collective_us("all_reduce", b, 4, 7.0, 300.0)} for b in (1e3, 1e5, 1e7, 1e8)]
    alpha, busbw = px.fit_collective(rows, "all_reduce", 4)
    assert alpha == pytest.approx(7.0) and busbw == pytest.approx(300.0)
    with pytest.raises(ValueError, match="two sizes"):
        px.fit_collective(rows[:1], "all_reduce", 4)
    with pytest.raises(ValueError, match="grow"):
        px.fit_collective([{"bytes": 1e3, "us": 9.0}, {"bytes": 1e6, "us": 8.0}], "all_reduce", 4)


@pytest.fixture(scope="module")
def ch7():
    r7 = results.load("07-decode-step", results.REFERENCE)
    a = decode_step.Analysis(r7["data"], r7["params"], ceilings.load(results.REFERENCE))
    alpha = decode_step_analysis.kernel_alpha_us(results.load("00-the-machine", results.REFERENCE)["data"]["copy_cold"])
    return a, alpha


def test_one_rank_is_chapter_7s_model_and_two_ranks_halve_the_split_parts(ch7):
    a, alpha = ch7
    base = decode_step_analysis.parts(a, alpha)
    base = base[(base["B"] == 1) & (base["L"] == 1024) & (base["path"] == "fused")].set_index("part")
    one = px.tp_step(a, alpha, 1, 1024, 1, 10.0, 400.0).set_index("part")
    two = px.tp_step(a, alpha, 1, 1024, 2, 10.0, 400.0).set_index("part")
    assert one.loc["all-reduces", "predicted (us)"] == 0.0
    for part in base.index:
        assert one.loc[part, "predicted (us)"] == pytest.approx(base.loc[part, "predicted (us)"])
    for part, div in (("layer weights", 2), ("attention (K/V)", 2), ("output head", 1), ("small operators", 1)):
        assert two.loc[part, "work (us)"] == pytest.approx(one.loc[part, "work (us)"] / div)
        assert two.loc[part, "kernels"] == one.loc[part, "kernels"]  # every rank launches the same kernels
    c = a.cfg
    assert two.loc["all-reduces", "kernels"] == 2 * c.layers
    assert two.loc["all-reduces", "predicted (us)"] == pytest.approx(
        2 * c.layers * px.collective_us("all_reduce", 1 * c.hidden * 2, 2, 10.0, 400.0))


def test_at_the_break_even_latency_tp_is_no_faster(ch7):
    a, alpha = ch7
    for B, L in ((1, 1024), (64, 4096)):
        be = px.breakeven_alpha_us(a, alpha, B, L, 2, 400.0)
        assert be > 0
        assert px.tp_speedup(a, alpha, B, L, 2, be, 400.0) == pytest.approx(1.0, abs=1e-3)
        assert px.tp_speedup(a, alpha, B, L, 2, be / 2, 400.0) > 1 > px.tp_speedup(a, alpha, B, L, 2, 2 * be, 400.0)
    with pytest.raises(ValueError, match="divide"):
        px.tp_step(a, alpha, 1, 1024, 3, 10.0, 400.0)
    with pytest.raises(ValueError, match="no step"):
        px.tp_step(a, alpha, 2, 1024, 2, 10.0, 400.0)


def test_expert_ranks_by_hand():
    ids = torch.tensor([[0, 2], [0, 3], [0, 2]])
    counts = px.expert_counts(ids, 4)
    assert counts.tolist() == [3, 0, 2, 1]
    # rank 0 owns experts 0-1 (3 rows, 1 active), rank 1 experts 2-3 (3 rows, 2 active); K = I = 1000, 2 bytes:
    # an expert's weights are 6 MB, 6 us at 1,000 GB/s; a row 6e6 FLOPs, 6e-6 us at 1 PFLOP/s: bytes win
    r = px.ep_rank_us(counts, 2, 1000, 1000, b=2, BW_GBps=1000.0, P_TFLOPs=1000.0, kernel_alpha_us=1.0)
    assert r["rows"].tolist() == [3, 3] and r["active experts"].tolist() == [1, 2]
    assert r["predicted (us)"].tolist() == pytest.approx([3 + 6.0, 3 + 12.0])
    assert px.hot_rank_slowdown(r) == pytest.approx(15.0 / 12.0)
    layer = px.ep_layer_us(r, 3, 2, 1000, b=2, a2a_alpha_us=5.0, busbw_GBps=100.0)
    assert layer == pytest.approx(15.0 + 2 * (5.0 + 0.5 * 3 * 2 * 1000 * 2 / 1e5))
    with pytest.raises(ValueError, match="divide"):
        px.ep_rank_us(counts, 3, 8, 8, b=2, BW_GBps=1.0, P_TFLOPs=1.0, kernel_alpha_us=0.0)
    with pytest.raises(ValueError, match="lie in"):
        px.expert_counts(torch.tensor([[4]]), 4)


def test_a_part_without_a_prediction_leaves_the_step_unpredicted(ch7):
    # on a CPU chapter 7 has no kernel profile, so its parts have no kernel counts: NaN, never a step of 0 us
    a, _ = ch7
    nan = float("nan")
    assert px.tp_speedup(a, nan, 1, 1024, 2, 10.0, 400.0) != px.tp_speedup(a, nan, 1, 1024, 2, 10.0, 400.0)
    rows = [{"B": 1, "L": 1024, "tp": 2, "round": 0, "gpu_us": 100.0, "call_us": 120.0}]
    t = px.tp_rank_table(rows, a, nan)
    assert t["predicted (us)"].isna().all() and t["measured / predicted"].isna().all()
