"""Chapter 3's analysis: the tables, numbers and words its page quotes, from ``lib.experiments.kv_cache``'s
data (the sweep and the measurement stay there: this module measures nothing).

The notebook's tables, each a function of the results ``res`` (``data``, ``params``):

- ``points(res, c)``: one row per shape and path, with GPU time, its spread, call time, GB/s and the share of
  chapter 0's copy bandwidth; ``by_shape(pts)``: GPU time by shape and path, and Q_KV in MiB; ``ratios(wide)``:
  the paths' ratios at every shape (SDPA over the kernel on pages of 16, and so on);
- ``against_prediction(wide, c, hbm_GBps)``: each path over Q_KV / read rate + launch, the datasheet floor's
  share of each path's time, the caches of 1 GiB and more; ``vs_sdpa(wide, ratios)``: the page's table;
- ``at_seed(pts, seed)``: the worked example's shape, path by path;
- ``pages(res)``: the page-size sweep; ``paging(res, paged_over_dense)``: pages of 16 timed in pairs;
- ``prefetch(pts)``: tiles in flight and warps; ``short(res)``: short contexts, a fixed cost and a rate per path;
- ``targets(r, seed_table, paging, seed)``: the chapter's targets, measured.

``page(...)`` gathers what the page pastes into a ``Page`` (``lib.bench.page``); the notebook only publishes it.

Chapter: 3 (the KV cache).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from lib.bench import ceilings, fit
from lib.bench.page import Page
from lib.kernels import decode_attention as da

SHAPE = ["H_kv", "B", "L"]
NAN = float("nan")


# ---------------------------------------------------------------------------- the main sweep

def points(res, c: dict) -> pd.DataFrame:
    """The sweep's points with their medians, spread (interquartile range over the median), GB/s (Q_KV over
    GPU time) and share of chapter 0's copy bandwidth."""
    pts = pd.DataFrame(res.data["points"])
    pts["GPU time (us)"] = [t["gpu_us"]["median"] for t in pts["timing"]]
    pts["GPU spread"] = [t["gpu_us"]["q3"] / t["gpu_us"]["median"] - t["gpu_us"]["q1"] / t["gpu_us"]["median"]
                         for t in pts["timing"]]
    pts["call time (us)"] = [t["call_us"]["median"] for t in pts["timing"]]
    pts["GB/s"] = pts["Q"] / pts["GPU time (us)"] / 1e3
    pts["of copy BW"] = pts["GB/s"] / c["copy_bw_GBps"]
    return pts


def by_shape(pts: pd.DataFrame) -> pd.DataFrame:
    """GPU time by shape (H_kv, B, L) and path, and the K and V bytes ``Q (MiB)``."""
    wide = pts.pivot_table(index=SHAPE, columns="path", values="GPU time (us)")
    wide["Q (MiB)"] = pts.groupby(SHAPE)["Q"].first() / 2**20
    return wide


def ratios(wide: pd.DataFrame) -> dict:
    """The paths' ratios at every shape, by name: ``sdpa_over_paged`` (above 1, the kernel on pages of 16 is
    faster), ``sdpa_over_dense``, ``paged_over_dense``, ``naive_over_sdpa``, ``read_over_sdpa`` (the read-only
    floor's speedup over SDPA), ``paged_read`` (the read-only kernel on pages over contiguous), ``paged_of_read``
    (the kernel's share of the floor's speed), ``sdpa_over_read_paged``, ``one_over_two`` (one launch over two)."""
    nan_col = wide["read-only"] * NAN
    has_paged_read = "read-only paged 16" in wide
    return {
        "sdpa_over_paged": wide["sdpa"] / wide["kernel paged 16"],
        "sdpa_over_dense": wide["sdpa"] / wide["kernel dense"],
        "paged_over_dense": wide["kernel paged 16"] / wide["kernel dense"],
        "naive_over_sdpa": wide["naive"] / wide["sdpa"],
        "read_over_sdpa": wide["sdpa"] / wide["read-only"],
        "paged_read": (wide["read-only paged 16"] / wide["read-only"]) if has_paged_read else nan_col,
        "paged_of_read": wide["read-only"] / wide["kernel paged 16"],
        "sdpa_over_read_paged": wide["sdpa"] / wide["read-only paged 16"] if has_paged_read else wide["sdpa"] * NAN,
        "one_over_two": wide["kernel paged 16, one launch"] / wide["kernel paged 16, two launches"],
    }


