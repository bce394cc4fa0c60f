"""Chapter 2, the roofline: the sweep that times every operator of a forward pass, and every point against the model.

The notebook defines what is timed: for each memory-bound operator (``OPS``: an elementwise add, RMSNorm,
an embedding gather, a softmax over the vocabulary) a function ``make(T, H, V, device, shared)`` that makes
one set of random inputs of T tokens and returns ``(call, inputs)``, ``shared`` holding what every call
shares (the embedding's table: a model has one); and for attention (``ATTENTION``: a causal prefill of T
tokens, a decode step of B requests over L cached tokens) a function ``make(B, T, L, heads, device)`` that
returns ``(call, (q, k, v))``. This module runs them over the sizes of ``sweep(size)``:

- main points: every T of ``T`` (``T_softmax`` for the softmax, whose rows are a whole vocabulary),
  with ``timing.rotation`` input sets whose total is four times the L2, so each call reads HBM;
- attention points: every shape of ``attention_shapes`` (Llama-3-8B's heads at full size), rotated the same way;
- detail points: finer sweeps of the small sizes (``T_detail``), cold as above and hot (one set).

F and Q are counted as the operator needs them, each input read once and each output written once
(``counts``, ``attention_counts``: the chapter's table). Before timing, the first set's output is checked
against a reference (``check``: exact for the add and the gather, a relative error of at most 1e-2 for the
bf16 RMSNorm against float32, 1e-5 for the fp32 softmax against float64; ``check_attention``: at most
``ATTN_TOL`` against float32 attention). The profiler names the GPU kernels one call launches.

The analysis gives each point the HBM rate its floor uses (``floor_rate``: chapter 0's read rate where the
reads are at least twice the writes, its copy rate otherwise; ``rooflines``), puts chapter 1's linear
layers, these operators and attention in one table against the model T = max(F/P, Q/BW, k t_launch)
(``points``), summarizes it (``model_summary``), predicts attention from the formulas alone
(``predict_attention``, ``prefill_knee_T``), lists every operator's intensity for the chapter's diagram
(``intensities``), and picks the numbers the chapter's page quotes (``findings``, ``attention_findings``).

Chapter: 2 (roofline); it reads chapter 0's ceilings and chapter 1's points.
"""

from __future__ import annotations

import pandas as pd
import torch

from lib import costs
from lib.bench import profile, timing
from lib.experiments import require

OPS = ("add", "rmsnorm", "embedding", "softmax")
ATTENTION = ("attn_prefill", "attn_decode")
PARAMS = ("H", "V", "T", "T_softmax", "T_detail", "attention", "reps", "target_ms")
RMS_EPS = 1e-6
ATTN_TOL = 2e-2  # relative error of bf16 attention against float32


def sweep(size: str) -> dict:
    """Hidden size H, vocabulary V, the token counts of the main and the detail points, and the timing."""
    if size == "full":
        return {"H": 4096, "V": 128256, "T": [1, 16, 256, 4096, 16384], "T_softmax": [1, 16, 256, 2048],
                # finer sweeps of the small sizes, to see why small calls miss the model
                "T_detail": {"embedding": [1, 2, 4, 8, 16, 32, 64, 128, 256], "rmsnorm": [1, 64, 132, 264, 528, 1056],
                             "softmax": [1, 4, 16, 64, 132, 264, 528]},
                # Llama-3-8B's attention heads: prefill of T-token prompts, decode of B requests over L tokens
                "attention": {"H_q": 32, "H_kv": 8, "d": 128, "T": [512, 1024, 2048, 4096, 8192],
                              "B": [1, 16, 64], "L": [1024, 8192]},
                "reps": 25, "target_ms": 1.5}
    if size == "smoke":
        return {"H": 256, "V": 8000, "T": [1, 16, 256], "T_softmax": [1, 16],
                "T_detail": {"embedding": [1, 2], "rmsnorm": [1, 2], "softmax": [1, 2]},
                "attention": {"H_q": 4, "H_kv": 2, "d": 16, "T": [8, 32], "B": [1, 2], "L": [16]},
                "reps": 3, "target_ms": 0.2}
    raise ValueError(f"size={size!r}: the sweep has a 'full' and a 'smoke' size")


