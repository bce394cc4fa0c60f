"""Chapter 1, matrix shapes of prefill and decode: the sweep that times Y = XW over M, and its tables.

The notebook defines what is timed: ``linear(M, K, N, device)`` makes one set of bf16 buffers
(x [M, K], w [N, K] in the layout of ``nn.Linear``, y [M, N]) and returns them with the call that
computes y = x w^T on them. This module runs it for each of the four linear layers of a Llama-3-8B
block (``SHAPES``, as K -> N) and each M of ``sweep(size)``, twice:

- cold: ``timing.rotation`` sets of buffers whose total is four times the L2, used in turn, so each
  call reads its weight from HBM;
- hot: one set, called over and over, so a weight that fits in the L2 stays there.

Before timing, the first set's product is compared on its first rows with a float32 reference (a
relative error of at most 1e-2 passes, bf16 rounding being about 4e-3). The profiler counts the GPU
kernels one call launches (``lib.bench.profile``), which the roofline model charges one launch each.

The analysis functions add F, Q, intensity, rate, bandwidth and the roofline model's time to every
point (``points``), find the knee where a flat time meets the line fitted to the arithmetic-bound points
(``knee``), sum the layers into a decode step of B requests (``decode_steps``: each linear layer runs with
M = B, every block alike), count the weight bytes a decode step reads (``weight_bytes``: the blocks'
linear layers and the LM head; the embedding table is only gathered, one row per token), find the
largest batch whose step fits a time (``largest_within``), and pick the numbers the chapter's page
quotes (``findings``).

Chapter: 1 (matrix shapes); chapter 2 sets its points against the roofline again.
"""

from __future__ import annotations

import pandas as pd
import torch

from lib import costs
from lib.bench import profile, timing
from lib.experiments import require

SHAPES = dict(costs.LLAMA3_8B["linears"])  # layer -> (K, N)
BYTES = 2  # bf16, the element size of every buffer the notebook's ``linear`` makes
MAX_REL_ERR = 1e-2  # against a float32 product of the same bf16 inputs
PARAMS = ("shapes", "M", "reps", "target_ms")


