"""Chapter 8's analysis of what ``lib.experiments.engine`` measured: the engine's cost model fitted
to its calibration steps, the offline run against chapter 7's step, host time, the incident, the latency
decomposition, and chapter 6's simulator run on the same workloads and compared request percentile by
percentile, with the calibrated costs and with costs fitted to the steps of the other runs. Everything
here reads stored data (it measures nothing), so it runs on a replay too.

Chapters: 8.
"""

from __future__ import annotations

import statistics

import pandas as pd

from lib import simulator, workloads
from lib.engine import cost
from lib.engine.metrics import decomposition, goodput, summary
from lib.experiments import engine as se

RUNS = ("light", "near", "before", "after", "fix")  # the open-loop runs, chat-only then the incident's
SMALL_RUNS = ("light", "near")  # the smaller configuration's (no incident)


def requests(run: dict) -> list[dict]:
    """A run's per-request metrics, a value stored as None (it does not exist: the TPOT of a one-token
    request) read back as NaN, which the percentiles leave out."""
    return [{k: float("nan") if v is None else v for k, v in r.items()} for r in run["requests"]]


def steps(run: dict, keys) -> pd.DataFrame:
    """A run's step records, one row per step, with its wall time (s) and kind: "decode" (a CUDA-graph
    decode step) or "prefill" (an eager step that prefills, decodes riding along)."""
    d = pd.DataFrame(run["steps"], columns=list(keys)).astype({"gpu_s": float})
    d["wall_s"] = d["end"] - d["start"]
    d["kind"] = ["prefill" if p else "decode" for p in d["prefill_tokens"]]
    return d


def fitted(data: dict) -> tuple[cost.EngineCostModel, pd.DataFrame]:
    """The engine's cost model fitted to its calibration steps, and the points with the model's prediction."""
    from lib.engine import EngineConfig

    cm = cost.fit(data["cal_points"], EngineConfig().graph_batch_sizes)
    pts = pd.DataFrame(data["cal_points"])

    def predict(r):
        if r["kind"] == "decode":
            return cm.step(r["B"], 0.0, r["B"] * r["ctx"])
        return cm.step(r["new"], cost.work(r["new"], r["ctx"]), 0)

    pts["measured (ms)"] = pts["seconds"] * 1e3
    pts["model (ms)"] = [predict(r) * 1e3 for _, r in pts.iterrows()]
    pts["model / measured"] = pts["model (ms)"] / pts["measured (ms)"]
    return cm, pts.drop(columns=["seconds"])


def offline(data: dict, params: dict) -> dict:
    """The offline run: output tokens/s, what chapter 7's step predicts for the same steps (its prefill steps
    as measured, each decode step at the fused step's GPU time alone), and the host over GPU time of its
    decode steps at the full batch."""
    o, keys = data["offline"], data["step_keys"]
    st = steps(o, keys)
    tokens = sum(r["tokens"] for r in requests(o))
    dec = st[st["kind"] == "decode"]
    ch7 = data["ch7_step"]["gpu_s"] or data["ch7_step"]["call_s"]  # a CPU has no GPU time: its call time
    predicted_s = st[st["kind"] == "prefill"]["wall_s"].sum() + len(dec) * ch7
    full = dec[dec["decode_tokens"] == params["offline"]["max_num_seqs"]]
    return {"tokens_per_s": tokens / o["span_s"], "predicted_tokens_per_s": tokens / predicted_s,
            "over_predicted": predicted_s / o["span_s"], "steps": len(st), "decode_steps": len(dec),
            "full_batch_steps": len(full), "host_over_gpu": float((full["host_s"] / full["gpu_s"]).median()),
            "host_ms": float(full["host_s"].median() * 1e3), "gpu_ms": float(full["gpu_s"].median() * 1e3),
            "wall_ms": float(full["wall_s"].median() * 1e3), "ch7_gpu_ms": ch7 * 1e3,
            "ch7_call_ms": data["ch7_step"]["call_s"] * 1e3}


def run_of(data: dict, name: str) -> dict:
    """An open-loop run by name: "light", "near" (chat only) or an incident configuration (its production run)."""
    return data["chat_runs"][name] if name in data["chat_runs"] else data["incident"][name]["prod"]