def counts(op: str, T: int, H: int, V: int) -> tuple[int, int]:
    """(F, Q) of one call of ``op`` on T tokens: FLOPs, and bytes with each input read once and each
    output written once (bf16, the softmax fp32; the gather reads T int64 ids)."""
    if op == "add":  # c = a + b, [T, H]
        return T * H, 3 * 2 * T * H
    if op == "rmsnorm":  # x * rsqrt(mean(x^2) + eps) * w: square, sum, scale, weight
        return 4 * T * H, 2 * 2 * T * H + 2 * H
    if op == "embedding":  # T rows of the [V, H] table
        return 0, 2 * 2 * T * H + 8 * T
    if op == "softmax":  # max, subtract, exp, sum, divide over [T, V]
        return 5 * T * V, 2 * 4 * T * V
    raise ValueError(f"op={op!r} is not one of {OPS}")


def written_bytes(op: str, T: int, H: int, V: int) -> int:
    """The bytes of ``counts``' Q that ``op`` writes (its output): the rest is read."""
    if op in ("add", "rmsnorm", "embedding"):
        return 2 * T * H
    if op == "softmax":
        return 4 * T * V
    raise ValueError(f"op={op!r} is not one of {OPS}")


def attention_written(B: int, T: int, H_q: int, d: int, b: int = 2) -> int:
    """The bytes of ``attention_counts``' Q that attention writes: its output, B T H_q d elements."""
    return b * B * T * H_q * d


def floor_rate(Q: float, written: float) -> str:
    """Which of chapter 0's bandwidths bounds traffic of Q bytes of which ``written`` are writes: "read" (the
    best streaming read rate) where the reads are at least twice the writes, "copy" (the copy rate, as many
    bytes written as read) otherwise. HBM reads faster than it copies, so a floor at the copy rate is beaten by
    work that mostly reads, and a floor at the read rate is too low for work that writes as much as it reads."""
    if not (Q > 0 and 0 <= written <= Q):
        raise ValueError(f"need 0 <= written <= Q and Q > 0, got Q={Q}, written={written}")
    return "read" if 3 * written <= Q else "copy"


def attention_shapes(a: dict) -> list[tuple[str, int, int, int]]:
    """(op, B, T, L) of every attention point of the sweep's ``attention`` parameters ``a``: a causal
    prefill of each prompt length T (one request, its T tokens attend to the T tokens of the prompt, L = T),
    and a decode step (one query token per request, T = 1) of each batch B over each context L."""
    return ([("attn_prefill", 1, T, T) for T in a["T"]]
            + [("attn_decode", B, 1, L) for B in a["B"] for L in a["L"]])


def attention_counts(op: str, B: int, T: int, L: int, H_q: int, H_kv: int, d: int, b: int = 2) -> tuple[int, int]:
    """(F_attn, Q) of one attention call: B requests of T query tokens over L KV tokens each, H_q query heads
    sharing H_kv KV heads of dimension d, b bytes per element.

    F counts the two products, q k^T and p v, 2 d FLOPs each per (query, key) pair and query head: 4 d H_q
    per pair. A decode step has B L pairs; a causal prefill (L = T) half of its T^2, F_attn = 4 T^2 H_q d / 2.
    Q reads q and writes the output (T H_q d each) and reads the K and V of L tokens (L H_kv d each), once
    per request: the scores never leave the chip (a fused kernel)."""
    for name, v in {"B": B, "T": T, "L": L, "H_q": H_q, "H_kv": H_kv, "d": d, "b": b}.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if H_q % H_kv:
        raise ValueError(f"H_q={H_q} must be a multiple of H_kv={H_kv}: each KV head serves H_q/H_kv query heads")
    Q = b * B * (2 * T * H_q * d + 2 * L * H_kv * d)
    if op == "attn_prefill":
        if L != T:
            raise ValueError(f"a causal prefill attends to its own prompt: L must equal T, got T={T}, L={L}")
        return 4 * B * T * T * H_q * d // 2, Q
    if op == "attn_decode":
        if T != 1:
            raise ValueError(f"a decode step has one query token per request: T must be 1, got {T}")
        return 4 * B * L * H_q * d, Q
    raise ValueError(f"op={op!r} is not one of {ATTENTION}")


