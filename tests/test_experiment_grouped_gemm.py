"""lib.experiments.grouped_gemm (chapter 4): the smoke sweep measured on the CPU with the notebook's own
paths, the data's structure against the stored H200 results, the correctness checks on wrong paths, and the
analysis (lib.experiments.grouped_gemm_analysis) on cases worked by hand."""

from __future__ import annotations

import json
import re
from numbers import Real
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from lib.bench import ceilings, results
from lib.experiments import grouped_gemm as experiment
from lib.experiments import grouped_gemm_analysis as analysis
from lib.kernels import grouped_gemm as gg
from lib.kernels import launch
from tests.conftest import ROOT

NOTEBOOK = ROOT / "notebooks" / "04-grouped-gemm.ipynb"
# one case, the cheapest the sweep can run: the checks come before any timing
TINY = {**experiment.sweep("smoke"), "shapes": [[3, 16, 24]], "T": [6], "routing": ["uniform"]}


def notebook_paths():
    """The notebook's ``paths`` (its cells tagged measure, less the run cell), after its import cell."""
    cells = [c for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code"]
    src = ["".join(c["source"]) for c in cells]
    ns = {}
    exec(next(s for s in src if "from lib.experiments import grouped_gemm" in s), ns)
    for c, s in zip(cells, src):
        tags = c["metadata"].get("tags", [])
        if "measure" in tags and "measure_or_replay" not in s:
            exec(s, ns)
    return ns["paths"]


@pytest.fixture(scope="module")
def smoke():
    params = experiment.sweep("smoke")
    return params, experiment.measure(params, "cpu", notebook_paths())


def stored():
    return results.load("04-grouped-gemm", results.REFERENCE)


def test_smoke_data_has_the_structure_of_the_stored_data(smoke):
    params, data = smoke
    ref = {r["path"]: r for r in stored()["data"]["points"]}
    assert data["sms"] == launch.CPU_SMS
    cases = [(E, T, str(r)) for E, _, _ in params["shapes"] for T in params["T"] for r in params["routing"]]
    seen = {}
    for row in data["points"]:
        seen.setdefault((row["E"], row["T"], row["routing"]), []).append(row["path"])
        assert set(row) == set(ref[row["path"]]), row["path"]
        assert set(row["timing"]) == set(ref[row["path"]]["timing"]) and row["timing"]["method"] == "cpu-wall"
        counts = row["counts"]
        assert len(counts) == row["E"] and sum(counts) == row["T"]
        assert row["nonempty"] == sum(1 for m in counts if m) and row["Mmax"] == max(counts)
        assert row["err"] < experiment.tolerance(params["dtype"])
        assert row["kernels"] == (row["nonempty"] if row["path"] == "loop" else None)  # no profiler on the CPU
        if row["path"] == "lib":
            assert set(row["config"]) == set(ref["lib"]["config"])
            assert row["config"]["programs"] == row["config"]["programs_per_sm"] * launch.CPU_SMS
            assert row["half_tail_err"] < experiment.tolerance(params["dtype"])
            assert len(row["half_tail_pairs"]["ratio"]) and row["half_tail_pairs"]["method"] == "cpu-wall pairs"
    assert list(seen) == cases  # every case once, in the order of the sweep's loops
    for paths in seen.values():  # every path of the CPU once per case, in the notebook's order
        assert paths[0] == "loop" and paths[-2:] == ["lib", "lib, unplanned"] and "padded bmm" in paths
        assert not any(p.startswith("streams") for p in paths)  # streams are CUDA streams: GPU only


def test_smoke_data_goes_through_the_analysis(smoke):
    params, data = smoke
    c = {"bf16_tflops": 1.0, "copy_bw_GBps": 1.0, "read_bw_GBps": 1.0}
    a = analysis.Analysis(data, params, c)
    assert len(a.cases) == len(params["shapes"]) * len(params["T"]) * len(params["routing"])
    numbers, texts, checks = a.numbers(), a.texts(), a.checks()
    assert numbers["cases"] == len(a.cases) and numbers["lib_tma_cases"] == len(a.cases)
    assert set(texts) >= {f"target_{i}_verdict" for i in (1, 2, 3, 4)}
    assert checks["err_max"] < experiment.tolerance(params["dtype"]) and checks["lib_kernels_max"] == 1


def wrong(name, paths):
    """``paths`` with the path ``name`` returning its output plus one."""
    def bad(c, p, device):
        fns = paths(c, p, device)
        good = fns[name]
        fns[name] = lambda: good() + 1
        return fns
    return bad


@pytest.mark.parametrize("name", ["loop", "padded bmm", "lib, unplanned", experiment.HALF])
def test_a_wrong_path_stops_the_run(name):
    with pytest.raises(AssertionError, match=f"{name} E=3 T=6 uniform: relative error"):
        experiment.measure(TINY, "cpu", wrong(name, notebook_paths()))


def test_paths_must_give_the_lib_plan_and_the_required_paths():
    paths = notebook_paths()

    def unplanned_lib(c, p, device):
        fns = paths(c, p, device)
        fns["lib"] = fns["lib, unplanned"]
        return fns

    def no_half(c, p, device):
        fns = paths(c, p, device)
        del fns[experiment.HALF]
        return fns

    with pytest.raises(TypeError, match="functools.partial"):
        experiment.measure(TINY, "cpu", unplanned_lib)
    with pytest.raises(ValueError, match="no callable for \\['lib, half tails'\\]"):
        experiment.measure(TINY, "cpu", no_half)
    with pytest.raises(ValueError, match="params lack \\['pairs'\\]"):
        experiment.measure({k: v for k, v in TINY.items() if k != "pairs"}, "cpu", paths)


def test_route_counts_every_token_once():
    gen = torch.Generator().manual_seed(0)
    for routing in ("uniform", 0.1):
        counts = experiment.route(100, 7, routing, gen)
        assert counts.shape == (7,) and int(counts.sum()) == 100 and bool((counts >= 0).all())


def point(path, gpu_us, call_us, **extra):
    """One row of data for the case E = 2, K = 4, N = 8, T = 4, counts [3, 1]."""
    t = {"median": 0.0, "q1": 0.0, "q3": 0.0, "min": 0.0, "max": 0.0, "n": 1}
    timing = {"gpu_us": {**t, "median": gpu_us}, "call_us": {**t, "median": call_us}, "calls_per_sample": 1,
              "buffers": 1, "method": "cpu-wall"}
    return {"E": 2, "K": 4, "N": 8, "T": 4, "routing": "uniform", "path": path, "err": 0.0, "nonempty": 2,
            "Mmax": 3, "counts": [3, 1], "kernels": 1, "kernel_names": None, "timing": timing, **extra}


def test_analysis_of_a_case_worked_by_hand():
    """bf16 (2 bytes), P = 1 TFLOP/s, BW = 1 GB/s: F = 2 * 4 * 4 * 8 = 256 FLOPs, Q = 2 (2 * 4 * 8 + 4 * 4 +
    4 * 8) = 224 bytes, the floor max(0.000256, 0.224) us, memory-bound. Tiles of 16 x 16 over experts of 3
    and 1 rows, N = 8: 2 tiles of 256 cells for 32 useful ones: waste 1 - 32/512; padded to the busiest:
    1 - 4 / (2 * 3). Four programs (4 SMs, one each): one round, half a tile per program."""
    cfg = dict(gg.choose_config(4, 2, 4), block_m=16, block_n=16, programs_per_sm=1)
    ratio = {"median": 1.25, "q1": 1.0, "q3": 1.5, "min": 1.0, "max": 1.5, "n": 3}
    data = {"sms": 4, "points": [
        point("loop", 2.0, 8.0),
        point("grouped_mm", 1.0, 3.0),
        point("lib", 0.448, 2.0, config=cfg, tma=True, half_tail_err=0.0, half_tail_pairs={"ratio": ratio},
              vs_grouped_mm_pairs={"ratio": {**ratio, "median": 0.5}}),
        point("lib, unplanned", 0.448, 6.0),
    ]}
    params = {**experiment.sweep("full"), "shapes": [[2, 4, 8]], "T": [4], "routing": ["uniform"]}
    a = analysis.Analysis(data, params, {"bf16_tflops": 1.0, "copy_bw_GBps": 1.0, "read_bw_GBps": 1.0})
    case = (2, 4, "uniform")
    row = a.cases.loc[case]
    assert row["floor (us)"] == pytest.approx(0.224) and row["bound"] == "memory"
    assert a.per_path("GPU time (us)").columns.tolist() == ["loop", "grouped_mm", "lib"]
    s = a.summary.loc[case]
    assert s["lib of floor"] == pytest.approx(0.5)
    assert s["speedup vs grouped_mm (GPU, pairs)"] == pytest.approx(2.0)  # 1 / the pairs' median ratio
    assert s["speedup vs grouped_mm (GPU, apart)"] == pytest.approx(1.0 / 0.448)
    assert s["speedup vs loop (call)"] == pytest.approx(4.0) and s["loop call / floor"] == pytest.approx(8 / 0.224)
    t = a.tiles.loc[case]
    assert (t["tiles"], t["rounds"], t["tile"]) == (2, 1, "16 x 16")
    assert t["tiles per program"] == pytest.approx(0.5)
    assert t["tile waste"] == pytest.approx(1 - 32 / 512) and t["padded bmm waste"] == pytest.approx(1 - 4 / 6)
    w = a.work.loc[case]
    assert w["computed / useful FLOPs"] == pytest.approx(16.0)
    assert w["half tails: computed / useful"] == pytest.approx((8 + 8) * 16 / 32)  # half tiles of 8 rows
    assert w["half tails / whole (GPU)"] == pytest.approx(1.25)
    assert a.best_rate == pytest.approx(256 * 16 / 0.448e-6)
    n = a.numbers()
    assert n["lib_unplanned_over_planned_call_median"] == pytest.approx(3.0)
    assert n["grouped_mm_e8_worst_q1"] == pytest.approx(1 / 1.5) and n["grouped_mm_e8_worst_q3"] == pytest.approx(1.0)
    assert a.texts()["grouped_mm_e8_worst_case"] == "T = 4, uniform routing"
    assert a.checks()["unplanned_over_planned_smallest"] == pytest.approx(3.0)
    # no compute-bound case at the fewest experts, no case at E >= 64; lib beats grouped_mm
    assert list(a.targets["met"]) == [False, False, True, False]


def case_point(E, counts, path, gpu_us, **extra):
    """One row of data for E experts with ``counts`` tokens, K = 4, N = 8, bf16 (no padded bmm)."""
    t = {"median": 0.0, "q1": 0.0, "q3": 0.0, "min": 0.0, "max": 0.0, "n": 1}
    timing = {"gpu_us": {**t, "median": gpu_us}, "call_us": {**t, "median": 10 * gpu_us}, "calls_per_sample": 1,
              "buffers": 1, "method": "cpu-wall"}
    return {"E": E, "K": 4, "N": 8, "T": sum(counts), "routing": "uniform", "path": path, "err": 0.0,
            "nonempty": sum(1 for m in counts if m), "Mmax": max(counts), "counts": counts, "kernels": 1,
            "kernel_names": None, "timing": timing, **extra}


def test_targets_against_the_cublas_loop_and_the_read_floor_worked_by_hand():
    """bf16, P = 0.001 TFLOP/s (1e9 FLOP/s), read rate 1 GB/s, copy rate 0.5 GB/s; K = 4, N = 8, T = 4:
    F = 2 * 4 * 4 * 8 = 256 FLOPs, F/P = 0.256 us.
    E = 2, counts [3, 1]: Q = 2 (2 * 32 + 16 + 32) = 224 bytes; read floor max(0.256, 0.224) = 0.256 us,
    compute-bound (by the copy rate, 0.448 us, it would be memory-bound: the floor takes the read rate). The cuBLAS
    loop 0.4 us, lib 0.5 us: the loop's time over lib's is 0.8, under the target of 1.
    E = 64, four experts of one token: Q = 2 (4 * 32 + 16 + 32) = 352 bytes, read floor 0.352 us,
    memory-bound; lib 0.4 us reaches 0.352 / 0.4 = 0.88 of it, over the target of 0.85."""
    cfg = dict(gg.choose_config(4, 2, 4), block_m=16, block_n=16, programs_per_sm=1)
    heavy = [1, 1, 1, 1] + [0] * 60
    pairs = {"ratio": {"median": 0.5, "q1": 0.5, "q3": 0.5, "min": 0.5, "max": 0.5, "n": 1}}
    data = {"sms": 4, "points": [
        case_point(2, [3, 1], "loop", 0.4), case_point(2, [3, 1], "lib", 0.5, config=cfg, tma=True, vs_grouped_mm_pairs=pairs),
        case_point(2, [3, 1], "grouped_mm", 1.0), case_point(64, heavy, "grouped_mm", 0.8),
        case_point(64, heavy, "loop", 2.0), case_point(64, heavy, "lib", 0.4, config=cfg, tma=True, vs_grouped_mm_pairs=pairs),
    ]}
    params = {**experiment.sweep("full"), "shapes": [[2, 4, 8], [64, 4, 8]], "T": [4], "routing": ["uniform"]}
    a = analysis.Analysis(data, params, {"bf16_tflops": 0.001, "copy_bw_GBps": 0.5, "read_bw_GBps": 1.0})
    small, large = (2, 4, "uniform"), (64, 4, "uniform")
    assert a.cases.loc[small, "read floor (us)"] == pytest.approx(0.256)
    assert (a.cases.loc[small, "read bound"], a.cases.loc[small, "bound"]) == ("compute", "compute")
    assert a.cases.loc[small, "floor (us)"] == pytest.approx(0.256)  # the floor is the read floor, not the copy one
    assert a.cases.loc[large, "read floor (us)"] == pytest.approx(0.352) and a.cases.loc[large, "read bound"] == "memory"
    n, t = a.numbers(), a.texts()
    assert n["speedup_vs_cublas_loop_e8"] == pytest.approx(0.8) and n["e8_compute_cases"] == 1
    assert n["read_floor_frac_min_weight_bound"] == pytest.approx(0.88) and n["weight_bound_cases"] == 1
    assert n["read_floor_misses"] == 0 and n["read_bw_GBps"] == pytest.approx(1.0)
    assert t["cublas_e8_worst_case"] == "E = 2, T = 4, uniform routing"
    assert (t["e8_compute_cases_words"], t["e8_memory_cases_words"]) == ("T = 4, uniform", "none")
    assert t["read_floor_worst_case"] == "E = 64, T = 4, uniform routing"
    targets = a.targets.set_index("goal")
    assert list(a.targets["goal"][:2]) == [">= 1.0", ">= 0.85"]
    assert list(a.targets["met"][:2]) == [False, True] and targets.loc[">= 0.85", "measured"] == pytest.approx(0.88)
    table = a.compare_table()
    assert table.columns.tolist() == ["E", "T", "routing", "bound", "lib / read floor", "vs grouped_mm",
                                      "vs cuBLAS loop"]
    assert table.set_index("E").loc[2, "vs cuBLAS loop"] == pytest.approx(0.8)
    assert len(a.launch_table().columns) <= 7


def test_analysis_needs_the_read_rate():
    data = {"sms": 4, "points": [point("loop", 2.0, 8.0)]}
    params = {**experiment.sweep("full"), "shapes": [[2, 4, 8]], "T": [4], "routing": ["uniform"]}
    with pytest.raises(ValueError, match="read_bw_GBps"):
        analysis.Analysis(data, params, {"bf16_tflops": 1.0, "copy_bw_GBps": 1.0})


def test_experts_touched_hand_worked():
    # one pair touches one expert; E pairs over E = 2 experts: 2 (1 - 1/4) = 1.5
    assert analysis.experts_touched(8, 1) == pytest.approx(1.0)
    assert analysis.experts_touched(2, 2) == pytest.approx(1.5)
    assert analysis.experts_touched(5, 0) == 0
    with pytest.raises(ValueError):
        analysis.experts_touched(0, 3)


def test_layer_step_costs_hand_worked():
    # E = 4, K = 8, I = 16, k = 2, n = 3 tokens, 2 experts touched, b = 2 bytes: 6 pairs
    c = {s: analysis.layer_step_cost(s, 4, 8, 16, 2, 3, 2) for s in experiment.STEPS}
    assert c["router"] == {"flops": 2 * 3 * 8 * 4, "bytes": 2 * (3 * 8 + 8 * 4 + 3 * 4)}
    assert c["permute"]["bytes"] == 2 * 2 * 6 * 8 + 32 * 6
    assert c["gate-up GEMM"] == {"flops": 2 * 6 * 8 * 32, "bytes": 2 * (2 * 8 * 32 + 6 * 8 + 6 * 32)}
    assert c["down GEMM"] == {"flops": 2 * 6 * 16 * 8, "bytes": 2 * (2 * 16 * 8 + 6 * 16 + 6 * 8)}
    assert c["unpermute"]["bytes"] == 2 * (3 * 6 * 8 + 3 * 8)
    with pytest.raises(ValueError, match="step"):
        analysis.layer_step_cost("softmax", 4, 8, 16, 2, 3, 2)


def layer_row(step, us, E=4, n=3, kernels=1, counts=(2, 0, 3, 1)):
    t = {"median": us, "q1": us, "q3": us, "min": us, "max": us, "n": 1}
    return {"E": E, "K": 8, "I": 16, "k": 2, "n": n, "step": step, "kernels": kernels, "kernel_names": None,
            "timing": {"gpu_us": t, "call_us": {**t, "median": 2 * us}, "calls_per_sample": 1, "buffers": 1,
                       "method": "cuda-graph/eager"}, "counts": list(counts), "router_err": 0, "topk_err": 0,
            "layer_err": 0}


def test_layer_analysis_shares_worked_by_hand():
    # routing steps 1 + 2 + 3 + 4 = 10 us, experts 20 + 5 + 15 = 40 us: share 10 / 50 = 0.2; 3 experts touched
    times = dict(zip(experiment.STEPS, (1, 2, 3, 20, 5, 15, 4)))
    rows = [layer_row(s, us) for s, us in times.items()] + [layer_row("layer", 48.0)]
    la = analysis.LayerAnalysis(rows, {"bf16_tflops": 1.0, "read_bw_GBps": 1.0, "launch_graph_us": 1.0}, "bfloat16")
    r = la.table.iloc[0]
    assert (r["routing (us)"], r["experts (us)"], r["layer (us)"]) == (10, 40, 48)
    assert r["routing share"] == pytest.approx(0.2) and r["layer, call time (us)"] == 96
    assert r["experts touched"] == 3 and r["expected touched"] == pytest.approx(4 * (1 - 0.75 ** 6))
    shares = la.share_figure_data().iloc[0]
    assert shares.sum() == pytest.approx(1.0) and shares["gate-up GEMM"] == pytest.approx(0.4)
    with pytest.raises(ValueError, match="launch_graph_us"):
        analysis.LayerAnalysis(rows, {"bf16_tflops": 1.0, "read_bw_GBps": 1.0}, "bfloat16")


# ---------------------------------------------------------------------------- the page

PASTED = re.compile(r"\{glue:[a-z]+\}`\.\./notebooks/04-grouped-gemm\.ipynb::([A-Za-z0-9_]+)")
# glued beside their figure and table, not by the page: the figures, the schedule diagram's and expert
# parallelism's numbers, the claims table
GLUED_ELSEWHERE = re.compile(r"fig_|sched_|ep_|claims_table$")


def page_of_the_stored_results():
    """Chapter 4's page from the stored H200 results, through the notebook's own analyses."""
    stored_ = stored()
    prov = stored_["provenance"]
    res = SimpleNamespace(data=stored_["data"], params=stored_["params"], provenance=prov, date=prov["date"][:10])
    c = ceilings.load(results.REFERENCE)
    a = analysis.Analysis(res.data, res.params, c)
    layer = analysis.LayerAnalysis(res.data["layer"], c, res.params["dtype"])
    example_rows = pd.DataFrame(gg.tile_schedule([64, 192], 128, 64, 64, workers=4))
    masks = {"outside_cells": 3, "next_cells": 2, "wrong_cells": 7, "cells": 8}  # counts handed on as given
    masks_table = pd.DataFrame({"unmasked kernel": ["x"], "cells": [3]})
    return analysis.page(a, layer, res, c, example_rows, masks, masks_table), a, c


def test_the_page_holds_every_name_the_chapter_pastes():
    page = page_of_the_stored_results()[0]
    pasted = set(PASTED.findall((ROOT / "book" / "04-grouped-gemm.md").read_text()))
    on_page = set(page.numbers) | set(page.texts) | set(page.tables)
    assert pasted and not {n for n in pasted - on_page if not GLUED_ELSEWHERE.match(n)}


def test_the_page_of_the_stored_h200_results_worked_by_hand():
    page, a, c = page_of_the_stored_results()
    n, t, tables = page.numbers, page.texts, page.tables
    # A (64 rows) and B (192 rows), N = 128, in 64 x 64 tiles: 1 x 2 + 3 x 2 = 8 tiles
    assert n["example_tiles_total"] == 8 and len(tables["example_schedule"]) == 8
    assert (n["mask_outside_cells"], n["mask_next_cells"], n["mask_wrong_cells"], n["mask_cells"]) == (3, 2, 7, 8)
    assert n["bf16_tflops"] == c["bf16_tflops"]
    assert t["device_name"].startswith("NVIDIA H200") and len(t["measured_date"]) == 10
    assert t["target_1_verdict"] in ("yes", "no")
    # the compare table's share of the read floor, for one case, from the raw points by hand:
    # max(2 T K N / P, 2 (touched K N + T K + T N) / BW) over lib's median GPU time
    E, K, N = stored()["params"]["shapes"][-1]
    T = max(stored()["params"]["T"])
    lib = next(p for p in stored()["data"]["points"]
               if (p["path"], p["E"], p["T"], p["routing"]) == ("lib", E, T, "uniform"))
    floor_s = max(2 * T * K * N / (c["bf16_tflops"] * 1e12),
                  2 * (lib["nonempty"] * K * N + T * K + T * N) / (c["read_bw_GBps"] * 1e9))
    share = floor_s * 1e6 / lib["timing"]["gpu_us"]["median"]
    row = tables["summary_table"].set_index(["E", "T", "routing"]).loc[(E, T, "uniform")]
    assert row["lib / read floor"] == pytest.approx(share, abs=6e-4)  # the table is rounded to 3 digits
    assert tables["targets_table"].equals(a.targets.round(3))
    # every number is a real number, every text non-empty (glue.publish refuses anything else)
    assert all(isinstance(v, Real) and not isinstance(v, bool) for v in n.values()) and all(t.values())
