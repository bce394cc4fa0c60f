"""lib.experiments.kv_cache_analysis (chapter 3): the page's numbers, words and tables from the stored H200
results, against values worked by hand from the raw points, and every name the chapter's page pastes."""

from __future__ import annotations

import re
from numbers import Real
from types import SimpleNamespace

import pandas as pd
import pytest

from lib import costs
from lib.bench import ceilings, results
from lib.experiments import kv_cache_analysis as analysis
from tests.conftest import ROOT

PASTED = re.compile(r"\{glue:[a-z]+\}`\.\./notebooks/03-kv-cache\.ipynb::([A-Za-z0-9_]+)")
# glued beside what they draw, not by the page: the figures, the paged-KV diagram's numbers, the claims table
GLUED_ELSEWHERE = re.compile(r"fig_|diagram_|claims_table$")
HBM_GBPS = 4800.0  # the H200's datasheet


@pytest.fixture(scope="module")
def stored():
    s = results.load("03-kv-cache", results.REFERENCE)
    prov = s["provenance"]
    return SimpleNamespace(data=s["data"], params=s["params"], provenance=prov, date=prov["date"][:10])


@pytest.fixture(scope="module")
def page(stored):
    c = ceilings.load(results.REFERENCE)
    kv_seed = costs.kv_step_bytes(B=8, L=4096, H_kv=8, d=128, b=2)
    worked = {"kv_seed": kv_seed, "per_token_all_layers": 128 * 1024, "seed_formula_llama": 2**33,
              "gqa_llama": 2**32, "weights_llama": 15 * 2**30, "weights_resident": 16 * 2**30,
              "weights_linears": 14 * 2**30}
    plan = {"gpu_memory_utilization": 0.9, "memory_bytes": 141 * 10**9, "capacity_tokens": 1000,
            "per_token_kv": 2**20, "block_size": 16, "pred_seed_us": 50.0}
    theory = pd.DataFrame({"quantity": ["x"], "value": [1.234], "unit": ["MiB"]})
    capacity = pd.DataFrame({"context L (tokens)": [4096, 32768, 131072], "max batch (requests)": [7, 3, 1]})
    return analysis.page(stored, c, HBM_GBPS, worked, plan, theory, capacity), c


def gpu_us(stored, path, shape):
    """A path's median GPU time at (H_kv, B, L), from the raw points."""
    return next(p["timing"]["gpu_us"]["median"] for p in stored.data["points"]
                if p["path"] == path and (p["H_kv"], p["B"], p["L"]) == shape)


def test_the_page_holds_every_name_the_chapter_pastes(page):
    p, _ = page
    pasted = set(PASTED.findall((ROOT / "book" / "03-kv-cache.md").read_text()))
    on_page = set(p.numbers) | set(p.texts) | set(p.tables)
    assert len(pasted) > 50 and not {n for n in pasted - on_page if not GLUED_ELSEWHERE.match(n)}
    assert all(isinstance(v, Real) and not isinstance(v, bool) for v in p.numbers.values())


def test_the_worked_example_and_the_plan_by_hand(page):
    n = page[0].numbers
    # 2 B L H_kv d b = 2 * 8 * 4096 * 8 * 128 * 2 bytes = 128 MiB; its floor at 4800 GB/s
    assert n["kv_bytes_seed_MiB"] == 128
    assert n["pred_seed_floor_us"] == pytest.approx(128 * 2**20 / 4800e3)
    assert (n["llama_kv_per_token_KiB"], n["llama_cache_seed_formula_GiB"], n["llama_cache_gqa_GiB"]) == (128, 8, 4)
    assert n["llama_tokens_cache_equals_weights"] == 15 * 2**30 / (128 * 1024)
    assert n["kv_capacity_GiB"] == pytest.approx(1000 / 1024)
    assert (n["max_batch_4k"], n["max_batch_32k"], n["max_batch_128k"]) == (7, 3, 1)
    assert n["device_memory_GiB"] == pytest.approx(141e9 / 2**30)


def test_the_stored_h200_results_by_hand(stored, page):
    p, c = page
    n, t = p.numbers, p.texts
    shapes = {(q["H_kv"], q["B"], q["L"]) for q in stored.data["points"]}
    assert n["shapes"] == len(shapes) and n["check_cases"] == len(stored.data["check"])
    # SDPA's GPU time over the kernel's on pages of 16, every shape: the least, and where
    ratio = {s: gpu_us(stored, "sdpa", s) / gpu_us(stored, "kernel paged 16", s) for s in shapes}
    worst = min(ratio, key=ratio.get)
    assert n["vs_sdpa_min"] == pytest.approx(ratio[worst], rel=1e-12)
    assert t["vs_sdpa_min_shape"] == f"B = {worst[1]}, L = {worst[2]}, H_kv = {worst[0]}"
    assert n["vs_sdpa_shapes_won"] == sum(r >= 1 for r in ratio.values())
    # the worked example's shape: Q_KV / GPU time in GB/s, and the 1.1 target's time
    sB, sL, sH = stored.params["seed"]
    seed = next(q for q in stored.data["points"] if q["path"] == "sdpa" and (q["B"], q["L"], q["H_kv"]) == (sB, sL, sH))
    assert n["seed_sdpa_GBps"] == pytest.approx(seed["Q"] / seed["timing"]["gpu_us"]["median"] / 1e3, rel=1e-12)
    assert n["seed_target_gpu_us"] == pytest.approx(seed["timing"]["gpu_us"]["median"] / 1.1, rel=1e-12)
    assert n["speedup_vs_sdpa_seed"] == pytest.approx(ratio[(sH, sB, sL)], rel=1e-12)
    # the targets: four, each verdict as its table says, and the count met
    met = list(p.tables["targets_table"]["met"])
    assert [t[f"target_{i}_verdict"] for i in (1, 2, 3, 4)] == ["yes" if m else "no" for m in met]
    assert n["targets_met"] == sum(met)
    assert n["copy_bw_GBps"] == c["copy_bw_GBps"] and t["device_name"].startswith("NVIDIA H200")


def test_shape_text():
    assert analysis.shape_text((8, 4, 4096)) == "B = 4, L = 4096, H_kv = 8"
    assert analysis.shape_text(None) == "none"
