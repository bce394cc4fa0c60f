"""Chapter 7's experiment: one decode step of Llama-3-8B (``lib.models``), its paths measured side by side,
its kernels listed, its prefill timed.

``measure(params, device, paths)`` builds the model with random weights (``lib.models.Llama.random``) and,
for each (batch B, context L) of ``params["shapes"]``, a paged pool holding B requests of L tokens of
random K and V (pages of ``block`` tokens in a shuffled order, as a pool that has served many requests
holds them). ``paths(m, device)`` gives the notebook's ways of running one step (each called as
``m.decode`` is, ``(tokens, pool, table, lens)``, returning the logits); for each shape:

1. every path's logits are compared with the first path's (the unfused step), and at the first shape
   also with the same step in float32 on a float32 copy of the model and pool: largest differences and
   argmax agreement. A path whose logits differ from the first path's by more than
   ``lib.models.LOGITS_TOLERANCE`` raises (a wrong path is never timed);
2. every path is timed with ``lib.bench.timing.bench`` (GPU time by CUDA-graph replay, call time eager)
   in ``rounds`` interleaved rounds, the order reversed every other round;
3. every path is timed again with greedy sampling (its own fused sampling, ``greedy``, where it has one,
   else the argmax of its logits), after checking that it picks the argmax of its logits;
4. and with top-p sampling (``top_p``, ``temperature``): its own (``sample``, ``lib.kernels.sampling``'s
   search without a sort) where it has one, else the sorting path engines write in PyTorch
   (``sampling.top_p_torch``), after checking the kernels against the float64 oracle on the same uniforms
   (``top_p_draws`` draws per request) and that every path draws inside the kept set;
5. every path's kernels are listed with their device times (``lib.bench.trace.kernel_times``).

At the first shape, every path also generates ``greedy_steps`` tokens greedily, free-running, on an output
head made to give a clear argmax (``_successor_greedy``: each token's successor under a random permutation
of the vocabulary leads), to compare the paths' tokens. Then a prefill of each length of
``params["prefill"]`` at batch 1 (the whole prompt, the last token's logits) is timed the same way.

Chapter: 7.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import pandas as pd
import torch

import lib.bench.kernel_kinds as kernel_kinds
from lib import models
from lib.bench import timing, trace
from lib.experiments import require
from lib.kernels import sampling

PARAMS = ("config", "dtype", "shapes", "block", "prefill", "reps", "target_ms", "rounds", "greedy_steps", "top_p",
          "temperature", "top_p_draws", "seed")
WARMUP = {"cuda": 3, "cpu": 1}
RESIDUAL_SCALE = 0.25  # the greedy comparison's scale of the layers' O and down projections


def sweep(size: str) -> dict:
    """"full": Llama-3-8B in bf16 at (B, L) = (1, 1024) and (64, 4096), prefills of 1k and 8k; "smoke": the
    tiny configuration in float32, seconds on a CPU."""
    if size == "full":
        return {"config": "8b", "dtype": "bfloat16", "shapes": [[1, 1024], [64, 4096]], "block": 16,
                "prefill": [1024, 8192], "reps": 5, "target_ms": 20.0, "rounds": 3, "greedy_steps": 64, "top_p": 0.9,
                "temperature": 0.8, "top_p_draws": 8, "seed": 0}
    if size == "smoke":
        return {"config": "tiny", "dtype": "float32", "shapes": [[1, 12], [2, 20]], "block": 4, "prefill": [16], "reps": 1,
                "target_ms": 0.2, "rounds": 1, "greedy_steps": 4, "top_p": 0.9, "temperature": 0.8, "top_p_draws": 2, "seed": 0}
    raise ValueError(f"size must be 'full' or 'smoke', got {size!r}")


def prefill_flops(cfg, n: int) -> float:
    """FLOPs of a prefill of n tokens that returns the last token's logits: two per layer weight per token,
    causal attention (4 H_q d per position attended, j positions for the j-th token, per layer), and the
    output head once."""
    layer_weights = cfg.layers * (cfg.hidden * cfg.head_dim * (2 * cfg.heads + 2 * cfg.kv_heads) + 3 * cfg.hidden * cfg.mlp)
    return 2 * n * layer_weights + 2 * cfg.layers * cfg.heads * cfg.head_dim * n * (n + 1) + 2 * cfg.vocab * cfg.hidden


def _pool(m, B: int, L: int, block: int, gen: torch.Generator):
    """A pool of B requests of L tokens of random K and V, pages shuffled: (pool, table [B, pages] int32)."""
    pages = -(-L // block)
    pool = m.new_pool(B * pages, block)
    pool.k.normal_(generator=gen)
    pool.v.normal_(generator=gen)
    order = torch.randperm(B * pages, generator=gen, device=gen.device)
    return pool, order.reshape(B, pages).to(torch.int32).contiguous()


def _compare(a: torch.Tensor, b: torch.Tensor) -> dict:
    a, b = a.float(), b.float()
    return {"max_abs": float((a - b).abs().max()), "ref_absmax": float(b.abs().max()),
            "argmax_agree": float((a.argmax(-1) == b.argmax(-1)).float().mean())}


def _float32_reference(m, pool, tokens, table, lens) -> torch.Tensor:
    """The unfused step in float32 on a float32 copy of the model and the pool."""
    m32 = m.with_parts(models.EAGER).to(torch.float32)
    p32 = m32.new_pool(pool.num_blocks, pool.block_size)
    p32.k.copy_(pool.k)
    p32.v.copy_(pool.v)
    out = m32.decode(tokens, p32, table, lens, check=False).float()
    del m32, p32
    return out


def _successor_greedy(m, logits_fn, samplers: dict, pool, tokens, table, lens, steps: int, gen) -> list[dict]:
    """Free-running greedy steps on weights that give a clear argmax: the output head's column perm[t] set to
    token t's embedding times 0.02 (the head's own scale), for a random permutation perm of the vocabulary,
    and the layers' writes into the residual stream (the O and down projections) scaled by
    ``RESIDUAL_SCALE``, so that the stream still carries the input token's embedding at the end and the
    step points at its successor perm[t] (with the random layers at full scale, 32 of them drown it). Every
    path generates ``steps`` tokens from the same start (each rewrites the same K/V slots
    with its own); per step each path's tokens, the reference's lead (largest logit minus the second, over
    the largest, smallest over the batch) and the share of its tokens that are the previous one's successor."""
    w, vocab = m.weights, m.cfg.vocab  # shared by every path of the same weights: changed in place, restored below
    perm = torch.randperm(vocab, generator=gen, device=gen.device)
    head = w.head.clone()
    w.head[:, perm] = w.embed.T * 0.02
    for L in w.layers:  # exact in binary floating point, undone below
        L["wo"].mul_(RESIDUAL_SCALE)
        L["wd"].mul_(RESIDUAL_SCALE)
    try:
        rows = [{"step": s} for s in range(steps)]
        tok, ln = tokens.clone(), lens.clone()
        for s in range(steps):
            out = logits_fn(tok, pool, table, ln).float()
            top2 = out.topk(2, dim=-1).values
            nxt = out.argmax(-1)
            rows[s].update({"lead": float(((top2[:, 0] - top2[:, 1]) / top2[:, 0].abs()).min()),
                            "successor": float((nxt == perm[tok]).float().mean())})
            tok, ln = nxt, ln + 1
        for n, f in samplers.items():
            tok, ln = tokens.clone(), lens.clone()
            for s in range(steps):
                tok, ln = f(tok, pool, table, ln), ln + 1
                rows[s][f"tokens {n}"] = tok.tolist()
    finally:
        w.head.copy_(head)
        for L in w.layers:
            L["wo"].div_(RESIDUAL_SCALE)
            L["wd"].div_(RESIDUAL_SCALE)
    return rows