def check_attention(op: str, out: torch.Tensor, inputs: tuple) -> None:
    """Raise if ``out`` [B, H_q, T, d] is not attention of ``inputs`` = (q [B, H_q, T, d], k and v
    [B, H_kv, L, d]), causal for the prefill: query head h reads KV head h // (H_q / H_kv). The reference is
    float32, one request and one KV head at a time (so its scores stay small); the relative error must be at
    most ``ATTN_TOL``."""
    if op not in ATTENTION:
        raise ValueError(f"op={op!r} is not one of {ATTENTION}")
    q, k, v = inputs
    B, H_q, T, d = q.shape
    H_kv, L = k.shape[1], k.shape[2]
    g = H_q // H_kv
    if tuple(out.shape) != (B, H_q, T, d):
        raise AssertionError(f"{op}: the output has shape {tuple(out.shape)}, not {(B, H_q, T, d)}: the call is wrong, "
                             "and a wrong call is not timed")
    pos = torch.arange(L, device=q.device)
    mask = pos[None, :] <= pos[L - T:, None] if op == "attn_prefill" else None  # query i sits at position L - T + i
    err2 = ref2 = torch.zeros((), dtype=torch.float64, device=q.device)
    for i in range(B):
        for h in range(H_kv):
            qs = q[i, h * g:(h + 1) * g].float()  # [g, T, d]
            s = qs @ k[i, h].float().T / d ** 0.5  # [g, T, L]
            if mask is not None:
                s = s.masked_fill(~mask, float("-inf"))
            ref = torch.softmax(s, -1) @ v[i, h].float()
            err2 = err2 + (out[i, h * g:(h + 1) * g].float() - ref).pow(2).sum()
            ref2 = ref2 + ref.pow(2).sum()
    err = (err2 / ref2).sqrt().item()
    if not err <= ATTN_TOL:
        raise AssertionError(f"{op}: the output has a relative error of {err:.2e} against float32 (at most "
                             f"{ATTN_TOL:g}): the call is wrong, and a wrong call is not timed")


def check(op: str, out: torch.Tensor, inputs: tuple) -> None:
    """Raise if ``out`` is not ``op`` of ``inputs`` (the tensors its ``make`` returned)."""
    if op == "add":
        a, b = inputs
        ok, what = torch.equal(out, a + b), "differs from a + b"
    elif op == "embedding":
        ids, table = inputs
        ok, what = torch.equal(out, table[ids]), "differs from table[ids]"
    elif op == "rmsnorm":
        x, w = inputs
        xf = x.float()
        ref = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + RMS_EPS) * w.float()
        err = ((out.float() - ref).norm() / ref.norm()).item()
        ok, what = err < 1e-2, f"has a relative error of {err:.2e} against float32 (at most 1e-2)"
    elif op == "softmax":
        (x,) = inputs
        ref = torch.softmax(x.double(), -1)
        err = ((out.double() - ref).norm() / ref.norm()).item()
        ok, what = err < 1e-5, f"has a relative error of {err:.2e} against float64 (at most 1e-5)"
    else:
        raise ValueError(f"op={op!r} is not one of {OPS}")
    if not ok:
        raise AssertionError(f"{op}: the output {what}: the call is wrong, and a wrong call is not timed")


# ---------------------------------------------------------------------------- measuring

def measure_op(make, name: str, T: int, cold: bool, device: str, l2: int, p: dict, shared: dict) -> dict:
    """One point: ``make``'s call for T tokens, checked, then timed (cold: rotating input sets)."""
    call, inputs = make(T, p["H"], p["V"], device, shared)
    check(name, call(), inputs)
    flops, nbytes = counts(name, T, p["H"], p["V"])
    sets = timing.rotation(nbytes, l2) if (cold and l2) else 1
    fns = [call] + [make(T, p["H"], p["V"], device, shared)[0] for _ in range(sets - 1)]
    t = timing.bench(fns, device=device, reps=p["reps"], target_ms=p["target_ms"])
    names = profile.kernel_names(call, device)
    del fns
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"op": name, "T": T, "cold": cold, "F": flops, "Q": nbytes, "sets": sets,
            "kernels": len(names) if names else None, "kernel_names": names, "timing": t.to_dict()}


