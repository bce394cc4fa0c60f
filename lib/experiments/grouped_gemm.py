"""Chapter 4, grouped vs multi-stream GEMM: the sweep that times the ways of running an MoE layer's
expert GEMMs, the unmasked kernel that shows why the masks matter, and the tables drawn from the data.

The notebook defines what is compared (``paths``: for one case, a loop of ``torch.mm``, the loop over
several CUDA streams, ``torch._grouped_mm``, a batched GEMM over padded experts, and the book's kernel
``lib.kernels.grouped_gemm``); ``measure`` runs them over the cases of ``sweep(size)``:

- for each shape (E experts, K, N) one weight tensor w [E, K, N] of standard normal values in the
  sweep's dtype; for each number of routed tokens T and each routing, ``route`` draws the tokens per
  expert (a multinomial over uniform expert popularity, or over popularity drawn from a
  Dirichlet(routing)), and x [T, K] holds the tokens sorted by expert (a ``Case``);
- every path runs once and is checked against a float64 product on up to four non-empty experts (the
  first three and the last): the relative error of the stacked rows must be below ``tolerance``, or
  the case stops with an error (a wrong path is never timed). On a GPU the profiler names the kernels
  one call of each path launches; the loops launch one GEMM per non-empty expert;
- every path is timed with ``lib.bench.timing.bench`` (GPU time by CUDA-graph replay, call time eager)
  in two rounds, the second in reverse order, so that no path always runs after the others (a GPU
  that has just run heavy products runs at lower clocks); each path keeps the round of lower median
  GPU time;
- the two close comparisons are also timed in interleaved pairs (``timing.paired``): the lib path
  against ``grouped_mm``, and the lib kernel with half-height last row tiles against it.

``unmasked_tile`` is a grouped GEMM as a first attempt often writes it, one program per output tile
and no masks; ``masks_demo`` runs it on buffers padded with other data and counts the cells it
writes past its output and the cells it computes wrongly. It runs compiled on a GPU and in Triton's
interpreter on a CPU (``lib.kernels`` picks), with the same counts.

``Analysis`` turns the data into the chapter's tables (every case and path against the floor
max(F/P, Q/BW), launches, tiles and tail waste, the chapter's targets), the numbers its page quotes
(``numbers``, ``texts``) and the values its claims check (``checks``).

Chapter: 4 (grouped GEMM).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from lib import moe
from lib.bench import profile, timing
from lib.experiments import require
from lib.kernels import grouped_gemm as gg
from lib.kernels import launch

# isort: split
# triton after lib.kernels, which selects Triton's interpreter when torch sees no GPU: triton.language defines
# functions of its own (tl.cumsum) when first imported, compiled or interpreted by that choice
import triton
import triton.language as tl

PARAMS = ("shapes", "T", "routing", "streams", "max_padded_bytes", "dtype", "reps", "target_ms", "seed", "pairs", "moe")
HALF = "lib, half tails"  # the path timed only against "lib", in pairs
REQUIRED = ("loop", "lib", HALF)  # paths every case must have
# the paths of the tables, in this order, where the data has them
ORDER = ["loop", "streams 2", "streams 4", "streams 8", "grouped_mm", "padded bmm", "lib"]
CASE = ["E", "T", "routing"]
# warm-up calls before each timing: compilation, caches and handles on a GPU; on the CPU (smoke runs, Triton's
# interpreter, which compiles nothing) the timing's first call, which estimates the time per call, is warm-up enough
WARMUP = {"cuda": 3, "cpu": 0}


def sweep(size: str) -> dict:
    """The cases measured: MoE shapes [E, K, N], routed tokens T, routings; timing repetitions."""
    if size == "full":
        return {"shapes": [[8, 4096, 14336], [64, 2048, 1408], [128, 7168, 2048], [256, 7168, 2048]],
                "T": [64, 1024, 8192], "routing": ["uniform", 0.1], "streams": [2, 4, 8],
                "max_padded_bytes": 4 * 2**30, "dtype": "bfloat16", "reps": 5, "target_ms": 0.5, "seed": 0,
                "pairs": 15, "moe": {"models": [[8, 4096, 14336, 2], [256, 7168, 2048, 8]], "tokens": [8, 64, 512, 4096]}}
    if size == "smoke":  # every path, both routings, K and N no tile multiple; few calls: the CPU interprets the kernel
        return {"shapes": [[4, 32, 48], [6, 16, 20]], "T": [8], "routing": ["uniform", 0.1], "streams": [],
                "max_padded_bytes": 2**20, "dtype": "float32", "reps": 1, "target_ms": 0.2, "seed": 0, "pairs": 1,
                "moe": {"models": [[4, 32, 24, 2]], "tokens": [6]}}
    raise ValueError(f"size={size!r}: the sweep has a 'full' and a 'smoke' size")


def tolerance(dtype: str) -> float:
    """The largest relative error against float64 a path may have in ``dtype`` (bf16 keeps 8 bits)."""
    return 2e-2 if dtype == "bfloat16" else 1e-4


# ---------------------------------------------------------------------------- one case

def route(T: int, E: int, routing, gen: torch.Generator) -> torch.Tensor:
    """Token counts per expert: T draws of a multinomial over uniform expert popularity (``"uniform"``) or
    over popularity drawn from a Dirichlet(routing) (a few experts get most tokens)."""
    if routing == "uniform":
        p = torch.full((E,), 1.0 / E)
    else:
        p = torch.distributions.Dirichlet(torch.full((E,), float(routing))).sample()
    return torch.multinomial(p, T, replacement=True, generator=gen).bincount(minlength=E)


@dataclass
class Case:
    """One case's inputs: x [T, K] holds the tokens sorted by expert, expert e owning rows
    ``offs[e] .. offs[e+1] - 1`` (``rows(e)``); w [E, K, N]; ``offsets`` the same bounds, int32 on the device."""

    E: int
    K: int
    N: int
    T: int
    routing: str | float
    counts: torch.Tensor  # tokens per expert (CPU)
    offs: list[int]
    offsets: torch.Tensor
    x: torch.Tensor
    w: torch.Tensor

    @property
    def nonempty(self) -> list[int]:
        """The experts that got tokens."""
        return [e for e in range(self.E) if self.counts[e] > 0]

    @property
    def Mmax(self) -> int:
        """The busiest expert's tokens."""
        return int(self.counts.max())

    def rows(self, e: int) -> slice:
        return slice(self.offs[e], self.offs[e + 1])

    def padded(self) -> torch.Tensor:
        """x as [E, Mmax, K]: every expert's rows, padded with zeros to the busiest expert's."""
        xp = torch.zeros(self.E, self.Mmax, self.K, device=self.x.device, dtype=self.x.dtype)
        for e in self.nonempty:
            xp[e, : self.counts[e]] = self.x[self.rows(e)]
        return xp


