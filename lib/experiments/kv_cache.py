"""Chapter 3's experiment: how fast each path reads the KV cache in one decode step of attention.

The notebook defines what is compared at one shape, as three functions of an input set ``x``
(``Inputs``): ``plans(x)``, the kernel's launches planned once (``DecodeAttention``); ``paths(x, plans,
params)``, {path: call} of the attention paths, each returning the output [B, H_q, d] (or, for a split
pass alone, its partial results); ``floors(x)``, {path: call taking a launch} of the read-only kernels,
each returning partial sums of the bytes it read. ``measure`` runs them over the sweep:

1. Correctness first (``check_ragged``): the kernel on ragged batches (lengths 1, the full context,
   one past a page boundary, random ones), for every page size and group size, into an output with a
   NaN guard row on either side; the error against float32 attention over the gathered cache.
2. Every shape (B, L, H_kv) of ``Bs`` x ``Ls`` x ``Hkvs`` whose K and V (in 2-byte elements) stay within
   ``max_bytes`` (``measure_shape``): fresh random inputs, as many sets as ``timing.rotation`` asks for
   to hold four times the L2 (one on the CPU), each also copied into pages of ``page`` tokens in random
   order. Each path is checked on the first set against ``decode_attention.reference`` (the first two
   requests; a split pass's partials combined by hand) and stops the run when wrong, then its kernels
   are listed by the profiler and it is timed (``timing.bench``: GPU time and call time) over the
   rotation. Each read-only kernel is checked against the sum of K and V and timed in each launch of
   ``READ_LAUNCHES``, the fastest kept. At the worked example's shape (``seed``) the plain function
   ``decode_attention``, which plans its launch on every call, is timed too: the host time planning saves.
3. Page sizes (``measure_pages``): the default launch on one cache laid out contiguously and in pages of
   each size of ``page_sweep``, at its shapes, each page size timed in pairs against the contiguous layout.
4. Paging in pairs (``measure_paging``): at every shape with L >= ``paging.min_L``, the default launch on
   the contiguous cache against the same cache in pages laid out in order and in random orders, timed
   in alternating pairs (``timing.paired``), so that drift falls on both alike; and the read-only kernel
   over each layout against the contiguous read, in pairs the same way.
5. Short contexts (``measure_short``): SDPA, the kernel on pages and the read-only kernel over the same
   pages at one (B, H_kv), over short contexts, timed in rounds whose order alternates.

Every loop is bounded by the parameters. ``sweep(size)`` gives the parameters of a "full" run (the H200's)
or a "smoke" run (seconds on a CPU, in Triton's interpreter).

Chapters: 3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lib import costs
from lib.bench import profile, timing
from lib.kernels import decode_attention as da
from lib.kernels import stream

# the read-only kernels' launches (programs, block, warps, eviction hint), the fastest of its list taken per
# shape: the launches that were fastest somewhere in the tuning runs
# (results/nvidia-h200/tuning/decode-attention-reads.json)
READ_LAUNCHES = {
    "read-only": [(1024, 4096, 4, ""), (8192, 2048, 4, ""), (4096, 8192, 4, "evict_first"),
                  (4096, 2048, 8, "evict_first")],
    "read-only paged 16": [(1024, 4096, 4, ""), (2048, 4096, 4, "evict_first"), (4096, 2048, 8, "evict_first"),
                           (4096, 8192, 8, "evict_first")],
}
LAUNCH_KEYS = ("programs", "block", "num_warps", "evict")
UNPLANNED = "kernel paged 16, unplanned"  # the plain function at the seed's shape


class WrongResult(AssertionError):
    """A path's output differs from the reference: the run stops before timing it."""


