"""Chapter 7's step model with a fixed cost per kernel: the latency-bandwidth model, kernel by kernel.

Chapter 2's model charges each kernel the larger of its bytes over the read rate and one launch time,
chapter 0's GPU time of an empty kernel in a CUDA graph. An empty kernel never goes to memory; every kernel
of a decode step does, and waits for its first bytes before it can finish. The latency-bandwidth model
charges each kernel a fixed cost alpha plus its work at the machine's rates,

    t_part = k_part * alpha + max(Q_part / BW, F_part / P),

with alpha read from chapter 0's cold copies (copies whose source the L2 does not hold): their time
against their bytes is a line whose intercept is what a kernel that goes to memory costs before its bytes
(``kernel_alpha_us``, a least-squares fit over the whole sweep). ``parts`` applies it to each part of
``decode_step.Analysis.parts`` (the small operators move kilobytes: alpha each).

Chapter: 7.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from lib.experiments import decode_step


def kernel_alpha_us(copy_cold: list[dict]) -> float:
    """The intercept (us) of a least-squares line through chapter 0's cold copies: GPU time (the medians of
    their CUDA-graph replays) against bytes. ``copy_cold`` is chapter 0's ``data["copy_cold"]``."""
    pts = [(r["bytes"], r["timing"]["gpu_us"]["median"]) for r in copy_cold]
    if len({b for b, _ in pts}) < 2:
        raise ValueError("a line needs cold copies of at least two sizes: chapter 0's data['copy_cold']")
    x, y = np.array(pts, dtype=float).T
    slope, intercept = np.polyfit(x, y, 1)
    if not slope > 0:
        raise ValueError(f"the cold copies' time does not grow with their bytes (slope {slope:.3g} us/byte)")
    return float(intercept)


def parts(a: decode_step.Analysis, alpha_us: float) -> pd.DataFrame:
    """Each part of ``a.parts`` but the time between kernels, predicted as k alpha + max(Q/BW, F/P): the
    layer weights' and the head's bytes and FLOPs (2 per weight per request), the K/V's bytes and attention's
    FLOPs, nothing for the small operators. Columns: B, L, path, part, kernels, measured (us),
    predicted (us), measured / predicted."""
    rows = []
    b = 2 if a.params["dtype"] == "bfloat16" else 4
    c = a.cfg
    for r in a.parts[a.parts["part"] != "between kernels"].to_dict("records"):
        B, L = r["B"], r["L"]
        q = decode_step.step_bytes(c, B, L, b)
        flops = {"layer weights": 2 * B * q["layer weights"] / b, "output head": 2 * B * q["output head"] / b,
                 "attention (K/V)": 4 * B * L * c.layers * c.heads * c.head_dim, "small operators": 0.0}
        work = max(q.get(r["part"], 0.0) / a.BW, flops[r["part"]] / a.P) * 1e6 if r["part"] != "small operators" else 0.0
        pred = r["kernels"] * alpha_us + work
        rows.append({"B": B, "L": L, "path": r["path"], "part": r["part"], "kernels": r["kernels"],
                     "measured (us)": r["measured (us)"], "predicted (us)": pred,
                     "measured / predicted": r["measured (us)"] / pred})
    return pd.DataFrame(rows)


def median_abs_err(table: pd.DataFrame, B: int, L: int, path: str = "fused") -> float:
    """Median |measured / predicted - 1| over a shape's parts for one path."""
    t = table[(table["B"] == B) & (table["L"] == L) & (table["path"] == path)]
    return float((t["measured / predicted"] - 1).abs().median())
