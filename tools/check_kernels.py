"""Compile every kernel the book launches for Hopper (sm_90a), without a GPU.

    python tools/check_kernels.py [--only decode_attention,grouped_gemm,stream,fused,tuning,quant] [--paths] [--limit N]
                                  [--jobs J] [--list] [--fresh-cache]

Triton's interpreter (how CI runs the kernels) never compiles them, so a kernel that the frontend, the
compiler's passes or ptxas would reject on the GPU passes every CPU test. This check compiles them, for
the launch configurations the book's rules choose at the chapters' shapes, down to a cubin for sm_90a,
and checks that each fits in the shared memory of one H100/H200 program.

The configurations are not listed by hand: the check takes the shapes of each chapter's full run from
its experiment module (``lib.experiments``), plans the calls with the library's own plans
(``DecodeAttention``, ``GroupedGemm``, ``read_sum``, ``read_pages_sum``) on meta tensors (shapes, strides
and dtypes, no memory), as a GPU with ``--sms`` SMs would see them, and records what the plans hand to
``kernel[grid](...)`` instead of launching it. Each recorded launch is specialized the way
Triton's launcher specializes it on a GPU (pointers aligned to 16 bytes, integers equal to 1 made
constants, integers divisible by 16 marked so), deduplicated, and compiled through
``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))``.

- Chapter 3 (``decode_attention``): its main sweep (H_q = 32, d = 128, bf16, B in 1, 8, 64, L from 512 to
  131072, H_kv in 32, 8, 1, pages of 16 and the contiguous cache), its page-size sweep, ragged checks and
  short contexts; the default plan, and the paths the chapter times (combine inline and in a second
  kernel, prefetch off, 4 warps).
- Chapter 4 (``grouped_gemm``): its MoE shapes (E, K, N) and token counts T in bf16; the TMA and the
  pointer kernels, whole and half-height last tiles.
- Chapter 3's read-only kernels (``stream``) at the launches its run takes, and with every load hint.
- Chapter 7 (``fused``): residual add + RMSNorm, RoPE + the K/V write, SiLU x up and the skinny GEMM at
  Llama-3-8B's shapes.
- Chapter 9 (``quant_gemm``): the GEMMs of int8 and int4 weights at Llama-3-8B's four layer products, a few
  row counts and every int4 group size.
- ``tuning``: a few launches of the tuning sweeps' variant kernels (``tools/tuning``).

A kernel the frontend or ptxas rejects is reported with its name and configuration; the exit status is 1
when any fails. ``--fresh-cache`` compiles into an empty Triton cache (otherwise kernels compiled
before are found in Triton's cache).
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "0"  # compile, never interpret: before anything defines a kernel

import argparse  # noqa: E402
import inspect  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools" / "tuning"))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)  # Hopper: Triton compiles capability 90 for sm_90a
H200_SMS = 132
MAX_SHARED = 232448  # bytes of shared memory one program may use on sm_90 (227 KiB)
GROUPS = ("decode_attention", "grouped_gemm", "stream", "fused", "tuning", "quant")
_TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64",
          torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8",
          torch.bool: "i1", torch.float8_e4m3fn: "fp8e4nv"}


@dataclass
class Job:
    """One kernel to compile: its parameters' signature types, constants and attributes, its options."""

    kernel: object
    signature: dict
    constants: dict
    attrs: dict
    options: dict
    label: str  # where it came from: the chapter's call that planned it
    shown: dict = field(default_factory=dict)  # the configuration, for messages

    @property
    def name(self) -> str:
        return self.kernel.fn.__name__

    def key(self):
        return (self.kernel.fn.__module__, self.name, tuple(self.signature.items()),
                tuple((k, repr(v)) for k, v in self.constants.items()), tuple((k, repr(v)) for k, v in self.attrs.items()),
                tuple(sorted(self.options.items())))

    def code_path(self):
        """What decides the code the compiler sees, without the sizes that only scale it: the kernel, its
        options, its argument types, its flags and tile sizes, whether a context is split and how a page
        compares with a tile. One job of each is what ``--paths`` compiles."""
        meta = dict(self.shown)
        kept = {k: v for k, v in meta.items() if isinstance(v, bool) or k.startswith(("BLOCK", "STAGES", "ORDER"))}
        if "SPLITS" in meta:
            kept["SPLITS"] = min(int(meta["SPLITS"]), 2)
        if "PAGE" in meta and "BLOCK_N" in meta:
            kept["PAGE"] = "whole tiles" if meta["PAGE"] % meta["BLOCK_N"] == 0 else "pages per tile"
        return (self.kernel.fn.__module__, self.name, tuple(self.signature.values()), tuple(sorted(kept.items())),
                tuple(sorted(self.options.items())))

    def describe(self) -> str:
        return f"{self.name} {self.shown} options {self.options} (from {self.label})"


