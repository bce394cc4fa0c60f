"""Chapter 0, the machine: the sweep that measures the GPU's ceilings, and the tables drawn from it.

The notebook defines the calls that are timed (``ops``: two ways to copy a buffer, a read, a matrix
product, a one-element add); this module runs them over the sizes of ``sweep(size)``:

- copy and kernel copy: for each buffer size, one pair of float32 buffers of uniform random values,
  copied call after call, so a pair that fits in the L2 is served from it. Below ``ceilings.HBM_FACTOR``
  times the L2, the copy is timed once more over ``timing.rotation`` pairs whose total is four times
  the L2 ("copy_cold"): each call then finds its source in HBM. Every copy must equal its source
  before it is timed.
- read: a sum over the buffer into one number, checked against a float64 sum; and over the buffers
  that only HBM can serve (``ceilings.HBM_FACTOR`` times the L2), the book's read-only Triton kernel
  (``lib.kernels.stream.read_sum``, no arithmetic but the sum) at each launch of ``read_launches``, so
  that the read ceiling is the best streaming read measured, not one library's reduction.
- matmul: n x n x n products of standard normal values in each dtype; TF32 is allowed only for
  "tf32" (``torch.set_float32_matmul_precision``, set back to "highest" afterwards). The first rows
  are compared with a float64 product before timing, and the relative error is kept: it also shows
  whether TF32 was on. On a GPU the SM clock, power and temperature are read right after the timing.
- zeros: the bf16 product at ``zeros_n`` once on random inputs and once on all-zero inputs.
- matmul shapes: bf16 products of the rectangular shapes ``matmul_shapes`` ([M, K, N]: the layer
  shapes later chapters time), so that the bf16 ceiling is the best product measured, square or not.
- launch: a one-element add; its GPU time is one kernel in a CUDA graph, its call time one eager
  launch.

Every timing is ``lib.bench.timing.bench``: GPU time (CUDA-graph replay) and call time (eager calls),
medians of ``reps`` samples of about ``target_ms`` each. The analysis functions turn the data into the
chapter's tables (bandwidth over footprint, matmul rates, call time over GPU time) and the numbers its
page quotes (``findings``).

Chapter: 0 (the machine); its ceilings (``lib.bench.ceilings``) are what chapters 1-6 compare against.
"""

from __future__ import annotations

import pandas as pd
import torch

from lib.bench import ceilings, timing
from lib.bench.device import clocks
from lib.experiments import require

MiB = 1 << 20
DTYPES = ["bf16", "fp16", "tf32", "fp32"]
TORCH_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32, "fp32": torch.float32}
MAX_REL_ERR = {"bf16": 1e-2, "fp16": 2e-3, "tf32": 2e-3, "fp32": 1e-5}  # against a float64 reference
OPS = ("copy", "copy_kernel", "read", "read_kernel", "matmul", "launch")  # the calls ``measure`` needs, by name
PARAMS = ("buffer_bytes", "matmul_n", "zeros_n", "dtypes", "reps", "target_ms", "read_launches", "matmul_shapes")
# data key -> (label, bytes touched per buffer byte): a copy reads and writes its buffer, a read reads it
METHODS = {
    "copy": ("memcpy", 2),
    "copy_kernel": ("kernel copy", 2),
    "copy_cold": ("memcpy, L2 defeated", 2),
    "read": ("read", 1),
    "read_kernel": ("read kernel", 1),
}
# the read-only kernel's launches (programs, block, warps, eviction hint): those fastest somewhere in the
# decode-attention tuning runs (results/nvidia-h200/tuning/decode-attention-reads.json)
READ_LAUNCHES = [[1024, 4096, 4, ""], [8192, 2048, 4, ""], [4096, 8192, 4, "evict_first"], [4096, 2048, 8, "evict_first"]]
# the Llama-3-8B layer shapes (qkv, o, gate_up, down) at two token counts: [M, K, N]
LAYER_SHAPES = [[m, k, n] for m in (2048, 16384) for k, n in ((4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096))]


def sweep(size: str) -> dict:
    """The sizes measured: buffer bytes for copy and read, n for the n x n x n products."""
    if size == "full":
        return {
            "buffer_bytes": [m * MiB for m in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 2048, 4096)],
            "matmul_n": [256, 512, 1024, 2048, 4096, 6144, 8192, 12288, 16384],
            "zeros_n": 8192,
            "dtypes": list(DTYPES),
            "reps": 30,
            "target_ms": 2.0,
            "read_launches": READ_LAUNCHES,
            "matmul_shapes": LAYER_SHAPES,
        }
    if size == "smoke":
        return {
            "buffer_bytes": [64 << 10, 256 << 10, 1 * MiB, 4 * MiB],
            "matmul_n": [64, 128, 256],
            "zeros_n": 128,
            "dtypes": list(DTYPES),
            "reps": 5,
            "target_ms": 0.2,
            "read_launches": [[4, 1024, 4, ""]],
            "matmul_shapes": [[64, 128, 96]],
        }
    raise ValueError(f"size={size!r}: the sweep has a 'full' and a 'smoke' size")