def measure_attention(make, name: str, B: int, T: int, L: int, device: str, l2: int, p: dict) -> dict:
    """One attention point: ``make``'s call for B requests of T query tokens over L KV tokens, checked, then
    timed with rotating input sets (the L2 defeated), as ``measure_op`` times the other operators."""
    a = p["attention"]
    call, inputs = make(B, T, L, a, device)
    check_attention(name, call(), inputs)
    flops, nbytes = attention_counts(name, B, T, L, a["H_q"], a["H_kv"], a["d"])
    sets = timing.rotation(nbytes, l2) if l2 else 1
    fns = [call] + [make(B, T, L, a, device)[0] for _ in range(sets - 1)]
    t = timing.bench(fns, device=device, reps=p["reps"], target_ms=p["target_ms"])
    names = profile.kernel_names(call, device)
    del fns, inputs
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"op": name, "B": B, "T": T, "L": L, "cold": True, "F": flops, "Q": nbytes, "sets": sets,
            "kernels": len(names) if names else None, "kernel_names": names, "timing": t.to_dict()}


def measure(params: dict, device: str, ops: dict, attention: dict) -> dict:
    """Every point of chapter 2: the main points (cold), the attention points (cold), then the detail
    points (cold and hot)."""
    require(params, PARAMS)
    if set(ops) != set(OPS) or not all(callable(m) for m in ops.values()):
        raise ValueError(f"ops must map each of {list(OPS)} to a function (T, H, V, device, shared) -> (call, inputs), "
                         f"got {sorted(ops)}; see chapter 2's notebook")
    if set(attention) != set(ATTENTION) or not all(callable(m) for m in attention.values()):
        raise ValueError(f"attention must map each of {list(ATTENTION)} to a function (B, T, L, heads, device) -> "
                         f"(call, (q, k, v)), got {sorted(attention)}; see chapter 2's notebook")
    require(params["attention"], ("H_q", "H_kv", "d", "T", "B", "L"))
    p = params
    l2 = torch.cuda.get_device_properties(0).L2_cache_size if device == "cuda" else 0
    shared = {}
    rows = [measure_op(ops[name], name, T, True, device, l2, p, shared)
            for name in OPS for T in (p["T_softmax"] if name == "softmax" else p["T"])]
    print("operators done", flush=True)
    attn = [measure_attention(attention[name], name, B, T, L, device, l2, p)
            for name, B, T, L in attention_shapes(p["attention"])]
    print("attention done", flush=True)
    detail = [measure_op(ops[name], name, T, cold, device, l2, p, shared)
              for name, Ts in p["T_detail"].items() for T in Ts for cold in (True, False)]
    print("details done", flush=True)
    return {"l2_bytes": l2, "points": rows, "detail": detail, "attention": attn}


# ---------------------------------------------------------------------------- analysis

ATTN_NAMES = {"attn_prefill": "prefill attention", "attn_decode": "decode attention"}


def rooflines(c: dict, launch: str = "graph") -> dict[str, costs.Roofline]:
    """The two machines of the model, from chapter 0's ceilings ``c``: "read" (bf16 rate, streaming read
    rate) and "copy" (bf16 rate, copy rate), each with the launch cost in a graph or eagerly."""
    copy = costs.Roofline.from_ceilings(c, launch)
    return {"read": costs.Roofline(copy.P_flops, c["read_bw_GBps"] * 1e9, copy.t_launch_s), "copy": copy}


def prefill_knee_T(a: dict, ridge: float) -> float:
    """The prompt length where causal prefill attention turns compute-bound: its intensity
    I = T H_q / (2 (H_q + H_kv)) reaches the ridge at T = 2 I* (H_q + H_kv) / H_q."""
    return 2 * ridge * (a["H_q"] + a["H_kv"]) / a["H_q"]


