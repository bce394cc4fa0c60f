"""Chapter 7's analysis: the step model with a fixed cost per kernel (the latency-bandwidth model, kernel by
kernel), the chapter's tables and its page.

Chapter 2's model charges each kernel the larger of its bytes over the read rate and one launch time,
chapter 0's GPU time of an empty kernel in a CUDA graph. An empty kernel never goes to memory; every kernel
of a decode step does, and waits for its first bytes before it can finish. The latency-bandwidth model
charges each kernel a fixed cost alpha plus its work at the machine's rates,

    t_part = k_part * alpha + max(Q_part / BW, F_part / P),

with alpha read from chapter 0's cold copies (copies whose source the L2 does not hold): their time
against their bytes is a line whose intercept is what a kernel that goes to memory costs before its bytes
(``kernel_alpha_us``, a least-squares fit over the whole sweep). ``parts`` applies it to each part of
``decode_step.Analysis.parts`` (the small operators move kilobytes: alpha each).

The chapter's other tables from the data and the ``Analysis`` (what fusion saves, shape by shape and
fusion by fusion; what sampling adds; the logit, greedy and top-p checks; the targets) and ``page``, every
number, word and table the chapter's page quotes as a ``lib.bench.page.Page``.

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


# ---------------------------------------------------------------------------- the chapter's tables and page

def _tag(B: int, shapes: list) -> str:
    """The page's name of a shape by its batch: "b1" for the first shape's, "b64" for the other."""
    return "b1" if B == shapes[0][0] else "b64"


def model_errors(model_parts: pd.DataFrame, shapes: list) -> dict:
    """``median_abs_err`` of the fused step at each shape: {alpha_model_median_abs_err_b1 (and _b64): value}."""
    return {f"alpha_model_median_abs_err_{_tag(B, shapes)}": median_abs_err(model_parts, B, L) for B, L in shapes}


def fusion_savings(a: decode_step.Analysis) -> pd.DataFrame:
    """Per shape, what fusing saves: the small-operator kernels removed (unfused minus fused), the saving
    predicted at one launch time each, the saving measured (small operators and the time between kernels,
    unfused minus fused), per kernel removed, and the weight GEMMs' time (layers and head) in both steps."""
    rows = []
    for B, L in [tuple(s) for s in a.params["shapes"]]:
        pt = a.parts[(a.parts["B"] == B) & (a.parts["L"] == L)].pivot_table(
            index="part", columns="path", values=["measured (us)", "kernels"], aggfunc="first", dropna=False)
        small = ["small operators", "between kernels"]
        gemm = ["layer weights", "output head"]
        removed = pt["kernels"].loc["small operators", "unfused"] - pt["kernels"].loc["small operators", "fused"]
        saved = pt["measured (us)"].loc[small, "unfused"].sum(min_count=1) \
            - pt["measured (us)"].loc[small, "fused"].sum(min_count=1)
        rows.append({"B": B, "L": L, "kernels removed": removed, "predicted saving (us)": removed * a.t0,
                     "measured saving (us)": saved, "measured per kernel removed (us)": saved / removed,
                     "GEMMs: cuBLAS (us)": pt["measured (us)"].loc[gemm, "unfused"].sum(min_count=1),
                     "GEMMs: fused step (us)": pt["measured (us)"].loc[gemm, "fused"].sum(min_count=1)})
    return pd.DataFrame(rows)


def fusion_by_group(kernels: dict, t0: float) -> pd.DataFrame:
    """Fusion by fusion (``decode_step.FUSIONS`` but "other"), from one shape's kernel lists {path: kernels}:
    kernels unfused and fused, the saving predicted at ``t0`` (one launch time) per kernel removed, and the
    saving measured. Empty where the unfused or the fused step has no kernel list (no profile on a CPU)."""
    rows = []
    if all(kernels.get(p) for p in ("unfused", "fused")):
        gu, gf = (decode_step.fusion_groups(kernels[p]) for p in ("unfused", "fused"))
        for group in decode_step.FUSIONS[:-1]:
            rows.append({"fusion": group, "kernels unfused": gu[group]["kernels"], "kernels fused": gf[group]["kernels"],
                         "predicted saving (us)": (gu[group]["kernels"] - gf[group]["kernels"]) * t0,
                         "measured saving (us)": gu[group]["us"] - gf[group]["us"]})
    return pd.DataFrame(rows)


