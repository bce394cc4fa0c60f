"""A kernel that only reads: the fastest any kernel can consume a given set of bytes.

``read_sum(a, b)`` reads two tensors once, in large contiguous pieces, and writes one partial sum per
program (so the loads cannot be dropped). Its time for the bytes of a KV cache is the best that a
decode-attention kernel reading those bytes could do on this machine at this size: the kernel's
arithmetic, its page lookups and its reduction come on top. Chapter 3 sets every path against it.

``read_pages_sum(k_cache, v_cache, pages)`` reads the same kind of bytes the way a paged cache holds
them: page by page, in the order a block table names them, each page's slab [H_kv, page_size, d]
contiguous but the pages scattered. Against ``read_sum`` over as many bytes it gives what scattering
costs the memory system itself, before any attention kernel.

Chapters: 3.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lib.kernels import launch

EVICTS = ("", "evict_first", "evict_last")  # tl.load's eviction_policy
CACHES = ("", ".ca", ".cg", ".cv")  # tl.load's cache_modifier


def _hints(evict: str, cache: str) -> dict:
    """The loads' hints as the kernels' meta-parameters, checked: one of the two at most (ptxas takes
    no eviction policy together with a cache modifier)."""
    for name, value, allowed in (("evict", evict, EVICTS), ("cache", cache, CACHES)):
        if value not in allowed:
            raise ValueError(f"{name}={value!r} is not a load hint Triton takes here; use one of {allowed}")
    if evict and cache:
        raise ValueError(f"give evict ({evict!r}) or cache ({cache!r}), not both: ptxas rejects the pair")
    return dict(EVICT=evict, CACHE=cache)


@triton.jit
def _read_sum_kernel(A, B, OUT, n, n_per, BLOCK: tl.constexpr, EVICT: tl.constexpr = "", CACHE: tl.constexpr = ""):
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * n_per
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(0, n_per, BLOCK):
        off = base + i + tl.arange(0, BLOCK)
        mask = off < n
        acc += tl.load(A + off, mask=mask, other=0.0, eviction_policy=EVICT, cache_modifier=CACHE).to(tl.float32)
        acc += tl.load(B + off, mask=mask, other=0.0, eviction_policy=EVICT, cache_modifier=CACHE).to(tl.float32)
    tl.store(OUT + pid, tl.sum(acc))


def _launch_shape(programs, block, num_warps) -> None:
    """Refuse launch parameters the kernels cannot take (a bool passes for no number here)."""
    for name, value, least, power in (("programs", programs, 1, False), ("block", block, 16, True),
                                      ("num_warps", num_warps, 1, True)):
        if not launch.whole(value) or value < least or (power and value & (value - 1)):
            kind = "a power of two" if power else "a whole number"
            raise ValueError(f"{name} must be {kind} >= {least}; got {value!r}")


def _check_out(out, grid: int, device, inputs: dict) -> torch.Tensor:
    """The partial sums' tensor: ``out`` if it is float32 of shape (grid,) on ``device``, sharing no memory
    with the inputs (a new one if None)."""
    if out is None:
        return torch.empty(grid, device=device, dtype=torch.float32)
    launch.tensors(out=(out, f"float32 ({grid},)"))
    if out.shape != (grid,) or out.dtype != torch.float32 or out.device != device:
        raise ValueError(f"out must be float32 of shape ({grid},) on {device} for these arguments; got {out.dtype} "
                         f"{tuple(out.shape)} on {out.device}")
    if not out.is_contiguous():
        raise ValueError(f"out must be contiguous (program p writes element p); got stride {out.stride()}: pass "
                         f"out.contiguous() or None")
    launch.overlap(out, inputs)
    return out


def read_sum(a: torch.Tensor, b: torch.Tensor, *, programs: int = 1024, block: int = 4096, num_warps: int = 4,
             evict: str = "", cache: str = "", out: torch.Tensor | None = None) -> torch.Tensor:
    """Read ``a`` and ``b`` (contiguous, same number of elements, one device) once; return float32
    partial sums, one per program, whose total is a.sum() + b.sum(). ``programs`` pieces of
    ``block``-element steps; ``evict`` or ``cache`` (not both) is the loads' ``eviction_policy`` or
    ``cache_modifier`` (tl.load's). ``out``: float32 (grid,) sharing no memory with a or b. Empty a and b
    give one partial sum of 0 (nothing is launched)."""
    launch.tensors(a=(a, "contiguous"), b=(b, "contiguous, as many elements as a"))
    if not (a.is_contiguous() and b.is_contiguous()) or a.numel() != b.numel() or a.device != b.device:
        raise ValueError(f"a and b must be contiguous tensors of one size on one device; got {tuple(a.shape)} "
                         f"{a.device}, {tuple(b.shape)} {b.device}: pass .contiguous() copies on one device")
    _launch_shape(programs, block, num_warps)
    hints = _hints(evict, cache)
    n = a.numel()
    n_per = max(1, triton.cdiv(triton.cdiv(n, programs), block)) * block
    grid = max(1, triton.cdiv(n, n_per))
    out = _check_out(out, grid, a.device, dict(a=a, b=b))
    if n:
        _read_sum_kernel[(grid,)](a, b, out, n, n_per, BLOCK=block, **hints, num_warps=num_warps)
    else:
        out.zero_()
    return out


@triton.jit
def _read_pages_kernel(K, V, PAGES, OUT, n_units, per_prog, CHUNK: tl.constexpr, SUB: tl.constexpr,
                       ROWS: tl.constexpr, EVICT: tl.constexpr = "", CACHE: tl.constexpr = ""):
    """Units are (entry of PAGES, piece of SUB elements of that page's CHUNK); ROWS units per step, the
    page numbers of the next step requested one step ahead (so the loads do not wait on them)."""
    PIECES: tl.constexpr = CHUNK // SUB
    pid = tl.program_id(0)
    start = pid * per_prog
    end = tl.minimum(start + per_prog, n_units)
    r = tl.arange(0, ROWS)
    c = tl.arange(0, SUB)
    acc = tl.zeros([ROWS, SUB], tl.float32)
    nxt = tl.load(PAGES + (start + r) // PIECES, mask=start + r < end, other=0)
    for u0 in range(start, end, ROWS):
        u = u0 + r
        m = u < end
        page = nxt.to(tl.int64)
        nxt = tl.load(PAGES + (u + ROWS) // PIECES, mask=u + ROWS < end, other=0)
        off = page[:, None] * CHUNK + ((u % PIECES) * SUB)[:, None] + c[None, :]
        acc += tl.load(K + off, mask=m[:, None], other=0.0, eviction_policy=EVICT, cache_modifier=CACHE).to(tl.float32)
        acc += tl.load(V + off, mask=m[:, None], other=0.0, eviction_policy=EVICT, cache_modifier=CACHE).to(tl.float32)
    tl.store(OUT + pid, tl.sum(tl.sum(acc, 1), 0))


def read_pages_sum(k_cache: torch.Tensor, v_cache: torch.Tensor, pages: torch.Tensor, *, programs: int = 1024,
                   block: int = 4096, num_warps: int = 4, evict: str = "", cache: str = "",
                   out: torch.Tensor | None = None, check: bool | None = None) -> torch.Tensor:
    """Read, for every page number in ``pages`` (int32, any order, e.g. a flattened block table), that
    page's whole slab of ``k_cache`` and ``v_cache`` ([num_pages, H_kv, page_size, d], contiguous, one
    device); return float32 partial sums, one per program, whose total is the sum of those slabs. Each
    step reads ``block`` elements of each cache: several small pages, or a piece of a large one.
    ``evict``, ``cache`` and ``out`` as for ``read_sum``.

    ``pages`` is made contiguous where it is not. ``check``: read the page numbers and refuse any outside
    0 .. num_pages - 1 (the kernel would read outside the caches). None (the default): wherever they can
    be read, i.e. not on meta tensors nor during a CUDA graph capture (on a GPU that is a
    synchronisation); True: always (an error where they cannot be read); False: never."""
    launch.tensors(k_cache=(k_cache, "contiguous [num_pages, H_kv, page_size, d]"),
                   v_cache=(v_cache, "contiguous [num_pages, H_kv, page_size, d]"), pages=(pages, "int32 [n]"))
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError(f"k_cache and v_cache must be contiguous [num_pages, H_kv, page_size, d] of one shape; got "
                         f"{tuple(k_cache.shape)}, {tuple(v_cache.shape)}: pass .contiguous() copies")
    if pages.dtype != torch.int32 or pages.dim() != 1 or pages.device != k_cache.device \
            or v_cache.device != k_cache.device:
        raise ValueError(f"pages must be a 1-D int32 tensor on {k_cache.device}, the caches' device (a block table: "
                         f".flatten().to(torch.int32)); got {pages.dtype} {tuple(pages.shape)} on {pages.device}, "
                         f"v_cache on {v_cache.device}")
    pages = pages.contiguous()
    _launch_shape(programs, block, num_warps)
    hints = _hints(evict, cache)
    chunk = k_cache.shape[1] * k_cache.shape[2] * k_cache.shape[3]  # a page's slab (the pool may have no pages)
    if chunk < 1 or chunk & (chunk - 1):
        raise ValueError(f"a page's slab H_kv * page_size * d must be a power of two (the kernel steps through "
                         f"it in pieces of a power of two); got {chunk} for caches {tuple(k_cache.shape)}")
    if launch.values_readable(check, pages) and pages.numel():
        bad = (pages < 0) | (pages >= k_cache.shape[0])
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            n = k_cache.shape[0]
            raise ValueError(f"pages[{i}] = {int(pages[i])} names no page of the caches (they have {n} pages"
                             f"{f', 0 .. {n - 1}' if n else ''}): the kernel would read outside them")
    sub = min(chunk, block)
    n_units = pages.numel() * (chunk // sub)
    per = max(1, triton.cdiv(n_units, programs))
    grid = max(1, triton.cdiv(n_units, per))
    out = _check_out(out, grid, k_cache.device, dict(k_cache=k_cache, v_cache=v_cache, pages=pages))
    if n_units:
        _read_pages_kernel[(grid,)](k_cache, v_cache, pages, out, n_units, per, CHUNK=chunk, SUB=sub,
                                    ROWS=max(1, block // sub), **hints, num_warps=num_warps)
    else:
        out.zero_()
    return out
