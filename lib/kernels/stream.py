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


def read_sum(a: torch.Tensor, b: torch.Tensor, *, programs: int = 1024, block: int = 4096, num_warps: int = 4,
             evict: str = "", cache: str = "", out: torch.Tensor | None = None) -> torch.Tensor:
    """Read ``a`` and ``b`` (contiguous, same number of elements) once; return float32 partial sums, one
    per program, whose total is a.sum() + b.sum(). ``programs`` pieces of ``block``-element steps;
    ``evict`` or ``cache`` (not both) is the loads' ``eviction_policy`` or ``cache_modifier`` (tl.load's)."""
    if not (a.is_contiguous() and b.is_contiguous()) or a.numel() != b.numel() or a.device != b.device:
        raise ValueError(f"a and b must be contiguous tensors of one size on one device; got {tuple(a.shape)} "
                         f"{a.device}, {tuple(b.shape)} {b.device}")
    if programs < 1 or block < 16 or block & (block - 1):
        raise ValueError(f"programs must be >= 1 and block a power of two >= 16; got {programs}, {block}")
    n = a.numel()
    n_per = triton.cdiv(triton.cdiv(n, programs), block) * block
    grid = max(1, triton.cdiv(n, n_per))
    if out is None:
        out = torch.empty(grid, device=a.device, dtype=torch.float32)
    elif out.shape != (grid,) or out.dtype != torch.float32:
        raise ValueError(f"out must be float32 of shape ({grid},) for these arguments")
    _read_sum_kernel[(grid,)](a, b, out, n, n_per, BLOCK=block, **_hints(evict, cache), num_warps=num_warps)
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
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """Read, for every page number in ``pages`` (int32, any order, e.g. a flattened block table), that
    page's whole slab of ``k_cache`` and ``v_cache`` ([num_pages, H_kv, page_size, d], contiguous);
    return float32 partial sums, one per program, whose total is the sum of those slabs. Each step
    reads ``block`` elements of each cache: several small pages, or a piece of a large one. ``evict`` and
    ``cache`` as for ``read_sum``."""
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError(f"k_cache and v_cache must be contiguous [num_pages, H_kv, page_size, d] of one shape; got "
                         f"{tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    if pages.dtype != torch.int32 or pages.dim() != 1 or pages.device != k_cache.device:
        raise ValueError(f"pages must be a 1-D int32 tensor on {k_cache.device} (a block table: .flatten()); got "
                         f"{pages.dtype} {tuple(pages.shape)} on {pages.device}")
    chunk = k_cache[0].numel()
    if programs < 1 or block < 16 or block & (block - 1) or chunk & (chunk - 1):
        raise ValueError(f"programs must be >= 1, block a power of two >= 16 and a page's slab H_kv * page_size * d "
                         f"a power of two; got {programs}, {block}, {chunk}")
    sub = min(chunk, block)
    n_units = pages.numel() * (chunk // sub)
    per = max(1, triton.cdiv(n_units, programs))
    grid = max(1, triton.cdiv(n_units, per))
    if out is None:
        out = torch.empty(grid, device=k_cache.device, dtype=torch.float32)
    elif out.shape != (grid,) or out.dtype != torch.float32:
        raise ValueError(f"out must be float32 of shape ({grid},) for these arguments")
    if n_units:
        _read_pages_kernel[(grid,)](k_cache, v_cache, pages, out, n_units, per, CHUNK=chunk, SUB=sub,
                                    ROWS=max(1, block // sub), **_hints(evict, cache), num_warps=num_warps)
    else:
        out.zero_()
    return out