def intensities(params: dict, ms: list[int]) -> pd.DataFrame:
    """Every operator of the chapter at the sizes it is measured at, from the formulas alone (nothing
    measured): operator, size, F, Q, written bytes, I and the rate its floor uses. The linear layers are
    Llama-3-8B's (``costs.LLAMA3_8B``) at the token counts ``ms`` (chapter 1's M)."""
    rows = []
    for name, (K, N) in costs.LLAMA3_8B["linears"].items():
        for M in ms:
            rows.append({"what": f"linear {name}", "family": "linear", "size": M,
                         "F": costs.linear_flops(M, K, N), "Q": costs.linear_bytes(M, K, N, 2), "written": 2 * M * N})
    for op in OPS:
        for T in (params["T_softmax"] if op == "softmax" else params["T"]):
            F, Q = counts(op, T, params["H"], params["V"])
            rows.append({"what": op, "family": op, "size": T, "F": F, "Q": Q,
                         "written": written_bytes(op, T, params["H"], params["V"])})
    a = params["attention"]
    for op, B, T, L in attention_shapes(a):
        F, Q = attention_counts(op, B, T, L, a["H_q"], a["H_kv"], a["d"])
        rows.append({"what": ATTN_NAMES[op], "family": ATTN_NAMES[op], "size": T if op == "attn_prefill" else B,
                     "L": L, "F": F, "Q": Q, "written": attention_written(B, T, a["H_q"], a["d"])})
    out = pd.DataFrame(rows)
    out["I (FLOP/byte)"] = out["F"] / out["Q"]
    out["rate"] = [floor_rate(q, w) for q, w in zip(out["Q"], out["written"])]
    return out


def predict_attention(a: dict, c: dict) -> pd.DataFrame:
    """The attention shapes of the sweep's ``attention`` parameters ``a`` with their floors, written before
    any measurement: F, Q, I, the rate the floor uses, the floor max(F/P, Q/BW) in us and its bound."""
    roofs = rooflines(c)
    rows = []
    for op, B, T, L in attention_shapes(a):
        F, Q = attention_counts(op, B, T, L, a["H_q"], a["H_kv"], a["d"])
        rate = floor_rate(Q, attention_written(B, T, a["H_q"], a["d"]))
        roof = roofs[rate]
        rows.append({"what": ATTN_NAMES[op], "B": B, "T": T, "L": L, "F": F, "Q": Q, "I (FLOP/byte)": F / Q,
                     "rate": rate, "floor (us)": roof.time(F, Q, 0) * 1e6, "bound": roof.bound(F, Q, 0)})
    return pd.DataFrame(rows)