def _wrong(what: str) -> AssertionError:
    return AssertionError(f"{what}: the path computes a wrong result, and a wrong path is not timed; fix the path")


def _lib_plan(fns: dict) -> gg.GroupedGemm:
    """The plan behind the "lib" path, whose launch configuration is recorded."""
    plan = getattr(fns["lib"], "func", None)
    if not isinstance(plan, gg.GroupedGemm):
        raise TypeError('paths()["lib"] must be functools.partial(GroupedGemm(x, w, offsets, ...), x, w, offsets, '
                        "out=...): the launch its plan chose is recorded with the case")
    return plan


def measure_case(paths: Callable, E: int, K: int, N: int, w: torch.Tensor, T: int, routing, p: dict,
                 gen: torch.Generator, device: str) -> list[dict]:
    """Route T tokens over the E experts of w, build the case, check and time every path of ``paths``; one
    row per path (``HALF`` aside: it is timed against "lib", in pairs)."""
    dt = getattr(torch, p["dtype"])
    counts = route(T, E, routing, gen)
    offs = [0] + counts.cumsum(0).tolist()
    offsets = torch.tensor(offs, dtype=torch.int32, device=device)
    c = Case(E, K, N, T, routing, counts, offs, offsets, torch.randn(T, K, device=device).to(dt), w)
    fns = paths(c, p, device)
    missing = [name for name in REQUIRED if not callable(fns.get(name))]
    if missing:
        raise ValueError(f"paths() returned no callable for {missing}: it must give each of {list(REQUIRED)}")
    half = fns.pop(HALF)
    plan = _lib_plan(fns)
    nonempty = c.nonempty
    check = nonempty[:3] + nonempty[-1:]
    ref = {e: c.x[c.rows(e)].double() @ w[e].double() for e in check}

    def err(out):
        num = sum(float((out[c.rows(e)].double() - ref[e]).norm() ** 2) for e in check)
        return (num / sum(float(ref[e].norm() ** 2) for e in check)) ** 0.5

    tol = tolerance(p["dtype"])
    where = f"E={E} T={T} {routing}"
    rows = {}
    for name, fn in fns.items():
        o = fn()
        if name == "padded bmm":  # [E, Mmax, N]: each expert's first rows
            e_ = max(float((o[e, : counts[e]].double() - ref[e]).norm() / ref[e].norm()) for e in check)
        else:
            e_ = err(o)
        if not e_ < tol:
            raise _wrong(f"{name} {where}: relative error {e_:.2e} (at most {tol:.0e})")
        loops = name == "loop" or name.startswith("streams")  # one GEMM per non-empty expert
        names = None if loops else profile.kernel_names(fn, device)
        rows[name] = {"E": E, "K": K, "N": N, "T": T, "routing": str(routing), "path": name, "err": e_,
                      "nonempty": len(nonempty), "Mmax": c.Mmax, "counts": counts.tolist(),
                      "kernels": len(names) if names else (len(nonempty) if loops else None),
                      "kernel_names": names}
    rows["lib"].update({"config": {**gg.choose_config(T, E, K), **plan.config}, "tma": gg.tma_applies(c.x, w),
                        "half_tail_err": err(half())})
    if not rows["lib"]["half_tail_err"] < tol:
        raise _wrong(f"{HALF} {where}: relative error {rows['lib']['half_tail_err']:.2e} (at most {tol:.0e})")
    warmup = WARMUP[device]
    rounds = {name: [] for name in fns}
    for order in (list(fns), list(fns)[::-1]):
        for name in order:
            rounds[name].append(timing.bench([fns[name]], device=device, reps=p["reps"], warmup=warmup,
                                             target_ms=p["target_ms"]))
    for name, ts in rounds.items():
        rows[name]["timing"] = min(ts, key=lambda t: t.gpu_us.median).to_dict()
        rows[name]["rounds_gpu_us"] = [t.gpu_us.median for t in ts]
    if "grouped_mm" in fns:  # lib's time over grouped_mm's, pair by pair
        rows["lib"]["vs_grouped_mm_pairs"] = timing.paired(fns["grouped_mm"], fns["lib"], device=device,
                                                            pairs=p["pairs"], warmup=warmup,
                                                            target_ms=p["target_ms"]).to_dict()
    rows["lib"]["half_tail_pairs"] = timing.paired(fns["lib"], half, device=device, pairs=p["pairs"], warmup=warmup,
                                                    target_ms=p["target_ms"]).to_dict()
    return list(rows.values())