def _top_p_checks(fns: dict, samplers: dict, args, top_p, temperature, draws: int, gen) -> dict:
    """The top-p kernels against the float64 oracle on the first path's logits with the same uniforms
    (``draws`` draws per request): the share of equal tokens; each path's top-p sampler's draws: the share
    inside the kernels' kept set of its own logits; and the kept set's size."""
    logits = next(iter(fns.values()))(*args)
    same = 0
    for _ in range(draws):
        u = torch.rand(logits.shape, generator=gen, device=gen.device)
        same += int((sampling.top_p_sample(logits, top_p, temperature, uniform=u)
                     == sampling.top_p_reference(logits, top_p, temperature, u)).sum())
    out = {"oracle_agree": same / (draws * logits.shape[0]),
           "kept": float(sampling.top_p_mask(logits, top_p, temperature).sum(1).float().median())}
    for n, f in fns.items():
        kept = sampling.top_p_mask(f(*args), top_p, temperature)
        inside = [float(kept.gather(1, samplers[n](*args)[:, None]).float().mean()) for _ in range(draws)]
        out[f"inside {n}"] = sum(inside) / draws
    return out


def _interleaved(fns: dict, args: tuple, p: dict, device: str) -> dict:
    """Each of ``fns`` called on ``args``, timed by ``timing.bench`` in ``p["rounds"]`` interleaved rounds, the
    order reversed every other round: {name: [one timing dict per round]}."""
    names, out = list(fns), {n: [] for n in fns}
    for r in range(p["rounds"]):
        for n in (names if r % 2 == 0 else names[::-1]):
            t = timing.bench([lambda f=fns[n]: f(*args)], device=device, reps=p["reps"], warmup=WARMUP[device],
                             target_ms=p["target_ms"])
            out[n].append(t.to_dict())
    return out