def workload_of(data: dict, params: dict, name: str) -> tuple[list[dict], object]:
    """The requests an open-loop run sent (regenerated from the seeds, as ``measure`` drew them) and the
    engine settings it ran with."""
    mix, chat = se.mixes(params)
    if name in data["chat_runs"]:
        rate, spec = data["chat_runs"][name]["rate"], params["chat_rates"][name]
        return (workloads.requests(se.requests_for(rate, spec), rate, mix=chat, seed=params["seed"] + 6),
                se.base_config(params))
    rate = data["prod_rate"]
    return (workloads.requests(se.requests_for(rate, params["incident"]), rate, mix=mix, seed=params["seed"] + 3),
            se.configs(params)[name])


def incident(data: dict, slo_ttft: float, slo_tpot: float) -> tuple[pd.DataFrame, dict]:
    """Each incident configuration: benchmark tokens/s (every request at once), production tokens/s, goodput
    and chat and document latency percentiles at the production rate; and the four numbers the incident
    is judged by."""
    rows = []
    for name, runs in data["incident"].items():
        bench, prod = requests(runs["bench"]), requests(runs["prod"])
        sc, sd = summary(prod, "chat"), summary(prod, "doc")
        rows.append({"config": name, "benchmark tokens/s": summary(bench)["tokens_per_s"],
                     "production tokens/s": summary(prod)["tokens_per_s"],
                     "goodput tokens/s": goodput(prod, slo_ttft, slo_tpot),
                     "chat TTFT p50 (ms)": sc["ttft_p50"] * 1e3, "chat TTFT p95 (ms)": sc["ttft_p95"] * 1e3,
                     "doc TTFT p95 (ms)": sd["ttft_p95"] * 1e3 if sd else float("nan"),
                     "chat TPOT p95 (ms)": sc["tpot_p95"] * 1e3, "pre-empted": sum(r["preemptions"] for r in prod)})
    t = pd.DataFrame(rows).set_index("config")
    b, a, f = (t.loc[k] for k in ("before", "after", "fix"))
    gain = a["benchmark tokens/s"] / b["benchmark tokens/s"] - 1
    fix_gain = f["benchmark tokens/s"] / b["benchmark tokens/s"] - 1
    return t, {"tps_gain": gain, "ttft_p95_ratio": a["chat TTFT p95 (ms)"] / b["chat TTFT p95 (ms)"],
               "fix_ttft_p95_ratio": f["chat TTFT p95 (ms)"] / b["chat TTFT p95 (ms)"],
               "fix_tps_kept": fix_gain / gain if gain else float("nan"), "fix_tps_gain": fix_gain}


def incident_loads(data: dict, params: dict, loads=(0.3, 0.5, 0.7, 0.85)) -> pd.DataFrame:
    """The incident's three settings simulated at several production loads (fractions of the "before"
    setting's calibrated capacity, as the measured run's 0.3), with costs fitted to every run's steps in
    service: the most requests the "before" setting ran at once, chat TTFT P95 of each setting and the two
    ratios the incident is judged by. Where the engine's costs make the incident appear, if anywhere."""
    from lib.engine import EngineConfig

    cm = cost.fit_steps([step_records(data, n) for n in (*RUNS, "offline")], EngineConfig().graph_batch_sizes)
    mix, _ = se.mixes(params)
    cfgs, rows = se.configs(params), []
    for load in loads:
        rate = load * data["capacity_before_rps"]
        reqs = workloads.requests(se.requests_for(rate, params["incident"]), rate, mix=mix, seed=params["seed"] + 3)
        p95, trace = {}, []
        for name, c in cfgs.items():
            res = simulator.simulate(reqs, cm, c.as_policy(), trace=trace if name == "before" else None)
            p95[name] = simulator.summary([r for r in res if r["kind"] == "chat"])["ttft_p95"]
        rows.append({"load": load, "requests/s": rate,
                     "most running, before": max(len(t["prefill"]) + len(t["decode"]) for t in trace),
                     **{f"chat TTFT p95 {k} (ms)": v * 1e3 for k, v in p95.items()},
                     "after / before": p95["after"] / p95["before"], "fix / before": p95["fix"] / p95["before"]})
    return pd.DataFrame(rows).set_index("load")