def sweep(size: str) -> dict:
    """The parameters of a "full" run (the H200's) or a "smoke" run (seconds on a CPU)."""
    if size == "full":
        return {"Hq": 32, "d": 128, "dtype": "bfloat16", "Bs": [1, 8, 64], "Ls": [512, 2048, 4096, 16384, 131072],
                "Hkvs": [32, 8, 1], "max_bytes": 16 * 2**30, "max_naive_bytes": 8 * 2**30, "page": 16,
                "page_sweep": {"pages": [1, 16, 64, 256], "pairs": 9, "shapes": [[8, 4096, 8], [8, 16384, 8], [1, 131072, 8],
                                                                    [64, 16384, 8]]},
                "check": {"B": 8, "L": 32768, "pages": [1, 16, 64, 256], "Hkvs": [32, 8, 4, 1]},
                "paging": {"min_L": 16384, "layouts": 3, "pairs": 15},
                "short": {"B": 64, "H_kv": 1, "Ls": [128, 256, 384, 512, 768, 1024], "rounds": 3},
                "seed": [8, 4096, 8], "reps": 15, "target_ms": 1.0}
    if size == "smoke":  # one shape (the seed's) with every path; each other sweep at its smallest
        return {"Hq": 4, "d": 16, "dtype": "float32", "Bs": [1], "Ls": [32], "Hkvs": [1], "max_bytes": 2**20,
                "max_naive_bytes": 2**20, "page": 16,
                "page_sweep": {"pages": [1, 16], "pairs": 1, "shapes": [[1, 32, 1]]},
                "check": {"B": 3, "L": 40, "pages": [1, 16], "Hkvs": [4, 1]},
                "paging": {"min_L": 32, "layouts": 1, "pairs": 1},
                "short": {"B": 1, "H_kv": 1, "Ls": [16, 32], "rounds": 1},
                "seed": [1, 32, 1], "reps": 1, "target_ms": 0.2}
    raise ValueError(f"size must be 'full' or 'smoke', got {size!r}")


# ---------------------------------------------------------------------------- inputs and checks

@dataclass
class Inputs:
    """One input set of a shape [B, L, H_kv] (Q: its K and V bytes): the query ``q`` [B, H_q, d], the dense
    cache ``k``, ``v`` [B, H_kv, L, d] with its block table ``dense_bt`` (one page per request), the same cache
    in pages ``kc``, ``vc`` placed in random order with their block table ``bt`` and its pages in table order
    ``pages`` (flattened), and the lengths ``lens`` (all L)."""

    shape: list
    Q: int
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kc: torch.Tensor
    vc: torch.Tensor
    bt: torch.Tensor
    pages: torch.Tensor
    dense_bt: torch.Tensor
    lens: torch.Tensor


