"""Chapter 4's analysis: the tables, numbers and claims' values drawn from ``lib.experiments.grouped_gemm``'s
data (its sweep and measurement stay there).

``Analysis`` turns the GEMM sweep's data into the chapter's tables (every case and path against the floor
max(F/P, Q/BW), launches, tiles and tail waste, the chapter's targets), the numbers its page quotes
(``numbers``, ``texts``) and the values its claims check (``checks``). ``LayerAnalysis`` does the same for
the whole MoE layer's steps against ``layer_step_cost`` on chapter 0's ceilings.

Chapter: 4 (grouped GEMM).
"""

from __future__ import annotations

import re

import pandas as pd

from lib.bench.page import Page
from lib.experiments.grouped_gemm import CASE, GEMMS, LAYER, ORDER, ROUTING, STEPS
from lib.kernels import grouped_gemm as gg


def _case_words(case: tuple) -> str:
    E, T, routing = case
    return "E = {}, T = {}, {} routing".format(E, T, "uniform" if routing == "uniform" else f"Dirichlet({routing})")


def _tokens_words(case: tuple) -> str:
    """A case named by its tokens and routing only, where the page has already named E."""
    _, T, routing = case
    return "T = {}, {}".format(T, "uniform" if routing == "uniform" else f"Dirichlet({routing})")