def decompositions(data: dict, runs=RUNS) -> pd.DataFrame:
    """Where chat TTFT goes in each open-loop run: time queued, in prefill steps, and the rest, at the median
    and the 95th percentile of each stage (ms)."""
    rows = []
    for name in runs:
        res = requests(run_of(data, name))
        for q in (50, 95):
            d = decomposition(res, "chat", q)
            rows.append({"run": name, "percentile": q, **{f"{k} (ms)": v * 1e3 for k, v in d.items()}})
    return pd.DataFrame(rows).set_index(["run", "percentile"])


def step_records(data: dict, name: str) -> list[dict]:
    """A run's steps as the engine recorded them (the stored columns): "offline" or an open-loop run."""
    run = data["offline"] if name == "offline" else run_of(data, name)
    return [dict(zip(data["step_keys"], r)) for r in run["steps"]]


def service_fits(data: dict, runs=RUNS, *, detail: bool = False) -> dict:
    """For each open-loop run, the cost model fitted (``lib.engine.cost.fit_steps``) to the steps of the other
    runs and the offline run: costs measured in service that never saw the run they predict. None where the
    other runs hold too few steps to fit (a smoke run's handful of requests)."""
    from lib.engine import EngineConfig

    sizes = EngineConfig().graph_batch_sizes
    fits = {}
    for held in runs:
        try:
            fits[held] = cost.fit_steps([step_records(data, n) for n in (*runs, "offline") if n != held], sizes,
                                               detail=detail)
        except ValueError:
            fits[held] = None
    return fits


def _simulated(data: dict, params: dict, name: str, cm) -> dict:
    reqs, config = workload_of(data, params, name)
    return simulator.summary(simulator.simulate(reqs, cm, config.as_policy()))


def sim_vs_engine(data: dict, params: dict, cm, runs=RUNS) -> pd.DataFrame:
    """Chapter 6's simulator on each open-loop run's workload and settings, TTFT and TPOT at P50 and P95 over
    all requests, against the engine's: with the costs of the calibration (``cm``) and with the costs
    fitted to the other runs' steps (``service_fits``)."""
    held = service_fits(data, runs)
    # the detailed fit (the longest decode, the prompts per step) where the records hold what it needs
    detailed = service_fits(data, runs, detail=True) if "decode_ctx_max" in data["step_keys"] else None
    rows = []
    for name in runs:
        cal = _simulated(data, params, name, cm)
        srv = _simulated(data, params, name, held[name]) if held[name] else dict.fromkeys(cal, float("nan"))
        det = (_simulated(data, params, name, detailed[name]) if detailed and detailed[name]
               else dict.fromkeys(cal, float("nan")))
        meas = simulator.summary(requests(run_of(data, name)))
        for m in ("ttft", "tpot"):
            for q in (50, 95):
                k = f"{m}_p{q}"
                row = {"run": name, "metric": f"{m.upper()} P{q}", "measured (ms)": meas[k] * 1e3,
                       "calibrated (ms)": cal[k] * 1e3, "calibrated / measured": cal[k] / meas[k],
                       "service fit (ms)": srv[k] * 1e3, "service fit / measured": srv[k] / meas[k]}
                if detailed is not None:
                    row |= {"detailed fit (ms)": det[k] * 1e3, "detailed fit / measured": det[k] / meas[k]}
                rows.append(row)
    return pd.DataFrame(rows).set_index(["run", "metric"])


def fit_step_ratios(data: dict, runs=RUNS) -> pd.DataFrame:
    """Each open-loop run's steps against the service fit that did not see them: the run's total measured
    time over the model's, by kind of step."""
    held = service_fits(data, runs)
    rows = []
    for name in runs:
        cm = held[name]
        for kind in ("decode", "prefill"):
            if cm is None:
                rows.append({"run": name, "step": kind, "steps": 0, "measured / model": float("nan")})
                continue
            sel = [s for s in cost.periods(step_records(data, name))
                   if bool(s["prefill_tokens"]) == (kind == "prefill")]
            model = sum(cm.step(s["prefill_tokens"] + s["decode_tokens"], s["prefill_work"],
                                s["decode_kv"] + s["decode_tokens"]) for s in sel)
            rows.append({"run": name, "step": kind, "steps": len(sel),
                         "measured / model": sum(s["period"] for s in sel) / model})
    return pd.DataFrame(rows).set_index(["run", "step"])