# ---------------------------------------------------------------------------- measuring

def _wrong(what: str) -> AssertionError:
    return AssertionError(f"{what}: the call computes a wrong result, and a wrong call is not timed; fix the op")


def measure_copy(op, nbytes: int, device: str, p: dict, l2: int = 0) -> dict:
    """Time ``op(dst, src)`` on float32 buffers of ``nbytes``; with ``l2`` > 0, rotate over enough pairs
    that their total is four times the L2."""
    pairs = timing.rotation(2 * nbytes, l2) if l2 else 1
    srcs = [torch.rand(nbytes // 4, device=device) for _ in range(pairs)]
    dsts = [torch.empty_like(s) for s in srcs]
    for d, s in zip(dsts, srcs):
        op(d, s)
        if not torch.equal(d, s):
            raise _wrong(f"copy of {nbytes} bytes")
    fns = [lambda d=d, s=s: op(d, s) for d, s in zip(dsts, srcs)]
    t = timing.bench(fns, device=device, reps=p["reps"], target_ms=p["target_ms"])
    return {"bytes": nbytes, "pairs": pairs, "timing": t.to_dict()}


def measure_read(op, nbytes: int, device: str, p: dict) -> dict:
    """Time ``op(x, s)``, a sum of ``nbytes`` of float32 into the scalar ``s``, checked in float64."""
    x = torch.rand(nbytes // 4, device=device)
    s = torch.empty((), device=device)
    op(x, s)
    ref = x.double().sum()
    rel_err = abs(s.double().item() - ref.item()) / ref.item()
    if not rel_err < 1e-4:
        raise _wrong(f"read of {nbytes} bytes (relative error {rel_err:.2e})")
    t = timing.bench(lambda: op(x, s), device=device, reps=p["reps"], target_ms=p["target_ms"])
    return {"bytes": nbytes, "rel_err": rel_err, "timing": t.to_dict()}


def measure_read_kernel(op, nbytes: int, launch: list, device: str, p: dict) -> dict:
    """Time ``op(a, b, out, launch)``: the read-only kernel over two float32 halves of ``nbytes``, its
    per-program partial sums into ``out``, their total checked against a float64 sum."""
    programs, block, warps, evict = launch
    kw = dict(programs=programs, block=block, num_warps=warps, evict=evict)
    a = torch.rand(nbytes // 8, device=device)
    b = torch.rand(nbytes // 8, device=device)
    out = op(a, b, None, kw)
    ref = a.double().sum() + b.double().sum()
    rel_err = abs(out.double().sum().item() - ref.item()) / ref.item()
    if not rel_err < 1e-4:
        raise _wrong(f"read kernel over {nbytes} bytes, launch {launch} (relative error {rel_err:.2e})")
    t = timing.bench(lambda: op(a, b, out, kw), device=device, reps=p["reps"], target_ms=p["target_ms"])
    return {"bytes": nbytes, "launch": list(launch), "rel_err": rel_err, "timing": t.to_dict()}


def measure_matmul_shape(op, shape: list, device: str, p: dict) -> dict:
    """Time ``op(a, b, c)``, c = a b with a [M, K] and b [K, N] in bf16, after checking its first rows."""
    m, k, n = shape
    a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
    c = torch.empty(m, n, device=device, dtype=torch.bfloat16)
    op(a, b, c)
    rows = min(m, 256)
    ref = a[:rows].double() @ b.double()
    rel_err = ((c[:rows].double() - ref).norm() / ref.norm()).item()
    if not rel_err <= MAX_REL_ERR["bf16"]:
        raise _wrong(f"bf16 {m}x{k}x{n} (relative error {rel_err:.2e})")
    t = timing.bench(lambda: op(a, b, c), device=device, reps=p["reps"], target_ms=p["target_ms"])
    after = clocks() if device == "cuda" else None
    return {"shape": [m, k, n], "rel_err": rel_err, "timing": t.to_dict(), "clocks": after}


def measure_matmul(op, dtype: str, n: int, device: str, p: dict, zeros: bool = False) -> dict:
    """Time ``op(a, b, c)``, c = a b for n x n matrices of ``dtype``, after checking its first rows."""
    torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")
    try:
        make = torch.zeros if zeros else torch.randn
        a = make(n, n, device=device, dtype=TORCH_DTYPE[dtype])
        b = make(n, n, device=device, dtype=TORCH_DTYPE[dtype])
        c = torch.empty(n, n, device=device, dtype=TORCH_DTYPE[dtype])
        op(a, b, c)
        rows = min(n, 256)
        if zeros:
            rel_err = 0.0
            if c[:rows].count_nonzero().item():
                raise _wrong(f"{dtype} n={n} on zeros")
        else:
            ref = a[:rows].double() @ b.double()
            rel_err = ((c[:rows].double() - ref).norm() / ref.norm()).item()
        if not rel_err <= MAX_REL_ERR[dtype]:
            raise _wrong(f"{dtype} n={n} (relative error {rel_err:.2e}, at most {MAX_REL_ERR[dtype]:.0e} allowed)")
        t = timing.bench(lambda: op(a, b, c), device=device, reps=p["reps"], target_ms=p["target_ms"])
        after = clocks() if device == "cuda" else None  # SM clock, power, temperature right after timing
    finally:
        torch.set_float32_matmul_precision("highest")
    return {"dtype": dtype, "n": n, "zeros": zeros, "rel_err": rel_err, "timing": t.to_dict(), "clocks": after}


def measure_launch(op, device: str, p: dict) -> dict:
    """Time ``op(x, y, z)``, z = x + y on one element: the cost of one launch."""
    x, y = torch.rand(1, device=device), torch.rand(1, device=device)
    z = torch.empty_like(x)
    op(x, y, z)
    if not torch.equal(z, x + y):
        raise _wrong("one-element add")
    t = timing.bench(lambda: op(x, y, z), device=device, reps=p["reps"], target_ms=p["target_ms"], max_calls=1000)
    return {"timing": t.to_dict()}


def _check(params: dict, ops: dict) -> None:
    require(params, PARAMS)
    absent = [k for k in OPS if not callable(ops.get(k))]
    if absent:
        raise ValueError(f"ops lack callables for {absent}: give one for each of {list(OPS)} (see chapter 0's notebook)")


def measure(params: dict, device: str, ops: dict) -> dict:
    """Every measurement of chapter 0 over ``params`` (``sweep``), with the calls ``ops`` (names in ``OPS``)."""
    _check(params, ops)
    p = params
    l2 = torch.cuda.get_device_properties(0).L2_cache_size if device == "cuda" else 0
    data = {"l2_bytes": l2, "copy": [], "copy_cold": [], "copy_kernel": [], "read": [], "read_kernel": [],
            "matmul": [], "matmul_shapes": [], "zeros": [], "launch": None}
    for nbytes in p["buffer_bytes"]:
        data["copy"].append(measure_copy(ops["copy"], nbytes, device, p))
        data["copy_kernel"].append(measure_copy(ops["copy_kernel"], nbytes, device, p))
        if l2 and not ceilings.beyond_l2(2 * nbytes, l2):
            data["copy_cold"].append(measure_copy(ops["copy"], nbytes, device, p, l2=l2))
        data["read"].append(measure_read(ops["read"], nbytes, device, p))
        # the read kernel where only HBM can serve the buffer (on the CPU: the smallest buffer, to run it)
        if (ceilings.beyond_l2(nbytes, l2) if l2 else nbytes == min(p["buffer_bytes"])):
            data["read_kernel"] += [measure_read_kernel(ops["read_kernel"], nbytes, launch, device, p)
                                    for launch in p["read_launches"]]
        print(f"copy/read {nbytes / MiB:8.2f} MiB done", flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
    for dtype in p["dtypes"]:
        for n in p["matmul_n"]:
            data["matmul"].append(measure_matmul(ops["matmul"], dtype, n, device, p))
            print(f"matmul {dtype} n={n} done", flush=True)
    data["matmul_shapes"] = [measure_matmul_shape(ops["matmul"], shape, device, p) for shape in p["matmul_shapes"]]
    data["zeros"] = [measure_matmul(ops["matmul"], "bf16", p["zeros_n"], device, p, zeros=z) for z in (False, True)]
    data["launch"] = measure_launch(ops["launch"], device, p)
    return data


# ---------------------------------------------------------------------------- analysis

def bandwidth(data: dict) -> pd.DataFrame:
    """One row per copy or read: its footprint (bytes one call touches), GPU and call time, and GB/s."""
    return pd.DataFrame([
        {
            "method": label, "buffer_bytes": r["bytes"], "footprint_bytes": per * r["bytes"],
            "GPU time (us)": r["timing"]["gpu_us"]["median"],
            "GPU spread": timing.Stats.from_dict(r["timing"]["gpu_us"]).spread,
            "call time (us)": r["timing"]["call_us"]["median"],
            "GB/s": ceilings.gbps(per * r["bytes"], r["timing"]["gpu_us"]["median"]),
            "GB/s, call time": ceilings.gbps(per * r["bytes"], r["timing"]["call_us"]["median"]),
        }
        for key, (label, per) in METHODS.items() for r in fastest_launch(data.get(key, []))
    ])


def fastest_launch(rows: list) -> list:
    """Of rows measured at several launches per buffer size (the read kernel), the fastest per size;
    rows without a launch unchanged."""
    best: dict = {}
    for r in rows:
        key = r["bytes"] if "launch" in r else id(r)
        if key not in best or r["timing"]["gpu_us"]["median"] < best[key]["timing"]["gpu_us"]["median"]:
            best[key] = r
    return list(best.values())


def _clock(r: dict, key: str) -> float:
    return (r["clocks"] or {}).get(key, float("nan"))


def matmul(data: dict) -> pd.DataFrame:
    """One row per product: times, TFLOP/s (2n^3 over the GPU time), relative error, clock and power."""
    return pd.DataFrame([
        {
            "dtype": r["dtype"], "n": r["n"],
            "GPU time (us)": r["timing"]["gpu_us"]["median"],
            "GPU spread": timing.Stats.from_dict(r["timing"]["gpu_us"]).spread,
            "call time (us)": r["timing"]["call_us"]["median"],
            "TFLOP/s": ceilings.tflops(2.0 * r["n"] ** 3, r["timing"]["gpu_us"]["median"]),
            "rel. error": r["rel_err"],
            "SM clock (MHz)": _clock(r, "sm_MHz"),
            "power (W)": _clock(r, "power_W"),
        }
        for r in data["matmul"]
    ])


def zeros(data: dict) -> pd.DataFrame:
    """The bf16 product on random and on zero inputs, indexed by "random" / "zeros"."""
    return pd.DataFrame([
        {"inputs": "zeros" if r["zeros"] else "random", "n": r["n"], "GPU time (us)": r["timing"]["gpu_us"]["median"],
         "TFLOP/s": ceilings.tflops(2.0 * r["n"] ** 3, r["timing"]["gpu_us"]["median"]),
         "SM clock (MHz)": _clock(r, "sm_MHz"), "power (W)": _clock(r, "power_W")}
        for r in data["zeros"]
    ]).set_index("inputs")


def call_over_gpu(bw: pd.DataFrame, mm: pd.DataFrame, launch: timing.Timing) -> pd.DataFrame:
    """Every item timed (copies, reads, products, the launch) with its call time over its GPU time."""
    items = pd.concat([
        bw[["method", "GPU time (us)", "call time (us)"]],
        mm.assign(method="matmul")[["method", "GPU time (us)", "call time (us)"]],
        pd.DataFrame([{"method": "launch", "GPU time (us)": launch.gpu_us.median, "call time (us)": launch.call_us.median}]),
    ], ignore_index=True)
    items["call/GPU"] = items["call time (us)"] / items["GPU time (us)"]
    return items


SHORT, LONG = "GPU time <= 5 us", "GPU time >= 1 ms (memcpy aside)"


def call_over_gpu_summary(items: pd.DataFrame) -> pd.DataFrame:
    """The median call/GPU ratio of short items (GPU time <= 5 us) and of long ones (>= 1 ms; the memcpy,
    whose eager copy runs faster than in a graph, aside)."""
    short = items[items["GPU time (us)"] <= 5]
    long = items[(items["GPU time (us)"] >= 1000) & (items["method"] != "memcpy")]
    return pd.DataFrame({
        "items": [len(short), len(long)],
        "median call/GPU": [short["call/GPU"].median(), long["call/GPU"].median()],
    }, index=[SHORT, LONG])


def ridge(p_tflops: float, bw_GBps: float) -> float:
    """The ridge P / BW in FLOP per byte (TFLOP/s over GB/s, times 1000)."""
    return p_tflops * 1e3 / bw_GBps


def against_datasheet(c: dict, sheet: dict) -> pd.DataFrame:
    """Each ceiling (``lib.bench.ceilings``) beside the datasheet's figure (NaN without a datasheet).

    Two ridges: bf16 over the read rate (for read-dominated work: a linear layer reads its weights) and
    bf16 over the copy rate; the datasheet has one HBM rate, so one ridge for both.
    """
    nan = float("nan")
    ridge_sheet = ridge(sheet["bf16_tflops"], sheet["hbm_GBps"]) if sheet else nan
    rows = [
        ("copy bandwidth (GB/s)", c["copy_bw_GBps"], sheet.get("hbm_GBps", nan)),
        ("read bandwidth (GB/s)", c["read_bw_GBps"], sheet.get("hbm_GBps", nan)),
        ("bf16 matmul (TFLOP/s)", c["bf16_tflops"], sheet.get("bf16_tflops", nan)),
        ("fp16 matmul (TFLOP/s)", c["fp16_tflops"], sheet.get("fp16_tflops", nan)),
        ("tf32 matmul (TFLOP/s)", c["tf32_tflops"], sheet.get("tf32_tflops", nan)),
        ("fp32 matmul (TFLOP/s)", c["fp32_tflops"], sheet.get("fp32_tflops", nan)),
        ("ridge, bf16 / read (FLOP/byte)", ridge(c["bf16_tflops"], c["read_bw_GBps"]), ridge_sheet),
        ("ridge, bf16 / copy (FLOP/byte)", ridge(c["bf16_tflops"], c["copy_bw_GBps"]), ridge_sheet),
    ]
    return pd.DataFrame(
        [{"ceiling": k, "measured": v, "datasheet": s, "measured / datasheet": v / s} for k, v, s in rows]
    ).set_index("ceiling")


# The prediction, written from the datasheet before measuring: each rate as a band of the datasheet's figure.
PREDICTED = {
    # HBM moves data in bursts of rows; refreshing the DRAM, opening new rows and turning the bus around
    # between reads and writes cost a tenth or more of the pins' rate
    "copy": (0.85, 0.90),
    # a stream of reads alone has no read/write turnarounds: at least the copy's fraction
    "read": (0.85, 0.95),
    # the datasheet counts every tensor core at its rated clock; a long product draws enough power to pull
    # the clock down under the power limit, and the rate with it
    "bf16": (0.70, 0.80),
}


def band(value: float, low: float, high: float) -> str:
    """Where ``value`` lies against the band [low, high]: "inside", "above" or "below" (NaN: "not measured")."""
    if not value == value:  # NaN
        return "not measured"
    return "below" if value < low else "above" if value > high else "inside"


def prediction(sheet: dict) -> pd.DataFrame:
    """The predicted ceilings (``PREDICTED``) in their units: low, high and the middle of the band.

    The ridge's band follows from the others: bf16's low end over the read's high end, and the reverse.
    Empty without a datasheet (a device the book has none for).
    """
    if not sheet:
        return pd.DataFrame(columns=["quantity", "datasheet", "low", "high", "predicted"])
    (cl, ch), (rl, rh), (bl, bh) = PREDICTED["copy"], PREDICTED["read"], PREDICTED["bf16"]
    ridge_sheet = ridge(sheet["bf16_tflops"], sheet["hbm_GBps"])
    rows = [
        ("copy bandwidth (GB/s)", sheet["hbm_GBps"], cl, ch),
        ("read bandwidth (GB/s)", sheet["hbm_GBps"], rl, rh),
        ("bf16 matmul (TFLOP/s)", sheet["bf16_tflops"], bl, bh),
        ("ridge, bf16 / read (FLOP/byte)", ridge_sheet, bl / rh, bh / rl),
    ]
    return pd.DataFrame([
        {"quantity": q, "datasheet": d, "low": lo * d, "high": hi * d, "predicted": (lo + hi) / 2 * d}
        for q, d, lo, hi in rows
    ])


def against_prediction(pred: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """Each predicted quantity beside its measurement (``against_datasheet``'s "measured" column):
    measured over the middle of the band, and whether the measurement fell inside, above or below it."""
    out = pred.copy()
    out["measured"] = [summary.loc[q, "measured"] for q in pred["quantity"]]
    out["measured / predicted"] = out["measured"] / out["predicted"]
    out["band"] = [band(m, lo, hi) for m, lo, hi in zip(out["measured"], out["low"], out["high"])]
    return out[["quantity", "low", "high", "measured", "measured / predicted", "band"]]


def findings(bw: pd.DataFrame, mm: pd.DataFrame, c: dict) -> dict:
    """The quantities the chapter's page quotes and its claims check, by name:

    - ``bw_max_*``: the highest rate of any copy or read (GPU time), its method and footprint: the top
      of the bandwidth figure.
    - ``l2_peak_GBps``: the best hot copy (memcpy or kernel) whose footprint is at most half the L2;
      ``l2_edge_bytes``: the largest footprint at which a hot copy still beats HBM by 20%, where the
      L2's help ends (``l2_edge_over_l2`` relative to the L2).
    - ``cold_small_max_GBps``: the best rotated copy below half the L2; ``cold_smallest_*``: the
      smallest rotated copy.
    - ``memcpy_graph_over_eager`` / ``kernel_graph_over_eager``: GPU time over call time of copies of
      at least 1 GiB footprint (median); ``memcpy_*_big_GBps``: their bandwidth both ways.
    - ``copy_best_*``: the copy that set the bandwidth ceiling (method, footprint, spread).
    - ``read_best_*``: the read that set the read ceiling ("read": torch.sum; "read kernel": the book's
      read-only kernel), its footprint; ``read_sum_GBps``: torch.sum's best over the same footprints.
    - ``bf16_*``: the n of the best bf16 rate, its spread and clock; the largest n, its rate, clock and
      power; the highest clock seen and the largest n's clock over it (``bf16_clock_drop``).
    - ``full_clock_n``: the largest n at which bf16 and fp16 both ran within 1% of the highest clock
      (there the formats compare fairly), and fp16 over bf16 there; ``matmul_big_spread_max``: the
      largest spread of bf16 and fp16 products beyond that n.
    - relative errors of the fp32 (TF32 off) and tf32 (TF32 on) products: median, worst, best.
    """
    nan = float("nan")
    L2 = c["l2_bytes"]
    hot = bw[bw["method"].isin(["memcpy", "kernel copy"])]
    l2_edge = hot[hot["GB/s"] >= 1.2 * c["copy_bw_GBps"]]["footprint_bytes"].max() if L2 else nan
    cold = bw[bw["method"] == "memcpy, L2 defeated"]
    memcpy_big = bw[(bw["method"] == "memcpy") & (bw["footprint_bytes"] >= 1 << 30)]
    kernel_big = bw[(bw["method"] == "kernel copy") & (bw["footprint_bytes"] >= 1 << 30)]
    best_copy = hot[hot["footprint_bytes"] >= ceilings.HBM_FACTOR * L2].sort_values("GB/s").iloc[-1]
    reads = bw[bw["method"].isin(["read", "read kernel"]) & (bw["footprint_bytes"] >= ceilings.HBM_FACTOR * L2)]
    best_read = reads.sort_values("GB/s").iloc[-1]
    bf16 = mm[mm["dtype"] == "bf16"].set_index("n")
    fp16 = mm[mm["dtype"] == "fp16"].set_index("n")
    best_n = bf16["TFLOP/s"].idxmax()
    largest_n = bf16.index.max()
    top_clock = bf16["SM clock (MHz)"].max()
    full = [n for n in bf16.index if min(bf16.loc[n, "SM clock (MHz)"], fp16.loc[n, "SM clock (MHz)"]) >= 0.99 * top_clock]
    full_n = max(full) if full else nan
    big_half = mm[mm["dtype"].isin(["bf16", "fp16"]) & (mm["n"] > (full_n if full else 0))]
    rel_err = {dt: mm[mm["dtype"] == dt]["rel. error"] for dt in ("tf32", "fp32")}
    top = bw.sort_values("GB/s").iloc[-1]  # the highest point of the bandwidth figure (GPU time)
    return {
        "read_best_method": best_read["method"],
        "read_best_footprint_bytes": best_read["footprint_bytes"],
        "read_sum_GBps": reads[reads["method"] == "read"]["GB/s"].max(),
        "bw_max_GBps": top["GB/s"],
        "bw_max_method": top["method"],
        "bw_max_footprint_bytes": top["footprint_bytes"],
        "l2_peak_GBps": hot[hot["footprint_bytes"] <= L2 / 2]["GB/s"].max() if L2 else nan,
        "l2_edge_bytes": l2_edge,
        "l2_edge_over_l2": l2_edge / L2 if L2 else nan,
        "cold_small_max_GBps": cold[cold["footprint_bytes"] <= L2 / 2]["GB/s"].max() if len(cold) else nan,
        "cold_smallest_GBps": cold["GB/s"].iloc[0] if len(cold) else nan,
        "cold_smallest_footprint_bytes": cold["footprint_bytes"].iloc[0] if len(cold) else nan,
        "memcpy_graph_over_eager": (memcpy_big["GPU time (us)"] / memcpy_big["call time (us)"]).median(),
        "kernel_graph_over_eager": (kernel_big["GPU time (us)"] / kernel_big["call time (us)"]).median(),
        "memcpy_graph_big_GBps": memcpy_big["GB/s"].median(),
        "memcpy_eager_big_GBps": memcpy_big["GB/s, call time"].median(),
        "copy_best_method": best_copy["method"],
        "copy_best_footprint_bytes": best_copy["footprint_bytes"],
        "copy_best_spread": best_copy["GPU spread"],
        "bf16_best_n": best_n,
        "bf16_best_spread": bf16.loc[best_n, "GPU spread"],
        "bf16_best_clock_MHz": bf16.loc[best_n, "SM clock (MHz)"],
        "bf16_largest_n": largest_n,
        "bf16_largest_tflops": bf16.loc[largest_n, "TFLOP/s"],
        "bf16_largest_clock_MHz": bf16.loc[largest_n, "SM clock (MHz)"],
        "bf16_largest_power_W": bf16.loc[largest_n, "power (W)"],
        "bf16_max_clock_MHz": top_clock,
        "bf16_clock_drop": bf16.loc[largest_n, "SM clock (MHz)"] / top_clock,
        "full_clock_n": full_n,
        "fp16_over_bf16_full_clock": fp16.loc[full_n, "TFLOP/s"] / bf16.loc[full_n, "TFLOP/s"] if full else nan,
        "matmul_big_spread_max": big_half["GPU spread"].max(),
        "tf32_rel_err": rel_err["tf32"].median(),
        "fp32_rel_err": rel_err["fp32"].median(),
        "tf32_rel_err_min": rel_err["tf32"].min(),
        "fp32_rel_err_max": rel_err["fp32"].max(),
    }


def page(res, c: dict, summary: pd.DataFrame, vs: pd.DataFrame, f: dict, zeros_table: pd.DataFrame,
         calls: pd.DataFrame, example: pd.DataFrame, worked: dict):
    """Every number and word chapter 0's page quotes, by name, from the notebook's tables: ``res`` (the
    results: params, provenance, date, the L2's size), the ceilings ``c``, ``against_datasheet``'s
    ``summary``, ``against_prediction``'s ``vs`` (indexed by quantity), ``findings``' ``f``, ``zeros``'
    table, ``call_over_gpu_summary``'s ``calls``, the worked example's table (indexed by M) and its
    numbers ``worked`` (b, ridge_M_read, ridge_M_datasheet, ex_params, ex_step_floor_ms); a ``Page`` (``lib.bench.page``)."""
    from lib.bench.page import Page
    from lib.bench.units import human_bytes

    prov, L2, zeros = res.provenance, res.data["l2_bytes"], zeros_table
    ratio, datasheet = summary["measured / datasheet"], summary["datasheet"]
    b, ridge_M_read, ridge_M_datasheet = worked["b"], worked["ridge_M_read"], worked["ridge_M_datasheet"]
    ex_params, ex_step_floor_ms = worked["ex_params"], worked["ex_step_floor_ms"]
    zeros_speedup = zeros.loc["random", "GPU time (us)"] / zeros.loc["zeros", "GPU time (us)"]
    numbers = {
        "copy_bw_GBps": c["copy_bw_GBps"],
        "read_bw_GBps": c["read_bw_GBps"],
        "bf16_tflops": c["bf16_tflops"],
        "fp16_tflops": c["fp16_tflops"],
        "tf32_tflops": c["tf32_tflops"],
        "fp32_tflops": c["fp32_tflops"],
        "ridge_flop_per_byte": c["ridge_flop_per_byte"],
        "launch_eager_us": c["launch_eager_us"],
        "launch_graph_us": c["launch_graph_us"],
        "launch_eager_over_graph": c["launch_eager_us"] / c["launch_graph_us"],
        "copy_bw_frac_datasheet": ratio["copy bandwidth (GB/s)"],
        "read_bw_frac_datasheet": ratio["read bandwidth (GB/s)"],
        "bf16_frac_datasheet": ratio["bf16 matmul (TFLOP/s)"],
        "ridge_datasheet_flop_per_byte": datasheet["ridge, bf16 / copy (FLOP/byte)"],
        "ridge_frac_datasheet": ratio["ridge, bf16 / copy (FLOP/byte)"],
        "ridge_read_flop_per_byte": summary.loc["ridge, bf16 / read (FLOP/byte)", "measured"],
        "ridge_copy_flop_per_byte": summary.loc["ridge, bf16 / copy (FLOP/byte)", "measured"],
        "ridge_read_frac_datasheet": ratio["ridge, bf16 / read (FLOP/byte)"],
        "example_M1_mflop": example.loc[1, "F (MFLOP)"],
        "example_M1_MB": example.loc[1, "Q (MB)"],
        "example_M1_intensity": example.loc[1, "I (FLOP/byte)"],
        "example_M1_read_us": example.loc[1, "Q / read rate (us)"],
        "example_M1_flop_us": example.loc[1, "F / bf16 rate (us)"],
        "example_M128_intensity": example.loc[128, "I (FLOP/byte)"],
        "example_M128_read_us": example.loc[128, "Q / read rate (us)"],
        "example_M128_flop_us": example.loc[128, "F / bf16 rate (us)"],
        "ridge_M_read": ridge_M_read,
        "ridge_M_datasheet": ridge_M_datasheet,
        "ex_params_billion": ex_params / 1e9,
        "ex_weights_GB": b * ex_params / 1e9,
        "ex_step_floor_ms": ex_step_floor_ms,
        "ex_tokens_per_s": 1e3 / ex_step_floor_ms,
        "read_over_copy": c["read_bw_GBps"] / c["copy_bw_GBps"],
        "bw_max_GBps": f["bw_max_GBps"],
        "read_sum_GBps": f["read_sum_GBps"],
        "bw_max_footprint_over_l2": f["bw_max_footprint_bytes"] / L2 if L2 else float("nan"),
        "hbm_GiB": prov.get("memory_bytes", 0) / (1 << 30),
        "copy_measured_over_predicted": vs.loc["copy bandwidth (GB/s)", "measured / predicted"] if len(vs) else float("nan"),
        "read_measured_over_predicted": vs.loc["read bandwidth (GB/s)", "measured / predicted"] if len(vs) else float("nan"),
        "bf16_measured_over_predicted": vs.loc["bf16 matmul (TFLOP/s)", "measured / predicted"] if len(vs) else float("nan"),
        "ridge_measured_over_predicted": vs.loc["ridge, bf16 / read (FLOP/byte)", "measured / predicted"]
        if len(vs) else float("nan"),
        "copy_best_spread": f["copy_best_spread"],
        "bf16_best_n": f["bf16_best_n"],
        "bf16_best_spread": f["bf16_best_spread"],
        "bf16_best_clock_MHz": f["bf16_best_clock_MHz"],
        "bf16_largest_n": f["bf16_largest_n"],
        "bf16_largest_tflops": f["bf16_largest_tflops"],
        "bf16_largest_clock_MHz": f["bf16_largest_clock_MHz"],
        "bf16_largest_power_W": f["bf16_largest_power_W"],
        "bf16_max_clock_MHz": f["bf16_max_clock_MHz"],
        "l2_MiB": L2 / MiB,
        "l2_peak_GBps": f["l2_peak_GBps"],
        "l2_peak_over_hbm": f["l2_peak_GBps"] / c["copy_bw_GBps"],
        "l2_edge_MiB": f["l2_edge_bytes"] / MiB,
        "l2_edge_over_l2": f["l2_edge_over_l2"],
        "cold_small_max_GBps": f["cold_small_max_GBps"],
        "cold_smallest_GBps": f["cold_smallest_GBps"],
        "cold_smallest_footprint_MiB": f["cold_smallest_footprint_bytes"] / MiB,
        "datasheet_hbm_GBps": datasheet["copy bandwidth (GB/s)"],
        "datasheet_bf16_tflops": datasheet["bf16 matmul (TFLOP/s)"],
        "tf32_rel_err": f["tf32_rel_err"],
        "fp32_rel_err": f["fp32_rel_err"],
        "buffer_min_MiB": min(res.params["buffer_bytes"]) / MiB,
        "buffer_max_GiB": max(res.params["buffer_bytes"]) / (1 << 30),
        "matmul_n_min": min(res.params["matmul_n"]),
        "matmul_n_max": max(res.params["matmul_n"]),
        "target_ms": res.params["target_ms"],
        "memcpy_graph_over_eager": f["memcpy_graph_over_eager"],
        "kernel_graph_over_eager": f["kernel_graph_over_eager"],
        "memcpy_graph_big_GBps": f["memcpy_graph_big_GBps"],
        "memcpy_eager_big_GBps": f["memcpy_eager_big_GBps"],
        "zeros_speedup": zeros_speedup,
        "zeros_clock_MHz": zeros.loc["zeros", "SM clock (MHz)"],
        "zeros_power_W": zeros.loc["zeros", "power (W)"],
        "random_power_W": zeros.loc["random", "power (W)"],
        "random_clock_MHz": zeros.loc["random", "SM clock (MHz)"],
        "zeros_n": zeros["n"].iloc[0],
        "tf32_over_fp32": c["tf32_tflops"] / c["fp32_tflops"],
        "fp16_over_bf16": c["fp16_tflops"] / c["bf16_tflops"],
        "full_clock_n": f["full_clock_n"],
        "fp16_over_bf16_full_clock": f["fp16_over_bf16_full_clock"],
        "matmul_big_spread_max": f["matmul_big_spread_max"],
        "reps": res.params["reps"],
        "call_over_gpu_short": calls.loc[SHORT, "median call/GPU"],
        "call_over_gpu_long": calls.loc[LONG, "median call/GPU"],
        "sms": prov.get("sms", 0),
    }
    texts = {
        **{f"{k}_band": vs.loc[q, "band"] if len(vs) else "not predicted" for k, q in (
            ("copy", "copy bandwidth (GB/s)"), ("read", "read bandwidth (GB/s)"), ("bf16", "bf16 matmul (TFLOP/s)"),
            ("ridge", "ridge, bf16 / read (FLOP/byte)"))},
        "bw_max_method": f["bw_max_method"],
        "bw_max_footprint": human_bytes(f["bw_max_footprint_bytes"]),
        "copy_best_method": f["copy_best_method"],
        "read_best_method": {"read": "torch.sum", "read kernel": "the read-only kernel"}[f["read_best_method"]],
        "read_best_footprint": human_bytes(f["read_best_footprint_bytes"]),
        "copy_best_footprint": human_bytes(f["copy_best_footprint_bytes"]),
        "device_name": prov["name"],
        "measured_date": res.date,
    }
    return Page(numbers=numbers, texts=texts)