def points(ch1: dict, data: dict, params: dict, c: dict) -> pd.DataFrame:
    """Chapter 1's linear layers (cold and hot), this chapter's operators and its attention (cold), one row
    each: F, Q, the bytes written, I, kernels (1 where none were counted), GPU and call time, the rate the
    floor uses (``floor_rate``), the model's time and bound for GPU time (a launch in a graph) and for call
    time (an eager launch), and the ratios. ``c``: chapter 0's ceilings; ``params``: this chapter's."""
    roofs, roofs_eager = rooflines(c, "graph"), rooflines(c, "eager")
    rows = []
    for r in ch1["points"]:
        rows.append({"source": "linear", "what": r["name"], "size": r["M"], "L": None, "L2": "cold" if r["cold"] else "hot",
                     "F": costs.linear_flops(r["M"], r["K"], r["N"]), "Q": costs.linear_bytes(r["M"], r["K"], r["N"], 2),
                     "written": 2 * r["M"] * r["N"], "kernels": r["kernels"] or 1, "timing": r["timing"]})
    for r in data["points"]:
        rows.append({"source": "memory-bound", "what": r["op"], "size": r["T"], "L": None, "L2": "cold",
                     "F": r["F"], "Q": r["Q"], "written": written_bytes(r["op"], r["T"], params["H"], params["V"]),
                     "kernels": r["kernels"] or 1, "timing": r["timing"]})
    a = params["attention"]
    for r in data["attention"]:
        rows.append({"source": "attention", "what": ATTN_NAMES[r["op"]],
                     "size": r["T"] if r["op"] == "attn_prefill" else r["B"], "L": r["L"], "L2": "cold",
                     "F": r["F"], "Q": r["Q"], "written": attention_written(r["B"], r["T"], a["H_q"], a["d"]),
                     "kernels": r["kernels"] or 1, "timing": r["timing"]})
    pts = pd.DataFrame(rows)
    pts["GPU time (us)"] = [t["gpu_us"]["median"] for t in pts["timing"]]
    pts["call time (us)"] = [t["call_us"]["median"] for t in pts["timing"]]
    pts = pts.drop(columns="timing")
    pts["I (FLOP/byte)"] = pts["F"] / pts["Q"]
    pts["rate"] = [floor_rate(q, w) for q, w in zip(pts["Q"], pts["written"])]
    rows = list(zip(pts["F"], pts["Q"], pts["kernels"], pts["rate"]))
    pts["model (us)"] = [roofs[r].time(f, q, k) * 1e6 for f, q, k, r in rows]
    pts["bound"] = [roofs[r].bound(f, q, k) for f, q, k, r in rows]
    pts["measured / model"] = pts["GPU time (us)"] / pts["model (us)"]
    pts["call model (us)"] = [roofs_eager[r].time(f, q, k) * 1e6 for f, q, k, r in rows]
    pts["call / call model"] = pts["call time (us)"] / pts["call model (us)"]
    pts["GB/s"] = pts["Q"] / pts["GPU time (us)"] / 1e3
    pts["TFLOP/s"] = pts["F"] / pts["GPU time (us)"] / 1e6
    return pts


def model_summary(cold: pd.DataFrame) -> pd.DataFrame:
    """Points with the L2 defeated, by the term that bounds them and all together: how many, the median
    measured / model, and the median of |measured / model - 1|; the bound is a column, not the index."""
    err = (cold["measured / model"] - 1).abs()
    summary = pd.DataFrame({
        "points": cold.groupby("bound").size(),
        "median measured/model": cold.groupby("bound")["measured / model"].median(),
        "median |ratio - 1|": err.groupby(cold["bound"]).median(),
    })
    summary.loc["all (L2 defeated)"] = [len(cold), cold["measured / model"].median(), err.median()]
    summary["points"] = summary["points"].astype(int)
    return summary.rename_axis("bound").reset_index()


def detail(data: dict) -> pd.DataFrame:
    """The detail points: operator, T, L2 ("cold" or "hot"), GPU time, and the first kernel's name."""
    return pd.DataFrame([
        {"op": r["op"], "T": r["T"], "L2": "cold" if r["cold"] else "hot", "cold": r["cold"],
         "GPU time (us)": r["timing"]["gpu_us"]["median"], "kernel": (r["kernel_names"] or [""])[0]}
        for r in data["detail"]
    ])


def datasheet_floor(pts: pd.DataFrame, sheet: dict) -> pd.DataFrame:
    """Every point with the L2 defeated against the floor at the vendor's rates, max(F/P, Q/BW) with P the
    datasheet's bf16 rate and BW its HBM rate, no launch term: the hardware's limits, which no kernel beats,
    where chapter 0's measured rates are the best of the shapes it timed. Columns "datasheet floor (us)" and
    "measured / datasheet floor", sorted by the ratio (the fastest first)."""
    if not sheet or not (sheet.get("bf16_tflops", 0) > 0 and sheet.get("hbm_GBps", 0) > 0):
        raise ValueError("datasheet_floor needs the device's datasheet rates (bf16_tflops and hbm_GBps, as "
                         "lib.bench.device.DATASHEETS has them); this device has none: skip the comparison")
    cold = pts[pts["L2"] == "cold"].copy()
    floor_s = [max(f / (sheet["bf16_tflops"] * 1e12), q / (sheet["hbm_GBps"] * 1e9)) for f, q in zip(cold["F"], cold["Q"])]
    cold["datasheet floor (us)"] = [t * 1e6 for t in floor_s]
    cold["measured / datasheet floor"] = cold["GPU time (us)"] / cold["datasheet floor (us)"]
    return cold.sort_values("measured / datasheet floor")