class Scaled:
    """A cost model whose every step costs ``k`` times another's."""

    def __init__(self, cm, k: float):
        self.cm, self.k = cm, k

    def step(self, tokens: int, prefill_ctx_work: float, decode_kv_tokens: int) -> float:
        return self.k * self.cm.step(tokens, prefill_ctx_work, decode_kv_tokens)


def sensitivity(data: dict, params: dict, cm, name: str, scales=(0.9, 0.95, 1.0, 1.05, 1.1)) -> pd.DataFrame:
    """The simulator's TTFT and TPOT P95 on run ``name`` with every step cost scaled: how much a few percent
    on the costs moves the tail at that load."""
    rows = []
    for k in scales:
        s = _simulated(data, params, name, Scaled(cm, k))
        rows.append({"step costs x": k, "TTFT P95 (ms)": s["ttft_p95"] * 1e3, "TPOT P95 (ms)": s["tpot_p95"] * 1e3})
    return pd.DataFrame(rows).set_index("step costs x")


def host_spread(data: dict, name: str, max_tokens: int = 1024) -> dict:
    """Host time of a run's steps that prefill fewer than ``max_tokens`` tokens: 5th, 50th and 95th
    percentiles (s), and how many steps."""
    h = [s["host_s"] for s in step_records(data, name) if 0 < s["prefill_tokens"] < max_tokens]
    return {"n": len(h), **{f"p{q}": simulator.percentile(h, q) for q in (5, 50, 95)}}


def step_costs(data: dict, cm, runs=RUNS) -> pd.DataFrame:
    """Every open-loop run's steps by kind and number of prefilled requests: median wall time against the
    cost model's prediction for the same step."""
    rows = []
    keys = data["step_keys"]
    for name in runs:
        st = steps(run_of(data, name), keys)
        st["prefills"] = st["batch"] - st["decode_tokens"]
        st["model_s"] = [cm.step(r.prefill_tokens + r.decode_tokens, r.prefill_work, r.decode_kv + r.decode_tokens)
                         for r in st.itertuples()]
        for (kind, n), g in st.groupby(["kind", "prefills"]):
            rows.append({"run": name, "step": kind, "requests prefilled": n, "steps": len(g),
                         "measured (ms)": g["wall_s"].median() * 1e3, "model (ms)": g["model_s"].median() * 1e3,
                         "host (ms)": g["host_s"].median() * 1e3})
    return pd.DataFrame(rows)


def timeline(data: dict) -> dict:
    """The chat request kept from the incident's "before" run: the fields of a
    ``lib.diagrams.timeline.Timeline`` (id, arrival, admitted, prefill_steps, token_times)."""
    t = data["incident"]["before"]["prod"]["timeline"]
    return {"id": t["id"], "arrival": t["arrival"], "admitted": t["admitted"],
            "prefill_steps": tuple(tuple(s) for s in t["prefill_steps"]), "token_times": tuple(t["token_times"])}


def decode_cal(cal: pd.DataFrame, B: int) -> tuple[float, float]:
    """A calibration's decode steps of ``B`` requests at its shortest and its longest context (ms); NaN where
    the calibration has no such batch (a smoke run's)."""
    d = cal[(cal["kind"] == "decode") & (cal["B"] == B)].sort_values("ctx")["measured (ms)"]
    return (float(d.iloc[0]), float(d.iloc[-1])) if len(d) else (float("nan"), float("nan"))


def worst_err(frame: pd.DataFrame, column: str, metric: str) -> float:
    """The largest |ratio - 1| of ``column`` over the runs, for one metric ("TTFT P95", ...)."""
    return float((frame.xs(metric, level="metric")[column] - 1).abs().max())


def ratio_table(frame: pd.DataFrame) -> pd.DataFrame:
    """``sim_vs_engine``'s frame as printed on the page: the measurement (ms) and each simulation's ratio to it
    (calibrated, service fit, detailed fit where there is one)."""
    cols = {"measured (ms)": "measured (ms)", "calibrated / measured": "calibrated", "service fit / measured":
            "service fit", "detailed fit / measured": "detailed fit"}
    return frame[[c for c in cols if c in frame.columns]].rename(columns=cols)


