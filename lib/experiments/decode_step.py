"""Chapter 7's experiment: one decode step of Llama-3-8B (``lib.llama``), its paths measured side by side,
its kernels listed, its prefill timed.

``measure(params, device, paths)`` builds the model with random weights (``lib.llama.random_model``) and,
for each (batch B, context L) of ``params["shapes"]``, a paged pool holding B requests of L tokens of
random K and V (pages of ``block`` tokens in a shuffled order, as a pool that has served many requests
holds them). ``paths(m, device)`` gives the notebook's ways of running one step (each called as
``m.decode`` is, ``(tokens, pool, table, lens)``, returning the logits); for each shape:

1. every path's logits are compared with the first path's (the unfused step), and at the first shape
   also with the same step in float32 on a float32 copy of the model and pool: largest differences and
   argmax agreement. A path whose logits differ from the first path's by more than
   ``lib.model.LOGITS_TOLERANCE`` raises (a wrong path is never timed);
2. every path is timed with ``lib.bench.timing.bench`` (GPU time by CUDA-graph replay, call time eager)
   in ``rounds`` interleaved rounds, the order reversed every other round;
3. every path's kernels are listed with their device times (``lib.bench.trace.kernel_times``).

At the first shape, ``greedy_steps`` steps are also run teacher-forced (every path gets the first path's
token as input) to compare greedy tokens: at each step both argmaxes and the first path's top-2 gap.
Then a prefill of each length of ``params["prefill"]`` at batch 1 (the whole prompt, the last token's
logits) is timed the same way.

Chapter: 7.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from lib import llama, model
from lib.bench import timing, trace
from lib.experiments import require

PARAMS = ("config", "dtype", "shapes", "block", "prefill", "reps", "target_ms", "rounds", "greedy_steps", "seed")
WARMUP = {"cuda": 3, "cpu": 1}


def sweep(size: str) -> dict:
    """"full": Llama-3-8B in bf16 at (B, L) = (1, 1024) and (64, 4096), prefills of 1k and 8k; "smoke": the
    tiny configuration in float32, seconds on a CPU."""
    if size == "full":
        return {"config": "8b", "dtype": "bfloat16", "shapes": [[1, 1024], [64, 4096]], "block": 16,
                "prefill": [1024, 8192], "reps": 5, "target_ms": 20.0, "rounds": 3, "greedy_steps": 64, "seed": 0}
    if size == "smoke":
        return {"config": "tiny", "dtype": "float32", "shapes": [[2, 12]], "block": 4, "prefill": [16], "reps": 1,
                "target_ms": 0.2, "rounds": 1, "greedy_steps": 4, "seed": 0}
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
    m32 = model.TinyLlama.__new__(model.TinyLlama)
    m32.cfg, m32.dtype, m32.device = m.cfg, torch.float32, m.device
    m32.embed, m32.norm, m32.head = m.embed.float(), m.norm.float(), m.head.float()
    m32.layers = [{k: v.float() for k, v in L.items()} for L in m.layers]
    m32._inv_freq = m._inv_freq
    p32 = m32.new_pool(pool.num_blocks, pool.block_size)
    p32.k.copy_(pool.k)
    p32.v.copy_(pool.v)
    out = m32.decode(tokens, p32, table, lens, check=False).float()
    del m32, p32
    return out


def _greedy(m, fns: dict, pool, tokens, table, lens, steps: int) -> list[dict]:
    """Teacher-forced greedy steps: each path gets the first path's previous token; per step, each path's
    argmax and the first path's gap between its two largest logits."""
    names = list(fns)
    rows, tok, lens = [], tokens.clone(), lens.clone()
    for s in range(steps):
        out = {n: fns[n](tok, pool, table, lens).float() for n in names}
        top2 = out[names[0]].topk(2, dim=-1).values
        rows.append({"step": s, "gap": float((top2[:, 0] - top2[:, 1]).min()),
                     **{f"argmax {n}": out[n].argmax(-1).tolist() for n in names}})
        tok = out[names[0]].argmax(-1)
        lens = lens + 1
    return rows


def measure(params: dict, device: str, paths: Callable) -> dict:
    """Run the sweep (see the module) with ``paths(m, device) -> {name: step}``; the first path is the
    reference the others are checked against. Returns {"steps", "greedy", "prefill", "config"}."""
    require(params, PARAMS)
    if not callable(paths):
        raise TypeError("paths must be a function (model, device) -> {name: step}; see chapter 7's notebook")
    p = params
    cfg = llama.CONFIGS[p["config"]]
    dt = getattr(torch, p["dtype"])
    gen = torch.Generator(device=device).manual_seed(p["seed"])
    m = llama.random_model(cfg, seed=p["seed"], dtype=dt, device=device)
    fns = paths(m, device)
    if len(fns) < 2 or not all(callable(f) for f in fns.values()):
        raise ValueError("paths() must give at least two callables, the reference (unfused) step first")
    names = list(fns)
    tol = model.LOGITS_TOLERANCE[p["dtype"], device]
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
            greedy = _greedy(m, fns, pool, tokens, table, lens, p["greedy_steps"])
        rounds = {n: [] for n in names}
        for r in range(p["rounds"]):
            for n in (names if r % 2 == 0 else names[::-1]):
                t = timing.bench([lambda n=n, tk=tokens, pl=pool, tb=table, ln=lens: fns[n](tk, pl, tb, ln)], device=device,
                                 reps=p["reps"],
                                 warmup=WARMUP[device], target_ms=p["target_ms"])
                rounds[n].append(t.to_dict())
        kernels = {n: trace.kernel_times(lambda n=n, tk=tokens, pl=pool, tb=table, ln=lens: fns[n](tk, pl, tb, ln), device)
                   for n in names}
        steps.append({"B": B, "L": L, "checks": checks, "rounds": rounds, "kernels": kernels})
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