def sweep_table(wide: pd.DataFrame, r: dict) -> pd.DataFrame:
    """Every shape, the paths' GPU times and their ratios (the notebook's first table)."""
    return pd.DataFrame({
        "Q (MiB)": wide["Q (MiB)"],
        "sdpa (us)": wide["sdpa"], "naive (us)": wide["naive"], "dense (us)": wide["kernel dense"],
        "paged 16 (us)": wide["kernel paged 16"], "one launch (us)": wide["kernel paged 16, one launch"],
        "two launches (us)": wide["kernel paged 16, two launches"],
        "read-only (us)": wide["read-only"],
        "read-only paged 16 (us)": wide.get("read-only paged 16", wide["read-only"] * NAN),
        "speedup of paged 16 over sdpa": r["sdpa_over_paged"], "paged 16 / dense": r["paged_over_dense"],
        "paged read / read": r["paged_read"], "naive / sdpa": r["naive_over_sdpa"], "one launch / two": r["one_over_two"],
    })


def against_prediction(wide: pd.DataFrame, c: dict, hbm_GBps: float) -> tuple:
    """(each path's GPU time over Q_KV / read rate + launch, the datasheet floor Q_KV / HBM bandwidth over each
    path's GPU time (at most 1), the shapes whose cache is 1 GiB or more)."""
    pred = wide["Q (MiB)"] * 2**20 / c["read_bw_GBps"] / 1e3 + c["launch_graph_us"]
    over_pred = pd.DataFrame({p_: wide[p_] / pred for p_ in ["read-only", "kernel paged 16", "sdpa"]})
    floor_frac = (1 / wide[["read-only", "kernel paged 16", "sdpa", "kernel dense"]]).mul(
        wide["Q (MiB)"] * 2**20 / hbm_GBps / 1e3, axis=0)
    big_Q = wide["Q (MiB)"] * 2**20 >= 2**30  # caches of 1 GiB and more: the read dominates
    return over_pred, floor_frac, big_Q


def vs_sdpa(wide: pd.DataFrame, r: dict) -> pd.DataFrame:
    """The page's table of the kernel on pages of 16 against SDPA, one row per shape."""
    return pd.DataFrame({"H_kv": wide.index.get_level_values("H_kv"), "B": wide.index.get_level_values("B"),
                         "L": wide.index.get_level_values("L"), "K and V (MiB)": wide["Q (MiB)"].to_numpy(),
                         "SDPA (us)": wide["sdpa"].to_numpy(),
                         "kernel, pages of 16 (us)": wide["kernel paged 16"].to_numpy(),
                         "SDPA / kernel": r["sdpa_over_paged"].to_numpy()})


def at_seed(pts: pd.DataFrame, seed) -> tuple:
    """(the points at the worked example's shape ``seed`` (B, L, H_kv) by path, its table: times, GB/s, call
    time over GPU time and kernels per call)."""
    sB, sL, sH = seed
    rows = pts[(pts["B"] == sB) & (pts["L"] == sL) & (pts["H_kv"] == sH)].set_index("path")
    seed_table = rows[["GPU time (us)", "GPU spread", "call time (us)", "GB/s", "of copy BW"]].copy()
    seed_table["call / GPU"] = seed_table["call time (us)"] / seed_table["GPU time (us)"]
    seed_table["kernels per call"] = [len(k) if isinstance(k, list) else None for k in rows["kernels"]]
    return rows, seed_table


# ---------------------------------------------------------------------------- pages, tiles, short contexts

def pages(res) -> tuple:
    """(the page-size sweep's rows, each page size over the contiguous layout by shape): the contiguous layout
    timed alone, each page size in pairs against it (the median of the pairs' ratios)."""
    pg = pd.DataFrame(res.data["pages"])
    pg["shape"] = [f"B={b}, L={n}, H_kv={h}" for b, n, h in zip(pg["B"], pg["L"], pg["H_kv"])]
    dense_row = pg["page"] == "dense"
    pg["vs contiguous"] = [1.0 if d else t["ratio"]["median"] for d, t in zip(dense_row, pg["pairs"])]
    page_table = pg.pivot_table(index="shape", columns="page", values="vs contiguous", sort=False)
    page_table = page_table[[x for x in ["dense", *res.params["page_sweep"]["pages"]] if x in page_table.columns]]
    return pg, page_table