def measure(params: dict, device: str, paths: Callable) -> dict:
    """Run the sweep (see the module) with ``paths(m, device) -> {name: step}``; the first path is the
    reference the others are checked against. Returns {"steps", "greedy", "prefill", "config"}."""
    require(params, PARAMS)
    if not callable(paths):
        raise TypeError("paths must be a function (model, device) -> {name: step}; see chapter 7's notebook")
    p = params
    cfg = models.CONFIGS[p["config"]]
    dt = getattr(torch, p["dtype"])
    gen = torch.Generator(device=device).manual_seed(p["seed"])
    m = models.Llama.random(cfg, seed=p["seed"], dtype=dt, device=device)
    fns = paths(m, device)
    if len(fns) < 2 or not all(callable(f) for f in fns.values()):
        raise ValueError("paths() must give at least two callables, the reference (unfused) step first")
    names = list(fns)
    tol = models.LOGITS_TOLERANCE[p["dtype"], device]
    steps, greedy = [], []
    for i, (B, L) in enumerate(p["shapes"]):
        extra = p["greedy_steps"] if i == 0 else 0  # room for the greedy steps' tokens
        pool, table = _pool(m, B, L + extra, p["block"], gen)
        lens = torch.full((B,), L, dtype=torch.int32, device=device)
        tokens = torch.randint(0, cfg.vocab, (B,), generator=gen, device=device)
        ref = fns[names[0]](tokens, pool, table, lens).float()
        checks = {n: _compare(fns[n](tokens, pool, table, lens), ref) for n in names[1:]}
        for n, c in checks.items():
            if not c["max_abs"] <= tol * c["ref_absmax"]:
                raise AssertionError(f"path {n!r}, B={B} L={L}: logits differ from {names[0]!r}'s by {c['max_abs']:.4g} "
                                     f"(at most {tol} of the largest, {tol * c['ref_absmax']:.4g}): a wrong path is not timed")
        if i == 0:
            r32 = _float32_reference(m, pool, tokens, table, lens)
            checks["float32"] = {n: _compare(fns[n](tokens, pool, table, lens), r32) for n in names}
        args = (tokens, pool, table, lens)
        rounds = _interleaved(fns, args, p, device)
        # each path with greedy sampling: its own fused sampling where it has one (``greedy``), else an argmax
        samplers = {n: getattr(fns[n], "greedy", None) or (lambda *a, f=fns[n]: f(*a).argmax(-1)) for n in names}
        for n, sample in samplers.items():
            if not torch.equal(sample(tokens, pool, table, lens), fns[n](tokens, pool, table, lens).argmax(-1)):
                raise AssertionError(f"path {n!r}, B={B} L={L}: its greedy sampling picks other tokens than the argmax "
                                     "of its logits")
        greedy_rounds = _interleaved(samplers, args, p, device)
        if i == 0:
            greedy = _successor_greedy(m, fns[names[0]], samplers, pool, tokens, table, lens, p["greedy_steps"], gen)
        # each path with top-p sampling: its own (``sample``, no sort) where it has one, else the sorting path
        top_p = torch.full((B,), p["top_p"], device=device)
        temp = torch.full((B,), p["temperature"], device=device)
        seed = torch.tensor([p["seed"]], device=device, dtype=torch.int64)
        top_p_fns = {n: (lambda *a, f=fns[n], tp=top_p, tt=temp, sd=seed: f.sample(*a, tp, tt, sd))
                     if hasattr(fns[n], "sample")
                     else (lambda *a, f=fns[n], tp=top_p, tt=temp: sampling.top_p_torch(f(*a), tp, tt)) for n in names}
        top_p_check = _top_p_checks(fns, top_p_fns, args, top_p, temp, p["top_p_draws"], gen)
        if top_p_check["oracle_agree"] < 0.9:
            raise AssertionError(f"B={B} L={L}: the top-p kernels draw the float64 oracle's token for only "
                                 f"{top_p_check['oracle_agree']:.3f} of the requests")
        top_p_rounds = _interleaved(top_p_fns, args, p, device)
        kernels = {n: trace.kernel_times(lambda n=n, tk=tokens, pl=pool, tb=table, ln=lens: fns[n](tk, pl, tb, ln), device)
                   for n in names}
        steps.append({"B": B, "L": L, "checks": checks, "rounds": rounds, "greedy_rounds": greedy_rounds,
                      "top_p_rounds": top_p_rounds, "top_p_check": top_p_check, "kernels": kernels})
        print(f"B={B} L={L} done", flush=True)
        del pool, table
        if device == "cuda":
            torch.cuda.empty_cache()
    prefill = []
    for n in p["prefill"]:
        pool, table = _pool(m, 1, n, p["block"], gen)
        tokens = torch.randint(0, cfg.vocab, (n,), generator=gen, device=device)
        blocks = table[0].long()
        t = timing.bench([lambda tk=tokens, pl=pool, bl=blocks: m.prefill(tk, pl, bl, 0, last_only=True)], device=device,
                         reps=p["reps"],
                         warmup=WARMUP[device], target_ms=p["target_ms"])
        prefill.append({"n": n, "timing": t.to_dict(), "flops": prefill_flops(cfg, n)})
        del pool, table
    return {"steps": steps, "greedy": greedy, "prefill": prefill,
            "config": {k: getattr(cfg, k) for k in ("vocab", "hidden", "layers", "heads", "kv_heads", "head_dim", "mlp")}}


