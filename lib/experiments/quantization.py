"""Chapter 9's experiment: decode's GEMMs with quantized weights, against bf16 and the vendors' paths.

``measure(params, device)`` takes each layer product (K, N) of ``params["shapes"]`` (Llama-3-8B's four on a
GPU), draws its weights (standard deviation 0.02, in ``dtype``) and, for each format of ``formats``:

- quantizes them (``lib.quant``) and checks the format's product at the first row count against the
  float64 product of x with the format's own dequantized weights (``check``): a path of the book that
  misses raises; a vendor path that misses is recorded with its error and not timed;
- times it at every row count M of ``params["rows"]`` with ``lib.bench.timing.bench`` (GPU time by
  CUDA-graph replay and call time), over enough copies of the weights to defeat the L2 on a GPU, in
  ``rounds`` interleaved rounds (the formats' order reversed every other round; the median of the rounds'
  medians is kept). A vendor path ``params["slow"]`` times slower than bf16 at a row count is not timed at
  more rows of that product (``skipped`` says where).

The formats: "bf16" (``x @ w``, cuBLAS), "int8" (``lib.kernels.quant_gemm.w8_mm``), "int4 gG" for each group
G of ``params["groups"]`` (``w4_mm``); on a GPU also torch's weight-only paths, "torch int8"
(``torch._weight_int8pack_mm``) and "torch int4 g128" (``torch._weight_int4pack_mm``, the tinygemm kernel),
"fp8" (``torch._scaled_mm``, cuBLASLt, e4m3 weights and activations with one scale each; the call
quantizes x with torch's operations, as a W8A8 layer must, and pads its rows to 16) and "fp8 gemm" (the
same product with x quantized before the timed call, as an engine that fuses the quantization into the
operation before the layer has it).

``measure_step(params, device)`` runs chapter 7's decode step with each weight format (``params["step"]``:
Llama-3-8B on a GPU; ``lib.models.quantized`` in int8 and int4 beside the bf16 ``lib.models.FUSED``): each
quantized step checked against the fused step of the model with the weights it effectively uses, then
timed in interleaved rounds, with the bytes it must read (its floor at chapter 0's read rate) and, on a
GPU, its kernels' time by kind.

``errors(params, device)`` is the error study: for Gaussian weights, weights with outlier input channels
(1% of the rows of w 20 times larger) and heavy-tailed weights (Student's t with 3 degrees of freedom), the
relative error of each format's product against the product with the unquantized bf16 weights, in float64,
at each shape. It needs no GPU (a smoke run does it on the CPU at its small shapes).

Chapters: 9.
"""

from __future__ import annotations

import os
import statistics
import time

import pandas as pd
import torch

from lib import models, quant
from lib.bench import kernel_kinds, timing
from lib.experiments import require
from lib.kernels import quant_gemm

PARAMS = ("shapes", "rows", "groups", "dtype", "reps", "target_ms", "rounds", "seed", "tolerance", "slow", "step", "kv")
SHAPES_8B = models.LLAMA3_8B.product_shapes()
WEIGHT_KINDS = ("gaussian", "outlier channels", "heavy tails")


def sweep(size: str) -> dict:
    """"full": Llama-3-8B's four products in bf16, 1 to 4,096 rows; "smoke": small products in float32 (the
    interpreter's kernels), seconds on a CPU."""
    if size == "full":
        return {"shapes": SHAPES_8B, "rows": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096],
                "groups": [32, 64, 128, 256], "dtype": "bfloat16", "reps": 5, "target_ms": 1.0, "rounds": 3,
                "seed": 0, "tolerance": 2e-2, "slow": 8.0,
                "step": {"config": "8b", "shapes": [[1, 1024], [16, 1024]], "group": 128, "block": 16,
                         "target_ms": 20.0},
                "kv": {"Bs": [1, 16], "Ls": [1024, 4096, 16384, 32768, 65536], "H_q": 32, "H_kv": 8, "d": 128,
                       "page": 16, "check_tokens": 65536, "tolerance": 2e-2}}
    if size == "smoke":
        return {"shapes": {"a": [256, 96], "b": [512, 64]}, "rows": [1, 5], "groups": [32, 128], "dtype": "float32",
                "reps": 1, "target_ms": 0.2, "rounds": 1, "seed": 0, "tolerance": 1e-4,
                "slow": 8.0,
                "step": {"config": "tiny", "shapes": [[1, 12], [2, 12]], "group": 32, "block": 4, "target_ms": 0.2},
                "kv": {"Bs": [1, 2], "Ls": [40, 100], "H_q": 4, "H_kv": 2, "d": 32, "page": 16, "check_tokens": 200,
                       "tolerance": 1e-4}}
    raise ValueError(f"size must be 'full' or 'smoke', got {size!r}")


