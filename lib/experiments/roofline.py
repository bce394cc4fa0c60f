"""Chapter 2, the roofline: the sweep that times the memory-bound operators, and every point against the model.

The notebook defines what is timed: for each operator of a forward pass (``OPS``: an elementwise add,
RMSNorm, an embedding gather, a softmax over the vocabulary) a function ``make(T, H, V, device, shared)``
that makes one set of random inputs of T tokens and returns ``(call, inputs)``; ``shared`` holds what
every call shares (the embedding's table: a model has one). This module runs each operator over the
token counts of ``sweep(size)``:

- main points: every T of ``T`` (``T_softmax`` for the softmax, whose rows are a whole vocabulary),
  with ``timing.rotation`` input sets whose total is four times the L2, so each call reads HBM;
- detail points: finer sweeps of the small sizes (``T_detail``), cold as above and hot (one set).

F and Q are counted as the operator needs them, each input read once and each output written once
(``counts``, the chapter's table). Before timing, the first set's output is checked against a
reference (``check``: exact for the add and the gather, a relative error of at most 1e-2 for the bf16
RMSNorm against float32, 1e-5 for the fp32 softmax against float64). The profiler names the GPU
kernels one call launches.

The analysis functions put chapter 1's linear layers and these operators in one table against the
model T = max(F/P, Q/BW, k t_launch) (``points``), summarize it (``model_summary``), and pick the numbers
the chapter's page quotes (``findings``).

Chapter: 2 (roofline); it reads chapter 0's ceilings and chapter 1's points.
"""

from __future__ import annotations

import pandas as pd
import torch

from lib import costs
from lib.bench import profile, timing
from lib.experiments import require

OPS = ("add", "rmsnorm", "embedding", "softmax")
PARAMS = ("H", "V", "T", "T_softmax", "T_detail", "reps", "target_ms")
RMS_EPS = 1e-6


def sweep(size: str) -> dict:
    """Hidden size H, vocabulary V, the token counts of the main and the detail points, and the timing."""
    if size == "full":
        return {"H": 4096, "V": 128256, "T": [1, 16, 256, 4096, 16384], "T_softmax": [1, 16, 256, 2048],
                # finer sweeps of the small sizes, to see why small calls miss the model
                "T_detail": {"embedding": [1, 2, 4, 8, 16, 32, 64, 128, 256], "rmsnorm": [1, 64, 132, 264, 528, 1056],
                             "softmax": [1, 4, 16, 64, 132, 264, 528]},
                "reps": 25, "target_ms": 1.5}
    if size == "smoke":
        return {"H": 256, "V": 8000, "T": [1, 16, 256], "T_softmax": [1, 16],
                "T_detail": {"embedding": [1, 2], "rmsnorm": [1, 2], "softmax": [1, 2]}, "reps": 3, "target_ms": 0.2}
    raise ValueError(f"size={size!r}: the sweep has a 'full' and a 'smoke' size")


def counts(op: str, T: int, H: int, V: int) -> tuple[int, int]:
    """(F, Q) of one call of ``op`` on T tokens: FLOPs, and bytes with each input read once and each
    output written once (bf16, the softmax fp32; the gather reads T int64 ids)."""
    if op == "add":  # c = a + b, [T, H]
        return T * H, 3 * 2 * T * H
    if op == "rmsnorm":  # x * rsqrt(mean(x^2) + eps) * w: square, sum, scale, weight
        return 4 * T * H, 2 * 2 * T * H + 2 * H
    if op == "embedding":  # T rows of the [V, H] table
        return 0, 2 * 2 * T * H + 8 * T
    if op == "softmax":  # max, subtract, exp, sum, divide over [T, V]
        return 5 * T * V, 2 * 4 * T * V
    raise ValueError(f"op={op!r} is not one of {OPS}")


def check(op: str, out: torch.Tensor, inputs: tuple) -> None:
    """Raise if ``out`` is not ``op`` of ``inputs`` (the tensors its ``make`` returned)."""
    if op == "add":
        a, b = inputs
        ok, what = torch.equal(out, a + b), "differs from a + b"
    elif op == "embedding":
        ids, table = inputs
        ok, what = torch.equal(out, table[ids]), "differs from table[ids]"
    elif op == "rmsnorm":
        x, w = inputs
        xf = x.float()
        ref = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + RMS_EPS) * w.float()
        err = ((out.float() - ref).norm() / ref.norm()).item()
        ok, what = err < 1e-2, f"has a relative error of {err:.2e} against float32 (at most 1e-2)"
    elif op == "softmax":
        (x,) = inputs
        ref = torch.softmax(x.double(), -1)
        err = ((out.double() - ref).norm() / ref.norm()).item()
        ok, what = err < 1e-5, f"has a relative error of {err:.2e} against float64 (at most 1e-5)"
    else:
        raise ValueError(f"op={op!r} is not one of {OPS}")
    if not ok:
        raise AssertionError(f"{op}: the output {what}: the call is wrong, and a wrong call is not timed")