def attention_findings(pts: pd.DataFrame, c: dict) -> dict:
    """The attention numbers the page quotes: decode at its smallest and largest shape (B, L) (time, ratio
    to the floor, the K/V read rate as a fraction of the read ceiling), the lowest and highest such fraction,
    and, at the longest context, how the time and the bytes grow from the second-largest batch to the largest;
    prefill at its smallest and largest T (ratio, TFLOP/s and the fraction of the bf16 rate)."""
    dec = pts[pts["what"] == "decode attention"]
    pre = pts[pts["what"] == "prefill attention"].sort_values("size")
    if dec.empty or pre.empty:
        raise ValueError("the points hold no decode or no prefill attention: the results predate chapter 2's attention "
                         "sweep; re-measure the chapter (python tools/book.py run 02-roofline --mode measure)")
    dec = dec.assign(kv=dec["size"] * dec["L"]).sort_values(["kv", "size"])
    small, big = dec.iloc[0], dec.iloc[-1]
    frac = dec["GB/s"] / c["read_bw_GBps"]
    longest = dec[dec["L"] == dec["L"].max()].sort_values("size")
    b1, b2 = longest.iloc[-2], longest.iloc[-1]
    return {
        "attn_decode_small_B": small["size"], "attn_decode_small_L": small["L"],
        "attn_decode_small_us": small["GPU time (us)"], "attn_decode_small_ratio": small["measured / model"],
        "attn_decode_big_us": big["GPU time (us)"], "attn_decode_big_ratio": big["measured / model"],
        "attn_decode_big_GBps": big["GB/s"],
        "attn_decode_big_frac_read": big["GB/s"] / c["read_bw_GBps"],
        "attn_decode_min_frac_read": frac.min(), "attn_decode_max_frac_read": frac.max(),
        "attn_decode_max_ratio": dec["measured / model"].max(),
        "attn_decode_batch_from": b1["size"], "attn_decode_batch_to": b2["size"],
        "attn_decode_batch_time_ratio": b2["GPU time (us)"] / b1["GPU time (us)"],
        "attn_decode_batch_bytes_ratio": b2["Q"] / b1["Q"],
        "attn_prefill_small_ratio": pre["measured / model"].iloc[0],
        "attn_prefill_big_us": pre["GPU time (us)"].iloc[-1], "attn_prefill_big_ratio": pre["measured / model"].iloc[-1],
        "attn_prefill_big_tflops": pre["TFLOP/s"].iloc[-1],
        "attn_prefill_big_frac_P": pre["TFLOP/s"].iloc[-1] / c["bf16_tflops"],
    }