def weights(kind: str, K: int, N: int, *, seed: int, device: str) -> torch.Tensor:
    """float32 weights [K, N] of ``kind`` (see the module), standard deviation about 0.02."""
    g = torch.Generator(device=device).manual_seed(seed)
    w = torch.randn(K, N, generator=g, device=device) * 0.02
    if kind == "outlier channels":
        rows = torch.randperm(K, generator=g, device=device)[: max(1, K // 100)]
        w[rows] *= 20
    elif kind == "heavy tails":
        chi2 = torch.randn(3, K, N, generator=g, device=device).pow(2).sum(0)  # Student's t, 3 degrees of freedom
        w = w / (chi2 / 3).sqrt() / 3 ** 0.5  # t_3 has variance 3: scaled back to about 0.02
    elif kind != "gaussian":
        raise ValueError(f"kind must be one of {WEIGHT_KINDS}, got {kind!r}")
    return w


class Format:
    """One way of storing w and multiplying by it: ``prepare(w)`` gives the stored form, ``call(x, s)`` the
    product, ``effective(s)`` the float32 weights the product uses (what it is checked against), ``nbytes``
    the bytes it reads per product; ``rounds_x(x)``, for a path that also quantizes x (W8A8), the x its
    product uses; ``given_x(x)``, for a path handed x already converted, what ``call`` takes in place of x
    (made before the timed call)."""

    def __init__(self, name, prepare, call, effective, nbytes, vendor=False, rounds_x=None, given_x=None):
        self.name, self.prepare, self.call, self.effective, self.nbytes = name, prepare, call, effective, nbytes
        self.vendor, self.rounds_x, self.given_x = vendor, rounds_x, given_x

    def input(self, x: torch.Tensor):
        """What ``call`` takes for x: x itself, or ``given_x(x)``."""
        return self.given_x(x) if self.given_x is not None else x


def formats(params: dict, device: str) -> list[Format]:
    """The formats of the run (see the module); the vendor paths only on a GPU."""
    dtype = getattr(torch, params["dtype"])
    out = [Format("bf16", lambda w: w.to(dtype), lambda x, s: x @ s, lambda s: s.float(), lambda K, N: 2 * K * N),
           Format("int8", quant.quantize_int8, quant_gemm.w8_mm, lambda s: s.dequantize(),
                  lambda K, N: K * N + 4 * N)]
    for g in params["groups"]:
        out.append(Format(f"int4 g{g}", lambda w, g=g: quant.quantize_int4(w, g), quant_gemm.w4_mm,
                          lambda s: s.dequantize(), lambda K, N, g=g: K * N // 2 + 4 * (K // g) * N))
    if device == "cuda":
        out += [Format("torch int8", _torch_int8, _torch_int8_mm, lambda s: s[2], lambda K, N: K * N + 2 * N, True),
                Format("torch int4 g128", _torch_int4, _torch_int4_mm, lambda s: s[3],
                       lambda K, N: K * N // 2 + 4 * (K // 128) * N, True),
                Format("fp8", _fp8, _fp8_mm, lambda s: s[2], lambda K, N: K * N, True, rounds_x=_fp8_x),
                Format("fp8 gemm", _fp8, _fp8_gemm, lambda s: s[2], lambda K, N: K * N, True, rounds_x=_fp8_x,
                       given_x=_fp8_given)]
    return out


def _torch_int8(w):
    q = quant.quantize_int8(w)
    return q.q.t().contiguous(), q.scale.to(torch.bfloat16), q.dequantize()


def _torch_int8_mm(x, s):
    return torch._weight_int8pack_mm(x, s[0], s[1])


def _torch_int4(w):
    """tinygemm's layout: the values q + 8 (0..15) of w^T [N, K], row k even in the high four bits, packed by
    ``_convert_weight_to_int4pack``; scales and zero points [K / 128, N, 2] with the zero points 0."""
    q = quant.quantize_int4(w, 128)
    u = (q.values().to(torch.int32) + 8).t().contiguous()
    packed = torch.ops.aten._convert_weight_to_int4pack((u[:, ::2] << 4 | u[:, 1::2]).to(torch.uint8), 8)
    sz = torch.stack([q.scale, torch.zeros_like(q.scale)], dim=-1).to(torch.bfloat16).contiguous()
    return packed, sz, 128, q.dequantize()


def _torch_int4_mm(x, s):
    return torch._weight_int4pack_mm(x, s[0], s[2], s[1])


def _fp8(w):
    scale = (w.abs().amax().float() / 448.0).clamp(min=1e-12)
    w8 = (w.float() / scale).to(torch.float8_e4m3fn)
    return w8.t().contiguous().t(), scale, w8.float() * scale  # column-major, as cuBLASLt takes the second operand


def _fp8_quantize_x(x):
    """x in e4m3 with one scale, as a W8A8 layer quantizes its input: (x8, scale)."""
    xs = (x.abs().amax().float() / 448.0).clamp(min=1e-12)
    return (x.float() / xs).to(torch.float8_e4m3fn), xs


def _fp8_x(x):
    """x as ``_fp8_mm`` rounds it, back in float32."""
    x8, xs = _fp8_quantize_x(x)
    return x8.float() * xs


def _fp8_given(x):
    """x quantized to e4m3 with one scale and its rows padded to 16 (cuBLASLt's FP8 product takes a multiple
    of 16): (x8, scale, M)."""
    M = x.shape[0]
    x8, xs = _fp8_quantize_x(x)
    if M % 16:
        x8 = torch.cat([x8, x8.new_zeros(16 - M % 16, x8.shape[1])])
    return x8, xs, M


def _fp8_gemm(given, s):
    """The FP8 product of x as ``_fp8_given`` made it."""
    x8, xs, M = given
    return torch._scaled_mm(x8, s[0], scale_a=xs, scale_b=s[1], out_dtype=torch.bfloat16)[:M]


def _fp8_mm(x, s):
    """x quantized to e4m3 with one scale (part of the call: a W8A8 layer does it), then the FP8 product."""
    return _fp8_gemm(_fp8_given(x), s)


def check(fmt: Format, x: torch.Tensor, state) -> float:
    """Relative error of the format's product against x @ its own effective weights in float64 (x as the
    format rounds it, for a path that quantizes x too)."""
    xe = fmt.rounds_x(x) if fmt.rounds_x is not None else x
    ref = xe.double() @ fmt.effective(state).double()
    y = fmt.call(fmt.input(x), state)
    return float((y.double() - ref).norm() / ref.norm())


def measure(params: dict, device: str) -> dict:
    """Every format at every shape and row count (see the module): {"rows": [...], "checks": [...]}, and the
    error study."""
    require(params, PARAMS)
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    dtype = getattr(torch, params["dtype"])
    l2 = torch.cuda.get_device_properties(0).L2_cache_size if device == "cuda" else 0
    rows, checks, skipped, slow, elapsed = [], [], [], set(), {}
    t0 = time.perf_counter()
    for si, (name, (K, N)) in enumerate(params["shapes"].items()):
        w = weights("gaussian", K, N, seed=params["seed"] + si, device=device).to(dtype)
        copies = timing.rotation(2 * K * N, l2) if l2 else 1
        ws = [w] + [w[torch.randperm(K, device=device)] for _ in range(copies - 1)]  # same values, other rows
        prepared = {}
        for f in formats(params, device):
            x = torch.randn(params["rows"][0], K, device=device).to(dtype)
            try:
                states = [f.prepare(c) for c in ws]
                err = check(f, x, states[0])
            except Exception as ex:  # noqa: BLE001 - a vendor path this build lacks is recorded, not fatal
                if not f.vendor:
                    raise
                checks.append({"shape": name, "format": f.name, "error": f"{type(ex).__name__}: {ex}"[:300]})
                continue
            checks.append({"shape": name, "format": f.name, "rel_err": err})
            if not err <= params["tolerance"]:
                if not f.vendor:
                    raise AssertionError(f"{f.name} at {name}: relative error {err:.3g} against its own weights, over "
                                         f"{params['tolerance']}: the kernel computes something else")
                continue
            prepared[f.name] = (f, states)
        for M in params["rows"]:
            x = torch.randn(M, K, device=device).to(dtype)
            for n in [n for n in prepared if n in slow]:  # past its limit: not timed at more rows
                del prepared[n]
            inputs = {n: f.input(x) for n, (f, _) in prepared.items()}
            times = _interleaved_rounds({n: [lambda s=s, f=f, xi=inputs[n]: f.call(xi, s) for s in states]
                                         for n, (f, states) in prepared.items()}, params, device)
            for n, t in times.items():
                rows.append({"shape": name, "K": K, "N": N, "M": M, "format": n, "bytes": prepared[n][0].nbytes(K, N),
                             **t})
            _progress(f"{name} M={M}: {time.perf_counter() - t0:.0f} s")
            t = {r["format"]: r["gpu_us"] or r["call_us"] for r in rows[-len(times):]}
            for n in times:  # a vendor path many times slower than bf16 is no contender at more rows
                if prepared[n][0].vendor and t[n] > params["slow"] * t["bf16"]:
                    slow.add(n)
                    skipped.append({"shape": name, "format": n, "after_M": M, "over_bf16": t[n] / t["bf16"]})
        slow = set()
        del ws, prepared
    elapsed["formats"] = time.perf_counter() - t0
    out = {"rows": rows, "checks": checks, "skipped": skipped}
    for key, part in (("layouts", measure_layouts), ("errors", errors), ("kv", measure_kv), ("step", measure_step)):
        t0 = time.perf_counter()
        out[key] = part(params, device)
        elapsed[key] = time.perf_counter() - t0
        _progress(f"{key}: {elapsed[key]:.0f} s")
    return {**out, "elapsed_s": elapsed}


def _progress(line: str) -> None:
    """A line appended to the file ``BOOK_PROGRESS`` names, if set: where a long measurement has got to."""
    path = os.environ.get("BOOK_PROGRESS")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def _interleaved_rounds(calls: dict, params: dict, device: str, target_ms: float | None = None) -> dict:
    """Each entry of ``calls`` (a name: callables over copies of its inputs) timed in ``params["rounds"]``
    rounds, the order reversed every other round: {name: {"gpu_us": the median of the rounds' medians (None
    where no GPU time was measured), "call_us": the same of the call times, "method", "gpu_us_rounds",
    "call_us_rounds": each round's median, in the order measured}}."""
    times = {n: [] for n in calls}
    for r in range(params["rounds"]):
        for n in (list(calls) if r % 2 == 0 else list(reversed(calls))):
            t = timing.bench(calls[n], device=device, reps=params["reps"], warmup=2,
                             target_ms=target_ms or params["target_ms"])
            times[n].append((t.gpu_us.median, t.call_us.median, t.method))
    out = {}
    for n, ts in times.items():
        gpu = [g for g, _, _ in ts if g == g]
        out[n] = {"gpu_us": statistics.median(gpu) if gpu else None, "call_us": statistics.median(c for _, c, _ in ts),
                  "method": ts[0][2], "gpu_us_rounds": gpu, "call_us_rounds": [c for _, c, _ in ts]}
    return out


def measure_layouts(params: dict, device: str) -> list[dict]:
    """int4 at one row (the GEMV) in every group size with its scales in their own array and interleaved
    after each group's weights (``lib.quant.interleave_scales``): the interleaved product checked equal to
    the separate one, then both timed over copies of the weights past the L2, in interleaved rounds."""
    dtype = getattr(torch, params["dtype"])
    l2 = torch.cuda.get_device_properties(0).L2_cache_size if device == "cuda" else 0
    out = []
    for si, (name, (K, N)) in enumerate(params["shapes"].items()):
        w = weights("gaussian", K, N, seed=params["seed"] + si, device=device).to(dtype)
        x = torch.randn(1, K, device=device).to(dtype)
        for g in params["groups"]:
            copies = timing.rotation(K * N // 2, l2) if l2 else 1
            sep = [quant.quantize_int4(w[torch.randperm(K, device=device)] if c else w, g) for c in range(copies)]
            inter = [quant.interleave_scales(s) for s in sep]
            a, b = quant_gemm.w4_gemv(x, sep[0]).float(), quant_gemm.w4_gemv(x, inter[0]).float()
            diff = float((a - b).abs().max() / a.abs().max())
            if not diff <= 1e-6:
                raise AssertionError(f"int4 g{g} at {name}: the interleaved layout's product differs from the separate "
                                     f"one's by {diff:.3g} of the largest; the layouts hold other values")
            t = _interleaved_rounds({lay: [lambda s=s, x=x: quant_gemm.w4_gemv(x, s) for s in ws]
                                     for lay, ws in (("separate", sep), ("interleaved", inter))}, params, device)
            for lay, times in t.items():
                out.append({"shape": name, "K": K, "N": N, "group": g, "layout": lay, **times,
                            "bytes": K * N // 2 + 4 * (K // g) * N, "max_rel_diff": diff})
            del sep, inter
    return out


def measure_kv(params: dict, device: str) -> dict:
    """Decode attention over a bf16 cache (``lib.kernels.decode_attention``) and an e4m3 one
    (``lib.kernels.decode_attention_fp8``) at each batch B and context L of ``params["kv"]`` (Llama-3-8B's
    heads on a GPU), paged, pages in a random order: where B L is at most ``check_tokens`` both outputs are
    checked against float64 attention over the cache each reads (the fp8 one over its dequantized values;
    over ``tolerance`` stops the run), and the fp8 output's error against float64 attention over the
    unquantized cache is recorded; then both timed over copies of the cache past the L2 in interleaved
    rounds. {"rows": one per (B, L, format), "checks": one per checked (B, L)}."""
    from lib.kernels import decode_attention as da
    from lib.kernels import decode_attention_fp8 as da8

    kv, dtype = params["kv"], getattr(torch, params["dtype"])
    l2 = torch.cuda.get_device_properties(0).L2_cache_size if device == "cuda" else 0
    gen = torch.Generator(device=device).manual_seed(params["seed"] + 7)
    rows, checks = [], []
    for B in kv["Bs"]:
        for L in kv["Ls"]:
            q = torch.randn(B, kv["H_q"], kv["d"], generator=gen, device=device).to(dtype)
            dense = [torch.randn(B, kv["H_kv"], L, kv["d"], generator=gen, device=device).to(dtype) for _ in "kv"]
            kc, bt = da.paginate(dense[0], kv["page"], generator=torch.Generator().manual_seed(B * L))
            vc, _ = da.paginate(dense[1], kv["page"], block_table=bt)
            del dense
            lens = torch.full((B,), L, dtype=torch.int32, device=device)
            (k8, ks), (v8, vs) = quant.quantize_kv_fp8(kc), quant.quantize_kv_fp8(vc)
            plans = {"bf16": da.DecodeAttention(q, kc, vc, bt, lens),
                     "fp8": da8.DecodeAttentionFP8(q, k8, v8, bt, lens, k_scale=ks, v_scale=vs)}
            if B * L <= kv["check_tokens"]:
                exact = da.reference(q, kc, vc, bt, lens, dtype=torch.float64)
                own = {"bf16": exact, "fp8": da.reference(q, k8.double() * ks, v8.double() * vs, bt, lens,
                                                          dtype=torch.float64)}  # over the dequantized cache
                row = {"B": B, "L": L}
                for n, ref in own.items():
                    got = plans[n](q, *((kc, vc) if n == "bf16" else (k8, v8)), bt, lens).double()
                    err = float((got - ref).norm() / ref.norm())
                    if not err <= kv["tolerance"]:
                        raise AssertionError(f"decode attention, {n} cache, B={B} L={L}: relative error {err:.3g} against "
                                             f"float64 over the cache it reads (at most {kv['tolerance']})")
                    row[f"{n}_rel_err"] = err
                    row[f"{n}_vs_exact"] = float((got - exact).norm() / exact.norm())
                checks.append(row)
                del exact, own
            copies = {n: timing.rotation(c.numel() * c.element_size() * 2, l2) if l2 else 1
                      for n, c in (("bf16", kc), ("fp8", k8))}
            stores = {"bf16": [(kc, vc)] + [(kc.clone(), vc.clone()) for _ in range(copies["bf16"] - 1)],
                      "fp8": [(k8, v8)] + [(k8.clone(), v8.clone()) for _ in range(copies["fp8"] - 1)]}
            calls = {n: [lambda p=plans[n], k=k, v=v, a=(q, bt, lens): p(a[0], k, v, *a[1:]) for k, v in stores[n]]
                     for n in plans}
            for n, times in _interleaved_rounds(calls, params, device).items():
                c = stores[n][0][0]
                rows.append({"B": B, "L": L, "format": n, **times, "bytes": 2 * c.numel() * c.element_size(),
                             "splits": plans[n].splits})
            del stores, calls, plans, kc, vc, k8, v8
            if device == "cuda":
                torch.cuda.empty_cache()
    return {"rows": rows, "checks": checks}


def errors(params: dict, device: str) -> list[dict]:
    """The error study (see the module): one row per (shape, weight kind, format)."""
    dtype = getattr(torch, params["dtype"])
    out = []
    for si, (name, (K, N)) in enumerate(params["shapes"].items()):
        x = torch.randn(16, K, generator=torch.Generator(device=device).manual_seed(params["seed"] + 100 + si),
                        device=device).to(dtype)
        for kind in WEIGHT_KINDS:
            w = weights(kind, K, N, seed=params["seed"] + si, device=device).to(dtype)
            ref = x.double() @ w.double()
            cands = {"int8": quant.quantize_int8(w).dequantize()}
            for g in params["groups"]:
                cands[f"int4 g{g}"] = quant.quantize_int4(w, g).dequantize()
            fp8_scale = w.abs().amax().float() / 448.0
            cands["fp8 (weights)"] = (w.float() / fp8_scale).to(torch.float8_e4m3fn).float() * fp8_scale
            for fmt, deq in cands.items():
                err = float((x.double() @ deq.double() - ref).norm() / ref.norm())
                out.append({"shape": name, "weights": kind, "format": fmt, "rel_err": err})
    return out


def _kernel_kinds(kernels) -> dict | None:
    """Kernel time (us) by kind, from one profiled call: the quantized products (the book's ``_w4_``/``_w8_``
    kernels), the other matrix kernels (bf16 products, sums of split-K partials; ``lib.bench.kernel_kinds``),
    attention, the rest. None where the profiler sees no GPU."""
    if kernels is None:
        return None
    names = {"gemm": "other matrix kernels", "attention": "attention", "other": "other"}
    out = {}
    for k in kernels:
        n = k["name"]
        kind = "quantized products" if n.startswith(("_w4_", "_w8_")) else names[kernel_kinds.kind(n)]
        out[kind] = out.get(kind, 0.0) + k["us"]
    return out


def measure_step(params: dict, device: str) -> list[dict]:
    """The decode step with each weight format at each (B, L) of ``params["step"]["shapes"]`` (see the
    module): one row per (format, B, L)."""
    from lib.bench import trace
    from lib.experiments import decode_step

    sp, dtype = params["step"], params["dtype"]
    cfg = models.CONFIGS[sp["config"]]
    gen = torch.Generator(device=device).manual_seed(params["seed"])
    m = models.Llama.random(cfg, seed=params["seed"], dtype=getattr(torch, dtype), device=device)
    g = sp["group"]
    steps = {"bf16": m.with_parts(models.FUSED), "int8": m.with_parts(models.quantized("int8")),
             f"int4 g{g}": m.with_parts(models.quantized("int4", g))}
    tol = models.LOGITS_TOLERANCE[dtype, device]
    out = []
    for B, L in sp["shapes"]:
        pool, table = decode_step._pool(m, B, L + 1, sp["block"], gen)
        lens = torch.full((B,), L, dtype=torch.int32, device=device)
        tokens = torch.randint(0, cfg.vocab, (B,), generator=gen, device=device)
        args = (tokens, pool, table, lens)
        checks = {}
        for name, fmt in (("int8", "int8"), (f"int4 g{g}", "int4")):
            ref = models.dequantized(m, fmt, g)(*args).float()
            got = steps[name](*args).float()
            err = float((got - ref).abs().max() / ref.abs().max())
            if not err <= tol:
                raise AssertionError(f"the {name} step at B={B}, L={L}: logits differ from the dequantized model's by "
                                     f"{err:.3g} of the largest (at most {tol}): a wrong step is not timed")
            checks[name] = {"max_rel": err, "argmax_agree": float((got.argmax(-1) == ref.argmax(-1)).float().mean())}
            del ref
        rounds = decode_step._interleaved(steps, args, {"rounds": params["rounds"], "reps": params["reps"],
                                                         "target_ms": sp["target_ms"]}, device)
        base = decode_step.step_bytes(cfg, B, L, b=getattr(torch, dtype).itemsize)
        for name, step in steps.items():
            layer = base["layer weights"] if name == "bf16" else step.layer_weight_bytes()
            gpu = [r["gpu_us"]["median"] for r in rounds[name] if r["gpu_us"]["median"] == r["gpu_us"]["median"]]
            out.append({"format": name, "B": B, "L": L, "check": checks.get(name),
                        "gpu_us": statistics.median(gpu) if gpu else None, "gpu_us_rounds": gpu,
                        "call_us": statistics.median(r["call_us"]["median"] for r in rounds[name]),
                        "bytes": {**base, "layer weights": layer},
                        "kernels_us": _kernel_kinds(trace.kernel_times(lambda s=step, a=args: s(*a), device))})
        del pool, table
        if device == "cuda":
            torch.cuda.empty_cache()
    return out



# ---------------------------------------------------------------------------- analysis

def speedups(rows: list[dict]) -> pd.DataFrame:
    """GPU time (us) per (shape, M, format) and its speedup over bf16 at the same (shape, M): bf16's time
    over the format's. A format without a GPU time (the CPU) gets NaN."""
    df = pd.DataFrame(rows)
    df["gpu_us"] = df["gpu_us"].astype(float)
    base = df[df["format"] == "bf16"].set_index(["shape", "M"])["gpu_us"]
    df["speedup"] = [base.get((s, m), float("nan")) / t for s, m, t in zip(df["shape"], df["M"], df["gpu_us"])]
    return df


def speedup_min(df, fmt: str, M: int) -> float:
    """The least speedup of ``fmt`` over bf16 at M rows over the shapes (NaN where it was not timed)."""
    s = df[(df["format"] == fmt) & (df["M"] == M)]["speedup"]
    return float(s.min()) if len(s) else float("nan")


def first_rows_faster(df, fmt: str, than: str) -> float:
    """The least row count from which ``fmt`` is faster than ``than`` at every shape and every larger row count
    measured (NaN if it never is)."""
    t = df.pivot_table(index="M", columns=["format", "shape"], values="gpu_us")
    if fmt not in t.columns.get_level_values(0) or than not in t.columns.get_level_values(0):
        return float("nan")
    wins = (t[fmt] < t[than]).all(axis=1)
    rows = list(wins.index)
    for i, m in enumerate(rows):
        if wins.iloc[i:].all():
            return float(m)
    return float("nan")


def memory_model(df, read_GBps: float, *, formats=None) -> pd.DataFrame:
    """Each timed point against the memory bound: its bytes (weights and scales) over ``read_GBps``, the
    least time it can take while the weights' read sets it; ``measured / predicted``."""
    out = df[df["gpu_us"].notna()].copy()
    if formats is not None:
        out = out[out["format"].isin(formats)]
    out["predicted_us"] = out["bytes"] / (read_GBps * 1e3)
    out["measured / predicted"] = out["gpu_us"] / out["predicted_us"]
    return out


def kind_of(fmt: str) -> tuple[str, int | None]:
    """A format's storage and group: "int4 g128" and "torch int4 g128" -> ("int4", 128), "int8" and "torch
    int8" -> ("int8", None), "fp8" and "fp8 gemm" -> ("fp8", None), "bf16" -> itself."""
    name = fmt.removeprefix("torch ").removesuffix(" gemm")
    if name.startswith("int4 g"):
        return "int4", int(name.removeprefix("int4 g"))
    if name in ("bf16", "int8", "fp8"):
        return name, None
    raise ValueError(f"unknown format {fmt!r}")


def memory_bound_points(df, read_GBps: float, mma_TFLOPs: float):
    """The points of ``memory_model`` below their format's crossover (``lib.quant.crossover_rows``): where
    the bytes, not the matrix work, bound the product."""
    mm = memory_model(df, read_GBps)
    keep = [M < quant.crossover_rows(*kind_of(f), read_GBps=read_GBps, mma_TFLOPs=mma_TFLOPs, K=K)
            for f, K, M in zip(mm["format"], mm["K"], mm["M"])]
    return mm[keep]


def step_table(step_rows: list[dict], read_GBps: float) -> pd.DataFrame:
    """The decode step with each weight format: GPU time, its floor (every byte it must read at ``read_GBps``),
    GPU time over the floor, and the speedup over the bf16 step at the same (B, L)."""
    rows = []
    for r in step_rows:
        nbytes = sum(r["bytes"].values())
        rows.append({"format": r["format"], "B": r["B"], "L": r["L"], "gpu_us": r["gpu_us"], "call_us": r["call_us"],
                     "floor_us": nbytes / (read_GBps * 1e3), "GB read": nbytes / 1e9})
    df = pd.DataFrame(rows)
    df["gpu_us"] = df["gpu_us"].astype(float)
    df["over floor"] = df["gpu_us"] / df["floor_us"]
    base = df[df["format"] == "bf16"].set_index(["B", "L"])["gpu_us"]
    df["speedup"] = [base.get((b, n), float("nan")) / t for b, n, t in zip(df["B"], df["L"], df["gpu_us"])]
    return df


def layout_table(layout_rows: list[dict]) -> pd.DataFrame:
    """int4 at one row by group size and product: GPU time (us) with the scales in their own array and
    interleaved, and interleaved over separate (above 1: interleaving is slower)."""
    df = pd.DataFrame(layout_rows)
    t = df.pivot_table(index=["group", "shape"], columns="layout", values="gpu_us").reset_index()
    t["interleaved / separate"] = t["interleaved"] / t["separate"]
    return t[["group", "shape", "separate", "interleaved", "interleaved / separate"]]


def kv_table(kv_rows: list[dict]) -> pd.DataFrame:
    """Decode attention by batch B and context L: GPU time (us) over the bf16 and the fp8 cache, the fp8
    cache's speedup (bf16's time over fp8's), and each one's read rate (cache bytes over GPU time, GB/s)."""
    df = pd.DataFrame(kv_rows)
    df["gpu_us"] = df["gpu_us"].astype(float)
    t = df.pivot_table(index=["B", "L"], columns="format", values=["gpu_us", "bytes"])
    out = pd.DataFrame({"bf16 us": t["gpu_us"]["bf16"], "fp8 us": t["gpu_us"]["fp8"]})
    out["speedup"] = out["bf16 us"] / out["fp8 us"]
    out["bf16 GB/s"] = t["bytes"]["bf16"] / out["bf16 us"] / 1e3
    out["fp8 GB/s"] = t["bytes"]["fp8"] / out["fp8 us"] / 1e3
    return out.reset_index()


def kv_speedup_min(table: pd.DataFrame, from_L: int) -> float:
    """The fp8 cache's least speedup over contexts of at least ``from_L`` tokens, every batch (NaN if none)."""
    s = table[table["L"] >= from_L]["speedup"]
    return float(s.min()) if len(s) else float("nan")


def speedup_max(df, fmt: str, M: int) -> float:
    """The largest speedup of ``fmt`` over bf16 at M rows over the shapes (NaN where it was not timed)."""
    s = df[(df["format"] == fmt) & (df["M"] == M)]["speedup"]
    return float(s.max()) if len(s) else float("nan")


# ---------------------------------------------------------------------------- the page

def page(res, df: pd.DataFrame, mb: pd.DataFrame, st: pd.DataFrame, lay: pd.DataFrame, kvt: pd.DataFrame,
         kvc: pd.DataFrame, checks: pd.DataFrame, read_GBps: float):
    """Every number and word chapter 9's page quotes, by name, from the notebook's tables: a ``Page`` (``lib.bench.page``).

    ``res``: the results (params, data, provenance, date); ``df``: ``speedups`` of the products; ``mb``:
    ``memory_bound_points``; ``st``: ``step_table``; ``lay``: ``layout_table``; ``kvt``: ``kv_table``;
    ``kvc``: the KV cache's checks (a row each); ``checks``: the products' checks with a "timed" column
    ("yes" within the tolerance); ``read_GBps``: chapter 0's read rate. A format or row count that was not
    timed (a smoke run on the CPU has no vendor path) gives NaN."""
    from lib.bench.page import Page

    nan = float("nan")
    rows, g = res.params["rows"], res.params["step"]["group"]
    e = pd.DataFrame(res.data["errors"]).pivot_table(index="format", columns="weights", values="rel_err", aggfunc="max")
    mm = mb.groupby("format")["measured / predicted"]  # a format with no memory-bound point (a smoke run): NaN
    by = {f: st[(st["format"] == f) & (st["B"] == st["B"].min())].iloc[0] for f in st["format"].unique()}
    b16 = {f: st[(st["format"] == f) & (st["B"] == st["B"].max())].iloc[0] for f in st["format"].unique()}
    b1 = by[f"int4 g{g}"]
    k1 = {r["format"]: r["kernels_us"] or {} for r in res.data["step"] if r["B"] == st["B"].min()}
    g1 = df[(df["M"] == rows[0]) & df["format"].str.startswith("int4")]
    g1t = g1.pivot_table(index="shape", columns="format", values="gpu_us")
    ok = checks[checks["timed"] == "yes"]["rel_err"]
    t4 = df[df["format"] == "torch int4 g128"].groupby("M")["speedup"].max()
    r1 = memory_model(df, read_GBps)
    r1 = r1[(r1["format"] == "int4 g128") & (r1["M"] == rows[0])]["predicted_us"]
    gemm = df[(df["format"] == "fp8 gemm") & df["speedup"].notna()]  # none on the CPU (a vendor path)
    bf = df[df["format"] == "bf16"].set_index(["shape", "M"])["gpu_us"]
    if len(gemm):
        top = gemm.loc[gemm["speedup"].idxmax()]
        i = rows.index(top["M"])  # bf16 at the row count before (none before the first)
        at = {"speedup": float(top["speedup"]), "M": float(top["M"]), "shape": str(top["shape"]).replace("_", "-"),
              "bf16": float(bf[(top["shape"], top["M"])]), "before": float(bf[(top["shape"], rows[i - 1])]) if i else nan}
    else:
        at = {"speedup": nan, "M": nan, "shape": "-", "bf16": nan, "before": nan}
    t1 = df[df["M"] == rows[0]].pivot_table(index="shape", columns="format", values="gpu_us")
    lr = lay["interleaved / separate"]
    speeds = {  # (name, format, M, least or largest over the products)
        "int4_g128_speedup_m1_min": ("int4 g128", 1, min), "int4_g128_speedup_m16_min": ("int4 g128", 16, min),
        "int8_speedup_m1_min": ("int8", 1, min), "torch_int4_speedup_m1_min": ("torch int4 g128", 1, min),
        "fp8_speedup_m2048_min": ("fp8", 2048, min), "int4_g128_speedup_m2_max": ("int4 g128", 2, max),
        "torch_int4_speedup_m4_min": ("torch int4 g128", 4, min), "torch_int8_speedup_m1_max": ("torch int8", 1, max),
        "int4_g128_speedup_m1_max": ("int4 g128", 1, max), "torch_int4_speedup_m1_max": ("torch int4 g128", 1, max),
        "int8_speedup_m1_max": ("int8", 1, max), "torch_int8_speedup_m1_min": ("torch int8", 1, min),
        "int4_g128_speedup_m16_max": ("int4 g128", 16, max), "torch_int4_speedup_m16_max": ("torch int4 g128", 16, max),
        "int8_speedup_m16_min": ("int8", 16, min), "int8_speedup_m16_max": ("int8", 16, max),
        "fp8_gemm_speedup_m1_min": ("fp8 gemm", 1, min), "fp8_gemm_speedup_m1_max": ("fp8 gemm", 1, max),
        "fp8_gemm_speedup_m2048_min": ("fp8 gemm", 2048, min), "fp8_speedup_m1_min": ("fp8", 1, min),
        "fp8_speedup_m1_max": ("fp8", 1, max), "int4_g128_speedup_m32_min": ("int4 g128", 32, min),
        "int4_g128_speedup_m32_max": ("int4 g128", 32, max), "int4_g128_speedup_m4096_min": ("int4 g128", rows[-1], min),
    }
    numbers = {name: (speedup_min if f is min else speedup_max)(df, fmt, M) for name, (fmt, M, f) in speeds.items()}
    numbers.update({
        "fp8_gemm_over_int4_from_rows": first_rows_faster(df, "fp8 gemm", "int4 g128"),
        "step_int4_over_floor_b1": b1["over floor"], "step_int4_speedup_b1": b1["speedup"],
        "quant_model_median_abs_err": float((mb["measured / predicted"] - 1).abs().median()),
        "int4_g128_bound": quant.speedup_bound("int4", 128),
        "fp8_kv_speedup_16k_min": kv_speedup_min(kvt, 16384),
        "fp8_kv_speedup_max": float(kvt["speedup"].max()),
        "fp8_kv_err_vs_exact_max": float(kvc["fp8_vs_exact"].max()),
        "layout_ratio_median": float(lr.median()),
        "layout_ratio_max": float(lr.max()),
        "layout_ratio_g128_max": float(lr[lay["group"] >= 128].max()),
        "layout_ratio_g128_min": float(lr[lay["group"] >= 128].min()),
        "layout_ratio_small_min": float(lr[lay["group"] < 128].min()),
        "int4_g128_speedup_m4096_max": float(df[(df["format"] == "int4 g128") & (df["M"] == rows[-1])]["speedup"].max()),
        "int8_speedup_m4096_max": float(df[(df["format"] == "int8") & (df["M"] == rows[-1])]["speedup"].max()),
        "fp8_kv_speedup_b16_max": float(kvt[kvt["B"] == kvt["B"].max()]["speedup"].max()),
        "fp8_kv_rate_max": float(kvt["fp8 GB/s"].max()), "bf16_kv_rate_max": float(kvt["bf16 GB/s"].max()),
        "fp8_kv_speedup_min": float(kvt["speedup"].min()),
        "bf16_over_read_median": float(mm.median().get("bf16", nan)),
        "int4_g128_over_read_min": float(mm.min().get("int4 g128", nan)),
        "g32_over_g128_m1_max": float((g1t["int4 g32"] / g1t["int4 g128"]).max()),
        "g32_over_g128_bytes": quant.bytes_per_weight("int4", 32) / quant.bytes_per_weight("int4", 128),
        "err_int8_gauss": e.loc["int8", "gaussian"], "err_int8_outlier": e.loc["int8", "outlier channels"],
        "err_int4_g128_gauss": e.loc["int4 g128", "gaussian"], "err_int4_g32_gauss": e.loc["int4 g32", "gaussian"],
        "err_int4_g128_outlier": e.loc["int4 g128", "outlier channels"],
        "err_int4_g32_outlier": e.loc["int4 g32", "outlier channels"],
        "err_fp8_gauss": e.loc["fp8 (weights)", "gaussian"], "err_fp8_outlier": e.loc["fp8 (weights)", "outlier channels"],
        "step_bf16_b1_ms": by["bf16"]["gpu_us"] / 1e3, "step_int8_b1_ms": by["int8"]["gpu_us"] / 1e3,
        "step_int4_b1_ms": by[f"int4 g{g}"]["gpu_us"] / 1e3, "step_bf16_over_floor_b1": by["bf16"]["over floor"],
        "step_int8_over_floor_b1": by["int8"]["over floor"], "step_int8_speedup_b1": by["int8"]["speedup"],
        "step_int4_speedup_b16": b16[f"int4 g{g}"]["speedup"], "step_int8_speedup_b16": b16["int8"]["speedup"],
        "step_b16": float(st["B"].max()),
        "step_int4_quant_ms_b1": k1[f"int4 g{g}"].get("quantized products", 0.0) / 1e3,
        "step_bf16_matrix_ms_b1": k1["bf16"].get("other matrix kernels", 0.0) / 1e3,
        "checks_max_err_timed": float(ok.max()), "tolerance": res.params["tolerance"],
        "fp8_check_err_min": float(checks[checks["format"] == "fp8"]["rel_err"].min()),
        "torch_int4_below_bf16_from_rows": float(t4[t4 < 1].index.min()),
        "int4_read_us_min": float(r1.min()), "int4_read_us_max": float(r1.max()),
        "fp8_over_bf16_kv_rate": float(kvt["fp8 GB/s"].max() / kvt["bf16 GB/s"].max()),
        "scale_share_g32": 4 / 32 / quant.bytes_per_weight("int4", 32),
        "scale_share_g128": 4 / 128 / quant.bytes_per_weight("int4", 128),
        "int4_m1_share_of_bound_min": speedup_min(df, "int4 g128", 1) / quant.speedup_bound("int4", 128),
        "int4_m1_share_of_bound_max": speedup_max(df, "int4 g128", 1) / quant.speedup_bound("int4", 128),
        "fp8_gemm_speedup_min": float(gemm["speedup"].min()) if len(gemm) else nan,
        "fp8_gemm_speedup_max": at["speedup"], "fp8_gemm_max_rows": at["M"], "bf16_at_fp8_max_us": at["bf16"],
        "bf16_before_fp8_max_us": at["before"],
        "fp8_quantize_x_us_m1": float((t1["fp8"] - t1["fp8 gemm"]).median()) if len(gemm) else nan,
        "fp8_gemm_over_read_median": float(mm.median().get("fp8 gemm", nan)),
        "read_floor_over_min": float(memory_model(df, read_GBps)["measured / predicted"].min()),
    })
    texts = {"device_name": res.provenance["name"], "measured_date": res.date, "fp8_gemm_max_shape": at["shape"]}
    return Page(numbers=numbers, texts=texts)