def paging(res, paged_over_dense: pd.Series) -> tuple:
    """(the paired timings' rows, one row per shape: pages of 16 in order and shuffled over contiguous, the
    read-only kernel's same ratio, the layouts, the tile, and the main sweep's paged 16 over dense)."""
    pq = pd.DataFrame(res.data["paging"])
    pq["contiguous (us)"] = [t["a_us"]["median"] for t in pq["pairs"]]
    pq["paged (us)"] = [t["b_us"]["median"] for t in pq["pairs"]]
    pq["paged / contiguous"] = [t["ratio"]["median"] for t in pq["pairs"]]  # median of the pairs' ratios
    pq["read-only paged / contiguous"] = [t["ratio"]["median"] for t in pq["read_pairs"]]
    shuffled = pq[pq["layout"] != "in order"].groupby(SHAPE)
    table = pd.DataFrame({
        "contiguous (us)": shuffled["contiguous (us)"].median(),
        "in order / contiguous": pq[pq["layout"] == "in order"].set_index(SHAPE)["paged / contiguous"],
        "random / contiguous, median": shuffled["paged / contiguous"].median(),
        "random / contiguous, worst": shuffled["paged / contiguous"].max(),
        "read-only: random / contiguous, median": shuffled["read-only paged / contiguous"].median(),
        "layouts": shuffled.size(),
        "tile (tokens)": shuffled["block_n"].first(),
    })
    table["main sweep: paged 16 / dense"] = paged_over_dense.reindex(table.index)
    return pq, table


def prefetch(pts: pd.DataFrame) -> pd.DataFrame:
    """The kernel on pages of 16 by shape: tile, warps, tiles in flight with and without prefetch, GPU times,
    and no prefetch or 4 warps over the default."""
    kp = pts[pts["path"].isin(["kernel paged 16", "kernel paged 16, no prefetch", "kernel paged 16, 4 warps"])]
    # unstack, not pivot_table: it keeps the tiles-in-flight columns where the interpreter compiled nothing (None)
    pf = kp.set_index([*SHAPE, "path"])[["GPU time (us)", "tiles_in_flight", "block_n", "warps"]].unstack("path")
    four = ("GPU time (us)", "kernel paged 16, 4 warps")
    table = pd.DataFrame({
        "tile (tokens)": pf[("block_n", "kernel paged 16")],
        "warps": pf[("warps", "kernel paged 16")],
        "tiles in flight: default": pf[("tiles_in_flight", "kernel paged 16")],
        "tiles in flight: no prefetch": pf[("tiles_in_flight", "kernel paged 16, no prefetch")],
        "default (us)": pf[("GPU time (us)", "kernel paged 16")],
        "no prefetch (us)": pf[("GPU time (us)", "kernel paged 16, no prefetch")],
        "4 warps (us)": pf[four] if four in pf else NAN,
    })
    table["no prefetch / default"] = table["no prefetch (us)"] / table["default (us)"]
    table["4 warps / default"] = table["4 warps (us)"] / table["default (us)"]
    return table


def short(res) -> dict:
    """Short contexts at one (B, H_kv): ``B``, ``H_kv``, ``times`` (GPU time by L and path: the middle of its
    rounds' medians), ``fit`` (per path a + b L: fixed, per 1000 tokens, largest residual), ``table`` (times
    and the kernel over SDPA) and ``launches`` (the kernel's launch options, as JSON texts)."""
    sh = pd.DataFrame(res.data["short"])
    sh["GPU time (us)"] = [float(np.median([r["gpu_us"]["median"] for r in rounds])) for rounds in sh["rounds"]]
    times = sh.pivot_table(index="L", columns="path", values="GPU time (us)")
    lines = {}
    for path in times:
        a_, b_ = fit.fit_line(times.index.to_numpy(float).tolist(), times[path].tolist())
        resid = times[path] - (a_ + b_ * times.index.to_numpy(float))
        lines[path] = {"fixed (us)": a_, "per 1000 tokens (us)": 1e3 * b_, "largest residual (us)": resid.abs().max()}
    table = times.copy()
    table["kernel / sdpa"] = times["kernel paged 16"] / times["sdpa"]
    return {"B": int(sh["B"].iloc[0]), "H_kv": int(sh["H_kv"].iloc[0]), "times": times,
            "fit": pd.DataFrame(lines).T, "table": table,
            "launches": {json.dumps(x, sort_keys=True) for x in sh["launch"].dropna()}}


# ---------------------------------------------------------------------------- targets

def seed_index(res) -> tuple:
    """The worked example's shape as the tables index it: (H_kv, B, L)."""
    sB, sL, sH = res.params["seed"]
    return (sH, sB, sL)