# ---------------------------------------------------------------------------- measuring

def measure_op(make, name: str, T: int, cold: bool, device: str, l2: int, p: dict, shared: dict) -> dict:
    """One point: ``make``'s call for T tokens, checked, then timed (cold: rotating input sets)."""
    call, inputs = make(T, p["H"], p["V"], device, shared)
    check(name, call(), inputs)
    flops, nbytes = counts(name, T, p["H"], p["V"])
    sets = timing.rotation(nbytes, l2) if (cold and l2) else 1
    fns = [call] + [make(T, p["H"], p["V"], device, shared)[0] for _ in range(sets - 1)]
    t = timing.bench(fns, device=device, reps=p["reps"], target_ms=p["target_ms"])
    names = profile.kernel_names(call, device)
    del fns
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"op": name, "T": T, "cold": cold, "F": flops, "Q": nbytes, "sets": sets,
            "kernels": len(names) if names else None, "kernel_names": names, "timing": t.to_dict()}


def measure(params: dict, device: str, ops: dict) -> dict:
    """Every point of chapter 2: the main points (cold), then the detail points (cold and hot)."""
    require(params, PARAMS)
    if set(ops) != set(OPS) or not all(callable(m) for m in ops.values()):
        raise ValueError(f"ops must map each of {list(OPS)} to a function (T, H, V, device, shared) -> (call, inputs), "
                         f"got {sorted(ops)}; see chapter 2's notebook")
    p = params
    l2 = torch.cuda.get_device_properties(0).L2_cache_size if device == "cuda" else 0
    shared = {}
    rows = [measure_op(ops[name], name, T, True, device, l2, p, shared)
            for name in OPS for T in (p["T_softmax"] if name == "softmax" else p["T"])]
    print("operators done", flush=True)
    detail = [measure_op(ops[name], name, T, cold, device, l2, p, shared)
              for name, Ts in p["T_detail"].items() for T in Ts for cold in (True, False)]
    print("details done", flush=True)
    return {"l2_bytes": l2, "points": rows, "detail": detail}


# ---------------------------------------------------------------------------- analysis

def points(ch1: dict, data: dict, roof: costs.Roofline, roof_eager: costs.Roofline) -> pd.DataFrame:
    """Chapter 1's linear layers (cold and hot) and this chapter's operators (cold), one row each: F, Q,
    I, kernels (1 where none were counted), GPU and call time, the model's time and bound for GPU time
    (``roof``: a launch in a graph) and for call time (``roof_eager``: an eager launch), and the ratios."""
    rows = []
    for r in ch1["points"]:
        rows.append({"source": "linear", "what": r["name"], "size": r["M"], "L2": "cold" if r["cold"] else "hot",
                     "F": costs.linear_flops(r["M"], r["K"], r["N"]), "Q": costs.linear_bytes(r["M"], r["K"], r["N"], 2),
                     "kernels": r["kernels"] or 1, "timing": r["timing"]})
    for r in data["points"]:
        rows.append({"source": "memory-bound", "what": r["op"], "size": r["T"], "L2": "cold",
                     "F": r["F"], "Q": r["Q"], "kernels": r["kernels"] or 1, "timing": r["timing"]})
    pts = pd.DataFrame(rows)
    pts["GPU time (us)"] = [t["gpu_us"]["median"] for t in pts["timing"]]
    pts["call time (us)"] = [t["call_us"]["median"] for t in pts["timing"]]
    pts = pts.drop(columns="timing")
    pts["I (FLOP/byte)"] = pts["F"] / pts["Q"]
    pts["model (us)"] = [roof.time(f, q, k) * 1e6 for f, q, k in zip(pts["F"], pts["Q"], pts["kernels"])]
    pts["bound"] = [roof.bound(f, q, k) for f, q, k in zip(pts["F"], pts["Q"], pts["kernels"])]
    pts["measured / model"] = pts["GPU time (us)"] / pts["model (us)"]
    pts["call model (us)"] = [roof_eager.time(f, q, k) * 1e6 for f, q, k in zip(pts["F"], pts["Q"], pts["kernels"])]
    pts["call / call model"] = pts["call time (us)"] / pts["call model (us)"]
    return pts


def model_summary(cold: pd.DataFrame) -> pd.DataFrame:
    """Points with the L2 defeated, by the term that bounds them and all together: how many, the median
    measured / model, and the median of |measured / model - 1|."""
    err = (cold["measured / model"] - 1).abs()
    summary = pd.DataFrame({
        "points": cold.groupby("bound").size(),
        "median measured/model": cold.groupby("bound")["measured / model"].median(),
        "median |ratio - 1|": err.groupby(cold["bound"]).median(),
    })
    summary.loc["all (L2 defeated)"] = [len(cold), cold["measured / model"].median(), err.median()]
    return summary