def findings(pts: pd.DataFrame, det: pd.DataFrame) -> dict:
    """The quantities the chapter's page quotes and its claims check, by name:

    - the model over the L2-defeated points: the median |measured / model - 1|, the extreme ratios, the
      point fastest against its floor apart from decode attention (its ratio, and what it is), the share
      within 0.9x to 2x and the count outside, the medians of the linear layers, of the operators and of
      the compute-bound points; hot points that beat the model by more than 10%, and the lowest hot ratio;
    - the memory-bound operators: the largest add's bandwidth, the smallest add's GPU and call time,
      RMSNorm's kernels and its smallest and largest ratios, the add and the gather at a middle T (256, or
      the largest) in MiB, GB/s and ratio, the largest softmax's GB/s and ratio, and the median call / GPU
      time of the smallest calls;
    - the detail sweeps (``det``): up to which T the gather uses PyTorch's small-index kernel and how long
      it takes, where the general gather starts; RMSNorm's median time cold and hot; the softmax at
      T = 1, 16, 64, 132 and 528 (NaN where the sweep lacks a size).
    """
    nan = float("nan")
    cold = pts[pts["L2"] == "cold"]
    hot = pts[pts["L2"] == "hot"]
    ratio = cold["measured / model"]
    held = cold[cold["what"] != "decode attention"]  # decode attention is set against the read rate on its own (a target)
    fastest = held.loc[held["measured / model"].idxmin()]
    fastest_what = (f"the {fastest['what']} layer of chapter 1 at M = {fastest['size']}" if fastest["source"] == "linear"
                    else f"{fastest['what']} at T = {fastest['size']}")
    ops = pts[pts["source"] == "memory-bound"]
    add = ops[ops["what"] == "add"].set_index("size")
    sm = ops[ops["what"] == "softmax"].set_index("size")
    rms = ops[ops["what"] == "rmsnorm"].set_index("size")
    emb_main = ops[ops["what"] == "embedding"].set_index("size")
    small = ops[ops["size"] == ops["size"].min()]
    mid = 256 if 256 in add.index else add.index[-1]
    emb = det[(det["op"] == "embedding") & det["cold"]].set_index("T")
    small_kernel = emb[emb["kernel"].str.contains("SmallIndex")]
    gather = emb[~emb.index.isin(small_kernel.index)]
    rd = det[det["op"] == "rmsnorm"]
    sd = det[(det["op"] == "softmax") & det["cold"]].set_index("T")
    return {
        "model_median_abs_err": (ratio - 1).abs().median(),
        "model_points": len(cold),
        "model_min_ratio_cold": ratio.min(),
        "floor_min_ratio": fastest["measured / model"],
        "floor_min_what": fastest_what,
        "model_max_ratio_cold": ratio.max(),
        "model_within_2x_frac": ((ratio >= 0.9) & (ratio <= 2)).mean(),
        "outliers_cold": int(((ratio < 0.9) | (ratio > 2)).sum()),
        "outliers_hot_beat": int((hot["measured / model"] < 0.9).sum()),
        "hot_min_ratio": hot["measured / model"].min() if len(hot) else nan,
        "linear_cold_median_ratio": cold[cold["source"] == "linear"]["measured / model"].median(),
        "ops_median_ratio": cold[cold["source"] == "memory-bound"]["measured / model"].median(),
        "compute_median_ratio": cold[cold["bound"] == "compute"]["measured / model"].median(),
        "compute_points": int((cold["bound"] == "compute").sum()),
        "add_big_GBps": add["GB/s"].iloc[-1],
        "add_small_gpu_us": add["GPU time (us)"].iloc[0],
        "add_small_call_us": add["call time (us)"].iloc[0],
        "rmsnorm_kernels": rms["kernels"].iloc[0],
        "mid_T": mid,
        "add_mid_ratio": add.loc[mid, "measured / model"],
        "add_mid_MiB": add.loc[mid, "Q"] / 2**20,
        "add_mid_GBps": add.loc[mid, "GB/s"],
        "emb_mid_ratio": emb_main.loc[mid, "measured / model"],
        "emb_mid_MiB": emb_main.loc[mid, "Q"] / 2**20,
        "rmsnorm_small_ratio": rms["measured / model"].iloc[0],
        "rmsnorm_big_ratio": rms["measured / model"].iloc[-1],
        "softmax_big_GBps": sm["GB/s"].iloc[-1],
        "softmax_big_ratio": sm["measured / model"].iloc[-1],
        "small_call_over_gpu": (small["call time (us)"] / small["GPU time (us)"]).median(),
        "emb_small_kernel_max_T": small_kernel.index.max() if len(small_kernel) else nan,
        "emb_small_kernel_max_us": small_kernel["GPU time (us)"].max() if len(small_kernel) else nan,
        "emb_gather_min_T": gather.index.min(),
        "emb_gather_first_us": gather["GPU time (us)"].iloc[0],
        "rms_floor_cold_us": rd[rd["cold"]]["GPU time (us)"].median(),
        "rms_floor_hot_us": rd[~rd["cold"]]["GPU time (us)"].median(),
        "rms_detail_max_T": rd["T"].max(),
        "softmax_t1_us": sd["GPU time (us)"].iloc[0],
        **{f"softmax_t{T}_us": sd.loc[T, "GPU time (us)"] if T in sd.index else nan for T in (16, 64, 132, 528)},
    }