# ---------------------------------------------------------------------------- analysis

PARTS = ("layer weights", "output head", "attention (K/V)", "small operators", "between kernels")


def kernel_parts(kernels: list[dict]) -> dict:
    """A step's profiled kernels ({"name", "us"}, in order) split into the parts of ``PARTS`` (all but the
    time between kernels): the GEMM kernels at the end of the list are the output head's, the other GEMMs
    the layers'; the attention kernels; everything else. Returns {part: {"kernels", "us"}}."""
    tail = len(kernels)
    while tail and kernel_kinds.kind(kernels[tail - 1]["name"]) == "gemm":
        tail -= 1
    out = {p: {"kernels": 0, "us": 0.0} for p in PARTS[:-1]}
    for i, k in enumerate(kernels):
        kind = kernel_kinds.kind(k["name"])
        if kind == "gemm":
            part = "output head" if i >= tail else "layer weights"
        else:
            part = "attention (K/V)" if kind == "attention" else "small operators"
        out[part]["kernels"] += 1
        out[part]["us"] += k["us"]
    return out


def step_bytes(cfg, B: int, L: int, b: int = 2) -> dict:
    """Bytes one decode step must read: the layers' weights and the output head once per step, each
    request's K and V (L tokens, every layer), and the new tokens' embedding rows."""
    per_layer = cfg.hidden * cfg.head_dim * (cfg.heads + 2 * cfg.kv_heads) + cfg.heads * cfg.head_dim * cfg.hidden \
        + 3 * cfg.hidden * cfg.mlp
    return {"layer weights": b * cfg.layers * per_layer, "output head": b * cfg.vocab * cfg.hidden,
            "attention (K/V)": b * B * L * cfg.layers * 2 * cfg.kv_heads * cfg.head_dim,
            "embedding rows": b * B * cfg.hidden}


def step_flops(cfg, B: int, L: int) -> float:
    """FLOPs of one decode step: two per weight per token, and attention over L positions (4 H_q d per
    position and layer)."""
    per_layer = cfg.hidden * cfg.head_dim * (cfg.heads + 2 * cfg.kv_heads) + cfg.heads * cfg.head_dim * cfg.hidden \
        + 3 * cfg.hidden * cfg.mlp
    return 2 * B * (cfg.layers * per_layer + cfg.vocab * cfg.hidden) + 4 * B * L * cfg.layers * cfg.heads * cfg.head_dim


