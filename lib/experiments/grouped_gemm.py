"""Chapter 4, grouped vs multi-stream GEMM: the sweep that times the ways of running an MoE layer's
expert GEMMs, and the one that times the whole layer step by step.

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

``measure_layer`` times the steps of a whole MoE layer (router, top-k, permute, the two grouped GEMMs and
SwiGLU, unpermute), each on the previous step's outputs, and the layer in one call.

The chapter's other parts live beside this module: the tables and numbers drawn from this data in
``lib.experiments.grouped_gemm_analysis``, the unmasked teaching kernel in ``lib.experiments.unmasked_gemm``,
and expert parallelism's traffic model in ``lib.experiments.ep_traffic``.

Chapter: 4 (grouped GEMM).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from lib import moe
from lib.bench import profile, timing
from lib.experiments import require
from lib.kernels import grouped_gemm as gg
from lib.kernels import launch

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