def sweep(size: str) -> dict:
    """The layers (name -> (K, N)) and the M measured."""
    if size == "full":
        return {
            "shapes": dict(SHAPES),
            "M": [1, 2, 3, 4, 8, 16, 32, 64, 100, 128, 256, 512, 1000, 1024, 1500, 2048, 4096, 8192, 16384],
            "reps": 25,
            "target_ms": 1.5,
        }
    if size == "smoke":
        return {  # the same four layers, 16 times narrower, and a few M
            "shapes": {name: (k // 16, n // 16) for name, (k, n) in SHAPES.items()},
            "M": [1, 3, 16, 100],
            "reps": 3,
            "target_ms": 0.2,
        }
    raise ValueError(f"size={size!r}: the sweep has a 'full' and a 'smoke' size")


# ---------------------------------------------------------------------------- measuring

def measure_linear(linear, name: str, K: int, N: int, M: int, cold: bool, device: str, l2: int, p: dict) -> dict:
    """One point: ``linear``'s call for one layer and one M, checked, then timed (cold: rotating sets)."""
    sets = timing.rotation(costs.linear_bytes(M, K, N, BYTES), l2) if (cold and l2) else 1
    made = [linear(M, K, N, device) for _ in range(sets)]
    (x, w, y), call = made[0]
    call()
    rows = min(M, 64)
    ref = x[:rows].float() @ w.float().t()
    rel_err = ((y[:rows].float() - ref).norm() / ref.norm()).item()
    if not rel_err < MAX_REL_ERR:
        raise AssertionError(f"{name} M={M}: relative error {rel_err:.2e} against float32, at most {MAX_REL_ERR:.0e} "
                             "allowed: the call does not compute y = x w^T, and a wrong call is not timed")
    fns = [fn for _, fn in made]
    t = timing.bench(fns, device=device, reps=p["reps"], target_ms=p["target_ms"])
    return {"name": name, "K": K, "N": N, "M": M, "cold": cold, "sets": sets, "rel_err": rel_err,
            "kernels": profile.kernels_per_call(fns[0], device), "timing": t.to_dict()}


def measure(params: dict, device: str, linear) -> dict:
    """Every point of chapter 1: each layer of ``params["shapes"]``, each M, cold then hot."""
    require(params, PARAMS)
    if not callable(linear):
        raise TypeError("linear must be a function (M, K, N, device) -> ((x, w, y), call); see chapter 1's notebook")
    p = params
    l2 = torch.cuda.get_device_properties(0).L2_cache_size if device == "cuda" else 0
    rows = []
    for name, (K, N) in p["shapes"].items():
        for M in p["M"]:
            for cold in (True, False):
                rows.append(measure_linear(linear, name, K, N, M, cold, device, l2, p))
            if device == "cuda":
                torch.cuda.empty_cache()
        print(f"{name} done", flush=True)
    return {"l2_bytes": l2, "points": rows}


# ---------------------------------------------------------------------------- analysis

def points(data: dict, roof: costs.Roofline) -> pd.DataFrame:
    """One row per product: times, kernels, F, Q, I = F/Q, TFLOP/s, GB/s, and the model's time
    max(F/P, Q/BW, kernels x t_launch) with measured over model. No kernel count (the CPU) counts 1."""
    pts = pd.DataFrame([
        {
            "layer": r["name"], "K": r["K"], "N": r["N"], "M": r["M"], "L2": "cold" if r["cold"] else "hot",
            "GPU time (us)": r["timing"]["gpu_us"]["median"],
            "GPU spread": timing.Stats.from_dict(r["timing"]["gpu_us"]).spread,
            "call time (us)": r["timing"]["call_us"]["median"],
            "kernels": r["kernels"] or 1,
            "rel. error": r["rel_err"],
        }
        for r in data["points"]
    ])
    pts["F"] = [costs.linear_flops(m, k, n) for m, k, n in zip(pts["M"], pts["K"], pts["N"])]
    pts["Q"] = [costs.linear_bytes(m, k, n, BYTES) for m, k, n in zip(pts["M"], pts["K"], pts["N"])]
    pts["I (FLOP/byte)"] = pts["F"] / pts["Q"]
    pts["TFLOP/s"] = pts["F"] / pts["GPU time (us)"] / 1e6
    pts["GB/s"] = pts["Q"] / pts["GPU time (us)"] / 1e3
    pts["model (us)"] = [roof.time(f, q, k) * 1e6 for f, q, k in zip(pts["F"], pts["Q"], pts["kernels"])]
    pts["measured / model"] = pts["GPU time (us)"] / pts["model (us)"]
    return pts


def findings(cold: pd.DataFrame, decode: pd.DataFrame) -> dict:
    """The quantities the chapter's page quotes and its claims check, from the L2-defeated points:
    the K=N=4096 layer ("o") at M=1 (time, GB/s, call time), its worst time up to M=64 over M=1, its rate
    at the largest M, and M=1000 and M=1500 against M=1024; gate_up's weight read rate at M=1; the best
    rate of all, the worst at M >= 1024, the worst over layers at the largest M; decode at B=128 over B=1.
    NaN where the sweep lacks a size."""
    nan = float("nan")
    o = cold[cold["layer"] == "o"].set_index("M")
    t1 = o.loc[1, "GPU time (us)"]
    return {
        "o_m1_us": t1,
        "o_m1_GBps": o.loc[1, "GB/s"],
        "o_m1_call_us": o.loc[1, "call time (us)"],
        "o_m64_max_over_m1": o[o.index <= 64]["GPU time (us)"].max() / t1,
        "o_mmax_tflops": o["TFLOP/s"].iloc[-1],
        "m_1000_over_1024": o.loc[1000, "GPU time (us)"] / o.loc[1024, "GPU time (us)"] if 1000 in o.index else nan,
        "m_1500_over_1024": o.loc[1500, "GPU time (us)"] / o.loc[1024, "GPU time (us)"] if 1500 in o.index else nan,
        "gate_up_m1_GBps": cold[(cold["layer"] == "gate_up") & (cold["M"] == 1)]["GB/s"].iloc[0],
        "max_tflops_all": cold["TFLOP/s"].max(),
        "min_tflops_big": cold[cold["M"] >= 1024]["TFLOP/s"].min(),
        "largest_M_min_tflops": cold[cold["M"] == cold["M"].max()]["TFLOP/s"].min(),
        "decode_gain_b128": decode.loc[128, "vs B=1"] if 128 in decode.index else nan,
    }


def knee(times: pd.Series, flat_max_M: int = 16, line_min_M: int = 4096) -> float:
    """The measured knee M* of a time over M (a Series indexed by M): where the flat part, the median of
    the times at M <= ``flat_max_M`` (the weights' read, which M does not change), meets the line through
    the origin fitted to the arithmetic-bound points at M >= ``line_min_M`` (the median of time / M, in
    time per token). NaN where the sweep has no point in either range (a smoke run's small M)."""
    if not isinstance(times, pd.Series):
        raise TypeError(f"knee takes a pandas Series of times indexed by M, got {type(times).__name__}")
    if not flat_max_M < line_min_M:
        raise ValueError(f"the flat range (M <= {flat_max_M}) must end below the line's (M >= {line_min_M})")
    m = times.index.to_series()
    flat, big = times[m <= flat_max_M], times[m >= line_min_M]
    if flat.empty or big.empty:
        return float("nan")
    return float(flat.median() / (big / big.index).median())


def decode_steps(cold: pd.DataFrame, n_layers: int, max_B: int | None = None) -> pd.DataFrame:
    """The linear layers of a decode step of B requests, from the L2-defeated points: every linear layer
    runs with M = B, so the step takes the sum over the layers of a block of their times at M = B, times
    ``n_layers`` blocks (attention, norms, the LM head and the host are not in it). One row per B up to
    ``max_B`` (all by default): the step's time (us), its time per token (step / B) and how many times
    cheaper a token is than at the smallest B. Only the M measured for every layer count."""
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
        raise ValueError(f"n_layers must be a positive int (Llama-3-8B has 32), got {n_layers!r}")
    if cold.empty:
        raise ValueError("no points to sum: pass the L2-defeated rows of points()")
    layers = cold["layer"].nunique()
    by_m = cold.groupby("M")["GPU time (us)"]
    complete = by_m.count() == layers
    step = by_m.sum()[complete] * n_layers
    if max_B is not None:
        step = step[step.index <= max_B]
    out = pd.DataFrame({"step (us)": step, "per token (us)": step / step.index})
    out.index.name = "B"
    out["vs B=1"] = out["per token (us)"].iloc[0] / out["per token (us)"]
    return out


def weight_bytes(model: dict = costs.LLAMA3_8B, b: int = BYTES) -> dict:
    """The weight bytes of a model of ``costs.LLAMA3_8B``'s form, in b-byte elements: its blocks' linear
    layers (``n_layers`` x the sum of K N), the LM head (hidden x vocabulary), the embedding table (the
    same size), and what one decode step reads: the linear layers and the LM head. The embedding table
    is not read whole: a step gathers one row per token. Norm weights (a few vectors) are left out."""
    missing = [k for k in ("layers", "hidden", "vocab", "linears") if k not in model]
    if missing:
        raise KeyError(f"the model lacks {missing}: pass a dict of costs.LLAMA3_8B's form")
    linears = b * model["layers"] * sum(k * n for k, n in model["linears"].values())
    head = b * model["hidden"] * model["vocab"]
    return {"linear layers": linears, "LM head": head, "embedding": head, "decode step reads": linears + head}


def largest_within(step_us: pd.Series, target_us: float) -> int:
    """The largest B (index) whose step time is at most ``target_us``; 0 when none is."""
    if not target_us > 0:
        raise ValueError(f"the target time must be positive, got {target_us!r} us")
    fits = step_us[step_us <= target_us]
    return int(fits.index.max()) if len(fits) else 0


def page(res, c: dict, roof: costs.Roofline, pts: pd.DataFrame, cold: pd.DataFrame, decode: pd.DataFrame, f: dict,
         knees: pd.DataFrame, hot_cold: pd.DataFrame, worked: dict, step: dict):
    """Every number and word chapter 1's page quotes, by name (a ``lib.bench.page.Page``), from the notebook's tables:
    the results ``res``, chapter 0's ceilings ``c`` and their ``roof``, the ``points``, the cold rows, the
    decode steps (``decode_steps`` up to B = 2048), ``findings``' ``f``, the knees (by layer) and the
    hot / cold table (by M); ``worked``: the worked example (m1_F, m1_Q, m128_F, m128_Q, P_seed, BW_seed,
    and its table, with a "match" column); ``step``: step_knee_B, tpot_target_ms, tpot_target_max_B and the
    M = 1 line fit (fit_GBps, fit_t0_us)."""
    from lib.bench.page import Page
    from lib.models.config import crossover_M

    m1_F, m1_Q, m128_F, m128_Q = worked["m1_F"], worked["m1_Q"], worked["m128_F"], worked["m128_Q"]
    P_seed, BW_seed, worked = worked["P_seed"], worked["BW_seed"], worked["table"]
    step_knee_B, tpot_target_ms, tpot_target_max_B = step["step_knee_B"], step["tpot_target_ms"], step["tpot_target_max_B"]
    fit_GBps, fit_t0_us = step["fit_GBps"], step["fit_t0_us"]
    predicted_ridge_M = costs.ridge_M(2, roof.P_flops, roof.BW_Bps)
    n_layers = costs.LLAMA3_8B["layers"]
    weights = weight_bytes(costs.LLAMA3_8B)
    floor_us = {name: nbytes / roof.BW_Bps * 1e6 for name, nbytes in weights.items()}
    m1 = cold[cold["M"] == 1].set_index("layer")
    numbers = {
        "m1_flops": m1_F,
        "m1_bytes": m1_Q,
        "m1_intensity": costs.intensity(m1_F, m1_Q),
        "m128_flops": m128_F,
        "m128_bytes": m128_Q,
        "m128_intensity": costs.intensity(m128_F, m128_Q),
        "m1_compute_bound_us_seed": m1_F / P_seed * 1e6,
        "m1_traffic_bound_us_seed": m1_Q / BW_seed * 1e6,
        "m1_traffic_over_compute_worked": (m1_Q / BW_seed) / (m1_F / P_seed),
        "worked_matches": int(worked["match"].sum()),
        "worked_total": len(worked),
        "predicted_ridge_M": predicted_ridge_M,
        "measured_knee_M": knees.loc["o", "measured knee M*"],
        "knee_over_ridge": knees.loc["o", "knee / ridge"],
        "knee_over_ridge_min": knees["knee / ridge"].min(),
        "knee_over_ridge_max": knees["knee / ridge"].max(),
        "o_m1_us": f["o_m1_us"],
        "o_m1_GBps": f["o_m1_GBps"],
        "o_m64_max_over_m1": f["o_m64_max_over_m1"],
        "o_mmax_tflops": f["o_mmax_tflops"],
        "o_m1_call_us": f["o_m1_call_us"],
        "gate_up_m1_GBps": f["gate_up_m1_GBps"],
        "gate_up_m1_of_read": f["gate_up_m1_GBps"] / c["read_bw_GBps"],
        "max_tflops_all": f["max_tflops_all"],
        "min_tflops_big": f["min_tflops_big"],
        "o_weight_MiB": SHAPES["o"][0] * SHAPES["o"][1] * 2 / 2**20,
        "gate_up_weight_MiB": SHAPES["gate_up"][0] * SHAPES["gate_up"][1] * 2 / 2**20,
        "n_layers": n_layers,
        "hot_cold_o_m1": hot_cold.loc[1, "o"],
        "hot_cold_gate_up_m1": hot_cold.loc[1, "gate_up"],
        "decode_per_token_b1_us": decode["per token (us)"].iloc[0],
        "decode_gain_b128": f["decode_gain_b128"],
        "decode_gain_max": decode["vs B=1"].max(),
        "decode_step_b1_us": decode["step (us)"].iloc[0],
        "reps": res.params["reps"],
        "m_1000_over_1024": f["m_1000_over_1024"],
        "m_1500_over_1024": f["m_1500_over_1024"],
        "read_bw_GBps": c["read_bw_GBps"],
        "l2_MiB": c["l2_bytes"] / 2**20,
        "copy_bw_GBps": c["copy_bw_GBps"],
        "bf16_tflops": c["bf16_tflops"],
        "crossover_M": crossover_M(SHAPES),
        "linear_weights_GiB": weights["linear layers"] / 2**30,
        "lm_head_GiB": weights["LM head"] / 2**30,
        "embedding_GiB": weights["embedding"] / 2**30,
        "decode_weights_GiB": weights["decode step reads"] / 2**30,
        "linear_weights_floor_us": floor_us["linear layers"],
        "decode_weights_floor_us": floor_us["decode step reads"],
        "step_b1_over_floor": decode["step (us)"].iloc[0] / floor_us["linear layers"],
        "step_b1_read_GBps": weights["linear layers"] / decode["step (us)"].iloc[0] / 1e3,
        "step_b64_over_b1": decode.loc[64, "step (us)"] / decode["step (us)"].iloc[0] if 64 in decode.index else float("nan"),
        "step_knee_B": step_knee_B,
        "step_knee_over_ridge": step_knee_B / predicted_ridge_M,
        "per_token_b2048_over_b1024": (decode.loc[2048, "per token (us)"] / decode.loc[1024, "per token (us)"]
                                       if {1024, 2048} <= set(decode.index) else float("nan")),
        "tpot_target_ms": tpot_target_ms,
        "tpot_target_max_B": tpot_target_max_B,
        "m1_fit_GBps": fit_GBps,
        "m1_fit_t0_us": fit_t0_us,
        "o_m1_Q_MiB": m1.loc["o", "Q"] / 2**20,
        "gate_up_m1_Q_MiB": m1.loc["gate_up", "Q"] / 2**20,
        "gate_up_m1_us": m1.loc["gate_up", "GPU time (us)"],
        "tpot_half_target_max_B": largest_within(decode["step (us)"], tpot_target_ms * 1e3 / 2),
        "decode_weights_bytes": weights["decode step reads"],
        "lm_head_floor_us": floor_us["LM head"],
        "lm_head_crossover_M": crossover_M({"lm_head": (costs.LLAMA3_8B["hidden"], costs.LLAMA3_8B["vocab"])}),
        "ridge_M_weight_only_fp8": costs.ridge_M(1, roof.P_flops, roof.BW_Bps),
        "max_tflops_over_bf16": f["max_tflops_all"] / c["bf16_tflops"],
        "largest_M_min_of_bf16": f["largest_M_min_tflops"] / c["bf16_tflops"],
        "o_m1_GBps_of_read": f["o_m1_GBps"] / c["read_bw_GBps"],
        "worst_rel_err": pts["rel. error"].max(),
        "kernels_per_call_max": pts["kernels"].max(),
    }
    texts = {"device_name": res.provenance["name"], "measured_date": res.date}
    return Page(numbers=numbers, texts=texts)