class Analysis:
    """Chapter 7's tables from the data (``measure``), its params and chapter 0's ceilings ``c``.

    - ``paths``: per shape and path, GPU time and call time (medians over the rounds of each round's
      median), the spread of the rounds, kernels per step, and the GPU time over the floor;
    - ``floor``: per shape, the bytes, FLOPs and the floor max(Q/BW, F/P) on chapter 0's read rate and bf16
      rate;
    - ``parts``: per shape and path, each part of ``PARTS``: predicted time (bytes over the read rate, at
      least one launch time per kernel; small operators: one launch time each; nothing between kernels)
      and measured time (the profiler's kernel times; between kernels: the GPU time minus their sum);
    - ``prefill``: each prefill's GPU time and its FLOPs' share of the bf16 rate;
    - ``numbers()``: what the page quotes."""

    def __init__(self, data: dict, params: dict, c: dict):
        missing = [k for k in ("bf16_tflops", "read_bw_GBps", "launch_graph_us") if k not in c]
        if missing:
            raise ValueError(f"chapter 0's ceilings lack {missing}: pass lib.bench.ceilings.load(...)")
        self.P, self.BW, self.t0 = c["bf16_tflops"] * 1e12, c["read_bw_GBps"] * 1e9, c["launch_graph_us"]
        self.params, self.cfg = params, models.CONFIGS[params["config"]]
        b = 2 if params["dtype"] == "bfloat16" else 4
        nan = float("nan")
        rows, floors, parts = [], [], []
        for s in data["steps"]:
            B, L = s["B"], s["L"]
            q = step_bytes(self.cfg, B, L, b)
            f = step_flops(self.cfg, B, L)
            floor_us = max(sum(q.values()) / self.BW, f / self.P) * 1e6
            floors.append({"B": B, "L": L, "bytes (GB)": sum(q.values()) / 1e9, "TFLOPs": f / 1e12,
                           "read floor (us)": sum(q.values()) / self.BW * 1e6, "compute floor (us)": f / self.P * 1e6,
                           "floor (us)": floor_us})
            for name, rounds in s["rounds"].items():
                gpu = [r["gpu_us"]["median"] for r in rounds]
                call = [r["call_us"]["median"] for r in rounds]
                ks = s["kernels"].get(name) or []  # none on a CPU: no profile there
                gmed = statistics.median(gpu)
                rows.append({"B": B, "L": L, "path": name, "GPU time (us)": gmed,
                             "call time (us)": statistics.median(call),
                             "round spread": (max(gpu) - min(gpu)) / gmed, "kernels": len(ks) if ks else nan,
                             "GPU time / floor": gmed / floor_us})
                measured = kernel_parts(ks) if ks else None
                for part in PARTS:
                    if part == "between kernels":
                        pred, n = 0.0, nan
                        meas = gmed - sum(v["us"] for v in measured.values()) if measured else nan
                    else:
                        n = measured[part]["kernels"] if measured else nan
                        meas = measured[part]["us"] if measured else nan
                        pred = n * self.t0 if part == "small operators" else max(q[part] / self.BW * 1e6, n * self.t0)
                    parts.append({"B": B, "L": L, "path": name, "part": part, "kernels": n,
                                  "predicted (us)": pred, "measured (us)": meas})
        self.paths = pd.DataFrame(rows)
        self.floor = pd.DataFrame(floors)
        self.parts = pd.DataFrame(parts)
        pre = []
        for r in data["prefill"]:
            t = r["timing"]["gpu_us"]["median"]
            pre.append({"tokens": r["n"], "GPU time (ms)": t / 1e3, "call time (ms)": r["timing"]["call_us"]["median"] / 1e3,
                        "TFLOP/s": r["flops"] / t / 1e6, "of bf16 rate": r["flops"] / t / 1e6 / c["bf16_tflops"]})
        self.prefill = pd.DataFrame(pre)

    def time(self, B: int, L: int, path: str, column: str = "GPU time (us)") -> float:
        p = self.paths
        return float(p[(p["B"] == B) & (p["L"] == L) & (p["path"] == path)][column].iloc[0])

    def part_errors(self, B: int, L: int, path: str) -> pd.Series:
        """|measured / predicted - 1| of each part with a prediction (all but the time between kernels)."""
        t = self.parts[(self.parts["B"] == B) & (self.parts["L"] == L) & (self.parts["path"] == path)
                       & (self.parts["part"] != "between kernels")].set_index("part")
        return (t["measured (us)"] / t["predicted (us)"] - 1).abs()

    def numbers(self) -> dict:
        (B1, L1), (B2, L2) = [tuple(s) for s in self.params["shapes"][:2]]
        fl = self.floor.set_index(["B", "L"])
        out = {}
        for tag, B, L in (("b1", B1, L1), ("b64", B2, L2)):
            floor = float(fl.loc[(B, L), "floor (us)"])
            out.update({f"step_floor_{tag}_ms": floor / 1e3,
                        f"step_fused_{tag}_ms": self.time(B, L, "fused") / 1e3,
                        f"step_graph_{tag}_ms": self.time(B, L, "unfused") / 1e3,
                        f"step_compiled_{tag}_ms": self.time(B, L, "compiled") / 1e3,
                        f"step_eager_{tag}_ms": self.time(B, L, "unfused", "call time (us)") / 1e3,
                        f"step_over_floor_{tag}": self.time(B, L, "fused") / floor,
                        f"graph_over_floor_{tag}": self.time(B, L, "unfused") / floor,
                        f"compiled_over_floor_{tag}": self.time(B, L, "compiled") / floor,
                        f"fused_vs_compile_{tag}": self.time(B, L, "compiled") / self.time(B, L, "fused"),
                        f"eager_over_graph_{tag}": self.time(B, L, "unfused", "call time (us)") / self.time(B, L, "unfused"),
                        f"step_bytes_{tag}_GB": float(fl.loc[(B, L), "bytes (GB)"]),
                        f"kv_{tag}_GB": step_bytes(self.cfg, B, L)["attention (K/V)"] / 1e9,
                        f"kernels_unfused_{tag}": self.time(B, L, "unfused", "kernels"),
                        f"kernels_fused_{tag}": self.time(B, L, "fused", "kernels"),
                        f"kernels_compiled_{tag}": self.time(B, L, "compiled", "kernels"),
                        f"step_model_median_abs_err_{tag}": float(self.part_errors(B, L, "fused").median())})
            pt = self.parts[(self.parts["B"] == B) & (self.parts["L"] == L) & (self.parts["path"] == "fused")].set_index("part")
            w = float(pt.loc["layer weights", "measured (us)"]) + float(pt.loc["output head", "measured (us)"])
            out[f"gemm_read_frac_{tag}"] = (step_bytes(self.cfg, B, L)["layer weights"]
                                            + step_bytes(self.cfg, B, L)["output head"]) / self.BW * 1e6 / w
            out[f"gemm_{tag}_ms"] = w / 1e3
            out[f"small_{tag}_us"] = float(pt.loc["small operators", "measured (us)"])
            out[f"attention_{tag}_us"] = float(pt.loc["attention (K/V)", "measured (us)"])
            out[f"gaps_{tag}_us"] = float(pt.loc["between kernels", "measured (us)"])
        out["step_model_median_abs_err"] = max(out["step_model_median_abs_err_b1"], out["step_model_median_abs_err_b64"])
        pre = self.prefill.set_index("tokens")
        out["prefill_8k_frac_of_bf16"] = float(pre["of bf16 rate"].iloc[-1])
        out["prefill_1k_frac_of_bf16"] = float(pre["of bf16 rate"].iloc[0])
        out["prefill_8k_ms"] = float(pre["GPU time (ms)"].iloc[-1])
        out["prefill_1k_ms"] = float(pre["GPU time (ms)"].iloc[0])
        return out