def specialize(value) -> tuple[str, object]:
    """How Triton's launcher specializes one runtime argument on a GPU: ("constexpr", value) for integers
    equal to 1 and None, else (type, "D" if divisible by 16 else ""). Tensors count as aligned to 16 bytes:
    every GPU allocation is, and the book's plans launch directly only aligned data."""
    if isinstance(value, torch.Tensor):
        if value.dtype not in _TYPES:
            raise TypeError(f"no Triton pointer type for {value.dtype}")
        return "*" + _TYPES[value.dtype], "D"
    if value is None:
        return "constexpr", None
    if isinstance(value, bool):
        return "u1", ""
    if isinstance(value, int):
        if value == 1:
            return "constexpr", 1
        kind = "i32" if -2**31 <= value < 2**31 else ("u64" if value >= 2**63 else "i64")
        return kind, "D" if value % 16 == 0 else ""
    if isinstance(value, float):
        return "fp32", ""
    raise TypeError(f"cannot specialize a kernel argument of type {type(value).__name__}")


def _is_constexpr(param: inspect.Parameter) -> bool:
    ann = param.annotation
    if ann is inspect.Parameter.empty:
        return False
    return "constexpr" in (ann if isinstance(ann, str) else getattr(ann, "__name__", repr(ann)))


def job_for(kernel, args: tuple, kwargs: dict, label: str) -> Job:
    """The compile job of ``kernel[grid](*args, **kwargs)``: ``kwargs`` holds the constexprs and the
    compile options (num_warps, num_stages), as at a launch."""
    params = list(inspect.signature(kernel.fn).parameters.values())
    names = {p.name for p in params}
    options = {k: v for k, v in kwargs.items() if k not in names}
    bound = inspect.signature(kernel.fn).bind(*args, **{k: v for k, v in kwargs.items() if k in names})
    bound.apply_defaults()
    signature, constants, attrs, shown = {}, {}, {}, {}
    for i, p in enumerate(params):
        value = bound.arguments[p.name]
        if _is_constexpr(p):
            signature[p.name], constants[p.name] = "constexpr", value
            shown[p.name] = value
            continue
        kind, attr = specialize(value)
        signature[p.name] = kind
        if kind == "constexpr":
            constants[p.name] = attr
        elif attr == "D":
            attrs[(i,)] = [["tt.divisibility", 16]]
    return Job(kernel, signature, constants, attrs, options, label, shown)