def detail(data: dict) -> pd.DataFrame:
    """The detail points: operator, T, L2 ("cold" or "hot"), GPU time, and the first kernel's name."""
    return pd.DataFrame([
        {"op": r["op"], "T": r["T"], "L2": "cold" if r["cold"] else "hot", "cold": r["cold"],
         "GPU time (us)": r["timing"]["gpu_us"]["median"], "kernel": (r["kernel_names"] or [""])[0]}
        for r in data["detail"]
    ])


def findings(pts: pd.DataFrame, ops: pd.DataFrame, det: pd.DataFrame) -> dict:
    """The quantities the chapter's page quotes and its claims check, by name:

    - the model over the L2-defeated points: the median |measured / model - 1|, the extreme ratios, the
      share within 0.9x to 2x and the count outside, the medians of the linear layers and of the
      operators; hot points that beat the model by more than 10%, and the lowest hot ratio;
    - the operators (``ops``: the memory-bound rows of ``pts`` with their GB/s): the largest add's
      bandwidth, the smallest add's GPU and call time, RMSNorm's kernels and its smallest and largest
      ratios, the add and the gather at a middle T (256, or the largest) in MiB, GB/s and ratio, the
      largest softmax's GB/s and ratio, and the median call / GPU time of the smallest calls;
    - the detail sweeps (``det``): up to which T the gather uses PyTorch's small-index kernel and how long
      it takes, where the general gather starts; RMSNorm's median time cold and hot; the softmax at
      T = 1, 16, 64, 132 and 528 (NaN where the sweep lacks a size).
    """
    nan = float("nan")
    cold = pts[pts["L2"] == "cold"]
    hot = pts[pts["L2"] == "hot"]
    ratio = cold["measured / model"]
    add = ops[ops["what"] == "add"].set_index("size")
    sm = ops[ops["what"] == "softmax"].set_index("size")
    rms = ops[ops["what"] == "rmsnorm"].set_index("size")
    emb_main = ops[ops["what"] == "embedding"].set_index("size")
    small = ops[ops["size"] == ops["size"].min()]
    mid = 256 if 256 in add.index else add.index[-1]
    emb = det[(det["op"] == "embedding") & det["cold"]].set_index("T")
    small_kernel = emb[emb["kernel"].str.contains("SmallIndex")]
    gather = emb[~emb.index.isin(small_kernel.index)]
    rd = det[det["op"] == "rmsnorm"]
    sd = det[(det["op"] == "softmax") & det["cold"]].set_index("T")
    return {
        "model_median_abs_err": (ratio - 1).abs().median(),
        "model_points": len(cold),
        "model_min_ratio_cold": ratio.min(),
        "model_max_ratio_cold": ratio.max(),
        "model_within_2x_frac": ((ratio >= 0.9) & (ratio <= 2)).mean(),
        "outliers_cold": int(((ratio < 0.9) | (ratio > 2)).sum()),
        "outliers_hot_beat": int((hot["measured / model"] < 0.9).sum()),
        "hot_min_ratio": hot["measured / model"].min(),
        "linear_cold_median_ratio": cold[cold["source"] == "linear"]["measured / model"].median(),
        "ops_median_ratio": cold[cold["source"] == "memory-bound"]["measured / model"].median(),
        "add_big_GBps": add["GB/s"].iloc[-1],
        "add_small_gpu_us": add["GPU time (us)"].iloc[0],
        "add_small_call_us": add["call time (us)"].iloc[0],
        "rmsnorm_kernels": rms["kernels"].iloc[0],
        "mid_T": mid,
        "add_mid_ratio": add.loc[mid, "measured / model"],
        "add_mid_MiB": add.loc[mid, "Q"] / 2**20,
        "add_mid_GBps": add.loc[mid, "GB/s"],
        "emb_mid_ratio": emb_main.loc[mid, "measured / model"],
        "emb_mid_MiB": emb_main.loc[mid, "Q"] / 2**20,
        "rmsnorm_small_ratio": rms["measured / model"].iloc[0],
        "rmsnorm_big_ratio": rms["measured / model"].iloc[-1],
        "softmax_big_GBps": sm["GB/s"].iloc[-1],
        "softmax_big_ratio": sm["measured / model"].iloc[-1],
        "small_call_over_gpu": (small["call time (us)"] / small["GPU time (us)"]).median(),
        "emb_small_kernel_max_T": small_kernel.index.max() if len(small_kernel) else nan,
        "emb_small_kernel_max_us": small_kernel["GPU time (us)"].max() if len(small_kernel) else nan,
        "emb_gather_min_T": gather.index.min(),
        "emb_gather_first_us": gather["GPU time (us)"].iloc[0],
        "rms_floor_cold_us": rd[rd["cold"]]["GPU time (us)"].median(),
        "rms_floor_hot_us": rd[~rd["cold"]]["GPU time (us)"].median(),
        "rms_detail_max_T": rd["T"].max(),
        "softmax_t1_us": sd["GPU time (us)"].iloc[0],
        **{f"softmax_t{T}_us": sd.loc[T, "GPU time (us)"] if T in sd.index else nan for T in (16, 64, 132, 528)},
    }