def measure(params: dict, device: str, paths: Callable) -> dict:
    """Every case of ``params`` (``sweep``) with the paths ``paths(case, params, device)`` gives:
    {"points": one row per case and path, "sms": the SMs the lib kernel's grid is counted in}."""
    require(params, PARAMS)
    if not callable(paths):
        raise TypeError("paths must be a function (case, params, device) -> {name: callable}; see chapter 4's notebook")
    p = params
    torch.manual_seed(p["seed"])
    gen = torch.Generator().manual_seed(p["seed"])
    dt = getattr(torch, p["dtype"])
    rows = []
    for E, K, N in p["shapes"]:
        w = torch.randn(E, K, N, device=device).to(dt) if device == "cpu" else torch.randn(E, K, N, device=device,
                                                                                            dtype=dt)
        for T in p["T"]:
            for routing in p["routing"]:
                rows += measure_case(paths, E, K, N, w, T, routing, p, gen, device)
        print(f"E={E} done", flush=True)
        del w
        if device == "cuda":
            torch.cuda.empty_cache()
    return {"points": rows, "sms": launch.sm_count(torch.device(device))}


# ---------------------------------------------------------------------------- the routing around the GEMM

# the steps of an MoE layer (a SwiGLU expert MLP), in order; the routing steps are those around the GEMMs
STEPS = ("router", "top-k", "permute", "gate-up GEMM", "SwiGLU", "down GEMM", "unpermute")
ROUTING = ("router", "top-k", "permute", "unpermute")
GEMMS = ("gate-up GEMM", "SwiGLU", "down GEMM")  # the experts' own work
LAYER = "layer"  # all the steps in one call


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300))