def targets(r: dict, seed_table: pd.DataFrame, paging_table: pd.DataFrame, seed: tuple) -> pd.DataFrame:
    """The chapter's four targets for its kernel, measured (``seed``: the worked example's (H_kv, B, L))."""
    vs_sdpa_min = r["sdpa_over_paged"].min()
    speedup_vs_sdpa_seed = r["sdpa_over_paged"].loc[seed]
    call_over_gpu_seed = seed_table.loc["kernel paged 16", "call / GPU"]
    page16_overhead = paging_table["random / contiguous, worst"].max() - 1
    return pd.DataFrame([
        {"target": "paged 16 at least 0.97 of sdpa's speed at every shape (GPU time)", "measured": vs_sdpa_min,
         "goal": ">= 0.97", "met": vs_sdpa_min >= 0.97},
        {"target": "paged 16 at the worked example's shape, speedup over sdpa", "measured": speedup_vs_sdpa_seed,
         "goal": ">= 1.1", "met": speedup_vs_sdpa_seed >= 1.1},
        {"target": "call time / GPU time at the worked example's shape (planned launch)",
         "measured": call_over_gpu_seed, "goal": "<= 1.15", "met": call_over_gpu_seed <= 1.15},
        {"target": "paged 16 over contiguous, L >= 16384, worst shape and layout (timed in pairs), minus 1",
         "measured": page16_overhead, "goal": "<= 0.05", "met": page16_overhead <= 0.05},
    ])


# ---------------------------------------------------------------------------- the page

def shape_text(key) -> str:
    """A shape (H_kv, B, L) as the page writes it; "none" where no shape qualifies."""
    return "none" if key is None else "B = {1}, L = {2}, H_kv = {0}".format(*key)