def fused_code_lines() -> pd.DataFrame:
    """Lines of source of each fused kernel of ``lib.kernels.fused``, its Triton kernel and its wrapper."""
    import inspect

    from lib.kernels import fused

    return pd.DataFrame([{"fused kernel": f.__name__, "lines (kernel and wrapper)":
                          len(inspect.getsource(k.fn).splitlines()) + len(inspect.getsource(f).splitlines())}
                         for f, k in ((fused.rmsnorm, fused._rmsnorm_kernel), (fused.rope_write, fused._rope_write_kernel),
                                      (fused.silu_mul, fused._silu_mul_kernel))])


def sampling_costs(a: decode_step.Analysis, steps: list[dict]) -> pd.DataFrame:
    """Per shape and path, the step's GPU time and what greedy and top-p sampling add to it: the median over
    the rounds of the step timed with sampling, minus the step's time (``a.time``)."""
    import statistics

    rows = []
    for s in steps:
        for name in s["rounds"]:
            row = {"B": s["B"], "L": s["L"], "path": name, "step (us)": a.time(s["B"], s["L"], name)}
            for kind, key in (("greedy", "greedy_rounds"), ("top-p", "top_p_rounds")):
                with_sampling = statistics.median(r["gpu_us"]["median"] for r in s[key][name])
                row[f"{kind} sampling (us)"] = with_sampling - row["step (us)"]
            rows.append(row)
    return pd.DataFrame(rows)


def sampling_spread_us(steps: list[dict]) -> dict:
    """Each shape's largest range (largest minus smallest) of a path's medians over the rounds, with or
    without sampling: {(B, L): us}."""
    return {(s["B"], s["L"]): max(max(v) - min(v) for key in ("rounds", "greedy_rounds", "top_p_rounds")
                                  for v in ([r["gpu_us"]["median"] for r in rs] for rs in s[key].values()))
            for s in steps}


def sampling_numbers(table: pd.DataFrame, shapes: list) -> dict:
    """``sampling_costs``' table by name: sampling_{path}_{b1|b64}_us (greedy) and top_p_{path}_{b1|b64}_us."""
    return {f"{prefix}_{r['path']}_{_tag(r['B'], shapes)}_us": r[f"{kind} sampling (us)"]
            for r in table.to_dict("records") for prefix, kind in (("sampling", "greedy"), ("top_p", "top-p"))}


def top_p_checks(steps: list[dict]) -> pd.DataFrame:
    """Per shape, the top-p kernels' checks before timing: agreement with the float64 oracle, tokens kept,
    and each path's share of draws inside the kept set."""
    return pd.DataFrame([{"B": s["B"], "L": s["L"], **s["top_p_check"]} for s in steps])


def logit_checks(steps: list[dict]) -> pd.DataFrame:
    """Per shape, each path's logits against the unfused step's, and (first shape) each path in float32
    against its bf16 step: one row per (path, against), with the largest difference, the largest logit of
    the reference and the argmax agreement."""
    rows = []
    for s in steps:
        for name, ch in s["checks"].items():
            for ref_name, cc in (ch.items() if name == "float32" else [("unfused", ch)]):
                path, against = (ref_name, "float32") if name == "float32" else (name, "unfused")
                rows.append({"B": s["B"], "L": s["L"], "path": path, "against": against, **cc})
    return pd.DataFrame(rows)