def kv_bytes(B: int, L: int, H_kv: int, p: dict) -> int:
    """Q_KV of a shape in the run's dtype."""
    return costs.kv_step_bytes(B, L, H_kv, p["d"], torch.finfo(getattr(torch, p["dtype"])).bits // 8)


def random_qkv(B, L, H_kv, p, dev, gen):
    """Fresh random q [B, H_q, d] and a dense cache k, v [B, H_kv, L, d] in the run's dtype."""
    dt = getattr(torch, p["dtype"])
    q = torch.randn(B, p["Hq"], p["d"], device=dev, generator=gen).to(dt)
    k = torch.randn(B, H_kv, L, p["d"], device=dev, generator=gen).to(dt)
    v = torch.randn(B, H_kv, L, p["d"], device=dev, generator=gen).to(dt)
    return q, k, v


def input_sets(B, L, H_kv, p, dev, gen, l2) -> list[Inputs]:
    """As many input sets as hold four times the L2 (``timing.rotation``; one where ``l2`` is 0), each
    with its cache also in pages of ``p["page"]`` tokens in random order."""
    nbytes = kv_bytes(B, L, H_kv, p)
    sets = []
    for _ in range(timing.rotation(nbytes, l2) if l2 else 1):
        q, k, v = random_qkv(B, L, H_kv, p, dev, gen)
        kc, bt = da.paginate(k, p["page"])
        vc, _ = da.paginate(v, p["page"], block_table=bt)
        sets.append((q, k, v, kc, vc, bt))
    lens = torch.full((B,), L, dtype=torch.int32, device=dev)
    dense_bt = da.dense_as_paged(sets[0][1])[1]
    return [Inputs([B, L, H_kv], nbytes, q, k, v, kc, vc, bt, bt.flatten(), dense_bt, lens)
            for q, k, v, kc, vc, bt in sets]


def rel_err(out, ref) -> float:
    """Relative Frobenius error of ``out`` against ``ref``, in float64."""
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def tolerance(p: dict) -> float:
    """The largest relative error a path may have against the float32 reference in the run's dtype."""
    return 1e-2 if p["dtype"] == "bfloat16" else 1e-4


def check_output(path: str, out, ref, p: dict, where: str) -> float:
    """The relative error of a path's output (its first ``len(ref)`` requests) against the reference; a
    tuple of partial results (acc, m, l) is combined first (``decode_attention.combine_partials``).
    Raises ``WrongResult`` above ``tolerance(p)`` (NaN included)."""
    if isinstance(out, tuple):
        out = da.combine_partials(*out)
    err = rel_err(out[: len(ref)], ref)
    if not err < tolerance(p):
        raise WrongResult(f"{path} at {where}: relative error {err:.2e} against the float32 reference, more than "
                          f"{tolerance(p):g}; the path computes something else than attention")
    return err


def kv_sum(x: Inputs) -> tuple[float, int]:
    """The sum of every element of K and V of an input set, in float64, and how many elements they hold."""
    return (x.k.double().sum() + x.v.double().sum()).item(), x.k.numel() + x.v.numel()


def check_sum(path: str, partial: torch.Tensor, want: tuple[float, int], where: str) -> None:
    """A read-only kernel's partial sums must total ``want`` (``kv_sum``: the sum of the elements it was to
    read, and their number), to rounding: 1e-3 per square root of the elements. Raises ``WrongResult``
    otherwise."""
    total, n = want
    got = partial.double().sum().item()
    if not abs(got - total) <= 1e-3 * math.sqrt(n) + 1e-3:
        raise WrongResult(f"{path} at {where}: its partial sums total {got:.6g}, the elements it reads sum to "
                          f"{total:.6g}; it skipped or repeated some of them")


def bench(fns, p: dict, dev: str) -> dict:
    """GPU time and call time of a rotation of calls (``timing.bench``), as stored."""
    return timing.bench(fns, device=dev, reps=p["reps"], target_ms=p["target_ms"]).to_dict()


# ---------------------------------------------------------------------------- the sweeps

def prepare(B, L, H_kv, p, dev, gen, l2, plans, paths):
    """A shape's input sets, the float32 reference over the first set's first two requests, the kernel's
    plans (``plans`` of the first set) and every set's calls (``paths``)."""
    data = input_sets(B, L, H_kv, p, dev, gen, l2)
    x, few = data[0], min(B, 2)
    ref = da.reference(x.q[:few], x.kc, x.vc, x.bt[:few], x.lens[:few])
    plan = plans(x)
    return data, ref, plan, [paths(d, plan, p) for d in data]


def measure_shape(B, L, H_kv, p, dev, gen, l2, plans, paths, floors) -> list[dict]:
    """Every path at one shape, checked, then timed over a rotation of input sets: one row each."""
    data, ref, plan, calls = prepare(B, L, H_kv, p, dev, gen, l2, plans, paths)
    x, where = data[0], f"B={B} L={L} H_kv={H_kv}"
    shape = {"B": B, "L": L, "H_kv": H_kv, "Q": x.Q, "sets": len(data)}
    rows = []
    for path in calls[0]:
        fs = [c[path] for c in calls]
        out = fs[0]()
        err = check_output(path, out, ref, p, where)
        pl = plan.get(path)
        rows.append({"path": path, **shape, "err": err, "kernels": profile.kernel_names(fs[0], dev),
                     "timing": bench(fs, p, dev),
                     "splits": pl.splits if pl else out[0].shape[2] if isinstance(out, tuple) else None,
                     "combine": pl.combine if pl else None,
                     "tiles_in_flight": pl.tiles_in_flight() if pl else None,
                     "block_n": pl.meta["BLOCK_N"] if pl else None,
                     "warps": pl.options["num_warps"] if pl else None})
    reads, want = [floors(d) for d in data], kv_sum(x)
    for path in reads[0]:
        if path not in READ_LAUNCHES:
            raise ValueError(f"floors() names {path!r}, which has no launches in READ_LAUNCHES "
                             f"({sorted(READ_LAUNCHES)}): add its launches there or rename the path")
        best = None
        for config in READ_LAUNCHES[path]:
            launch = dict(zip(LAUNCH_KEYS, config))
            check_sum(path, reads[0][path](launch), want, f"{where}, launch {config}")
            t = bench([lambda f=r[path], launch=launch: f(launch) for r in reads], p, dev)
            if best is None or t["gpu_us"]["median"] < best[0]["gpu_us"]["median"]:
                best = (t, config)
        rows.append({"path": path, **shape, "err": None, "kernels": None, "timing": best[0], "splits": None,
                     "read_config": list(best[1])})
    if [B, L, H_kv] == p["seed"]:
        t = bench([lambda d=d: da.decode_attention(d.q, d.kc, d.vc, d.bt, d.lens) for d in data], p, dev)
        rows.append({"path": UNPLANNED, **shape, "err": None, "kernels": None, "timing": t, "splits": None})
    return rows


def _release(dev: str) -> None:
    if dev == "cuda":
        torch.cuda.empty_cache()


def measure_pages(B, L, H_kv, p, dev, gen, l2) -> list[dict]:
    """The default launch on one cache laid out contiguously ("dense") and in pages of each size of the page
    sweep, placed in random order. The contiguous layout is timed alone (``bench``); each page size is timed
    against it in ``page_sweep.pairs`` pairs of samples taken in alternation (``timing.paired``), so that
    drift between the two falls on both: one row per layout, the paged ones with the pairs' statistics."""
    nbytes = kv_bytes(B, L, H_kv, p)
    sets = timing.rotation(nbytes, l2) if l2 else 1
    lens = torch.full((B,), L, dtype=torch.int32, device=dev)
    dense = [random_qkv(B, L, H_kv, p, dev, gen) for _ in range(sets)]
    dense_bt = da.dense_as_paged(dense[0][1])[1]
    contiguous = da.DecodeAttention(*dense[0], dense_bt, lens)
    few, where = min(B, 2), f"B={B} L={L} H_kv={H_kv}"
    q, k, v = dense[0]
    ref = da.reference(q[:few], k, v, dense_bt[:few], lens[:few])
    shape = {"B": B, "L": L, "H_kv": H_kv, "Q": nbytes}
    run_dense = [lambda d=d: contiguous(*d, dense_bt, lens) for d in dense]
    err = check_output("page dense", run_dense[0](), ref, p, where)
    rows = [{**shape, "page": "dense", "err": err, "timing": bench(run_dense, p, dev)}]
    for page in p["page_sweep"]["pages"]:
        data = []
        for q, k, v in dense:
            kc, bt = da.paginate(k, page)
            vc, _ = da.paginate(v, page, block_table=bt)
            data.append((q, kc, vc, bt))
        plan = da.DecodeAttention(*data[0], lens)
        err = check_output(f"page {page}", plan(*data[0], lens, check=True), ref, p, where)
        pair = timing.paired(run_dense, [lambda d=d, plan=plan: plan(*d, lens) for d in data], device=dev,
                             pairs=p["page_sweep"]["pairs"], target_ms=p["target_ms"])
        rows.append({**shape, "page": page, "err": err, "pairs": pair.to_dict()})
        del data, plan, kc, vc, bt  # one paged copy in memory at a time
        _release(dev)
    del dense
    _release(dev)
    return rows


def measure_paging(B, L, H_kv, p, dev, gen, l2) -> list[dict]:
    """Pages of ``p["page"]`` against the contiguous cache, paired: the default launch over the contiguous
    cache, and over the same K and V copied into pages laid out in the contiguous order (an identity block
    table: only the lookups differ) and in ``paging.layouts`` random orders (their own generator, seeded by
    the shape). Each layout is timed against the contiguous cache in ``paging.pairs`` pairs of samples
    taken in alternation (``timing.paired``), and so is the read-only kernel over the same layout against
    the contiguous read, one launch for both: one row per layout, with both pairs' statistics."""
    nbytes = kv_bytes(B, L, H_kv, p)
    sets = timing.rotation(nbytes, l2) if l2 else 1
    dense = [random_qkv(B, L, H_kv, p, dev, gen) for _ in range(sets)]
    lens = torch.full((B,), L, dtype=torch.int32, device=dev)
    dense_bt = da.dense_as_paged(dense[0][1])[1]
    contiguous = da.DecodeAttention(*dense[0], dense_bt, lens)
    per = -(-L // p["page"])
    in_order = torch.arange(B * per, dtype=torch.int32, device=dev).view(B, per)
    order_gen = torch.Generator().manual_seed(B * 1000003 + L * 101 + H_kv)
    few = min(B, 2)
    rows = []
    for layout in ["in order"] + [f"random {i + 1}" for i in range(p["paging"]["layouts"])]:
        data = []
        for q, k, v in dense:
            kc, bt = da.paginate(k, p["page"], generator=order_gen, block_table=in_order if layout == "in order" else None)
            vc, _ = da.paginate(v, p["page"], block_table=bt)
            data.append((q, kc, vc, bt))
        plan = da.DecodeAttention(*data[0], lens)
        q, kc, vc, bt = data[0]
        ref = da.reference(q[:few], kc, vc, bt[:few], lens[:few])
        err = check_output(f"paging {layout}", plan(q, kc, vc, bt, lens, check=True), ref, p, f"B={B} L={L} H_kv={H_kv}")
        pair = timing.paired([lambda d=d: contiguous(*d, dense_bt, lens) for d in dense],
                             [lambda d=d, plan=plan: plan(*d, lens) for d in data],
                             device=dev, pairs=p["paging"]["pairs"], target_ms=p["target_ms"])
        # what the memory system alone charges for this layout: the same bytes read with no arithmetic, from the
        # contiguous cache and page by page in this block table's order, one launch for both, timed in pairs
        check_sum(f"read-only paging {layout}", stream.read_pages_sum(kc, vc, bt.flatten(), check=True),
                  (dense[0][1].double().sum().item() + dense[0][2].double().sum().item(), 2 * dense[0][1].numel()),
                  f"B={B} L={L} H_kv={H_kv}")
        read = timing.paired([lambda d=d: stream.read_sum(d[1], d[2]) for d in dense],
                             [lambda d=d: stream.read_pages_sum(d[1], d[2], d[3].flatten(), check=False) for d in data],
                             device=dev, pairs=p["paging"]["pairs"], target_ms=p["target_ms"])
        rows.append({"B": B, "L": L, "H_kv": H_kv, "layout": layout, "Q": nbytes, "sets": sets, "err": err,
                     "pairs": pair.to_dict(), "read_pairs": read.to_dict(), "block_n": plan.meta["BLOCK_N"],
                     "splits": plan.splits})
        del data
    del dense
    _release(dev)
    return rows


SHORT_PATHS = ("sdpa", "kernel paged 16")  # of paths(); with the floor "read-only paged 16" in its default launch


def measure_short(p, dev, gen, l2, plans, paths, floors) -> list[dict]:
    """Short contexts at one (B, H_kv): SDPA, the kernel's default launch on pages and the read-only kernel
    over the same pages (``SHORT_PATHS`` and the paged floor), each checked, then timed in ``short.rounds``
    rounds whose order alternates, so that drift falls on all three alike. One row per path and length,
    with every round's timing; the kernel's row also holds its launch."""
    s = p["short"]
    B, H_kv = s["B"], s["H_kv"]
    rows = []
    for L in s["Ls"]:
        data, ref, plan, calls = prepare(B, L, H_kv, p, dev, gen, l2, plans, paths)
        x, where = data[0], f"short B={B} L={L} H_kv={H_kv}"
        fns = {path: [c[path] for c in calls] for path in SHORT_PATHS}
        for path, fs in fns.items():
            check_output(path, fs[0](), ref, p, where)
        reads = [floors(d)["read-only paged 16"] for d in data]
        check_sum("read-only paged 16", reads[0]({}), kv_sum(x), where)
        fns["read-only paged 16"] = [lambda f=f: f({}) for f in reads]
        rounds = {path: [] for path in fns}
        for r in range(s["rounds"]):
            for path in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                rounds[path].append(bench(fns[path], p, dev))
        kernel = plan["kernel paged 16"]
        launch = {"head_block": kernel.meta["BLOCK_G"], "block_n": kernel.meta["BLOCK_N"], "splits": kernel.splits,
                  "warps": kernel.options["num_warps"]}
        rows += [{"path": path, "B": B, "L": L, "H_kv": H_kv, "Q": x.Q, "sets": len(data), "rounds": rounds[path],
                  "launch": launch if path == "kernel paged 16" else None} for path in fns]
        del data, calls, fns
    _release(dev)
    return rows


def check_ragged(p, dev, gen) -> list[dict]:
    """The kernel on ragged batches: lengths 1, the full context, one past a page boundary and random ones,
    for every page size and group size of ``check``, written into an output with a NaN-filled guard row on
    either side. One row per case: its error against the float32 reference and whether the guard held."""
    c = p["check"]
    dt = getattr(torch, p["dtype"])
    rows = []
    for H_kv in c["Hkvs"]:
        for page in c["pages"]:
            lens = torch.randint(1, c["L"] + 1, (c["B"],), generator=torch.Generator().manual_seed(page * 131 + H_kv))
            lens[0], lens[1], lens[2] = 1, c["L"], page * max(1, (c["L"] // 3) // page) + 1
            q, k, v = random_qkv(c["B"], c["L"], H_kv, p, dev, gen)
            kc, bt = da.paginate(k, page)
            vc, _ = da.paginate(v, page, block_table=bt)
            lens = lens.to(torch.int32).to(dev)
            guard = torch.full((c["B"] + 2, p["Hq"], p["d"]), float("nan"), device=dev, dtype=dt)
            out = da.decode_attention(q, kc, vc, bt, lens, out=guard[1:-1])
            ok_guard = bool(torch.isnan(guard[0]).all() and torch.isnan(guard[-1]).all() and not torch.isnan(out).any())
            err = rel_err(out, da.reference(q, kc, vc, bt, lens))
            rows.append({"H_kv": H_kv, "G": p["Hq"] // H_kv, "page": page, "lens": lens.tolist(), "err": err,
                         "guard_intact": ok_guard})
            del q, k, v, kc, vc
    return rows


def measure(p: dict, device: str, plans, paths, floors) -> dict:
    """The whole experiment (the module's docstring gives the algorithm): the ragged checks, every shape's
    paths, the page sizes, the paging pairs and the short contexts, as the notebook stores them."""
    gen = torch.Generator(device=device).manual_seed(0)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size if device == "cuda" else 0
    check = check_ragged(p, device, gen)
    print("correctness done", flush=True)
    shapes = [(B, L, H_kv) for H_kv in p["Hkvs"] for B in p["Bs"] for L in p["Ls"]
              if costs.kv_step_bytes(B, L, H_kv, p["d"], 2) <= p["max_bytes"]]
    points = []
    for H_kv in p["Hkvs"]:
        for B, L, _ in [s for s in shapes if s[2] == H_kv]:
            points += measure_shape(B, L, H_kv, p, device, gen, l2, plans, paths, floors)
            _release(device)  # each shape's buffers freed to the driver: the next shape allocates afresh
        print(f"H_kv={H_kv} done", flush=True)
    pages = [r for B, L, H_kv in p["page_sweep"]["shapes"] for r in measure_pages(B, L, H_kv, p, device, gen, l2)]
    print("page sizes done", flush=True)
    paging = [r for B, L, H_kv in shapes if L >= p["paging"]["min_L"]
              for r in measure_paging(B, L, H_kv, p, device, gen, l2)]
    print("paging done", flush=True)
    short = measure_short(p, device, gen, l2, plans, paths, floors)
    print("short contexts done", flush=True)
    return {"l2_bytes": l2, "check": check, "points": points, "pages": pages, "paging": paging, "short": short}



# The analysis (chapter 3's page): what a serving engine plans from these formulas. Nothing below measures.


def weights_bytes(model: dict = costs.LLAMA3_8B, b: int = 2) -> dict:
    """The bytes of a model's weights in b-byte elements: ``read`` per decode step (every linear layer and the
    LM head, which multiply the step's activations by their whole matrices) and ``resident`` on the GPU
    (those and the embedding table, of which a step only gathers the rows of its tokens). Norms are left out
    (a few hundred thousand weights)."""
    linears = model["layers"] * sum(k * n for k, n in model["linears"].values())
    table = model["vocab"] * model["hidden"]  # the LM head and the embedding table are each vocab x hidden
    return {"linears": b * linears, "read": b * (linears + table), "resident": b * (linears + 2 * table)}


def kv_capacity_tokens(memory_bytes: float, utilization: float, resident_bytes: float, per_token_bytes: float,
                       block_size: int = 16) -> int:
    """Tokens of KV cache that fit on a GPU of ``memory_bytes`` when an engine may use ``utilization`` of it
    (vLLM's ``gpu_memory_utilization``) and the weights take ``resident_bytes``, in whole blocks of
    ``block_size`` tokens: floor((utilization * memory - weights) / (per_token * block_size)) * block_size.
    An upper bound: an engine also sets memory aside for activations and CUDA graphs (vLLM measures it by
    a profiling run at start-up)."""
    if not 0 < utilization <= 1:
        raise ValueError(f"utilization must lie in (0, 1] (a fraction of the GPU's memory), got {utilization!r}")
    if per_token_bytes <= 0 or block_size < 1:
        raise ValueError(f"per_token_bytes and block_size must be positive, got {per_token_bytes} and {block_size}")
    free = utilization * memory_bytes - resident_bytes
    if free < per_token_bytes * block_size:
        raise ValueError(f"the weights ({resident_bytes / 2**30:.1f} GiB) leave no room for one block of KV cache in "
                         f"{utilization} of {memory_bytes / 2**30:.1f} GiB: raise the utilization, or use a GPU "
                         "with more memory (or several, with tensor parallelism)")
    return int(free // (per_token_bytes * block_size)) * block_size


def max_batch(capacity_tokens: int, context: int, block_size: int = 16) -> int:
    """Requests of ``context`` tokens each whose KV blocks fit in ``capacity_tokens`` (whole blocks per
    request: a request's last block is allocated whole)."""
    if context < 1:
        raise ValueError(f"context must be at least one token, got {context!r}")
    return (capacity_tokens // block_size) // -(-context // block_size)


def predicted_us(nbytes: float, read_bw_GBps: float, launch_us: float) -> float:
    """The chapter's prediction for one decode-attention call: its K and V bytes at the best streaming read
    rate chapter 0 measured, plus the launch floor of one kernel in a CUDA graph."""
    return nbytes / read_bw_GBps / 1e3 + launch_us