def tiles_of(counts, N: int, BM: int, BN: int) -> int:
    """Output tiles of BM x BN over experts of ``counts`` rows and N columns."""
    return sum(-(-m // BM) * -(-N // BN) for m in counts)


class Analysis:
    """Chapter 4's tables from one run's data (``measure``), its params and chapter 0's ceilings ``c``.

    - ``points``: one row per case and path, with GPU and call time, F = 2TKN, Q (bytes of the weights
      of experts that got tokens, of x and of y), the floor max(F/P, Q/BW) with P the bf16 rate and BW
      chapter 0's streaming read rate, which of the two sets it (``bound``), the share of the floor reached, TFLOP/s.
    - ``per_path(column)``: a column by case and path; ``cases``: the floor, bound, non-empty experts,
      largest expert and every path's GPU time (" gpu") and call time (" call"), one row per case.
    - ``summary``: lib's share of the floor (and of the read floor, the same with chapter 0's streaming
      read rate) and its speedups over grouped_mm (GPU time, in pairs and timed apart), over cuBLAS's
      per-expert loop (the loop of ``torch.mm``, GPU time) and over the loop (call time); the loop's call
      time over the floor (the most any kernel at the floor could gain over it); 4 streams over the loop.
      ``compare_table()`` and ``launch_table()`` split it for the page.
    - ``tiles``: the lib kernel's tile per case, its tiles, tiles per program, rounds of the static
      schedule (one tile per program per round), the share of computed tile area outside any expert's
      rows, and that of the padded bmm.
    - ``work``: each case's computed FLOPs (the useful ones over one minus the tile waste) at the best
      rate the kernel reached on any case (``best_rate``, FLOP/s), against the floor; in whole rounds;
      the same with half-height last row tiles, and their GPU time over whole tiles' (pairs).
    - ``targets``: the chapter's targets, measured: at least cuBLAS's per-expert loop's speed where the
      fewest experts are compute-bound (GPU time, worst case), at least 0.85 of the read floor where the
      weights set it at E >= 64 (worst case), at least grouped_mm's speed at the fewest experts, at least
      5 times the eager loop's speed (call time) at E >= 64.
    - ``numbers()``, ``texts()``: what the page quotes, by glue name; ``checks()``: what the claims check.
    ``page`` (below) gathers them with the layer's and the worked examples' into the chapter's ``Page`` (``lib.bench.page``).
    """

    def __init__(self, data: dict, params: dict, c: dict):
        missing = [k for k in ("bf16_tflops", "read_bw_GBps") if k not in c]
        if missing:
            raise ValueError(f"chapter 0's ceilings lack {missing}: pass lib.bench.ceilings.load(...) of a run of "
                             "00-the-machine that measured them")
        self.params, self.sms = params, data["sms"]
        # the floor's bandwidth is chapter 0's streaming read rate, the fastest rate measured for reading HBM:
        # a floor measurements cannot beat (the copy rate, lower, would flatter every share of the floor)
        P, BW = c["bf16_tflops"] * 1e12, c["read_bw_GBps"] * 1e9
        self.read_bw = BW
        pts = pd.DataFrame(data["points"])
        pts["GPU time (us)"] = [t["gpu_us"]["median"] for t in pts["timing"]]
        pts["call time (us)"] = [t["call_us"]["median"] for t in pts["timing"]]
        b = 2 if params["dtype"] == "bfloat16" else 4
        pts["F"] = 2 * pts["T"] * pts["K"] * pts["N"]
        pts["Q"] = b * (pts["nonempty"] * pts["K"] * pts["N"] + pts["T"] * pts["K"] + pts["T"] * pts["N"])
        pts["floor (us)"] = [max(f / P, q / BW) * 1e6 for f, q in zip(pts["F"], pts["Q"])]
        pts["bound"] = ["compute" if f / P > q / BW else "memory" for f, q in zip(pts["F"], pts["Q"])]
        pts["read floor (us)"] = pts["floor (us)"]  # the names the targets use
        pts["read bound"] = pts["bound"]
        pts["of floor"] = pts["floor (us)"] / pts["GPU time (us)"]
        pts["TFLOP/s"] = pts["F"] / pts["GPU time (us)"] / 1e6
        pts["case"] = [f"E={e} T={t} {r}" for e, t, r in zip(pts["E"], pts["T"], pts["routing"])]
        self.points = pts
        self.floor = pts.groupby(CASE)[["floor (us)", "bound", "read floor (us)", "read bound", "nonempty",
                                        "Mmax"]].first()
        self.cases = self.floor.join(self.per_path("GPU time (us)").add_suffix(" gpu")).join(
            self.per_path("call time (us)").add_suffix(" call"))
        self.lib = pts[pts["path"] == "lib"].set_index(CASE)
        self._compare()
        self.tiles = self._tiles()
        self.work = self._work()
        self.targets = self._targets()

    def per_path(self, column: str) -> pd.DataFrame:
        """``column`` of every path (in ``ORDER``), one row per case."""
        pts = self.points
        order = [p_ for p_ in ORDER if p_ in set(pts["path"])]
        return pts.pivot_table(index=CASE, columns="path", values=column)[order]

    def _compare(self):
        cases, lib = self.cases, self.lib
        self.lib_of_floor = cases["floor (us)"] / cases["lib gpu"]
        # grouped_mm's time over lib's from the two timed in interleaved pairs: the median of the pairs' ratios
        self.vs_grouped = (1 / lib["vs_grouped_mm_pairs"].dropna().map(lambda d: d["ratio"]["median"])
                           if "vs_grouped_mm_pairs" in lib else pd.Series(dtype=float))
        self.vs_grouped_apart = (cases["grouped_mm gpu"] / cases["lib gpu"] if "grouped_mm gpu" in cases
                                 else pd.Series(dtype=float))
        self.vs_loop_call = cases["loop call"] / cases["lib call"]
        self.loop_bound = cases["loop call"] / cases["floor (us)"]  # the most a kernel at the floor could gain
        E = cases.index.get_level_values("E")
        self.mem = cases[(cases["bound"] == "memory") & (E >= 64)]
        self.mem_frac = self.mem["floor (us)"] / self.mem["lib gpu"]
        # the closer look is at the worst case under uniform routing, where padding every expert to the largest
        # is a fair comparison (under skewed routing the floor is loosest); the target is on every case
        uni = self.mem_frac[self.mem_frac.index.get_level_values("routing") == "uniform"]
        self.worst_uni = uni.idxmin() if len(uni) else (self.mem_frac.idxmin() if len(self.mem_frac) else None)
        self.E_min = min(s_[0] for s_ in self.params["shapes"])
        self.comp_vs = self.vs_grouped[self.vs_grouped.index.get_level_values("E") == self.E_min]
        self.e64 = self.vs_loop_call[self.vs_loop_call.index.get_level_values("E") >= 64]
        self.e64_bound = self.loop_bound[self.loop_bound.index.get_level_values("E") >= 64]
        self.e64_room = self.e64[self.e64_bound >= 5]  # where a kernel at the floor could be 5x faster than the loop
        # the two targets: against cuBLAS's per-expert loop (the loop of torch.mm) where the fewest experts
        # are compute-bound, GPU time; and the read floor over lib's GPU time where weights set it at E >= 64
        self.read_frac = cases["read floor (us)"] / cases["lib gpu"]
        self.read_wb = self.read_frac[(cases["read bound"] == "memory") & (E >= 64)]
        comp = (E == self.E_min) & (cases["read bound"] == "compute")
        self.vs_cublas_comp = (cases["loop gpu"] / cases["lib gpu"])[comp]

    @property
    def summary(self) -> pd.DataFrame:
        cases = self.cases
        summary = pd.DataFrame({"bound": cases["bound"], "lib of floor": self.lib_of_floor,
                                "lib of read floor": self.read_frac,
                                "speedup vs cuBLAS loop (GPU)": cases["loop gpu"] / cases["lib gpu"],
                                "speedup vs grouped_mm (GPU, pairs)": self.vs_grouped,
                                "speedup vs grouped_mm (GPU, apart)": self.vs_grouped_apart,
                                "speedup vs loop (call)": self.vs_loop_call, "loop call / floor": self.loop_bound,
                                "loop GPU / call": cases["loop gpu"] / cases["loop call"]})
        if "streams 4 gpu" in cases:
            summary["streams 4 / loop (GPU)"] = cases["streams 4 gpu"] / cases["loop gpu"]
            summary["streams 4 / loop (call)"] = cases["streams 4 call"] / cases["loop call"]
        return summary

    def compare_table(self) -> pd.DataFrame:
        """The page's first summary table: per case, what sets the read floor, lib's share of it, and lib's
        speedup (GPU time) over torch's grouped GEMM (in pairs) and over cuBLAS's per-expert loop."""
        s = self.summary
        return pd.DataFrame({"bound": self.cases["read bound"], "lib / read floor": s["lib of read floor"],
                             "vs grouped_mm": s["speedup vs grouped_mm (GPU, pairs)"],
                             "vs cuBLAS loop": s["speedup vs cuBLAS loop (GPU)"]}).reset_index()

    def launch_table(self) -> pd.DataFrame:
        """The page's second summary table, on launches: per case, lib's speedup over the eager loop (call
        time), the loop's call time over the floor (the most a kernel at the floor could gain over it), and
        four streams' GPU and call time over the loop's."""
        s = self.summary
        out = pd.DataFrame({"lib vs loop (call)": s["speedup vs loop (call)"], "loop call / floor": s["loop call / floor"]})
        if "streams 4 / loop (GPU)" in s:
            out["4 streams / loop (GPU)"] = s["streams 4 / loop (GPU)"]
            out["4 streams / loop (call)"] = s["streams 4 / loop (call)"]
        return out.reset_index()

    def _tiles(self) -> pd.DataFrame:
        pts = self.points
        rows = []
        for (E, T, routing), g in pts[pts["path"] == "lib"].groupby(CASE):
            r = g.iloc[0]
            cfg = r["config"] if isinstance(r.get("config"), dict) else gg.choose_config(T, E)
            BM, BN = cfg["block_m"], cfg["block_n"]
            tiles = tiles_of(r["counts"], r["N"], BM, BN)
            useful = T * r["N"]
            programs = self.sms * cfg["programs_per_sm"]
            rows.append({"E": E, "T": T, "routing": routing, "tile": f"{BM} x {BN}",
                         "programs per SM": cfg["programs_per_sm"], "tiles": tiles, "tiles per program": tiles / programs,
                         # the static schedule runs in rounds of one tile per program; the last may be partly idle
                         "rounds": -(-tiles // programs),
                         "tile waste": 1 - useful / (tiles * BM * BN) if tiles else 0.0,
                         "padded bmm waste": 1 - T / (E * r["Mmax"]) if r["Mmax"] else 0.0})
        return pd.DataFrame(rows).set_index(CASE)

    def _work(self) -> pd.DataFrame:
        lib, tiles = self.lib, self.tiles
        computed = lib["F"] / (1 - tiles["tile waste"])  # FLOPs of every computed tile
        self.best_rate = (computed / lib["GPU time (us)"]).max() * 1e6  # FLOP/s, the kernel's best over all cases
        work = pd.DataFrame({"bound": lib["bound"], "floor (us)": lib["floor (us)"], "lib (us)": lib["GPU time (us)"],
                             "tile waste": tiles["tile waste"], "computed / useful FLOPs": computed / lib["F"],
                             "tiles at the best rate (us)": computed / self.best_rate * 1e6})
        work["tiles at the best rate / floor"] = work["tiles at the best rate (us)"] / work["floor (us)"]
        # tiles of one case cost about the same, so the kernel takes whole rounds: the busiest program's tiles
        work["in whole rounds / floor"] = (work["tiles at the best rate / floor"] * tiles["rounds"]
                                           / tiles["tiles per program"])
        work["lib of floor"] = work["floor (us)"] / work["lib (us)"]
        # half-height last row tiles: the FLOPs their tiles compute, and their GPU time over whole tiles' (pairs)
        work["half tails: computed / useful"] = pd.Series([
            sum(sum(gg.row_tiles(m, r["config"]["block_m"], half_tail=True)) for m in r["counts"])
            * (-(-r["N"] // r["config"]["block_n"]) * r["config"]["block_n"]) / (T_ * r["N"])
            for (E_, T_, _), r in lib.iterrows()], index=lib.index)
        work["half tails / whole (GPU)"] = (lib["half_tail_pairs"].map(lambda d: d["ratio"]["median"])
                                            if "half_tail_pairs" in lib else float("nan"))
        return work

    def _targets(self) -> pd.DataFrame:
        comp_vs, e64, cub, rwb = self.comp_vs, self.e64, self.vs_cublas_comp, self.read_wb
        nan = float("nan")
        return pd.DataFrame([
            {"target": f"lib at least as fast as cuBLAS's per-expert loop at E = {self.E_min}, compute-bound cases "
                       "(GPU time, worst case)",
             "measured": cub.min() if len(cub) else nan, "goal": ">= 1.0", "met": bool(len(cub)) and cub.min() >= 1.0},
            {"target": "lib >= 0.85 of the read floor where weights set it (E >= 64, memory-bound cases, worst)",
             "measured": rwb.min() if len(rwb) else nan, "goal": ">= 0.85",
             "met": bool(len(rwb)) and rwb.min() >= 0.85},
            {"target": f"lib at least as fast as grouped_mm at E = {self.E_min} (GPU time, worst case)",
             "measured": comp_vs.min(), "goal": ">= 1.0", "met": comp_vs.min() >= 1.0},
            {"target": "lib at least 5x faster than the eager loop at E >= 64 (call time, worst case)",
             "measured": e64.min(), "goal": ">= 5", "met": e64.min() >= 5},
        ])

    def _padded_tile(self, case) -> tuple[str | None, tuple]:
        """The padded bmm's GEMM kernel at ``case`` (from the profiler's names) and the output tile its name
        gives (rows, columns)."""
        pts = self.points
        pad_row = pts[(pts["path"] == "padded bmm")].set_index(CASE)
        names = pad_row["kernel_names"].get(case) if "kernel_names" in pad_row and case in pad_row.index else None
        gemm = [n_ for n_ in (names or []) if re.search(r"_(\d+)x(\d+)_", n_)]
        tile = tuple(int(v) for v in re.search(r"_(\d+)x(\d+)_", gemm[0]).groups()) if gemm else (float("nan"),) * 2
        return (gemm[0] if gemm else None), tile

    def numbers(self) -> dict:
        """The numbers the chapter's page quotes, by glue name: the cases; lib's share of the floor where the
        weights set it (``floor_frac_*_weight_bound``, E >= 64); the targets met; lib against grouped_mm
        (``speedup_vs_grouped_mm_*``, ``vs_grouped_*_E<E>``, the worst case at the fewest experts:
        ``grouped_mm_e8_*``), against the loop (``speedup_vs_loop_e64*``, ``vs_loop_call_*_E<E>``, the
        loop's bound ``loop_bound_*``, ``loop_short_*``, ``room_worst_*``) and against the padded bmm
        (``padded_vs_lib_*``); tile waste, the kernel's best rate and half-height last tiles
        (``half_*``); the misses where weights set the floor (``wb_misses*``) and the worst such case under
        uniform routing (``worst_wb_*``); call time against GPU time (``lib_call_*``, ``lib_unplanned_*``,
        ``multistream_*``). Names that need a kind of case the data lacks (a smoke run has no E >= 64)
        are left out."""
        nan = float("nan")
        pts, cases, tiles, work, lib = self.points, self.cases, self.tiles, self.work, self.lib
        mem, mem_frac, vs_grouped, e64, e64_bound, e64_room = (self.mem, self.mem_frac, self.vs_grouped, self.e64,
                                                               self.e64_bound, self.e64_room)
        out = {
            "cases": len(cases),
            "floor_frac_min_weight_bound": mem_frac.min() if len(mem) else nan,
            "floor_frac_median_weight_bound": mem_frac.median() if len(mem) else nan,
            "floor_frac_max_weight_bound": mem_frac.max() if len(mem) else nan,
            "targets_met": int(self.targets["met"].sum()),
            "targets_total": len(self.targets),
            "speedup_vs_cublas_loop_e8": self.vs_cublas_comp.min() if len(self.vs_cublas_comp) else nan,
            "speedup_vs_cublas_loop_e8_max": self.vs_cublas_comp.max() if len(self.vs_cublas_comp) else nan,
            "e8_compute_cases": len(self.vs_cublas_comp),
            "read_floor_frac_min_weight_bound": self.read_wb.min() if len(self.read_wb) else nan,
            "read_floor_frac_median_weight_bound": self.read_wb.median() if len(self.read_wb) else nan,
            "read_floor_frac_max_weight_bound": self.read_wb.max() if len(self.read_wb) else nan,
            "read_floor_misses": int((self.read_wb < 0.85).sum()),
            "weight_bound_cases": len(self.read_wb),
            "read_bw_GBps": self.read_bw / 1e9,
        }
        e8_pairs = self._e8_pairs()
        if len(e8_pairs):
            worst = self._e8_worst(e8_pairs)
            out["grouped_mm_e8_worst_q1"] = 1 / e8_pairs.loc[worst]["ratio"]["q3"]
            out["grouped_mm_e8_worst_q3"] = 1 / e8_pairs.loc[worst]["ratio"]["q1"]
            out["grouped_mm_e8_worst_apart"] = self.vs_grouped_apart.loc[worst]
        out["grouped_mm_pairs"] = self.params.get("pairs", nan)
        out["tile_waste_max"] = tiles["tile waste"].max()
        out["padded_waste_max"] = tiles["padded bmm waste"].max()
        out["best_tile_tflops"] = self.best_rate / 1e12
        half = work["half tails / whole (GPU)"]
        out.update({"half_over_whole_min": half.min(), "half_over_whole_max": half.max(),
                    "half_over_whole_median": half.median()})
        if half.notna().any():
            out["half_worst_block_m"] = lib.loc[half.idxmax(), "config"]["block_m"]
            out["half_worst_half_rows"] = lib.loc[half.idxmax(), "config"]["block_m"] // 2
        wb_miss = work.loc[mem.index][work.loc[mem.index, "lib of floor"] < 0.9]
        out["wb_misses"] = len(wb_miss)
        out["wb_misses_tile_bound"] = int((wb_miss["tiles at the best rate / floor"] >= 1).sum())
        out["wb_misses_round_bound"] = int((wb_miss["in whole rounds / floor"] > 1 / 0.9).sum())
        if len(mem):
            out.update(self._worst_weight_bound())
        for E_, v in self.vs_loop_call.groupby(level="E"):
            out[f"vs_loop_call_min_E{E_}"] = v.min()
            out[f"vs_loop_call_max_E{E_}"] = v.max()
            out[f"vs_grouped_min_E{E_}"] = vs_grouped[vs_grouped.index.get_level_values("E") == E_].min()
            out[f"vs_grouped_max_E{E_}"] = vs_grouped[vs_grouped.index.get_level_values("E") == E_].max()
        lp = cases[cases.index.get_level_values("E") >= 64]
        out["loop_gpu_over_call_e64_median"] = (lp["loop gpu"] / lp["loop call"]).median()
        pb = (cases["padded bmm gpu"] / cases["lib gpu"]) if "padded bmm gpu" in cases else pd.Series(dtype=float)
        out["padded_vs_lib_min"] = pb.min() if len(pb) else nan
        out["padded_vs_lib_max"] = pb.max() if len(pb) else nan
        out["speedup_vs_grouped_mm_min"] = vs_grouped.min() if len(vs_grouped) else nan
        out["speedup_vs_grouped_mm_median"] = vs_grouped.median() if len(vs_grouped) else nan
        out["speedup_vs_grouped_mm_max"] = vs_grouped.max() if len(vs_grouped) else nan
        out["speedup_vs_grouped_mm_e8_min"] = self.comp_vs.min() if len(self.comp_vs) else nan
        out["speedup_vs_grouped_mm_e8_max"] = self.comp_vs.max() if len(self.comp_vs) else nan
        out["speedup_vs_loop_e64"] = e64.min() if len(e64) else nan
        out["speedup_vs_loop_e64_median"] = e64.median() if len(e64) else nan
        out["loop_bound_min_e64"] = e64_bound.min() if len(e64_bound) else nan
        out["loop_bound_below5_e64"] = int((e64_bound < 5).sum())
        out["cases_e64"] = len(e64_bound)
        out["speedup_vs_loop_e64_room"] = e64_room.min() if len(e64_room) else nan
        short = e64[e64 < 5]  # cases where the target is missed
        out["loop_short_cases"] = len(short)
        out["loop_short_no_room"] = int((e64_bound.loc[short.index] < 5).sum())
        if len(e64_room):
            rw = e64_room.idxmin()
            out["room_worst_lib_of_floor"] = self.lib_of_floor.loc[rw]
            out["room_worst_loop_bound"] = e64_bound.loc[rw]
        out["lib_call_over_gpu_max"] = (cases["lib call"] / cases["lib gpu"]).max()
        out["lib_call_us_min"] = cases["lib call"].min()
        unplanned = self._unplanned()
        out["lib_unplanned_call_us_min"] = unplanned.min() if len(unplanned) else nan
        out["lib_unplanned_call_over_gpu_max"] = (unplanned / cases["lib gpu"]).max() if len(unplanned) else nan
        out["lib_unplanned_over_planned_call_median"] = (unplanned / cases["lib call"]).median() if len(unplanned) else nan
        out["lib_gpu_us_min"] = cases["lib gpu"].min()
        out["lib_tma_cases"] = int(pts[pts["path"] == "lib"]["tma"].fillna(False).astype(bool).sum()) if "tma" in pts else 0
        out["multistream_vs_loop_e64"] = self._streams4("gpu")
        out["multistream_call_vs_loop_e64"] = self._streams4("call")
        out["lib_tflops_max"] = pts[pts["path"] == "lib"]["TFLOP/s"].max()
        return out

    def _e8_pairs(self) -> pd.Series:
        """The lib-vs-grouped_mm pairs of the cases with the fewest experts."""
        lib = self.lib
        pairs = lib["vs_grouped_mm_pairs"].dropna() if "vs_grouped_mm_pairs" in lib else pd.Series(dtype=object)
        return pairs[pairs.index.get_level_values("E") == self.E_min]

    @staticmethod
    def _e8_worst(pairs: pd.Series):
        return (1 / pairs.map(lambda d: d["ratio"]["median"])).idxmin()

    def _unplanned(self) -> pd.Series:
        pts = self.points
        return pts[pts["path"] == "lib, unplanned"].set_index(CASE)["call time (us)"]

    def _streams4(self, kind: str) -> float:
        """4 streams' time over the loop's (``kind`` "gpu" or "call"), median over the cases at E >= 64."""
        cases = self.cases
        if "streams 4 gpu" not in cases:
            return float("nan")
        return (cases[f"streams 4 {kind}"] / cases[f"loop {kind}"])[cases.index.get_level_values("E") >= 64].median()

    def _worst_weight_bound(self) -> dict:
        """The numbers of the worst weight-bound case at E >= 64 under uniform routing (``worst_uni``)."""
        cases, tiles, work, lib, wb = self.cases, self.tiles, self.work, self.lib, self.worst_uni
        pad_gpu = cases["padded bmm gpu"].get(wb, float("nan")) if "padded bmm gpu" in cases else float("nan")
        kernel, pad_tile = self._padded_tile(wb)
        r_ = lib.loc[wb]
        bm_ = r_["config"]["block_m"] if isinstance(r_.get("config"), dict) else gg.choose_config(wb[1], wb[0])["block_m"]
        return {
            "worst_wb_frac": self.mem_frac[wb],
            "worst_wb_computed_over_useful": work.loc[wb, "computed / useful FLOPs"],
            "worst_wb_tiles_over_floor": work.loc[wb, "tiles at the best rate / floor"],
            "worst_wb_tile_cap": 1 / work.loc[wb, "tiles at the best rate / floor"],
            "worst_wb_tile_waste": work.loc[wb, "tile waste"],
            "worst_wb_rounds": tiles.loc[wb, "rounds"],
            "worst_wb_tiles_per_program": tiles.loc[wb, "tiles per program"],
            "worst_wb_round_cap": 1 / work.loc[wb, "in whole rounds / floor"],
            "worst_wb_half_computed_over_useful": work.loc[wb, "half tails: computed / useful"],
            "worst_wb_half_over_whole": work.loc[wb, "half tails / whole (GPU)"],
            # cuBLAS's batched GEMM over every expert padded to the largest: how much of the floor it reaches there
            "worst_wb_padded_us": pad_gpu,
            "worst_wb_padded_of_floor": cases.loc[wb, "floor (us)"] / pad_gpu,
            "worst_wb_padded_computed_over_useful": wb[0] * lib.loc[wb, "Mmax"] / wb[1],
            "worst_wb_lib_us": cases.loc[wb, "lib gpu"],
            "worst_wb_padded_tile_m": pad_tile[0],
            "worst_wb_padded_tile_n": pad_tile[1],
            "worst_wb_mmax": lib.loc[wb, "Mmax"],
            "worst_wb_tiles": tiles.loc[wb, "tiles"],
            "worst_wb_programs": tiles.loc[wb, "tiles"] / tiles.loc[wb, "tiles per program"],
            "worst_wb_block_m": bm_,
            "worst_wb_experts": len(r_["counts"]),
            "worst_wb_experts_past_tile": sum(1 for m_ in r_["counts"] if m_ > bm_),
            "worst_wb_tokens_per_expert": wb[1] / wb[0],
        }

    def texts(self) -> dict:
        """The words the chapter's page quotes, by glue name: which case is worst or best where."""
        out = {f"target_{i + 1}_verdict": "yes" if met else "no" for i, met in enumerate(self.targets["met"])}
        e8_pairs = self._e8_pairs()
        if len(e8_pairs):
            worst = self._e8_worst(e8_pairs)
            out["grouped_mm_e8_worst_case"] = "T = {}, {} routing".format(
                worst[1], "uniform" if worst[2] == "uniform" else f"Dirichlet({worst[2]})")
        half = self.work["half tails / whole (GPU)"]
        if half.notna().any():
            out["half_worst_case"] = _case_words(half.idxmax())
            out["half_best_case"] = _case_words(half.idxmin())
        if len(self.mem):
            out["worst_wb_overall_case"] = _case_words(self.mem_frac.idxmin())
            out["worst_wb_case"] = _case_words(self.worst_uni)
            # how the page names the worst uniform case after naming the worst overall one
            out["worst_wb_uniform_is"] = ("that same case" if self.worst_uni == self.mem_frac.idxmin()
                                          else out["worst_wb_case"])
            kernel, _ = self._padded_tile(self.worst_uni)
            out["worst_wb_padded_kernel"] = kernel or "not recorded"
            misses = self.mem_frac[self.mem_frac < 0.9]
            out["wb_misses_cases"] = "; ".join(_case_words(k) for k in misses.index) or "none"
        if len(self.e64_room):
            out["room_worst_case"] = _case_words(self.e64_room.idxmin())
        if len(self.vs_cublas_comp):
            out["cublas_e8_worst_case"] = _case_words(self.vs_cublas_comp.idxmin())
            out["e8_compute_cases_words"] = "; ".join(_tokens_words(k) for k in self.vs_cublas_comp.index)
        cases = self.cases
        e8_mem = cases[(cases.index.get_level_values("E") == self.E_min) & (cases["read bound"] == "memory")]
        out["e8_memory_cases_words"] = "; ".join(_tokens_words(k) for k in e8_mem.index) or "none"
        if len(self.read_wb):
            out["read_floor_worst_case"] = _case_words(self.read_wb.idxmin())
        below = int((self.e64_bound < 5).sum())
        out["loop_room_words"] = ("so a kernel at the floor could be 5 times faster in every case" if below == 0 else
                                  f"so in {below} of {len(self.e64_bound)} cases no kernel at the floor could be 5 "
                                  "times faster")
        return out

    def checks(self) -> dict:
        """The values the chapter's claims check, by name (NaN where the data lacks the cases)."""
        nan = float("nan")
        pts, cases, work, wu = self.points, self.cases, self.work, self.worst_uni
        lib_pts = pts[pts["path"] == "lib"]
        has_mem = bool(len(self.mem))
        out = {
            "err_max": pts["err"].max(),
            "lib_kernels_max": lib_pts["kernels"].fillna(1).max(),
            "vs_grouped_median": self.vs_grouped.median(),
            "vs_loop_call_e64_median": self.e64.median(),
            "streams4_over_loop_gpu_e64": self._streams4("gpu"),
            "streams4_over_loop_call_e64": self._streams4("call"),
            "lib_tma_all": float(lib_pts["tma"].fillna(False).astype(bool).all()) if "tma" in pts else nan,
            "vs_grouped_fewest_experts_min": self.comp_vs.min(),
            "loop_bound_e64_min": self.e64_bound.min(),
            "vs_loop_call_room_min": self.e64_room.min() if len(self.e64_room) else nan,
            # where the loop takes 5x the floor or more, a kernel reaching a share s of the floor is 5 s times faster
            # or more (its own call overhead aside): s the lowest share lib reaches where weights set the floor
            "vs_loop_call_room_bound": 5 * self.mem_frac.min() if len(self.mem_frac) else nan,
            "lib_call_over_gpu_max": (cases["lib call"] / cases["lib gpu"]).max(),
            "unplanned_over_planned_smallest": ((self._unplanned() / cases["lib call"]).loc[cases["lib gpu"].idxmin()]
                                                if "lib, unplanned" in set(pts["path"]) else nan),
        }
        if has_mem:
            tiles_cap = work.loc[wu, "tiles at the best rate / floor"]
            rounds_cap = 1 / work.loc[wu, "in whole rounds / floor"]
            out.update({
                "worst_uni_tiles_over_floor": tiles_cap,
                "worst_uni_tile_cap_slack": 1 / tiles_cap - self.mem_frac[wu],
                "worst_uni_round_cap": rounds_cap,
                "worst_uni_round_cap_slack": rounds_cap - self.mem_frac[wu],
                "worst_uni_half_over_whole_flops": (work.loc[wu, "half tails: computed / useful"]
                                                    / work.loc[wu, "computed / useful FLOPs"]),
                "worst_uni_half_over_whole_gpu": work.loc[wu, "half tails / whole (GPU)"],
                "worst_uni_padded_of_floor": (cases.loc[wu, "floor (us)"] / cases.loc[wu, "padded bmm gpu"]
                                              if "padded bmm gpu" in cases else nan),
                "worst_uni_padded_tile_over_mmax": self._padded_tile(wu)[1][0] / self.lib.loc[wu, "Mmax"],
            })
        else:
            out.update(dict.fromkeys(["worst_uni_tiles_over_floor", "worst_uni_tile_cap_slack", "worst_uni_round_cap",
                                      "worst_uni_round_cap_slack", "worst_uni_half_over_whole_flops",
                                      "worst_uni_half_over_whole_gpu", "worst_uni_padded_of_floor",
                                      "worst_uni_padded_tile_over_mmax"], nan))
        return out

# ---------------------------------------------------------------------------- the whole layer

def experts_touched(E: int, pairs: int) -> float:
    """Experts expected to get at least one of ``pairs`` token-expert pairs when each pair picks one of E
    experts uniformly at random: E (1 - (1 - 1/E)^pairs). (A token's k experts are distinct, which this
    ignores; it changes the count by less than one expert for the chapter's cases.)"""
    if E < 1 or pairs < 0:
        raise ValueError(f"need E >= 1 and pairs >= 0, got E={E}, pairs={pairs}")
    return E * (1 - (1 - 1 / E) ** pairs)


def layer_step_cost(step: str, E: int, K: int, I_: int, k: int, n: int, touched: int, b: int = 2) -> dict:
    """FLOPs and bytes of one step of the MoE layer (``STEPS``) for n tokens, as ``lib.moe`` and the grouped
    GEMM compute it (chapter 2's terms: each tensor read or written once, float32 scores of 4 bytes):

    - router: [n, K] x [K, E]; top-k: the scores read, converted to float32, softmax, top-k (about four
      passes over n E float32 values);
    - permute: the n k rows of x gathered (read and written), the ids sorted (8-byte keys and values);
    - gate-up and down GEMMs: 2 n k K (2 I) and 2 n k I K FLOPs, the ``touched`` experts' weights read
      once, activations read and written; SwiGLU: [n k, 2 I] read, [n k, I] written;
    - unpermute: the n k rows put back (read and written), read again by the weighted sum, [n, K] written."""
    pairs = n * k
    cost = {
        "router": (2 * n * K * E, b * (n * K + K * E + n * E)),
        "top-k": (5 * n * E, b * n * E + 16 * n * E + 12 * pairs),
        "permute": (0, 2 * b * pairs * K + 32 * pairs),
        "gate-up GEMM": (2 * pairs * K * 2 * I_, b * (touched * K * 2 * I_ + pairs * K + pairs * 2 * I_)),
        "SwiGLU": (4 * pairs * I_, b * (pairs * 2 * I_ + pairs * I_)),
        "down GEMM": (2 * pairs * I_ * K, b * (touched * I_ * K + pairs * I_ + pairs * K)),
        "unpermute": (2 * pairs * K, b * (3 * pairs * K + n * K)),
    }
    if step not in cost:
        raise ValueError(f"step must be one of {STEPS}, got {step!r}")
    flops, nbytes = cost[step]
    return {"flops": flops, "bytes": nbytes}


def _model_name(E: int, k: int) -> str:
    return f"E = {E}, k = {k}"


class LayerAnalysis:
    """The MoE layer's steps (``measure_layer``'s rows) against chapter 2's model on chapter 0's ceilings
    ``c``: every step's floor max(F/P, Q/BW, kernels t_launch) with BW the streaming read rate and
    t_launch the GPU time of one kernel in a graph.

    - ``steps``: one row per case and step (GPU time, call time, kernels, floor);
    - ``table``: one row per case: the routing steps' and the experts' GPU time, the layer's, the routing
      steps' share of the sum of the steps, the experts touched against ``experts_touched``, and the
      experts' GPU time over their floor;
    - ``numbers()``, ``checks()``: what the page quotes and the claims check."""

    def __init__(self, rows: list[dict], c: dict, dtype: str):
        missing = [key for key in ("bf16_tflops", "read_bw_GBps", "launch_graph_us") if key not in c]
        if missing:
            raise ValueError(f"chapter 0's ceilings lack {missing}: pass lib.bench.ceilings.load(...)")
        P, BW, t0 = c["bf16_tflops"] * 1e12, c["read_bw_GBps"] * 1e9, c["launch_graph_us"] * 1e-6
        b = 2 if dtype == "bfloat16" else 4
        st = pd.DataFrame(rows)
        st["model"] = [_model_name(E, k) for E, k in zip(st["E"], st["k"])]
        st["GPU time (us)"] = [t["gpu_us"]["median"] for t in st["timing"]]
        st["call time (us)"] = [t["call_us"]["median"] for t in st["timing"]]
        st["touched"] = [sum(1 for m in counts if m > 0) for counts in st["counts"]]
        floors = []
        for r in st.itertuples():
            if r.step == LAYER:
                floors.append(float("nan"))
                continue
            cost = layer_step_cost(r.step, r.E, r.K, r.I, r.k, r.n, r.touched, b)
            kernels = r.kernels if r.kernels == r.kernels and r.kernels is not None else 1
            floors.append(max(cost["flops"] / P, cost["bytes"] / BW, kernels * t0) * 1e6)
        st["floor (us)"] = floors
        self.steps = st
        case = ["model", "E", "k", "n"]
        g = st[st["step"] != LAYER]
        wide = g.pivot_table(index=case, columns="step", values="GPU time (us)", sort=False)
        floor = g.pivot_table(index=case, columns="step", values="floor (us)", sort=False)
        first = st[st["step"] == LAYER].set_index(case)
        t = pd.DataFrame(index=wide.index)
        t["routing (us)"] = wide[list(ROUTING)].sum(axis=1)
        t["experts (us)"] = wide[list(GEMMS)].sum(axis=1)
        t["layer (us)"] = first["GPU time (us)"]
        t["layer, call time (us)"] = first["call time (us)"]
        t["routing share"] = t["routing (us)"] / (t["routing (us)"] + t["experts (us)"])
        t["routing over its floor"] = t["routing (us)"] / floor[list(ROUTING)].sum(axis=1)
        t["experts over their floor"] = t["experts (us)"] / floor[list(GEMMS)].sum(axis=1)
        t["experts touched"] = first["touched"]
        t["expected touched"] = [experts_touched(E, n * k) for (_m, E, k, n) in t.index]
        self.table = t.reset_index(level=["E", "k"], drop=True)
        self.wide = wide

    def share_figure_data(self) -> pd.DataFrame:
        """Each step's share of the sum of the steps' GPU time, one row per case (for a stacked bar)."""
        return self.wide[list(STEPS)].div(self.wide[list(STEPS)].sum(axis=1), axis=0).reset_index(
            level=["E", "k"], drop=True)

    def numbers(self) -> dict:
        t = self.table
        models = list(dict.fromkeys(m for m, _ in t.index))
        n_min, n_max = min(n for _, n in t.index), max(n for _, n in t.index)
        small, large = t.xs(n_min, level="n"), t.xs(n_max, level="n")
        fine = max(models, key=lambda m: self.steps.loc[self.steps["model"] == m, "E"].iloc[0])
        coarse = min(models, key=lambda m: self.steps.loc[self.steps["model"] == m, "E"].iloc[0])
        out = {"moe_n_min": n_min, "moe_n_max": n_max,
               "moe_share_min": float(t["routing share"].min()), "moe_share_max": float(t["routing share"].max()),
               "moe_share_small_max": float(small["routing share"].max()),
               "moe_share_large_fine": float(large.loc[fine, "routing share"]),
               "moe_share_large_coarse": float(large.loc[coarse, "routing share"]),
               "moe_experts_floor_small_min": float(small["experts over their floor"].min()),
               "moe_experts_floor_small_max": float(small["experts over their floor"].max()),
               "moe_routing_floor_max": float(t["routing over its floor"].max()),
               "moe_touched_ratio_min": float((t["experts touched"] / t["expected touched"]).min()),
               "moe_touched_ratio_max": float((t["experts touched"] / t["expected touched"]).max())}
        for label, m in (("fine", fine), ("coarse", coarse)):
            rows = self.steps[self.steps["model"] == m].iloc[0]
            out.update({f"moe_{label}_E": int(rows["E"]), f"moe_{label}_k": int(rows["k"]), f"moe_{label}_K": int(rows["K"]),
                        f"moe_{label}_I": int(rows["I"])})
            sub = t.loc[m]
            out[f"moe_{label}_touched_64"] = float(sub.loc[64, "experts touched"]) if 64 in sub.index else float("nan")
            out[f"moe_{label}_layer_64_us"] = float(sub.loc[64, "layer (us)"]) if 64 in sub.index else float("nan")
            out[f"moe_{label}_layer_small_us"] = float(sub.loc[n_min, "layer (us)"])
            out[f"moe_{label}_layer_large_us"] = float(sub.loc[n_max, "layer (us)"])
        unp = self.steps[(self.steps["model"] == fine) & (self.steps["n"] == n_max)].set_index("step")
        out["moe_fine_unpermute_us"] = float(unp.loc["unpermute", "GPU time (us)"])
        out["moe_fine_unpermute_over_floor"] = float(unp.loc["unpermute", "GPU time (us)"] / unp.loc["unpermute", "floor (us)"])
        return out


# ---------------------------------------------------------------------------- the page

def page(a: Analysis, layer: LayerAnalysis, res, c: dict, example_rows: pd.DataFrame, masks: dict,
         masks_table: pd.DataFrame) -> Page:
    """Every number, word and table chapter 4's page quotes, by name: the sweep's ``Analysis`` ``a`` and the
    layer's ``LayerAnalysis`` ``layer`` (their numbers, texts and tables, rounded as the page shows them),
    ``res`` (the device's name and the date), chapter 0's ceilings ``c``, the worked schedule's rows
    ``example_rows`` (one per tile, from ``gg.tile_schedule``) and the unmasked kernel's ``masks`` (counts of
    cells) and ``masks_table``. (The schedule diagram's and expert parallelism's numbers are glued beside their
    figure and table.)"""
    numbers = {
        "example_tiles_total": len(example_rows),
        "mask_outside_cells": masks["outside_cells"],
        "mask_next_cells": masks["next_cells"],
        "mask_wrong_cells": masks["wrong_cells"],
        "mask_cells": masks["cells"],
        "bf16_tflops": c["bf16_tflops"],
        **a.numbers(),
        **layer.numbers(),
    }
    texts = {"device_name": res.provenance["name"], "measured_date": res.date, **a.texts()}
    tables = {
        "masks_table": masks_table,
        "example_schedule": example_rows.set_index("tile"),
        "summary_table": a.compare_table().round(3),
        "launch_table": a.launch_table().round(3),
        "tiles_table": a.tiles.round(3),
        "work_table": a.work.round(3),
        "targets_table": a.targets.round(3),
        "layer_table": layer.table.round(3),
    }
    return Page(numbers, texts, tables)
