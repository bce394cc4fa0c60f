"""Chapter 10's predictions: collectives as a latency plus bytes over a bus bandwidth, the tensor-parallel
decode step, and the expert-parallel MoE layer set by its most loaded rank.

**Collectives.** A collective over w ranks moves, per byte of its buffer, f(w) bytes through each rank's
links: 2 (w - 1) / w for an all-reduce (a reduce-scatter, then an all-gather), (w - 1) / w for an
all-to-all (each rank keeps 1/w of its buffer). NCCL reports the bus bandwidth busbw = f(w) bytes / t,
which does not depend on w for a link-bound collective, so

    t(bytes) = alpha + f(w) bytes / busbw,

with alpha the latency of a collective that moves nothing. ``collective_us`` evaluates it;
``fit_collective`` fits alpha and busbw to a measured sweep (least squares of t against f(w) bytes).

**The tensor-parallel step.** Chapter 7's latency-bandwidth model charges each part of a decode step
k alpha_kernel + max(Q / BW, F / P) (``decode_step_analysis.parts``). With TP ranks, each rank reads 1/TP of the
layers' weights and of the K/V cache (its heads) and does 1/TP of their FLOPs; the output head is
replicated; every rank launches the same kernels; and each layer adds two all-reduces of B x hidden
values (after the attention's output product and after the MLP's down product). ``tp_step`` predicts the
step part by part; ``breakeven_alpha_us`` is the all-reduce latency at which TP ranks are no faster than
one GPU.

**The expert-parallel layer.** An MoE layer's experts spread over w ranks; a decode step's tokens go to
the ranks that own their k experts (an all-to-all), are multiplied there and come back (another). A
rank's time is that of its experts: every expert that received a row reads its weights (3 K I values of
a SwiGLU expert), and the rows cost 6 K I FLOPs each; ``ep_rank_us`` charges each rank its kernels'
fixed costs plus max(bytes / BW, FLOPs / P). The layer waits for the slowest rank, so its time is the
most loaded rank's plus the two all-to-alls; ``hot_rank_slowdown`` is that rank's time over the mean
rank's: 1 under a perfectly even routing, more when one expert is hot.

Chapter: 10.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import torch

from lib import models
from lib.bench import fit, timing
from lib.experiments import decode_step, decode_step_analysis, require

COLLECTIVES = ("all_reduce", "all_to_all")


def bus_factor(kind: str, world: int) -> float:
    """Bytes through each rank's links per byte of the buffer: 2 (w - 1) / w (all-reduce), (w - 1) / w
    (all-to-all)."""
    if kind not in COLLECTIVES:
        raise ValueError(f"kind must be one of {COLLECTIVES}, got {kind!r}")
    if not (isinstance(world, int) and world >= 1):
        raise ValueError(f"world = {world!r}: a collective needs at least one rank; pass a positive int")
    return (2.0 if kind == "all_reduce" else 1.0) * (world - 1) / world


def collective_us(kind: str, nbytes: float, world: int, alpha_us: float, busbw_GBps: float) -> float:
    """alpha + f(w) bytes / busbw, in us (see the module); one rank moves nothing: 0."""
    if nbytes < 0 or alpha_us < 0 or not busbw_GBps > 0:
        raise ValueError(f"need nbytes >= 0, alpha_us >= 0 and busbw_GBps > 0, got {nbytes}, {alpha_us}, {busbw_GBps}")
    f = bus_factor(kind, world)
    return 0.0 if f == 0 else alpha_us + f * nbytes / (busbw_GBps * 1e3)


def fit_collective(rows: list[dict], kind: str, world: int) -> tuple[float, float]:
    """(alpha_us, busbw_GBps) of the line through a sweep's points ({"bytes", "us"}): least squares of the
    time against f(w) bytes. Needs at least two sizes and a time that grows with the bytes."""
    f = bus_factor(kind, world)
    if f == 0:
        raise ValueError("one rank moves no bytes: fit a sweep of two or more ranks")
    pts = np.array([(r["bytes"] * f, r["us"]) for r in rows], dtype=float)
    if len(np.unique(pts[:, 0])) < 2:
        raise ValueError("a line needs points of at least two sizes")
    intercept, slope = fit.fit_line(pts[:, 0].tolist(), pts[:, 1].tolist())
    if not slope > 0:
        raise ValueError(f"the time does not grow with the bytes (slope {slope:.3g} us/byte): not a bandwidth-bound sweep")
    return float(intercept), float(1e-3 / slope)


def tp_step(a: decode_step.Analysis, kernel_alpha_us: float, B: int, L: int, tp: int, ar_alpha_us: float,
            busbw_GBps: float, path: str = "fused") -> pd.DataFrame:
    """Chapter 7's measured step (``a``, shape B, L, ``path``) predicted on ``tp`` ranks, part by part: each
    part's kernels at ``kernel_alpha_us`` plus its work (the layers' weights and the K/V divided by tp, the
    output head whole), and the all-reduces (2 per layer, B x hidden values of the model's dtype each).
    Columns: part, kernels, work (us), predicted (us)."""
    if not (isinstance(tp, int) and tp >= 1):
        raise ValueError(f"tp = {tp!r}: pass a positive int")
    c = a.cfg
    if c.heads % tp or c.kv_heads % tp or c.mlp % tp:
        raise ValueError(f"tp = {tp} must divide the query heads ({c.heads}), the KV heads ({c.kv_heads}) and the "
                         f"MLP width ({c.mlp}) of the model")
    t = decode_step_analysis.parts(a, kernel_alpha_us)
    t = t[(t["B"] == B) & (t["L"] == L) & (t["path"] == path)]
    if t.empty:
        raise ValueError(f"chapter 7's data has no step at B = {B}, L = {L} on path {path!r}")
    split = {"layer weights": tp, "attention (K/V)": tp}
    rows = []
    for r in t.to_dict("records"):
        work = r["predicted (us)"] - r["kernels"] * kernel_alpha_us
        work /= split.get(r["part"], 1)
        rows.append({"part": r["part"], "kernels": r["kernels"], "work (us)": work,
                     "predicted (us)": r["kernels"] * kernel_alpha_us + work})
    b = 2 if a.params["dtype"] == "bfloat16" else 4
    n = 2 * c.layers if tp > 1 else 0
    ar = collective_us("all_reduce", B * c.hidden * b, tp, ar_alpha_us, busbw_GBps) if tp > 1 else 0.0
    rows.append({"part": "all-reduces", "kernels": n, "work (us)": n * (ar - ar_alpha_us) if n else 0.0,
                 "predicted (us)": n * ar})
    return pd.DataFrame(rows)


def tp_speedup(a, kernel_alpha_us, B, L, tp, ar_alpha_us, busbw_GBps, path="fused") -> float:
    """The predicted step on one GPU over the predicted step on ``tp`` ranks (NaN where a part has no
    prediction: chapter 7's kernel counts come from a GPU profile)."""
    one = tp_step(a, kernel_alpha_us, B, L, 1, ar_alpha_us, busbw_GBps, path)["predicted (us)"].sum(skipna=False)
    return float(one / tp_step(a, kernel_alpha_us, B, L, tp, ar_alpha_us, busbw_GBps, path)["predicted (us)"].sum(skipna=False))


def breakeven_alpha_us(a, kernel_alpha_us, B, L, tp, busbw_GBps, path="fused") -> float:
    """The all-reduce latency at which the step on ``tp`` ranks takes as long as on one GPU: the time the
    split saves, less the all-reduces' bytes, over their number (negative: TP never pays at that shape)."""
    if tp < 2:
        raise ValueError("a break-even needs at least two ranks")
    one = tp_step(a, kernel_alpha_us, B, L, 1, 0.0, busbw_GBps, path)["predicted (us)"].sum(skipna=False)
    split = tp_step(a, kernel_alpha_us, B, L, tp, 0.0, busbw_GBps, path)["predicted (us)"].sum(skipna=False)
    return float((one - split) / (2 * a.cfg.layers))


def expert_counts(ids: torch.Tensor, E: int) -> torch.Tensor:
    """Rows each of E experts receives from a routing ``ids`` [n, k] of expert ids."""
    if ids.dim() != 2:
        raise ValueError(f"ids must be [tokens, k], got shape {tuple(ids.shape)}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= E):
        raise ValueError(f"expert ids must lie in [0, {E}), got {int(ids.min())} .. {int(ids.max())}")
    return torch.bincount(ids.reshape(-1).long().cpu(), minlength=E)


def expert_rank_us(rows: int, active: int, K: int, I: int, *, b: int, BW_GBps: float, P_TFLOPs: float,  # noqa: E741
                   kernel_alpha_us: float, kernels: int = 3) -> float:
    """One rank's expert work: ``kernels`` fixed costs (gate-up, SwiGLU, down) plus max(bytes / BW,
    FLOPs / P), the bytes those of its ``active`` experts (3 K I values of ``b`` bytes each) and the FLOPs
    6 K I per row."""
    return kernels * kernel_alpha_us + max(active * 3 * K * I * b / (BW_GBps * 1e3), rows * 6 * K * I / (P_TFLOPs * 1e6))


def ep_rank_us(counts: torch.Tensor, world: int, K: int, I: int, **rates) -> pd.DataFrame:  # noqa: E741
    """Each rank's expert time (``expert_rank_us``, with ``rates`` its keyword arguments) for per-expert row
    ``counts`` [E], rank r owning experts r E/w .. (r+1) E/w - 1. Columns: rank, rows, active experts,
    predicted (us)."""
    E = len(counts)
    if E % world:
        raise ValueError(f"{E} experts do not split over {world} ranks: world must divide E")
    per = E // world
    out = []
    for r in range(world):
        c = counts[r * per:(r + 1) * per]
        rows, active = int(c.sum()), int((c > 0).sum())
        out.append({"rank": r, "rows": rows, "active experts": active,
                    "predicted (us)": expert_rank_us(rows, active, K, I, **rates)})
    return pd.DataFrame(out)


def hot_rank_slowdown(ranks: pd.DataFrame) -> float:
    """The most loaded rank's predicted time over the mean rank's (``ep_rank_us``)."""
    t = ranks["predicted (us)"]
    return float(t.max() / t.mean())


def ep_layer_us(ranks: pd.DataFrame, tokens_per_rank: int, k: int, K: int, *, b: int, a2a_alpha_us: float,
                busbw_GBps: float) -> float:
    """The layer's time: the slowest rank's experts plus two all-to-alls (dispatch and combine) of each
    rank's tokens_per_rank k rows of K values."""
    world = len(ranks)
    a2a = collective_us("all_to_all", tokens_per_rank * k * K * b, world, a2a_alpha_us, busbw_GBps)
    return float(ranks["predicted (us)"].max() + 2 * a2a)


# ---------------------------------------------------------------------------- the measurement

PARAMS = ("config", "dtype", "shapes", "tp", "block", "moe", "worlds", "routings", "draws", "reps", "target_ms",
          "rounds", "seed", "collectives")
WARMUP = {"cuda": 3, "cpu": 1}


def sweep(size: str) -> dict:
    """"full": Llama-3-8B in bf16 at chapter 7's shapes, one rank's step at TP 1, 2 and 4, and chapter 4's
    MoE models (Mixtral-like and DeepSeek-V3-like) with 64 tokens a step over 2, 4 and 8 ranks, near-uniform
    (Dirichlet 100) and skewed (Dirichlet 0.1) routing, and the collectives from 1 KiB to 256 MiB over 2, 4
    and 8 GPUs; "smoke": tiny sizes in float32 and collectives over two gloo ranks, seconds on a CPU."""
    if size == "full":
        sizes = [2 ** e for e in range(10, 29, 2)]  # 1 KiB to 256 MiB
        return {"config": "8b", "dtype": "bfloat16", "shapes": [[1, 1024], [64, 4096]], "tp": [1, 2, 4], "block": 16,
                "moe": {"models": [[8, 4096, 14336, 2], [256, 7168, 2048, 8]], "tokens": 64},
                "worlds": [2, 4, 8], "routings": [100.0, 0.1], "draws": 5, "reps": 5, "target_ms": 20.0,
                "rounds": 3, "seed": 0, "collectives": {"worlds": [2, 4, 8], "sizes": sizes, "reps": 20}}
    if size == "smoke":
        return {"config": "tiny", "dtype": "float32", "shapes": [[1, 12], [2, 20]], "tp": [1, 2], "block": 4,
                "moe": {"models": [[8, 32, 24, 2]], "tokens": 8}, "worlds": [2, 4], "routings": [100.0, 0.1],
                "draws": 2, "reps": 1, "target_ms": 0.2, "rounds": 1, "seed": 0,
                "collectives": {"worlds": [2], "sizes": [1024, 65536], "reps": 3}}
    raise ValueError(f"size must be 'full' or 'smoke', got {size!r}")


def rank_config(cfg, tp: int):
    """The model one of ``tp`` ranks holds: 1/tp of the query heads, the KV heads and the MLP's width (the
    embedding and the output head whole)."""
    if cfg.heads % tp or cfg.kv_heads % tp or cfg.mlp % tp:
        raise ValueError(f"tp = {tp} must divide the heads ({cfg.heads}), KV heads ({cfg.kv_heads}) and MLP width "
                         f"({cfg.mlp})")
    return dataclasses.replace(cfg, heads=cfg.heads // tp, kv_heads=cfg.kv_heads // tp, mlp=cfg.mlp // tp)


def measure_tp_rank(params: dict, device: str) -> list[dict]:
    """One rank's decode step at each TP size on this one device: chapter 7's fused step (the model under ``lib.models.FUSED``) of
    the model ``rank_config`` gives (its weights drawn here), at each shape, checked against the unfused
    step of the same weights, then timed in interleaved rounds (GPU time and call time). What the ranks
    would add, the all-reduces, is not in it."""
    p = params
    cfg = models.CONFIGS[p["config"]]
    dt = getattr(torch, p["dtype"])
    gen = torch.Generator(device=device).manual_seed(p["seed"])
    out = []
    for B, L in p["shapes"]:
        cases = {}
        for tp in p["tp"]:
            m = models.Llama.random(rank_config(cfg, tp), seed=p["seed"], dtype=dt, device=device)
            pool, table = decode_step._pool(m, B, L, p["block"], gen)
            lens = torch.full((B,), L, dtype=torch.int32, device=device)
            tokens = torch.randint(0, cfg.vocab, (B,), generator=gen, device=device)
            step = m.with_parts(models.FUSED)
            models.check_logits(f"TP {tp} rank step, B={B} L={L}", step(tokens, pool, table, lens),
                               m.decode(tokens, pool, table, lens, check=False), p["dtype"], device)
            cases[tp] = (step, (tokens, pool, table, lens))
        for r in range(p["rounds"]):
            for tp in (p["tp"] if r % 2 == 0 else p["tp"][::-1]):
                step, args = cases[tp]
                t = timing.bench([lambda s=step, a=args: s(*a)], device=device, reps=p["reps"],
                                 warmup=WARMUP[device], target_ms=p["target_ms"])
                out.append({"B": B, "L": L, "tp": tp, "round": r, "gpu_us": t.gpu_us.median, "call_us": t.call_us.median,
                            "method": t.method})
        del cases
        if device == "cuda":
            torch.cuda.empty_cache()
    return out


def measure_ep_rank(params: dict, device: str) -> list[dict]:
    """Each rank's share of an expert-parallel MoE layer, timed on this one device: for each model [E, K, I, k]
    of ``params["moe"]``, world size and routing (a Dirichlet concentration, ``lib.parallel.ep.dirichlet_routing``)
    the step's tokens are routed ``draws`` times; for each draw every rank's rows and active experts are
    recorded, and for the first draw every rank's expert work (its rows through its experts' gate-up GEMM,
    SwiGLU and down GEMM, chapter 4's grouped kernel; the rank's experts are a slice of the layer's
    weights) is checked against float64 on its first rows and timed. The all-to-alls are not in it."""
    from lib import moe
    from lib.kernels.grouped_gemm import grouped_gemm
    from lib.parallel import ep

    p = params
    dt = getattr(torch, p["dtype"])
    gen = torch.Generator(device=device).manual_seed(p["seed"])
    n = p["moe"]["tokens"]
    out = []
    for E, K, I_, k in p["moe"]["models"]:
        w_up = (torch.randn(E, K, 2 * I_, device=device, generator=gen, dtype=dt) / K ** 0.5).to(dt)
        w_down = (torch.randn(E, I_, K, device=device, generator=gen, dtype=dt) / I_ ** 0.5).to(dt)
        for conc in p["routings"]:
            for d in range(p["draws"]):
                counts = expert_counts(ep.dirichlet_routing(n, E, k, float(conc), p["seed"] + d), E)
                for w in p["worlds"]:
                    per = E // w
                    for r in range(w):
                        c = counts[r * per:(r + 1) * per]
                        row = {"E": E, "K": K, "I": I_, "k": k, "tokens": n, "routing": conc, "draw": d, "world": w,
                               "rank": r, "rows": int(c.sum()), "active experts": int((c > 0).sum())}
                        if d == 0 and row["rows"]:
                            off = torch.tensor([0] + c.cumsum(0).tolist(), dtype=torch.int32, device=device)
                            xs = torch.randn(row["rows"], K, device=device, generator=gen, dtype=dt)
                            up, down = w_up[r * per:(r + 1) * per], w_down[r * per:(r + 1) * per]

                            def experts(xs=xs, up=up, down=down, off=off):
                                return grouped_gemm(moe.swiglu(grouped_gemm(xs, up, off)), down, off)
                            e0 = int(torch.nonzero(c)[0])  # the rank's first expert with rows: its first rows
                            first = experts()[: int(c[e0])].double()
                            ref = moe.swiglu(xs[: int(c[e0])].double() @ up[e0].double()) @ down[e0].double()
                            err = float((first - ref).norm() / ref.norm())
                            if not err < (2e-2 if p["dtype"] == "bfloat16" else 1e-4):
                                raise AssertionError(f"EP rank {r} of {w}, E={E}: experts' rows differ from float64 by "
                                                     f"{err:.3g}: the rank computes something else")
                            t = timing.bench([experts], device=device, reps=p["reps"], warmup=WARMUP[device],
                                             target_ms=p["target_ms"])
                            row |= {"rel_err": err, "gpu_us": t.gpu_us.median, "call_us": t.call_us.median,
                                    "method": t.method}
                        out.append(row)
        del w_up, w_down
        if device == "cuda":
            torch.cuda.empty_cache()
    return out


def collective_rank(rank: int, world: int, sizes: list[int], reps: int) -> dict:
    """A rank's part of a collective sweep (for ``lib.parallel.dist.run``): for each collective of
    ``COLLECTIVES`` and each size in bytes, ``reps`` timed calls on a buffer of that many bytes (bf16 on a
    GPU, float32 on the CPU), each started after a barrier; returns {kind: this rank's median time per
    size (us)}. On a GPU each call is timed by CUDA events around it, on the CPU by the host's clock."""
    import statistics
    import time

    import torch.distributed as dist

    cuda = dist.get_backend() == "nccl"
    dt = torch.bfloat16 if cuda else torch.float32
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    out = {}
    for kind in COLLECTIVES:
        out[kind] = []
        for nbytes in sizes:
            n = max(world, nbytes // dt.itemsize // world * world)  # an all-to-all splits the buffer evenly
            buf = torch.randn(n, device=dev).to(dt)
            res = torch.empty_like(buf)
            if kind == "all_reduce":
                def call(buf=buf):
                    dist.all_reduce(buf)
            else:
                def call(buf=buf, res=res):
                    dist.all_to_all_single(res, buf)
            for _ in range(2):
                call()
            times = []
            for _ in range(reps):
                dist.barrier()
                if cuda:
                    torch.cuda.synchronize()
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    call()
                    b.record()
                    b.synchronize()
                    times.append(a.elapsed_time(b) * 1e3)
                else:
                    t0 = time.perf_counter()
                    call()
                    times.append((time.perf_counter() - t0) * 1e6)
            out[kind].append(statistics.median(times))
    return out


def measure_collectives(params: dict, device: str) -> dict:
    """All-reduce and all-to-all over each world size of ``params["collectives"]["worlds"]`` that this machine
    has the devices for, at every size of ``params["collectives"]["sizes"]`` (bytes): NCCL on GPUs, gloo on
    the CPU. Rows {"kind", "world", "bytes", "us"} (the slowest rank's median), and "pending": the world
    sizes a GPU machine of this size cannot run (fewer GPUs than ranks), named, never dropped silently."""
    from lib.parallel import dist as pdist

    c = params["collectives"]
    have = torch.cuda.device_count() if device == "cuda" else max(c["worlds"])
    rows, pending = [], []
    for w in c["worlds"]:
        if w > have:
            pending.append({"world": w, "why": f"needs {w} GPUs, this machine has {have}"})
            continue
        per_rank = pdist.run(collective_rank, w, c["sizes"], c["reps"], backend="nccl" if device == "cuda" else "gloo")
        for kind in COLLECTIVES:
            for i, nbytes in enumerate(c["sizes"]):
                rows.append({"kind": kind, "world": w, "bytes": nbytes, "us": max(r[kind][i] for r in per_rank)})
    return {"rows": rows, "pending": pending}


def measure(params: dict, device: str) -> dict:
    """The chapter's run: one rank's TP step and EP expert work on this device, and the collectives the machine
    has the GPUs for (see each ``measure_*``). The sharded step and the EP layer are checked against the whole
    model by the test suite, with gloo ranks on the CPU."""
    require(params, PARAMS)
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    return {"tp_rank": measure_tp_rank(params, device),
            "ep_rank": measure_ep_rank(params, device), "collectives": measure_collectives(params, device)}


# ---------------------------------------------------------------------------- the analysis

def tp_rank_table(rows: list[dict], a: decode_step.Analysis, kernel_alpha_us: float) -> pd.DataFrame:
    """One rank's step at each TP size and shape: GPU time (median of the rounds) and the rounds' spread,
    the prediction of ``tp_step`` without its all-reduces, and measured over predicted."""
    df = pd.DataFrame(rows)
    out = []
    for (B, L, tp), g in df.groupby(["B", "L", "tp"]):
        gpu = g["gpu_us"].astype(float)
        pred = tp_step(a, kernel_alpha_us, int(B), int(L), int(tp), 0.0, 1.0)
        pred = float(pred[pred["part"] != "all-reduces"]["predicted (us)"].sum(skipna=False))
        med = float(gpu.median())
        out.append({"B": int(B), "L": int(L), "tp": int(tp), "GPU time (us)": med,
                    "round spread": float((gpu.max() - gpu.min()) / med), "call time (us)": float(g["call_us"].median()),
                    "predicted (us)": pred, "measured / predicted": med / pred})
    return pd.DataFrame(out)


def ep_table(rows: list[dict], *, b: int, BW_GBps: float, P_TFLOPs: float, kernel_alpha_us: float) -> pd.DataFrame:
    """Per model, routing and world size: the most loaded rank's rows over the mean (median over the draws),
    the predicted hot-rank slowdown (``hot_rank_slowdown`` of ``expert_rank_us``; median over the draws and
    for the first draw) and, for the first draw, the measured one (the slowest rank's GPU time over the
    mean rank's, a rank without rows counting as its fixed costs)."""
    df = pd.DataFrame(rows)
    df["predicted (us)"] = [expert_rank_us(r, a, K, I_, b=b, BW_GBps=BW_GBps, P_TFLOPs=P_TFLOPs,
                                           kernel_alpha_us=kernel_alpha_us)
                            for r, a, K, I_ in zip(df["rows"], df["active experts"], df["K"], df["I"])]
    out = []
    for (E, routing, w), g in df.groupby(["E", "routing", "world"]):
        per_draw = g.groupby("draw")
        pred = per_draw["predicted (us)"].agg(lambda t: t.max() / t.mean())
        rows_ratio = per_draw["rows"].agg(lambda t: t.max() / t.mean())
        first = g[g["draw"] == g["draw"].min()]
        t = first["gpu_us"].astype(float).fillna(first["predicted (us)"]) if "gpu_us" in first else first["predicted (us)"]
        out.append({"E": int(E), "routing": routing, "world": int(w), "rows max / mean": float(rows_ratio.median()),
                    "predicted slowdown": float(pred.median()), "predicted (first draw)": float(pred.iloc[0]),
                    "measured (first draw)": float(t.max() / t.mean()),
                    "hot rank GPU time (us)": float(first["gpu_us"].astype(float).max()) if "gpu_us" in first else float("nan")})
    return pd.DataFrame(out)


# the H200 SXM datasheet: 900 GB/s of NVLink per GPU, both directions together (a bound on the bus bandwidth,
# set against the measured one); the all-reduce latencies the prediction is drawn over
NVLINK_GBPS = {"nvidia-h200": 900.0}
AR_LATENCIES_US = (1.0, 2.0, 5.0, 10.0, 20.0, 40.0)