FUSIONS = ("RMSNorm and residual add", "RoPE and the K/V write", "SwiGLU", "copies", "other")


def fusion_groups(kernels: list[dict]) -> dict:
    """A step's small operators (neither GEMM nor attention) grouped by the fusion that replaces them:
    {group: {"kernels", "us"}} over ``FUSIONS``. By name: the norms (PyTorch's layer-norm kernel, the fused
    ``_rmsnorm_kernel``); SwiGLU (SiLU, the product launched right after it, the fused ``_silu_mul_kernel``);
    device-to-device copies; RoPE and the K/V write (the fused ``_rope_write_kernel``, and PyTorch's
    elementwise, concatenation and index-copy kernels); anything else (the embedding's gather)."""
    out = {g: {"kernels": 0, "us": 0.0} for g in FUSIONS}
    after_silu = False
    for k in kernels:
        name = k["name"]
        if kernel_kinds.kind(name) != "other":
            after_silu = False
            continue
        if "layer_norm" in name or "_rmsnorm_kernel" in name:
            group = "RMSNorm and residual add"
        elif "silu" in name or (after_silu and "Mul" in name):
            group = "SwiGLU"
        elif "Memcpy" in name:
            group = "copies"
        elif any(w in name for w in ("_rope_write_kernel", "elementwise", "Cat", "index_copy", "CUDAFunctor_add")):
            group = "RoPE and the K/V write"
        else:
            group = "other"
        after_silu = "silu" in name and "_silu_mul" not in name
        out[group]["kernels"] += 1
        out[group]["us"] += k["us"]
    return out