class Recorder:
    """While active, a kernel launched through ``kernel[grid](...)`` is recorded as a compile job, not run.
    Triton's ``JITFunction.run`` is what ``kernel[grid](...)`` calls, in every release this check knows."""

    def __init__(self):
        self.jobs: list[Job] = []
        self.label = ""

    def __enter__(self):
        from triton.runtime.jit import JITFunction

        self._jit, self._run = JITFunction, JITFunction.run
        recorder = self

        def run(kernel, *args, grid, warmup, **kwargs):
            recorder.jobs.append(job_for(kernel, args, kwargs, recorder.label))

        JITFunction.run = run
        return self

    def __exit__(self, *exc):
        self._jit.run = self._run


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _decode_calls(rec: Recorder) -> None:
    """Chapter 3's decode-attention calls at the shapes of its full run (``lib.experiments.kv_cache.sweep``),
    planned as on the GPU: the default plan everywhere, and at the main sweep's page size and the
    contiguous cache the paths the chapter times (combine inline and in a second kernel, no prefetch,
    4 warps)."""
    from lib.experiments import kv_cache
    from lib.kernels import decode_attention as da

    p = kv_cache.sweep("full")
    dtype, Hq, d = getattr(torch, p["dtype"]), p["Hq"], p["d"]
    pages: dict[tuple, set] = {}
    for B in p["Bs"]:
        for L in p["Ls"]:
            for Hkv in p["Hkvs"]:
                pages.setdefault((B, L, Hkv), set()).update({p["page"], 0})  # 0: the contiguous cache
    for B, L, Hkv in p["page_sweep"]["shapes"]:
        pages.setdefault((B, L, Hkv), set()).update({0, *p["page_sweep"]["pages"]})
    for Hkv in p["check"]["Hkvs"]:
        pages.setdefault((p["check"]["B"], p["check"]["L"], Hkv), set()).update({0, *p["check"]["pages"]})
    for L in p["short"]["Ls"]:
        pages.setdefault((p["short"]["B"], L, p["short"]["H_kv"]), set()).add(p["page"])
    timed = [{}, dict(combine="inline"), dict(combine="kernel"), dict(prefetch=False), dict(num_warps=4)]
    for (B, L, Hkv), sizes in sorted(pages.items()):
        for page in sorted(sizes):
            size = page or L
            per = -(-L // size)
            q, lens = _meta(B, Hq, d, dtype=dtype), _meta(B, dtype=torch.int32)
            kc, bt = _meta(B * per, Hkv, size, d, dtype=dtype), _meta(B, per, dtype=torch.int32)
            for kw in timed if page in (0, p["page"]) else timed[:1]:
                rec.label = f"chapter 3: B={B} L={L} H_kv={Hkv} page={page or 'dense'} {kw or 'default'}"
                plan = da.DecodeAttention(q, kc, kc, bt, lens, **kw)
                plan(q, kc, kc, bt, lens)
                if plan.second:
                    plan.partials(q, kc, kc, bt, lens)


def _grouped_calls(rec: Recorder) -> None:
    """Chapter 4's grouped-GEMM calls at the shapes of its full run (``lib.experiments.grouped_gemm.sweep``),
    planned as on the GPU: TMA and pointer kernels, whole and half-height last tiles."""
    from lib.experiments import grouped_gemm as chapter4
    from lib.kernels import grouped_gemm as gg

    p = chapter4.sweep("full")
    dtype = getattr(torch, p["dtype"])
    for E, K, N in p["shapes"]:
        w, offsets = _meta(E, K, N, dtype=dtype), _meta(E + 1, dtype=torch.int32)
        for T in p["T"]:
            x = _meta(T, K, dtype=dtype)
            for kw in (dict(), dict(half_tail=True), dict(tma=False), dict(tma=False, half_tail=True)):
                rec.label = f"chapter 4: E={E} K={K} N={N} T={T} {kw or 'default'}"
                gg.GroupedGemm(x, w, offsets, **kw)(x, w, offsets)


def _stream_calls(rec: Recorder) -> None:
    """Chapter 3's read-only kernels: the launches its run takes (``lib.experiments.kv_cache.READ_LAUNCHES``)
    at its numbers of KV heads, and every load hint."""
    from lib.experiments import kv_cache
    from lib.kernels import stream

    p = kv_cache.sweep("full")
    dtype, d, page = getattr(torch, p["dtype"]), p["d"], p["page"]
    hints = [(e, "") for e in stream.EVICTS] + [("", c) for c in stream.CACHES if c]
    B, L = p["seed"][:2]
    for Hkv in p["Hkvs"]:
        k = _meta(B, Hkv, L, d, dtype=dtype)
        kc, pages = _meta(B * L // page, Hkv, page, d, dtype=dtype), _meta(B * L // page, dtype=torch.int32)
        for path, launches in kv_cache.READ_LAUNCHES.items():
            for programs, block, warps, evict in launches:
                rec.label = f"chapter 3: {path} H_kv={Hkv} {programs} programs"
                if "paged" in path:
                    stream.read_pages_sum(kc, kc, pages, programs=programs, block=block, num_warps=warps, evict=evict)
                else:
                    stream.read_sum(k, k, programs=programs, block=block, num_warps=warps, evict=evict)
        for evict, cache in hints:
            rec.label = f"chapter 3: load hints evict={evict!r} cache={cache!r}"
            stream.read_sum(k, k, evict=evict, cache=cache)
            stream.read_pages_sum(kc, kc, pages, evict=evict, cache=cache)


def _tuning_calls(rec: Recorder) -> None:
    """A few launches of the tuning sweeps' variant kernels, so that they keep compiling."""
    import decode_attention_variants as dv
    import grouped_gemm_variants as gv

    q, lens = _meta(8, 32, 128), _meta(8, dtype=torch.int32)
    kc, bt = _meta(8 * 256, 8, 16, 128), _meta(8, 256, dtype=torch.int32)
    for kw in (dict(v_early=True), dict(evict="evict_first"), dict(per_page=True, block_n=32),
               dict(per_page=False, block_n=64), dict(v_early=True, evict="evict_first", block_n=64, num_warps=4)):
        rec.label = f"tuning: decode-attention variant {kw}"
        dv.DecodeAttentionVariant(q, kc, kc, bt, lens, **kw)(q, kc, kc, bt, lens)
    # as the sweeps run them: the interleaved order on the rule's tiles, with and without half tails
    # (--order), warp specialization with the flattened loop on every tile (--flatten) and on the large
    # tiles either way (--tma)
    for E, K, N, T in [(64, 2048, 1408, 8192), (64, 2048, 1408, 1024)]:
        x, w, offsets = _meta(T, K), _meta(E, K, N), _meta(E + 1, dtype=torch.int32)
        for kw in (dict(order="interleave"), dict(order="interleave", half_tail=True),
                   dict(warp_specialize=True, flatten=True)):
            rec.label = f"tuning: grouped-GEMM variant E={E} T={T} {kw}"
            gv.GroupedGemmVariant(x, w, offsets, **kw)(x, w, offsets)
    x, w, offsets = _meta(8192, 2048), _meta(64, 2048, 1408), _meta(65, dtype=torch.int32)
    for bn, stages, flatten in ((256, 4, False), (128, 3, True)):
        kw = dict(block_m=128, block_n=bn, block_k=64, num_warps=8, num_stages=stages, warp_specialize=True,
                  flatten=flatten)
        rec.label = f"tuning: grouped-GEMM variant E=64 T=8192 {kw}"
        gv.GroupedGemmVariant(x, w, offsets, **kw)(x, w, offsets)
    import quant_gemv_variants as qv

    from lib import quant

    w4 = quant.Int4Weight(_meta(2048, 4096, dtype=torch.uint8), _meta(32, 4096, dtype=torch.float32), 128)
    for M, block_m, rows, splits in ((2, 2, 16, 1), (4, 4, 16, 2), (8, 8, 8, 4)):
        rec.label = f"tuning: int4 GEMV of {block_m} rows per program, M={M}"
        qv.w4_gemv_rows(_meta(M, 4096), w4, block_m=block_m, rows=rows, splits=splits)


def _fused_calls(rec: Recorder) -> None:
    """Chapter 7's fused kernels at the shapes of its full run (``lib.experiments.decode_step.sweep``) on
    Llama-3-8B's configuration: residual add + RMSNorm, RoPE + the K/V write, SiLU x up, the skinny GEMM,
    greedy and top-p sampling."""
    from lib import models
    from lib.experiments import decode_step
    from lib.kernels import fused, sampling, skinny_gemm

    p = decode_step.sweep("full")
    c, dtype = models.CONFIGS[p["config"]], getattr(torch, p["dtype"])
    for B, L in p["shapes"]:
        pages = -(-L // p["block"])
        rec.label = f"chapter 7: B={B} L={L}"
        x = _meta(B, c.hidden, dtype=dtype)
        fused.rmsnorm(x, _meta(c.hidden, dtype=dtype), c.eps)
        fused.rmsnorm(x, _meta(c.hidden, dtype=dtype), c.eps, residual=x)
        kc = _meta(B * pages, c.kv_heads, p["block"], c.head_dim, dtype=dtype)
        fused.rope_write(_meta(B, (c.heads + 2 * c.kv_heads) * c.head_dim, dtype=dtype), _meta(B, dtype=torch.int64),
                         _meta(c.head_dim // 2, dtype=torch.float32), kc, kc, _meta(B, pages, dtype=torch.int32), c.heads)
        fused.silu_mul(_meta(B, 2 * c.mlp, dtype=dtype))
        # split-K products handed on as partial sums (the splits the skinny GEMM's rule picks on an H200)
        width = (c.heads + 2 * c.kv_heads) * c.head_dim
        for K, N in ((c.hidden, width), (c.heads * c.head_dim, c.hidden), (c.mlp, c.hidden)):
            if not skinny_gemm.use_for(B, N, K):
                continue
            s = skinny_gemm.choose_config(B, N, K, H200_SMS)["splits"]
            rec.label = f"chapter 7: {s} partial sums of M={B} K={K} N={N} into the next kernel"
            if s > 1 and N == width:
                fused.rope_write(_meta(s, B, N, dtype=torch.float32), _meta(B, dtype=torch.int64),
                                 _meta(c.head_dim // 2, dtype=torch.float32), kc, kc, _meta(B, pages, dtype=torch.int32),
                                 c.heads)
            elif s > 1:
                fused.rmsnorm(_meta(s, B, N, dtype=torch.float32), _meta(c.hidden, dtype=dtype), c.eps, residual=x)
        for K, N in ((c.hidden, (c.heads + 2 * c.kv_heads) * c.head_dim), (c.heads * c.head_dim, c.hidden),
                     (c.hidden, 2 * c.mlp), (c.mlp, c.hidden), (c.hidden, c.vocab)):
            rec.label = f"chapter 7: skinny GEMM M={B} K={K} N={N}"
            skinny_gemm.skinny_mm(_meta(B, K, dtype=dtype), _meta(K, N, dtype=dtype), out=_meta(B, N, dtype=dtype))
        rec.label = f"chapter 7: the head with greedy sampling, M={B}"
        skinny_gemm.skinny_argmax(_meta(B, c.hidden, dtype=dtype), _meta(c.hidden, c.vocab, dtype=dtype))
        rec.label = f"chapter 7: top-p sampling, M={B}"
        sampling.top_p_sample(_meta(B, c.vocab, dtype=dtype), _meta(B, dtype=torch.float32), _meta(B, dtype=torch.float32),
                              seed=_meta(1, dtype=torch.int64))
        sampling.top_p_sample(_meta(B, c.vocab, dtype=dtype), 0.9, 0.8, uniform=_meta(B, c.vocab, dtype=torch.float32))


def _quant_calls(rec: Recorder) -> None:
    """Chapter 9's GEMMs of quantized weights (``lib.kernels.quant_gemm``) at Llama-3-8B's four layer products,
    a few row counts, int8 and int4 in every group size, bf16 activations; and its decode attention over
    bf16 and fp8 caches at the batches and contexts of its full run."""
    from lib import models, quant
    from lib.kernels import quant_gemm

    c = models.LLAMA3_8B
    for K, N in ((c.hidden, (c.heads + 2 * c.kv_heads) * c.head_dim), (c.heads * c.head_dim, c.hidden),
                 (c.hidden, 2 * c.mlp), (c.mlp, c.hidden)):
        for M in (1, 16, 64, 256):
            x = _meta(M, K)
            rec.label = f"chapter 9: int8 M={M} K={K} N={N}"
            for swap in (False, True):
                quant_gemm.w8_mm(x, quant.Int8Weight(_meta(K, N, dtype=torch.int8), _meta(N, dtype=torch.float32)),
                                 swap=swap)
                for g in quant.GROUPS:
                    rec.label = f"chapter 9: int4 g={g} M={M} K={K} N={N} swap={swap}"
                    quant_gemm.w4_mm(x, quant.Int4Weight(_meta(K // 2, N, dtype=torch.uint8),
                                                         _meta(K // g, N, dtype=torch.float32), g), swap=swap)
        for M in (1, 4):
            x = _meta(M, K)
            rec.label = f"chapter 9: int8 GEMV M={M} K={K} N={N}"
            quant_gemm.w8_gemv(x, quant.Int8Weight(_meta(K, N, dtype=torch.int8), _meta(N, dtype=torch.float32)))
            for g in quant.GROUPS:
                rec.label = f"chapter 9: int4 GEMV g={g} M={M} K={K} N={N}"
                quant_gemm.w4_gemv(x, quant.Int4Weight(_meta(K // 2, N, dtype=torch.uint8),
                                                       _meta(K // g, N, dtype=torch.float32), g))
                rec.label = f"chapter 9: int4 GEMV, slices summed inline, g={g} M={M} K={K} N={N}"
                quant_gemm.w4_gemv(x, quant.Int4Weight(_meta(K // 2, N, dtype=torch.uint8),
                                                       _meta(K // g, N, dtype=torch.float32), g), splits=4,
                                   inline_sum=True)
                rec.label = f"chapter 9: int4 GEMV, scales interleaved, g={g} M={M} K={K} N={N}"
                quant_gemm.w4_gemv(x, quant.Int4Interleaved(_meta(K // g, g // 2 + 4, N // 4, dtype=torch.int32), g))
    from lib.experiments import quantization
    from lib.kernels import decode_attention as da
    from lib.kernels import decode_attention_fp8 as da8

    kv = quantization.sweep("full")["kv"]
    for B in kv["Bs"]:
        for L in kv["Ls"]:
            per = -(-L // kv["page"])
            q, lens = _meta(B, kv["H_q"], kv["d"]), _meta(B, dtype=torch.int32)
            bt = _meta(B, per, dtype=torch.int32)
            rec.label = f"chapter 9: decode attention B={B} L={L}, bf16 cache"
            c16 = _meta(B * per, kv["H_kv"], kv["page"], kv["d"])
            da.DecodeAttention(q, c16, c16, bt, lens)(q, c16, c16, bt, lens)
            rec.label = f"chapter 9: decode attention B={B} L={L}, fp8 cache"
            c8 = _meta(B * per, kv["H_kv"], kv["page"], kv["d"], dtype=torch.float8_e4m3fn)
            da8.DecodeAttentionFP8(q, c8, c8, bt, lens, k_scale=1.0, v_scale=1.0)(q, c8, c8, bt, lens)


CALLS = {"decode_attention": _decode_calls, "grouped_gemm": _grouped_calls, "stream": _stream_calls,
         "fused": _fused_calls, "tuning": _tuning_calls, "quant": _quant_calls}


def plan_jobs(groups=GROUPS, sms: int = H200_SMS) -> list[Job]:
    """The deduplicated compile jobs of ``groups``, planned for a GPU of ``sms`` SMs."""
    from lib.kernels import launch

    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("TRITON_INTERPRET is set: the kernels were defined for the interpreter, which compiles "
                           "nothing. Run this check in a process of its own (python tools/check_kernels.py).")
    real = launch.sm_count
    launch.sm_count = lambda device: sms  # the plans' rules count SMs: the GPU's, not the meta device's
    try:
        with Recorder() as rec:
            for group in groups:
                CALLS[group](rec)
    finally:
        launch.sm_count = real
    unique = {}
    for job in rec.jobs:
        unique.setdefault(job.key(), job)
    return list(unique.values())


def one_per_code_path(jobs: list[Job]) -> list[Job]:
    """The first job of each ``Job.code_path``: every branch and tile of every kernel, compiled once."""
    first = {}
    for job in jobs:
        first.setdefault(job.code_path(), job)
    return list(first.values())


def compile_job(job: Job) -> tuple[bool, str]:
    """Compile ``job`` for sm_90a; (ok, message). The message names the kernel and its configuration."""
    try:
        src = ASTSource(fn=job.kernel, signature=job.signature, constexprs=job.constants, attrs=job.attrs)
        compiled = triton.compile(src, target=TARGET, options=job.options)
    except Exception as e:  # the frontend, a compiler pass or ptxas refused it
        lines = [ln for ln in traceback.format_exception_only(type(e), e) if ln.strip()]
        return False, f"FAILED {job.describe()}:\n    " + "    ".join(lines[-6:])
    shared = getattr(compiled.metadata, "shared", 0)
    if shared > MAX_SHARED:
        return False, (f"FAILED {job.describe()}: needs {shared} bytes of shared memory, more than the {MAX_SHARED} "
                       f"one program may use on sm_90; use fewer stages or smaller tiles")
    return True, f"ok {job.name} ({shared} B shared) {job.shown}"


_JOBS: list[Job] = []  # what forked workers compile (kernels do not pickle)


def _compile_one(i):
    return compile_job(_JOBS[i])


def run(jobs: list[Job], workers: int = 1, verbose: bool = False) -> list[str]:
    """Compile every job (``workers`` processes); the failures' messages."""
    if workers > 1 and len(jobs) > 1:
        import multiprocessing

        _JOBS[:] = jobs
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            results = pool.map(_compile_one, range(len(jobs)), chunksize=2)
    else:
        results = [compile_job(job) for job in jobs]
    failures = []
    for ok, message in results:
        if verbose or not ok:
            print(message, flush=True)
        if not ok:
            failures.append(message)
    return failures


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(GROUPS), help=f"comma-separated groups of {GROUPS}")
    ap.add_argument("--limit", type=int, default=None, help="compile only the first N jobs of each group")
    ap.add_argument("--paths", action="store_true",
                    help="one configuration of each code path (Job.code_path): every branch and tile, not every size")
    ap.add_argument("--sms", type=int, default=H200_SMS, help="the SMs the plans' rules count (H200: 132)")
    ap.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)),
                    help="compile in this many processes (default: one per CPU core this process may use)")
    ap.add_argument("--list", action="store_true", help="list the jobs, compile nothing")
    ap.add_argument("--fresh-cache", action="store_true", help="compile into an empty Triton cache")
    ap.add_argument("-v", "--verbose", action="store_true", help="a line per compiled kernel")
    args = ap.parse_args(argv)
    groups = [g for g in args.only.split(",") if g]
    unknown = set(groups) - set(GROUPS)
    if unknown:
        ap.error(f"unknown group(s) {sorted(unknown)}; choose from {GROUPS}")
    t0 = time.perf_counter()
    jobs = []
    for group in groups:
        found = plan_jobs([group], args.sms)
        found = one_per_code_path(found) if args.paths else found
        jobs += found[: args.limit] if args.limit else found
    if args.list:
        for job in jobs:
            print(job.describe())
        return 0
    print(f"Triton {triton.__version__}: {len(jobs)} kernel configurations of {', '.join(groups)} for sm_90a "
          f"(planned in {time.perf_counter() - t0:.1f} s)", flush=True)
    if args.fresh_cache:
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="check-kernels-")
    failures = run(jobs, workers=max(1, args.jobs), verbose=args.verbose)
    took = time.perf_counter() - t0
    if failures:
        print(f"{len(failures)} of {len(jobs)} kernel configurations failed to compile ({took:.0f} s)", flush=True)
        return 1
    print(f"all {len(jobs)} compiled ({took:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
