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