def greedy_agreement(greedy: list[dict]) -> pd.DataFrame:
    """The free-running greedy steps (``data["greedy"]``), with "agree": whether every path drew the same
    tokens as the first."""
    table = pd.DataFrame(greedy)
    token_cols = [col for col in table.columns if col.startswith("tokens")]
    table["agree"] = [all(r[col] == r[token_cols[0]] for col in token_cols) for _, r in table.iterrows()]
    return table


def targets(n: dict, model_err: dict, shapes: list) -> pd.DataFrame:
    """The chapter's targets from ``Analysis.numbers()`` ``n`` and ``model_errors``' ``model_err``: each
    measured value, its goal ("<= x" or ">= x") and whether it was met."""
    (B1, L1), (B2, L2) = shapes[:2]
    t = pd.DataFrame([
        {"target": f"fused graph step over the floor, batch {B1}, context {L1:,}", "measured": n["step_over_floor_b1"],
         "goal": "<= 1.15"},
        {"target": f"fused graph step over the floor, batch {B2}, context {L2:,}", "measured": n["step_over_floor_b64"],
         "goal": "<= 1.08"},
        {"target": f"fused step vs torch.compile's, batch {B1} (compiled GPU time over fused)",
         "measured": n["fused_vs_compile_b1"], "goal": ">= 1.0"},
        {"target": f"fused step vs torch.compile's, batch {B2} (compiled GPU time over fused)",
         "measured": n["fused_vs_compile_b64"], "goal": ">= 1.0"},
        {"target": "prefill of the longest prompt at batch 1: share of the bf16 rate", "measured": n["prefill_8k_frac_of_bf16"],
         "goal": ">= 0.70"},
        {"target": "step model (alpha per kernel): median |measured / predicted - 1| over the fused step's parts, worse shape",
         "measured": max(model_err.values()), "goal": "<= 0.20"},
    ])
    t["met"] = [(v <= float(g.split()[1])) if g.startswith("<=") else (v >= float(g.split()[1]))
                for v, g in zip(t["measured"], t["goal"])]
    return t