def page(res, c: dict, hbm_GBps: float, worked: dict, plan: dict, theory: pd.DataFrame,
         capacity: pd.DataFrame) -> Page:
    """Every number, word and table chapter 3's page quotes, by name, from the results ``res`` (data, params,
    provenance, date), chapter 0's ceilings ``c`` (with the L2's size), the datasheet's HBM bandwidth
    ``hbm_GBps``, the worked example's byte counts ``worked`` (kv_seed, per_token_all_layers,
    seed_formula_llama, gqa_llama, weights_llama, weights_resident, weights_linears: bytes), the capacity
    planning ``plan`` (gpu_memory_utilization, memory_bytes, capacity_tokens, per_token_kv, block_size,
    pred_seed_us) and the notebook's ``theory`` and ``capacity`` tables (capacity: one row per context, 4k,
    32k, 128k). The figures are glued where they are drawn."""
    pts = points(res, c)
    wide = by_shape(pts)
    r = ratios(wide)
    sdpa_over_paged, sdpa_over_dense, naive_over_sdpa = r["sdpa_over_paged"], r["sdpa_over_dense"], r["naive_over_sdpa"]
    sdpa_over_read_paged, one_over_two, paged_of_read = r["sdpa_over_read_paged"], r["one_over_two"], r["paged_of_read"]
    paged_over_dense = r["paged_over_dense"]
    over_pred, floor_frac, big_Q = against_prediction(wide, c, hbm_GBps)
    rows, seed_table = at_seed(pts, res.params["seed"])
    pg, page_table = pages(res)
    pq, paging_table = paging(res, paged_over_dense)
    prefetch_table = prefetch(pts)
    sh = short(res)
    seed_idx = seed_index(res)
    target_table = targets(r, seed_table, paging_table, seed_idx)
    check = pd.DataFrame(res.data["check"])
    s = seed_table  # the worked example's shape, path by path

    def at(path, column):
        return s.loc[path, column]

    # the worked example's time in layers: the pages read alone, the split pass (reads and arithmetic, partials
    # written), the whole launch with its combine; against the time the 1.1 target allows
    seed_target_us = at("sdpa", "GPU time (us)") / 1.1
    seed_split_us = (at("kernel paged 16, split pass alone", "GPU time (us)")
                     if "kernel paged 16, split pass alone" in s.index else NAN)
    unplanned = "kernel paged 16, unplanned" in s.index
    # pages: the worst shape and layout of pages of 16 timed in pairs, L >= 16384
    long = paged_over_dense[paged_over_dense.index.get_level_values("L") >= 16384]
    paging_worst = paging_table["random / contiguous, worst"]
    page16_overhead = paging_worst.max() - 1
    worst_long = paging_worst.idxmax()  # both sweeps pair at least one shape
    shuffled_rows = pq[pq["layout"] != "in order"]
    shuffled = shuffled_rows.groupby(SHAPE)
    worst_row = shuffled_rows.loc[shuffled_rows["paged / contiguous"].idxmax()]
    paged_read_worst, worst_pairs = worst_row["read-only paged / contiguous"], worst_row["pairs"]
    paged_read_long = paging_table["read-only: random / contiguous, median"]  # timed in pairs
    pl = pg[(pg["page"].isin([64, 256])) & (pg["L"] >= 16384)]
    # the page-size sweep's single timing of pages of 16 against the paired timing, where both measured a shape
    p16 = pg[pg["page"] == 16].set_index(SHAPE)["vs contiguous"]
    both = pd.DataFrame({"sweep": p16, "paired": paging_table["random / contiguous, median"]}).dropna()
    far = (both["sweep"] - both["paired"]).abs().idxmax()
    # the kernel against sdpa, by kind of shape
    H_kv_of, L_of = sdpa_over_paged.index.get_level_values("H_kv"), sdpa_over_paged.index.get_level_values("L")
    worst = sdpa_over_paged.idxmin()  # where paged 16 is furthest behind sdpa
    mqa, gqa, short_L = sdpa_over_paged[H_kv_of == 1], sdpa_over_paged[H_kv_of > 1], sdpa_over_paged[L_of <= 512]
    mha = naive_over_sdpa[H_kv_of == H_kv_of.max()]
    groups = one_over_two.index.get_level_values("H_kv") * one_over_two.index.get_level_values("B")
    few_groups = groups <= 8
    many = sdpa_over_paged[H_kv_of * sdpa_over_paged.index.get_level_values("B") >= 64]
    losing = sdpa_over_paged[sdpa_over_paged < 1].index  # where a kernel that only reads the same pages gets
    big = pts[(pts["path"] == "kernel paged 16") & (pts["Q"] >= 2**30)]
    small = pts[pts["Q"] == pts["Q"].min()].set_index("path")  # the smallest shape
    fetched = prefetch_table[prefetch_table["tiles in flight: default"] > prefetch_table["tiles in flight: no prefetch"]]
    warps_ratio = prefetch_table["4 warps / default"].dropna()  # one warp against four, where the default runs one
    short_fit, short_times = sh["fit"], sh["times"]
    kr, sr, rr = (short_fit.loc[n_] for n_ in ("kernel paged 16", "sdpa", "read-only paged 16"))
    short_launch = json.loads(next(iter(sh["launches"]))) if sh["launches"] else {"head_block": NAN}
    # the naive path over H_q / H_kv where the cache is 4x the L2 or more; GQA and MQA alone (H_q > H_kv)
    naive_over_G = (naive_over_sdpa / (res.params["Hq"] // wide.index.get_level_values("H_kv"))).dropna()
    naive_big = naive_over_G[(wide["Q (MiB)"] * 2**20 >= ceilings.HBM_FACTOR * c["l2_bytes"]).reindex(naive_over_G.index)]
    naive_big_gqa = naive_big[naive_big.index.get_level_values("H_kv") < res.params["Hq"]]
    verdicts = ["yes" if met else "no" for met in target_table["met"]]

    texts = {
        "device_name": res.provenance["name"],
        "measured_date": res.date,
        "vs_sdpa_min_shape": shape_text(worst),
        "page16_worst_shape": shape_text(worst_long),
        "page16_sweep_worst_shape": shape_text(long.idxmax() if len(long) else None),
        "paged_read_max_long_shape": shape_text(paged_read_long.idxmax()),
        "pages_vs_paired_shape": shape_text(far),
        "prefetch_gain_max_shape": shape_text(fetched["no prefetch / default"].idxmax() if len(fetched) else None),
        **{f"target_{i + 1}_verdict": v for i, v in enumerate(verdicts)},
    }
    numbers = {
        # the formula and the correctness checks
        "kv_bytes_seed_MiB": worked["kv_seed"] / 2**20,
        "llama_kv_per_token_KiB": worked["per_token_all_layers"] / 2**10,
        "llama_cache_seed_formula_GiB": worked["seed_formula_llama"] / 2**30,
        "llama_cache_gqa_GiB": worked["gqa_llama"] / 2**30,
        "llama_weights_GiB": worked["weights_llama"] / 2**30,
        "llama_tokens_cache_equals_weights": worked["weights_llama"] / worked["per_token_all_layers"],
        "check_max_err": check["err"].max(),
        "check_cases": len(check),
        "shapes": len(wide),
        "copy_bw_GBps": c["copy_bw_GBps"],
        # the kernel against sdpa, over every shape
        "vs_sdpa_min": sdpa_over_paged.min(),
        "vs_sdpa_min_one_over_two": one_over_two.loc[worst],
        "vs_sdpa_max": sdpa_over_paged.max(),
        "vs_sdpa_median": sdpa_over_paged.median(),
        "vs_sdpa_median_many": many.median(),
        "gqa_vs_sdpa_min": gqa.min(),
        "mqa_vs_sdpa_min": mqa.min(),
        "mqa_vs_sdpa_max": mqa.max(),
        "mqa_vs_sdpa_median": mqa.median(),
        "short_vs_sdpa_max": short_L.max(),
        "dense_vs_sdpa_min": sdpa_over_dense.min(),
        "dense_vs_sdpa_median": sdpa_over_dense.median(),
        "losing_shapes": len(losing),
        "read_paged_slower_than_sdpa": int((sdpa_over_read_paged < 1).sum()),
        "read_paged_vs_sdpa_min": sdpa_over_read_paged.min(),
        "losing_read_paged_vs_sdpa_median": sdpa_over_read_paged.loc[losing].median(),
        "losing_paged_of_read_paged_median": (wide["read-only paged 16"] / wide["kernel paged 16"]).loc[losing].median(),
        "paged_of_read_median": paged_of_read.median(),
        "kernel_bw_frac_1GiB": big["of copy BW"].min(),
        "kernel_bw_max_GBps": pts[pts["path"] == "kernel paged 16"]["GB/s"].max(),
        "sdpa_bw_max_GBps": pts[pts["path"] == "sdpa"]["GB/s"].max(),
        "read_bw_max_GBps": pts[pts["path"] == "read-only"]["GB/s"].max(),
        "naive_gqa_slowdown": naive_over_sdpa.loc[seed_idx],
        "naive_gqa_slowdown_max": naive_over_sdpa.max(),
        "naive_mha_median": mha.median(),
        "one_over_two_median": one_over_two.median(),
        "one_over_two_max": one_over_two.max(),
        "one_over_two_seed": one_over_two.loc[seed_idx],
        "one_over_two_few_median": one_over_two[few_groups].median(),
        "one_over_two_many_min": one_over_two[~few_groups].min(),
        "inline_max_splits": da.INLINE_MAX_SPLITS,
        "max_splits": da.choose_splits(1, 2**30, 1, 10**6),
        # the worked example's shape
        "speedup_vs_sdpa_seed": sdpa_over_paged.loc[seed_idx],
        "call_over_gpu_seed": at("kernel paged 16", "call / GPU"),
        "unplanned_call_over_gpu": at("kernel paged 16, unplanned", "call / GPU") if unplanned else NAN,
    }
    for key, path in (("sdpa", "sdpa"), ("dense", "kernel dense"), ("paged", "kernel paged 16"), ("read", "read-only"),
                      ("naive", "naive"), ("unplanned", "kernel paged 16, unplanned")):
        numbers.update({f"seed_{key}_gpu_us": at(path, "GPU time (us)"), f"seed_{key}_call_us": at(path, "call time (us)"),
                        f"seed_{key}_GBps": at(path, "GB/s")})
    for key, path in (("one", "kernel paged 16, one launch"), ("two", "kernel paged 16, two launches")):
        numbers.update({f"seed_{key}_gpu_us": at(path, "GPU time (us)"), f"seed_{key}_call_us": at(path, "call time (us)")})
    numbers.update({
        "seed_read_over_sdpa": r["read_over_sdpa"].loc[seed_idx],
        "seed_paged_of_read": paged_of_read.loc[seed_idx],
        "seed_paged_splits": rows.loc["kernel paged 16", "splits"],
        "seed_sdpa_kernels": len(rows.loc["sdpa", "kernels"] or []),
        "seed_naive_kernels": len(rows.loc["naive", "kernels"] or []),
        "seed_target_gpu_us": seed_target_us,
        "seed_target_slack_us": seed_target_us - at("read-only paged 16", "GPU time (us)"),
        "seed_split_gpu_us": seed_split_us,
        "seed_split_over_target": seed_split_us / seed_target_us,
        "seed_combine_us": at("kernel paged 16", "GPU time (us)") - seed_split_us,
        "seed_combine_share": 1 - seed_split_us / at("kernel paged 16", "GPU time (us)"),
        "seed_read_paged_gpu_us": at("read-only paged 16", "GPU time (us)"),
        "seed_read_paged_over_target": at("read-only paged 16", "GPU time (us)") / seed_target_us,
        "targets_met": int(target_table["met"].sum()),
    })
    numbers.update(_paging_numbers(res, pg, paging_table, page16_overhead, paged_read_worst, paged_read_long, long,
                                   worst_long, shuffled, worst_pairs, p16, both, far, pl, paged_over_dense,
                                   wide, prefetch_table, seed_idx))
    numbers.update({
        # the smallest shape
        "small_Q_KiB": small["Q"].iloc[0] / 2**10,
        "small_sdpa_gpu_us": small.loc["sdpa", "GPU time (us)"],
        "small_paged_gpu_us": small.loc["kernel paged 16", "GPU time (us)"],
        "small_paged_call_us": small.loc["kernel paged 16", "call time (us)"],
        "small_sdpa_call_us": small.loc["sdpa", "call time (us)"],
        # tiles in flight and warps
        "warps_shapes": len(warps_ratio),
        "warps_gain_median": warps_ratio.median(),
        "warps_gain_min": warps_ratio.min(),
        "warps_gain_max": warps_ratio.max(),
        "warps_gain_seed": warps_ratio.get(seed_idx, NAN),
        "seed_paged_warps": prefetch_table.loc[seed_idx, "warps"],
        "seed_paged_tile": prefetch_table.loc[seed_idx, "tile (tokens)"],
        "seed_tile": prefetch_table.loc[seed_idx, "tile (tokens)"],
        "seed_tiles_default": prefetch_table.loc[seed_idx, "tiles in flight: default"],
        "seed_tiles_no_prefetch": prefetch_table.loc[seed_idx, "tiles in flight: no prefetch"],
        "seed_no_prefetch_gpu_us": prefetch_table.loc[seed_idx, "no prefetch (us)"],
        "prefetch_shapes": len(fetched),
        "prefetch_gain_median": fetched["no prefetch / default"].median(),
        "prefetch_gain_max": fetched["no prefetch / default"].max(),
        "prefetch_gain_min": fetched["no prefetch / default"].min(),
        # short contexts: a fixed cost and a rate per path
        "short_B": sh["B"],
        "short_Hkv": sh["H_kv"],
        "short_L_min": short_times.index.min(),
        "short_L_max": short_times.index.max(),
        "short_kernel_fixed_us": kr["fixed (us)"],
        "short_sdpa_fixed_us": sr["fixed (us)"],
        "short_read_fixed_us": rr["fixed (us)"],
        "short_kernel_per_ktok_us": kr["per 1000 tokens (us)"],
        "short_sdpa_per_ktok_us": sr["per 1000 tokens (us)"],
        "short_read_per_ktok_us": rr["per 1000 tokens (us)"],
        "short_kernel_over_read_rate": kr["per 1000 tokens (us)"] / rr["per 1000 tokens (us)"],
        "short_sdpa_over_read_rate": sr["per 1000 tokens (us)"] / rr["per 1000 tokens (us)"],
        "short_kernel_over_sdpa_rate": kr["per 1000 tokens (us)"] / sr["per 1000 tokens (us)"],
        "short_read_twice_per_ktok_us": 2 * rr["per 1000 tokens (us)"],
        "short_resid_max_us": short_fit["largest residual (us)"].max(),
        "short_kernel_over_sdpa_min": sh["table"]["kernel / sdpa"].min(),
        "short_kernel_over_sdpa_max": sh["table"]["kernel / sdpa"].max(),
        "short_head_block": short_launch["head_block"],
        # the fixed weights count, capacity planning, the prediction and measured / predicted
        "llama_weights_resident_GiB": worked["weights_resident"] / 2**30,
        "llama_weights_linears_GiB": worked["weights_linears"] / 2**30,
        "gpu_memory_utilization": plan["gpu_memory_utilization"],
        "device_memory_GiB": plan["memory_bytes"] / 2**30,
        "kv_capacity_tokens": plan["capacity_tokens"],
        "kv_capacity_GiB": plan["capacity_tokens"] * plan["per_token_kv"] / 2**30,
        "max_batch_4k": capacity.loc[0, "max batch (requests)"],
        "max_batch_32k": capacity.loc[1, "max batch (requests)"],
        "max_batch_128k": capacity.loc[2, "max batch (requests)"],
        "block_size": plan["block_size"],
        "pred_read_bw_GBps": c["read_bw_GBps"],
        "pred_launch_us": c["launch_graph_us"],
        "hbm_datasheet_GBps": hbm_GBps,
        "pred_seed_us": plan["pred_seed_us"],
        "pred_seed_floor_us": worked["kv_seed"] / hbm_GBps / 1e3,
        "seed_paged_over_pred": at("kernel paged 16", "GPU time (us)") / plan["pred_seed_us"],
        "seed_sdpa_over_pred": at("sdpa", "GPU time (us)") / plan["pred_seed_us"],
        "paged_over_pred_big_min": over_pred.loc[big_Q, "kernel paged 16"].min(),
        "paged_over_pred_big_max": over_pred.loc[big_Q, "kernel paged 16"].max(),
        "sdpa_over_pred_big_max": over_pred.loc[big_Q, "sdpa"].max(),
        "read_over_pred_min": over_pred["read-only"].min(),
        "floor_frac_max": floor_frac.max().max(),
        "paged_over_pred_median": over_pred["kernel paged 16"].median(),
        "paged_over_pred_max": over_pred["kernel paged 16"].max(),
        "naive_over_G_min_big": naive_big.min(),
        "naive_over_G_min_big_gqa": naive_big_gqa.min(),
        "vs_sdpa_shapes_won": int((sdpa_over_paged >= 1).sum()),
        "vs_sdpa_shapes_097": int((sdpa_over_paged >= 0.97).sum()),
    })
    tables = {
        "capacity_table": capacity.round(1),
        "vs_sdpa_table": vs_sdpa(wide, r).round(2),
        "theory_table": theory.round(2),
        "seed_table": seed_table.round(3),
        "page_table": page_table.round(3),
        "paging_table": paging_table.round(3),
        "prefetch_table": prefetch_table.round(3),
        "short_fit_table": short_fit.round(2),
        "targets_table": target_table.round(3),
    }
    return Page(numbers, texts, tables)


def _paging_numbers(res, pg, paging_table, page16_overhead, paged_read_worst, paged_read_long, long, worst_long,
                    shuffled, worst_pairs, p16, both, far, pl, paged_over_dense, wide, prefetch_table, seed_idx) -> dict:
    """The page's numbers on pages: the price of pages of 16 over long contexts, the page-size sweep, the
    paired timings (``page``'s intermediate values, by the names it gives them)."""
    paging = paging_table
    return {
        "page16_overhead": page16_overhead,
        "page16_overhead_median_long": long.median() - 1,
        "page16_overhead_over_read": page16_overhead - (paged_read_worst - 1),
        "page16_overhead_worst_HkvB": worst_long[0],
        "page16_worst_tile": prefetch_table.loc[worst_long, "tile (tokens)"],
        "page16_sweep_worst": long.max() - 1,
        "page16_sweep_max": pg[pg["page"] == 16]["vs contiguous"].max(),
        "paged_read_at_page16_worst": paged_read_worst,
        "paged_read_median_long": paged_read_long.median(),
        "paged_read_max_long": paged_read_long.max(),
        "paged_read_min_long": paged_read_long.min(),
        "page16_at_seed": p16.get(seed_idx, NAN),
        "paged_over_dense_seed": paged_over_dense.loc[seed_idx],
        "dense_of_read_at_page16_worst": wide["read-only"].loc[worst_long] / wide["kernel dense"].loc[worst_long],
        "page1_max": pg[pg["page"] == 1]["vs contiguous"].max(),
        "page1_min": pg[pg["page"] == 1]["vs contiguous"].min(),
        "page64_max": pg[pg["page"] == 64]["vs contiguous"].max(),
        "page256_max": pg[pg["page"] == 256]["vs contiguous"].max(),
        "page_big_max": pl["vs contiguous"].max() if len(pl) else NAN,
        "page_big_median": pl["vs contiguous"].median() if len(pl) else NAN,
        "paging_worst_ratio": 1 + page16_overhead,
        "paging_random_min_at_worst": shuffled["paged / contiguous"].min().loc[worst_long],
        "paging_pairs": res.params["paging"]["pairs"],
        "paging_worst_pair_q1": worst_pairs["ratio"]["q1"],
        "paging_worst_pair_q3": worst_pairs["ratio"]["q3"],
        "paging_worst_contiguous_span": worst_pairs["a_us"]["max"] / worst_pairs["a_us"]["min"],
        "paging_in_order_max": paging["in order / contiguous"].max(),
        "paging_in_order_median": paging["in order / contiguous"].median(),
        "paging_in_order_at_worst": paging.loc[worst_long, "in order / contiguous"],
        "paging_random_median": paging["random / contiguous, median"].median(),
        "paging_layouts": paging["layouts"].min(),
        "paging_shapes": len(paging),
        "paging_sweep_at_worst": paging.loc[worst_long, "main sweep: paged 16 / dense"],
        "pages_vs_paired_sweep": both.loc[far, "sweep"],
        "pages_vs_paired_paired": both.loc[far, "paired"],
        "pages_vs_paired_shapes": len(both),
    }
