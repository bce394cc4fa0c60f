"""lib.experiments.engine_analysis (chapter 8): the page's numbers, from the stored H200 results through the
notebook's own tables, worked by hand where they can be, and every name the book pastes from notebook 08."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from lib.bench import results
from lib.diagrams import timeline
from lib.experiments import engine as engine_experiment
from lib.experiments import engine_analysis as ea

ROOT = Path(__file__).resolve().parents[1]


def pasted_names(notebook: str) -> set[str]:
    """The names chapter pages paste from ``notebook`` ({glue:text}`../notebooks/NB.ipynb::name:fmt`, ...)."""
    return {m for p in (ROOT / "book").glob("*.md") for m in re.findall(rf"{notebook}\.ipynb::(\w+)", p.read_text())}


def test_the_judged_column_and_the_fit_errors():
    assert ea.judged_column(pd.DataFrame(columns=[ea.SRV, ea.CAL])) == ea.SRV
    assert ea.judged_column(pd.DataFrame(columns=[ea.SRV, "detailed fit / measured"])) == "detailed fit / measured"
    cal = pd.DataFrame({"model / measured": [0.8, 1.0, 1.25]})
    assert ea.fit_errors(cal).tolist() == pytest.approx([0.2, 0.0, 0.25])


@pytest.fixture(scope="module")
def page():
    """Chapter 8's page from the stored H200 results, through the notebook's own tables (as its cells make them)."""
    stored = results.load("08-serving-engine")
    data, params, prov = stored["data"], stored["params"], stored["provenance"]
    res = SimpleNamespace(data=data, params=params, provenance=prov, date=prov["date"][:10])
    cm, cal = ea.fitted(data)
    off = ea.offline(data, params)
    tl = timeline.Timeline(**ea.timeline(data))
    inc, judged = ea.incident(data, 1.0, 0.05)
    sve = ea.sim_vs_engine(data, params, cm)
    sdata, sparams = data["small"], engine_experiment.small_params(params)
    scm, scal = ea.fitted(sdata)
    small_runs = tuple(sdata["chat_runs"]) + tuple(sdata.get("incident", {}))
    sinc, sjudged = ea.incident(sdata, 1.0, 0.05)
    small = dict(data=sdata, cal=scal, off=ea.offline(sdata, sparams), sve=ea.sim_vs_engine(sdata, sparams, scm, small_runs),
                 sc=ea.step_costs(sdata, scm, small_runs), inc=sinc, judged=sjudged)
    # stand-ins for what the notebook's step-record cell computes: handed on as given
    steps = dict(max_running={"before": 20, "after": 48}, decode_ratio={"offline": 1.01, "open loop": 1.1},
                 prefill_ratio=1.2, prefill1_ratio=pd.Series({"min": 0.9, "max": 1.3}), kv_peak=0.25)
    p = ea.page(res, tl, cal=cal, off=off, sve=sve, ratios=ea.fit_step_ratios(data),
                sens=ea.sensitivity(data, params, ea.service_fits(data)["near"], "near", scales=(0.9, 1.0, 1.1)),
                loads=ea.incident_loads(data, params, loads=(0.3,)), inc=inc, judged=judged,
                dec=ea.decompositions(data), small=small, steps=steps)
    return p, stored


def test_the_page_holds_every_name_the_book_pastes_that_the_notebook_glues_there(page):
    p, _ = page
    cells = json.loads((ROOT / "notebooks" / "08-serving-engine.ipynb").read_text())["cells"]
    code = "".join("".join(c["source"]) + "\n" for c in cells if c["cell_type"] == "code")
    # names glued by the notebook's other cells (its tables, figures, the offline run's sizes) and by its claims
    elsewhere = set(re.findall(r'glue\.(?:figure|table|number|text)\("(\w+)"', code))
    elsewhere |= {k for d in re.findall(r"glue\.numbers\(\{(.*?)\}\)", code, re.S) for k in re.findall(r'"(\w+)":', d)}
    elsewhere |= {"claims_table", "claims_held", "claims_total", "book_targets", "book_targets_table"}
    assert {"cal_table", "fig_engine_loop", "offline_n"} <= elsewhere
    missing = pasted_names("08-serving-engine") - elsewhere - set(p.numbers) - set(p.texts)
    assert not missing


def test_the_page_of_the_stored_h200_results_worked_by_hand(page):
    p, stored = page
    n, t, data, params = p.numbers, p.texts, stored["data"], stored["params"]
    assert t["device_name"].startswith("NVIDIA H200") and len(t["measured_date"]) == 10
    # handed on from the stored data and parameters
    assert (n["prod_rate"], n["pool_gib"], n["pool_blocks"]) == (data["prod_rate"], params["kv_gib"], data["pool_blocks"])
    assert n["small_params_billion"] == data["small"]["params_count"] / 1e9
    assert n["timeline_tokens"] == len(data["incident"]["before"]["prod"]["timeline"]["token_times"])
    # the calibration's largest error, from its points: |model / measured - 1|
    _, cal = ea.fitted(data)
    assert n["fit_err_max"] == max(abs(r - 1) for r in cal["model / measured"])
    stack = cal[cal["kind"] == "stack"]
    assert (n["stack_small_ms"], n["stack_large_M"]) == (stack["measured (ms)"].iloc[0], stack["new"].iloc[-1])
    # the stand-ins for the step records' numbers, handed on as given
    assert (n["max_running_before"], n["max_running_after"], n["kv_peak_frac"]) == (20, 48, 0.25)
    assert (n["decode_ratio_open_loop"], n["prefill1_ratio_min"], n["prefill1_ratio_max"]) == (1.1, 0.9, 1.3)
    # the host's share of a decode step, 1.1B over 8B, is a ratio of the two offline runs' ratios
    assert n["host_share_small_over_8b"] == pytest.approx(n["small_host_over_gpu"] / n["host_over_gpu_b64"])
    # sensitivity near capacity: costs scaled by 0.9, 1 and 1.1; the tail grows with the costs
    assert n["sens_near_p95_down_ms"] <= n["sens_near_p95_base_ms"] <= n["sens_near_p95_up_ms"]