def page(res, c: dict, a: decode_step.Analysis, alpha_us: float):
    """Every number, word and table chapter 7's page quotes, by name, as a ``lib.bench.page.Page``: from the results
    ``res`` (data, params, provenance, date), chapter 0's ceilings ``c``, the ``Analysis`` ``a`` and alpha
    (``kernel_alpha_us``; NaN without a profile), through the tables the notebook shows (computed again here
    by the same functions)."""
    from lib.bench.page import Page

    steps, shapes = res.data["steps"], [tuple(s) for s in res.params["shapes"]]
    (B1, L1), (B2, L2) = shapes[:2]
    n = a.numbers()
    model_parts = parts(a, alpha_us)
    model_err = model_errors(model_parts, shapes)
    checks_table, greedy, top_p = logit_checks(steps), greedy_agreement(res.data["greedy"]), top_p_checks(steps)
    sampling_table, spread = sampling_costs(a, steps), sampling_spread_us(steps)
    sampled = sampling_numbers(sampling_table, shapes)
    fusion_table = fusion_savings(a)
    step1 = next(s for s in steps if (s["B"], s["L"]) == (B1, L1))
    groups = fusion_by_group(step1["kernels"], a.t0)
    targets_table = targets(n, model_err, shapes)
    first = checks_table[(checks_table["B"] == B1) & (checks_table["L"] == L1)].set_index(["path", "against"])
    vs_ref = checks_table[checks_table["against"] == "unfused"]
    # worked numbers of the page and its exercises
    pf1 = a.parts[(a.parts["B"] == B1) & (a.parts["L"] == L1)]
    small_unfused = float(pf1[(pf1["path"] == "unfused") & (pf1["part"] == "small operators")]["measured (us)"].iloc[0])
    small_fused_k = float(pf1[(pf1["path"] == "fused") & (pf1["part"] == "small operators")]["kernels"].iloc[0])
    kv64 = a.parts[(a.parts["B"] == B2) & (a.parts["path"] == "fused") & (a.parts["part"] == "attention (K/V)")].iloc[0]
    q1 = decode_step.step_bytes(a.cfg, 1, 0)
    read_b1_ms = (q1["layer weights"] + q1["output head"]) / a.BW * 1e3
    ex_q = decode_step.step_bytes(a.cfg, 16, 8192)
    cublas_b1_us = float(fusion_table["GEMMs: cuBLAS (us)"].iloc[0])
    norm_saving = norm_kernel_ratio = rope_saving = rope_pred = float("nan")  # no kernel lists, no fusion groups
    if len(groups):
        by_group = groups.set_index("fusion")
        gu, gf = (decode_step.fusion_groups(step1["kernels"][p])["RMSNorm and residual add"] for p in ("unfused", "fused"))
        norm_saving = float(by_group.loc["RMSNorm and residual add", "measured saving (us)"])
        norm_kernel_ratio = (gu["us"] / gu["kernels"]) / (gf["us"] / gf["kernels"])
        rope_saving = float(by_group.loc["RoPE and the K/V write", "measured saving (us)"])
        rope_pred = float(by_group.loc["RoPE and the K/V write", "predicted saving (us)"])
    numbers = {
        **n,
        "rounds": res.params["rounds"], "ridge_flop_per_byte": a.P / a.BW,
        "small_unfused_share_b1": small_unfused / n["step_graph_b1_ms"] / 1e3,
        "small_per_kernel_over_launch_b1": n["small_b1_us"] / small_fused_k / a.t0,
        "gemm_unused_frac_b1": 1 - n["gemm_read_frac_b1"],
        "attention_b64_over_floor": float(kv64["measured (us)"] / kv64["predicted (us)"]),
        "logit_absmax": float(vs_ref["ref_absmax"].max()),
        "prefill_8k_in_steps": n["prefill_8k_ms"] / n["step_fused_b1_ms"],
        "rest_b1_us": n["attention_b1_us"] + n["small_b1_us"] + n["gaps_b1_us"],
        "rest_allowed_b1_us": 1.15 * n["step_floor_b1_ms"] * 1e3 - read_b1_ms * 1e3,
        "step_if_gemv_at_read_rate_b1_ms": n["step_fused_b1_ms"] - n["gemm_b1_ms"] + read_b1_ms,
        "step_if_gemv_over_floor_b1": (n["step_fused_b1_ms"] - n["gemm_b1_ms"] + read_b1_ms) / n["step_floor_b1_ms"],
        "weights_read_b1_ms": read_b1_ms, "gemm_excess_b1_us": (n["gemm_b1_ms"] - read_b1_ms) * 1e3,
        "ex_kv_GB": ex_q["attention (K/V)"] / 1e9, "ex_total_GB": sum(ex_q.values()) / 1e9,
        "ex_floor_ms": sum(ex_q.values()) / a.BW * 1e3, "ex_compute_ms": decode_step.step_flops(a.cfg, 16, 8192) / a.P * 1e3,
        "weights_GB": (q1["layer weights"] + q1["output head"]) / 1e9,
        "read_bw_GBps": c["read_bw_GBps"], "bf16_tflops": c["bf16_tflops"], "launch_graph_us": c["launch_graph_us"],
        "launch_eager_us": c["launch_eager_us"],
        "max_logit_diff_fused": float(vs_ref[vs_ref["path"] == "fused"]["max_abs"].max()),
        "max_logit_fused_rel": float((vs_ref["max_abs"] / vs_ref["ref_absmax"]).max()),
        "fused_fp32_over_unfused_fp32": float(first.loc[("fused", "float32"), "max_abs"]
                                              / first.loc[("unfused", "float32"), "max_abs"]),
        "unfused_vs_fp32": float(first.loc[("unfused", "float32"), "max_abs"]),
        "fused_vs_fp32": float(first.loc[("fused", "float32"), "max_abs"]),
        "greedy_steps": len(greedy), "greedy_agree": int(greedy["agree"].sum()),
        "greedy_lead_min": float(greedy["lead"].min()), "greedy_successor_share": float(greedy["successor"].mean()),
        "residual_scale": decode_step.RESIDUAL_SCALE, "top_p": res.params["top_p"],
        "temperature": res.params["temperature"], "top_p_draws": res.params["top_p_draws"],
        "top_p_oracle_agree_min": float(top_p["oracle_agree"].min()),
        "top_p_kept_b1": float(top_p["kept"].iloc[0]),
        "top_p_fused_vs_torch_b1": sampled["top_p_unfused_b1_us"] / sampled["top_p_fused_b1_us"],
        "top_p_fused_vs_torch_b64": sampled["top_p_unfused_b64_us"] / sampled["top_p_fused_b64_us"],
        "saving_b1_us": float(fusion_table["measured saving (us)"].iloc[0]),
        "saving_pred_b1_us": float(fusion_table["predicted saving (us)"].iloc[0]),
        "saving_per_kernel_b1_us": float(fusion_table["measured per kernel removed (us)"].iloc[0]),
        "kernels_removed_b1": float(fusion_table["kernels removed"].iloc[0]),
        "gemm_cublas_b1_ms": cublas_b1_us / 1e3,
        "gemm_cublas_read_frac_b1": read_b1_ms * 1e3 / cublas_b1_us,
        "gemm_cublas_b64_ms": float(fusion_table["GEMMs: cuBLAS (us)"].iloc[1]) / 1e3,
        "norm_saving_b1_us": norm_saving, "norm_kernel_ratio_b1": norm_kernel_ratio,
        "rope_saving_b1_us": rope_saving, "rope_pred_b1_us": rope_pred,
        **sampled, **model_err, "kernel_alpha_us": alpha_us,
        "alpha_model_median_abs_err": max(model_err.values()),
        # the floor plus alpha per kernel: the least a step of this many kernels takes, and the most kernels
        # a step within 1.15 times the floor can launch if each pays alpha in full
        "floor_plus_alpha_b1_ms": n["step_floor_b1_ms"] + n["kernels_fused_b1"] * alpha_us / 1e3,
        "floor_plus_alpha_b1_over_floor": 1 + n["kernels_fused_b1"] * alpha_us / 1e3 / n["step_floor_b1_ms"],
        "kernels_allowed_b1": 0.15 * n["step_floor_b1_ms"] * 1e3 / alpha_us,
        "floor_plus_alpha_b64_over_floor": 1 + n["kernels_fused_b64"] * alpha_us / 1e3 / n["step_floor_b64_ms"],
        "sampling_spread_b1_us": spread[shapes[0]], "sampling_spread_b64_us": spread[shapes[1]],
        "targets_met": int(targets_table["met"].sum()), "targets_total": len(targets_table),
    }
    room = 1 + n["kernels_fused_b1"] * alpha_us / 1e3 / n["step_floor_b1_ms"] <= 1.15  # kernels x alpha fit the margin
    texts = {"device_name": res.provenance["name"], "measured_date": res.date,
             "room_words": "leaves room for" if room else "leaves no room for",
             **{f"target_{i + 1}_verdict": "met" if met else "missed" for i, met in enumerate(targets_table["met"])}}
    tables = {"floor_table": a.floor.round(3), "paths_table": a.paths.round(3), "fusion_table": fusion_table.round(3),
              "fusion_groups_table": groups.round(1), "code_lines": fused_code_lines(),
              "prefill_table": a.prefill.round(3), "model_parts": model_parts.round(3),
              "sampling_table": sampling_table.round(1), "top_p_checks": top_p.round(4),
              "checks_table": checks_table.round(4), "targets_table": targets_table.round(3)}
    return Page(numbers=numbers, texts=texts, tables=tables)