def median_abs_err(frame: pd.DataFrame, column: str = "service fit / measured") -> float:
    return statistics.median(abs(v - 1) for v in frame[column])


# ---------------------------------------------------------------------------- the page

SRV, CAL = "service fit / measured", "calibrated / measured"  # sim_vs_engine's ratio columns


def judged_column(frame: pd.DataFrame) -> str:
    """The ratio column the targets are judged on: the detailed fit (the longest decode, the prompts per
    step) where the step records hold what it needs; on records without them, the service fit."""
    return "detailed fit / measured" if "detailed fit / measured" in frame.columns else SRV


def fit_errors(cal: pd.DataFrame) -> pd.Series:
    """|model / measured - 1| of each calibration point (``fitted``'s table)."""
    return (cal["model / measured"] - 1).abs()


def page(res, tl, *, cal, off, sve, ratios, sens, loads, inc, judged, dec, small: dict, steps: dict):
    """Every number and word chapter 8's page quotes, by name (its tables are glued beside them in the
    notebook): from the results ``res`` (data, params, provenance, date), the kept request's timeline ``tl``
    (a ``lib.diagrams.timeline.Timeline``), the 8B run's tables (``fitted``'s ``cal``, ``offline``'s ``off``,
    ``sim_vs_engine``'s ``sve``, ``fit_step_ratios``' ``ratios``, ``sensitivity``'s ``sens`` near capacity,
    ``incident_loads``' ``loads``, ``incident``'s ``inc`` and ``judged``, ``decompositions``' ``dec``), the
    smaller model's (``small``: data, cal, off, sve, sc (``step_costs``), inc, judged) and what the step
    records say (``steps``: max_running {run: requests}, decode_ratio {"offline", "open loop": measured /
    model}, prefill_ratio, prefill1_ratio (min, max), kv_peak); a ``Page`` (``lib.bench.page``)."""
    from lib.bench.page import Page

    data, params, worst = res.data, res.params, worst_err
    JUDGED = judged_column(sve)
    sdata, scal, soff, ssve, ssc = small["data"], small["cal"], small["off"], small["sve"], small["sc"]
    sinc, sjudged = small["inc"], small["judged"]
    max_running, decode_ratio, prefill1_ratio = steps["max_running"], steps["decode_ratio"], steps["prefill1_ratio"]
    near_host = host_spread(data, "near")
    snear = ssc[(ssc["run"] == "near") & (ssc["step"] == "prefill")].set_index("requests prefilled")["measured (ms)"]
    snear = snear.reindex([1, 2, 3])  # a smoke run has no near-capacity run: NaN
    ssve_near = ssve.reindex([("near", "TTFT P95")])
    decode_fit = {n: ratios.loc[(n, "decode"), "measured / model"] for n in ("before", "after", "fix", "light", "near")}
    prefill_fit = ratios.xs("prefill", level="step")["measured / model"]
    stack = cal[cal["kind"] == "stack"]
    numbers = {
        "sim_vs_engine_ttft_p95_err_max": worst(sve, JUDGED, "TTFT P95"),
        "sim_vs_engine_tpot_p95_err_max": worst(sve, JUDGED, "TPOT P95"),
        "sim_srv_ttft_p95_err_max": worst(sve, SRV, "TTFT P95"), "sim_srv_tpot_p95_err_max": worst(sve, SRV, "TPOT P95"),
        "sim_vs_engine_median_abs_err": median_abs_err(sve),
        "sim_cal_ttft_p95_err_max": worst(sve, CAL, "TTFT P95"),
        "sim_cal_tpot_p95_err_max": worst(sve, CAL, "TPOT P95"),
        "sim_cal_median_abs_err": median_abs_err(sve, CAL),
        "sim_cal_tpot_ratio_max": sve.xs("TPOT P50", level="metric")[CAL].max(),
        "sim_srv_near_tpot_p50_ratio": sve.loc[("near", "TPOT P50"), SRV],
        "sim_srv_after_ttft_p50_ratio": sve.loc[("after", "TTFT P50"), SRV],
        "sim_srv_before_ttft_p95_ratio": sve.loc[("before", "TTFT P95"), SRV],
        "sim_srv_after_ttft_p95_ratio": sve.loc[("after", "TTFT P95"), SRV],
        "sim_srv_fix_ttft_p95_ratio": sve.loc[("fix", "TTFT P95"), SRV],
        "fit_decode_incident_min": min(decode_fit[n] for n in ("before", "after", "fix")),
        "fit_decode_incident_max": max(decode_fit[n] for n in ("before", "after", "fix")),
        "fit_decode_chat_max": max(decode_fit[n] for n in ("light", "near")),
        "fit_prefill_min": prefill_fit.min(), "fit_prefill_max": prefill_fit.max(),
        "sens_near_p95_base_ms": sens.loc[1.0, "TTFT P95 (ms)"], "sens_near_p95_up_ms": sens.loc[1.1, "TTFT P95 (ms)"],
        "sens_near_p95_down_ms": sens.loc[0.9, "TTFT P95 (ms)"],
        "near_host_p5_ms": near_host["p5"] * 1e3, "near_host_p50_ms": near_host["p50"] * 1e3,
        "near_host_p95_ms": near_host["p95"] * 1e3, "near_host_n": near_host["n"],
        "cal_decode_b8_short_ms": decode_cal(cal, 8)[0], "cal_decode_b8_long_ms": decode_cal(cal, 8)[1],
        "cal_decode_b64_short_ms": decode_cal(cal, 64)[0], "cal_decode_b64_long_ms": decode_cal(cal, 64)[1],
        "loads_ratio_max": loads["after / before"].max(), "loads_ratio_min": loads["after / before"].min(),
        "loads_top": loads.index.max(), "loads_fix_max": loads["fix / before"].max(),
        "small_params_billion": sdata["params_count"] / 1e9, "small_tps": soff["tokens_per_s"],
        "small_over_predicted": soff["over_predicted"], "small_host_over_gpu": soff["host_over_gpu"],
        "small_gpu_ms": soff["gpu_ms"], "small_host_ms": soff["host_ms"], "small_ch7_gpu_ms": soff["ch7_gpu_ms"],
        "small_ch7_call_ms": soff["ch7_call_ms"], "host_share_small_over_8b": soff["host_over_gpu"] / off["host_over_gpu"],
        "small_stack_small_ms": scal[scal["kind"] == "stack"]["measured (ms)"].iloc[0],
        "small_prefill1_ms": snear.loc[1], "small_prefill2_ms": snear.loc[2], "small_prefill3_ms": snear.loc[3],
        "small_sim_ttft_p95_err_max": worst(ssve, SRV, "TTFT P95"),
        "small_sim_tpot_p95_err_max": worst(ssve, SRV, "TPOT P95"),
        "small_det_tpot_p95_err_max": worst(ssve, JUDGED, "TPOT P95"),
        "small_det_ttft_p95_err_max": worst(ssve, JUDGED, "TTFT P95"),
        "small_det_median_abs_err": median_abs_err(ssve, JUDGED),
        "small_near_ttft_p95_det_ratio": ssve_near[JUDGED].iloc[0],
        "small_incident_tps_gain": sjudged["tps_gain"], "small_incident_ttft_p95_ratio": sjudged["ttft_p95_ratio"],
        "small_fix_ttft_p95_ratio": sjudged["fix_ttft_p95_ratio"], "small_fix_tps_kept": sjudged["fix_tps_kept"],
        "small_chat_p50_before_ms": sinc.loc["before", "chat TTFT p50 (ms)"],
        "small_chat_p50_after_ms": sinc.loc["after", "chat TTFT p50 (ms)"],
        "small_chat_p95_before_ms": sinc.loc["before", "chat TTFT p95 (ms)"],
        "small_chat_p95_after_ms": sinc.loc["after", "chat TTFT p95 (ms)"],
        "small_chat_p95_fix_ms": sinc.loc["fix", "chat TTFT p95 (ms)"],
        "small_prefill_steps_before": ssc[(ssc["run"] == "before") & (ssc["step"] == "prefill")]["steps"].sum(),
        "small_prefill_steps_fix": ssc[(ssc["run"] == "fix") & (ssc["step"] == "prefill")]["steps"].sum(),
        "small_near_ttft_p95_ms": ssve_near["measured (ms)"].iloc[0],
        "small_near_ttft_p95_sim_ms": ssve_near["service fit (ms)"].iloc[0],
        "small_capacity_rps": sdata["capacity_chat_rps"],
        "small_near_rate": sdata["chat_runs"].get("near", {}).get("rate", float("nan")),
        "host_over_gpu_b64": off["host_over_gpu"], "offline_tps_over_predicted": off["over_predicted"],
        "offline_tps": off["tokens_per_s"], "offline_predicted_tps": off["predicted_tokens_per_s"],
        "host_ms_b64": off["host_ms"], "gpu_ms_b64": off["gpu_ms"], "wall_ms_b64": off["wall_ms"],
        "ch7_gpu_ms": off["ch7_gpu_ms"],
        "engine_incident_tps_gain": judged["tps_gain"], "engine_incident_ttft_p95_ratio": judged["ttft_p95_ratio"],
        "engine_fix_ttft_p95_ratio": judged["fix_ttft_p95_ratio"], "engine_fix_tps_kept": judged["fix_tps_kept"],
        "prod_rate": data["prod_rate"], "capacity_before_rps": data["capacity_before_rps"],
        "capacity_chat_rps": data["capacity_chat_rps"], "fit_err_max": fit_errors(cal).max(),
        "max_running_before": max_running["before"], "max_running_after": max_running["after"],
        "decode_ratio_offline": decode_ratio["offline"], "decode_ratio_open_loop": decode_ratio["open loop"],
        "prefill_ratio_open_loop": steps["prefill_ratio"], "ch7_call_ms": off["ch7_call_ms"],
        "stack_small_ms": stack["measured (ms)"].iloc[0],
        "stack_floor_ms": cal[(cal["kind"] == "stack") & (cal["new"] <= 256)]["measured (ms)"].min(),
        "stack_large_ms": stack["measured (ms)"].iloc[-1],
        "stack_large_M": stack["new"].iloc[-1],
        "decode_b1_ms": cal[(cal["kind"] == "decode")]["measured (ms)"].iloc[0],
        "bench_tps_before": inc.loc["before", "benchmark tokens/s"],
        "bench_tps_after": inc.loc["after", "benchmark tokens/s"], "bench_tps_fix": inc.loc["fix", "benchmark tokens/s"],
        "chat_p95_before_ms": inc.loc["before", "chat TTFT p95 (ms)"],
        "chat_p95_after_ms": inc.loc["after", "chat TTFT p95 (ms)"],
        "chat_p95_fix_ms": inc.loc["fix", "chat TTFT p95 (ms)"],
        "chat_p50_before_ms": inc.loc["before", "chat TTFT p50 (ms)"],
        "chat_p50_after_ms": inc.loc["after", "chat TTFT p50 (ms)"],
        "chat_p50_fix_ms": inc.loc["fix", "chat TTFT p50 (ms)"],
        "fix_tps_gain": judged["fix_tps_gain"], "timeline_id": tl.id,
        "timeline_ttft_ms": tl.ttft * 1e3, "timeline_queue_ms": tl.stages()["queue"] * 1e3,
        "timeline_prefill_ms": tl.stages()["prefill"] * 1e3, "timeline_tpot_ms": tl.tpot * 1e3,
        "timeline_tokens": len(tl.token_times),
        "near_ttft_p95_ms": sve.loc[("near", "TTFT P95"), "measured (ms)"],
        "near_ttft_p95_sim_ms": sve.loc[("near", "TTFT P95"), "service fit (ms)"],
        "light_ttft_p50_ratio": sve.loc[("light", "TTFT P50"), CAL],
        "pool_gib": params["kv_gib"], "pool_blocks": data["pool_blocks"],
        "prefill1_ratio_min": prefill1_ratio["min"], "prefill1_ratio_max": prefill1_ratio["max"],
        "kv_peak_frac": steps["kv_peak"], "dec_before_p50_prefill_ms": dec.loc[("before", 50), "prefill (ms)"],
        "dec_before_p50_ttft_ms": dec.loc[("before", 50), "ttft (ms)"],
        "dec_before_p95_queue_ms": dec.loc[("before", 95), "queue (ms)"],
        "dec_before_p95_ttft_ms": dec.loc[("before", 95), "ttft (ms)"],
        "dec_light_p95_queue_ms": dec.loc[("light", 95), "queue (ms)"],
    }
    return Page(numbers=numbers, texts={"device_name": res.provenance["name"], "measured_date": res.date})