def check_layer(steps: dict, x: torch.Tensor, router: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor,
                k: int, tol: float) -> dict:
    """Check the steps of ``steps`` against their float64 definitions (``lib.moe``'s oracles) and return the
    errors; raise where a step computes something else (a wrong step is never timed)."""
    E = w_up.shape[0]
    logits = steps["router"]()
    e_router = _rel(logits, x.double() @ router.double())
    weights, ids = steps["top-k"]()
    w_ref, _ = moe.top_k_reference(logits, k)
    probs = torch.softmax(logits.double().cpu(), -1)
    e_topk = max(float((weights.double().cpu() - w_ref).abs().max()),  # the chosen experts' scores are the best
                 float((probs.gather(1, ids.cpu()) - probs.topk(k, -1).values).abs().max()))
    xs, offsets, order = steps["permute"]()
    counts = torch.bincount(ids.reshape(-1).cpu(), minlength=E)
    offsets_ok = offsets.cpu().tolist() == [0] + counts.cumsum(0).tolist()
    rows_ok = torch.equal(xs, x.index_select(0, order // k))
    n = x.shape[0]
    probe = sorted(set(range(min(4, n))) | set(range(max(0, n - 4), n)))
    y = steps[LAYER]()
    e_layer = _rel(y[probe], moe.moe_reference(x, moe.expert_mlp(w_up, w_down), ids, weights, probe))
    errs = {"router_err": e_router, "topk_err": e_topk, "layer_err": e_layer}
    if not (e_router < tol and e_topk < 1e-4 and offsets_ok and rows_ok and e_layer < tol):
        raise _wrong(f"MoE layer, n={n} E={E} k={k}: {errs}, offsets {'right' if offsets_ok else 'wrong'}, "
                     f"permuted rows {'right' if rows_ok else 'wrong'} (tolerance {tol:.0e}, top-k 1e-4)")
    return {**errs, "counts": counts.tolist()}


def measure_layer(params: dict, device: str, steps: Callable) -> list[dict]:
    """An MoE layer, routing and experts: for each model [E, K, I, k] of ``params["moe"]`` (E experts of a
    SwiGLU MLP K -> 2 I -> K, k experts per token) and each token count n, random x [n, K], router [K, E],
    w_up [E, K, 2 I] and w_down [E, I, K] (each scaled by one over the square root of its input width, so
    that values stay of order 1); ``steps(x, router, w_up, w_down, k)`` gives the callables of ``STEPS`` and
    ``LAYER``, each step on the previous one's outputs. All are checked (``check_layer``), their kernels
    counted, and timed (GPU time and call time); one row per step and case."""
    require(params, PARAMS)
    if not callable(steps):
        raise TypeError("steps must be a function (x, router, w_up, w_down, k) -> {step: callable}; "
                        "see chapter 4's notebook")
    p = params
    dt = getattr(torch, p["dtype"])
    gen = torch.Generator(device=device).manual_seed(p["seed"])

    def rand(*shape, fan_in=1):
        return (torch.randn(*shape, device=device, generator=gen, dtype=dt) / fan_in ** 0.5).to(dt)
    rows = []
    for E, K, I_, k in p["moe"]["models"]:
        router, w_up, w_down = rand(K, E, fan_in=K), rand(E, K, 2 * I_, fan_in=K), rand(E, I_, K, fan_in=I_)
        for n in p["moe"]["tokens"]:
            x = rand(n, K)
            fns = steps(x, router, w_up, w_down, k)
            missing = [s for s in (*STEPS, LAYER) if not callable(fns.get(s))]
            if missing:
                raise ValueError(f"steps() returned no callable for {missing}: it must give each of {[*STEPS, LAYER]}")
            errs = check_layer(fns, x, router, w_up, w_down, k, tolerance(p["dtype"]))
            for name in (*STEPS, LAYER):
                names = profile.kernel_names(fns[name], device)
                t = timing.bench([fns[name]], device=device, reps=p["reps"], warmup=WARMUP[device],
                                 target_ms=p["target_ms"])
                rows.append({"E": E, "K": K, "I": I_, "k": k, "n": n, "step": name,
                             "kernels": len(names) if names else None, "kernel_names": names, "timing": t.to_dict(),
                             **errs})
            del x, fns
        del router, w_up, w_down
        if device == "cuda":
            torch.cuda.empty_cache()
        print(f"MoE layer E={E} done", flush=True)
    return rows


# ---------------------------------------------------------------------------- why the masks matter

@triton.jit
def unmasked_tile(X, W, Y, OFFS, K, stride_xm, stride_we, stride_wk, stride_ym,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One output tile (program (e, tm, tn): expert e, row tile tm, column tile tn) with no masks at all:
    its rows run past the expert's tokens, its columns past N, its last step along K past K."""
    e, tm, tn = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    row0 = tl.load(OFFS + e)
    if tm * BLOCK_M < tl.load(OFFS + e + 1) - row0:  # tiles past the expert's tokens do nothing
        rows = row0 + tm * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tn * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(X + rows[:, None] * stride_xm + kk[None, :])
            b = tl.load(W + e * stride_we + kk[:, None] * stride_wk + cols[None, :])
            acc = tl.dot(a, b, acc, input_precision="ieee")  # float32 products, as the interpreter's
        tl.store(Y + rows[:, None] * stride_ym + cols[None, :], acc)


SENTINEL = -7.0  # what the output buffer holds where nothing was written


def _demo_device() -> str:
    """Where ``unmasked_tile`` runs: the CPU when lib.kernels chose Triton's interpreter, else the GPU."""
    if isinstance(unmasked_tile, triton.JITFunction):  # compiled: lib.kernels saw a GPU
        return "cuda"
    versions = [tuple(int(v) for v in m.__version__.split(".")[:2]) for m in (np, triton)]
    if versions[1] <= (3, 6) and versions[0] >= (2, 4):
        raise RuntimeError(f"numpy {np.__version__} with triton {triton.__version__}: the unmasked kernel runs in "
                           "Triton's interpreter here (no GPU), which needs numpy < 2.4 with this Triton (newer numpy "
                           "refuses its conversions of one-element arrays). Install numpy<2.4, run the book's pinned "
                           "environment, or run it on a GPU.")
    return "cpu"


def run_unmasked(Ms, K: int, N: int, experts: int | None = None, tile: int = 16, pad: int = 32, seed: int = 0):
    """``unmasked_tile`` over experts of Ms tokens, tiles of ``tile`` cubed: x [T, K] and w [E, K, N] inside
    buffers ``pad`` rows and columns larger holding other data (10 times standard normal values), the output
    inside a [T + pad, N + pad] buffer of ``SENTINEL``; ``experts`` runs only the first few experts' tiles.
    Every read and write of the kernel stays inside these buffers (rows and columns past the views by less
    than a tile). The data is drawn on the CPU and moved to where the kernel runs. Returns (x, w, offsets,
    the output buffer)."""
    device = _demo_device()
    gen = torch.Generator().manual_seed(seed)
    E, T = len(Ms), sum(Ms)
    xbuf = 10 * torch.randn(T + pad, K + pad, generator=gen)
    xbuf[:T, :K] = torch.randn(T, K, generator=gen)
    wbuf = 10 * torch.randn(E + 1, K + pad, N + pad, generator=gen)
    wbuf[:E, :K, :N] = torch.randn(E, K, N, generator=gen)
    xbuf, wbuf = xbuf.to(device), wbuf.to(device)
    x, w = xbuf[:T, :K], wbuf[:E, :K, :N]
    offsets = torch.tensor([0, *torch.tensor(Ms).cumsum(0).tolist()], dtype=torch.int32, device=device)
    ybuf = torch.full((T + pad, N + pad), SENTINEL, device=device)
    grid = (experts or E, max(-(-m // tile) for m in Ms), -(-N // tile))
    unmasked_tile[grid](x, w, ybuf, offsets, K, x.stride(0), w.stride(0), w.stride(1), ybuf.stride(0),
                        BLOCK_M=tile, BLOCK_N=tile, BLOCK_K=tile)
    return x, w, offsets, ybuf


def masks_demo(Ms=(5, 3), N: int = 24, K_whole: int = 32, K_tail: int = 20) -> dict:
    """What the unmasked kernel does: run over the first expert alone with K a tile multiple (``K_whole``),
    the cells it writes past the output [T, N] and into the next expert's rows; run over every expert with
    ``K_tail``, the output cells that differ from a float32 reference (relative and absolute 1e-3)."""
    Ms = list(Ms)
    T = sum(Ms)
    _, _, _, ybuf = run_unmasked(Ms, K_whole, N, experts=1)
    written = ybuf != SENTINEL
    next_cells = int(written[Ms[0]:T, :N].sum())
    written[:T, :N] = False
    outside_cells = int(written.sum())
    x, w, offsets, ybuf = run_unmasked(Ms, K_tail, N)
    y, ref = ybuf[:T, :N], gg.reference(x, w, offsets)
    wrong = int((~torch.isclose(y, ref, rtol=1e-3, atol=1e-3)).sum())
    return {"Ms": Ms, "N": N, "K_whole": K_whole, "K_tail": K_tail, "outside_cells": outside_cells,
            "next_cells": next_cells, "wrong_cells": wrong, "cells": T * N, "device": str(ybuf.device.type)}


def masks_table(m: dict) -> pd.DataFrame:
    """``masks_demo``'s counts as the chapter's table."""
    return pd.DataFrame([
        {"unmasked kernel": f"cells written past the output (first expert alone, K = {m['K_whole']})",
         "cells": m["outside_cells"]},
        {"unmasked kernel": "cells of the second expert's rows written by the first's tile", "cells": m["next_cells"]},
        {"unmasked kernel": f"output cells wrong, K = {m['K_tail']} (reads past K)", "cells": m["wrong_cells"]},
        {"unmasked kernel": "output cells in all", "cells": m["cells"]},
    ]).set_index("unmasked kernel")


# ---------------------------------------------------------------------------- analysis

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


# ---------------------------------------------------------------------------- the whole layer (analysis)

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


# ---------------------------------------------------------------------------- expert parallelism (theory)

def ep_bytes_per_token(K: int, top_k: int, ranks: int, b: int = 2) -> dict:
    """All-to-all bytes one token moves per MoE layer under expert parallelism over ``ranks`` GPUs, each
    holding E / ranks experts (chapter 4; theory, not measured on one GPU).

    A token's hidden vector (K values of b bytes) goes to each of its ``top_k`` experts (dispatch) and each
    expert's output comes back to be summed (combine). With the experts spread evenly and the token's
    experts chosen independently of where the token lives, a share (ranks - 1) / ranks of them lie on
    another GPU: dispatch = combine = top_k K b (ranks - 1) / ranks bytes. Returns dispatch, combine and
    their total."""
    for name, v in (("K", K), ("top_k", top_k), ("ranks", ranks), ("b", b)):
        if isinstance(v, bool) or int(v) != v or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    one_way = top_k * K * b * (ranks - 1) / ranks
    return {"dispatch": one_way, "combine": one_way, "total": 2 * one_way}


def ep_rank_loads(counts, ranks: int) -> np.ndarray:
    """Token-expert pairs each of ``ranks`` GPUs computes when experts 0 .. E-1 are placed in contiguous
    blocks of E / ranks (chapter 4). The busiest rank (the hot-expert rank) sets the layer's time: its
    load over the mean is the factor by which skewed routing slows an expert-parallel layer."""
    counts = np.asarray(counts, dtype=np.int64)
    if isinstance(ranks, bool) or int(ranks) != ranks or ranks < 1:
        raise ValueError(f"ranks must be a positive int, got {ranks!r}")
    if counts.ndim != 1 or len(counts) == 0 or (counts < 0).any():
        raise ValueError("counts must be a non-empty list of tokens per expert, none negative")
    if len(counts) % ranks:
        raise ValueError(f"{len(counts)} experts do not split evenly over {ranks} ranks: pick ranks dividing E")
    return counts.reshape(ranks, -1).sum(axis=1)
