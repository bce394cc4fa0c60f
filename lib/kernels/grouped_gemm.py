"""Grouped GEMM for mixture-of-experts layers: one persistent Triton launch for every expert's product.

An MoE layer sends each token to some experts; sorted by expert, the tokens of expert e are rows
``offsets[e] .. offsets[e+1] - 1`` of ``x`` [T, K], and the layer computes, for every expert,

    y[offsets[e]:offsets[e+1]] = x[offsets[e]:offsets[e+1]] @ w[e]        (w: [E, K, N])

Each expert is a GEMM of its own M (its token count, possibly 0) with the same K and N. The kernel
schedules them by output tile, statically (chapter 4 explains it):

- expert e has ceil(M_e / BLOCK_M) * ceil(N / BLOCK_N) output tiles; numbered one expert after
  another, they form one range of tile ids 0 .. total - 1;
- ``num_programs`` programs are launched (one or two per SM, ``choose_config``) and program p takes
  tiles p, p + num_programs, p + 2 num_programs, ...: no global queue, no atomics;
- every program computes the tile counts from ``offsets`` itself (a prefix sum over E values in
  registers), so the token counts never travel to the host: one launch, no synchronization;
- within an expert, consecutive tile ids walk down the rows of one column block of w[e], so programs
  running side by side share the same weight tile in the L2;
- ``order="heavy_first"`` takes the tiles of heavy experts (more than one row tile) before those of the
  light ones, each list expert after expert (``tile_schedule``; ``choose_config`` says when);
- tiles are loaded by the tensor-memory accelerator (TMA) through descriptors of x [T, K] and
  w [E, K, N], which fill what lies past T, K or N with zeros; only the store is masked on the
  expert's rows. Where strides rule TMA out, every load and store is masked on M, N and K instead:
  any M (0 included), N and K, and strided inputs.
- the tile size follows the tokens per expert (``choose_config``).

Nothing reaches the kernels unchecked: types, shapes, strides, dtypes and devices, an output that shares
memory with an input, and the launch parameters are checked before planning; the offsets' values (on the
device) where they can be read without cost or where the caller asks (``check``).

Accumulation is in fp32; inputs fp16, bf16 or fp32. ``tile_schedule`` is the same schedule in plain
Python (chapter 4's worked example). The kernels are written as small ``@triton.jit`` pieces (the
schedule, the order, one tile by pointer loads or by TMA) that variants for tuning reuse.

Chapters: 4.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lib.kernels import interpreter, launch

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# orders of the tiles in the schedule (tile_schedule), as the kernels' ORDER
ORDERS = {"experts": 0, "heavy_first": 1}


@triton.jit
def _schedule(OFFS, E, N, BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              HALF_TAIL: tl.constexpr):
    """Every expert's tile count and where its tiles end, from the offsets alone (in registers).
    HALF_TAIL: an expert whose rows past its last full row tile fit in half a tile gets a half-height
    last tile (``half``). ``tiles_h`` and ``ends_h``: the same counts for the heavy experts only (more
    than one row tile), the light ones counting none (``ORDER``)."""
    ee = tl.arange(0, BLOCK_E)
    emask = ee < E
    lo = tl.load(OFFS + ee, mask=emask, other=0)
    hi = tl.load(OFFS + ee + 1, mask=emask, other=0)
    count = tl.maximum(hi - lo, 0)
    tiles_m = (count + BLOCK_M - 1) // BLOCK_M
    if HALF_TAIL:
        half = (count > 0) & (count - (tiles_m - 1) * BLOCK_M <= BLOCK_M // 2)  # the last row tile's rows
    else:
        half = count < 0
    tiles = tiles_m * ((N + BLOCK_N - 1) // BLOCK_N)
    tiles_h = tl.where(tiles_m > 1, tiles, 0)
    ends = tl.cumsum(tiles, 0)  # inclusive: the first tile id after expert e
    ends_h = tl.cumsum(tiles_h, 0)
    total = tl.sum(tiles, 0)
    ends = tl.where(emask, ends, total + 1)  # padding never counts as a finished expert
    ends_h = tl.where(emask, ends_h, total + 1)
    return ee, lo, hi, tiles_m, half.to(tl.int32), tiles, ends, tiles_h, ends_h, total


@triton.jit
def _in_list(is_heavy, j, tiles, ends, tiles_h, ends_h, total):
    """Position i of the schedule taken as the j-th tile of the heavy experts' list (``is_heavy``) or of
    the light ones': j, and that list's per-expert tile counts and ends."""
    tiles_l = tiles - tiles_h
    ends_l = ends - ends_h
    ends_l = tl.where(ends <= total, ends_l, total + 1)
    return j, tl.where(is_heavy, tiles_h, tiles_l), tl.where(is_heavy, ends_h, ends_l)


@triton.jit
def _order(i, tiles, ends, tiles_h, ends_h, total, ORDER: tl.constexpr):
    """The tile computed at position i of the schedule: its index j in a list of tiles and that list's
    per-expert counts and ends. ORDER 0: one list, expert after expert. ORDER 1 (heavy first): the
    heavy experts' tiles (more than one row tile), then the light ones', each list expert after expert."""
    if ORDER == 0:
        return i, tiles, ends
    heavy_total = tl.sum(tiles_h, 0)
    is_heavy = i < heavy_total
    return _in_list(is_heavy, tl.where(is_heavy, i, i - heavy_total), tiles, ends, tiles_h, ends_h, total)


@triton.jit
def _tile(tile, ee, lo, hi, tiles_m, half, tiles, ends):
    """Expert, its rows [row0, row1), the (row, column) block of tile id ``tile``, and whether that tile
    is a half-height last row tile."""
    e = tl.sum((ends <= tile).to(tl.int32), 0)  # experts wholly before this tile; empty ones included
    sel = ee == e
    t = tile - (tl.sum(tl.where(sel, ends, 0), 0) - tl.sum(tl.where(sel, tiles, 0), 0))
    tm_count = tl.sum(tl.where(sel, tiles_m, 0), 0)
    row0 = tl.sum(tl.where(sel, lo, 0), 0)
    row1 = tl.sum(tl.where(sel, hi, 0), 0)
    tm = t % tm_count  # rows fastest: neighbouring tiles share w[e]'s column block
    tn = t // tm_count
    is_half = (tl.sum(tl.where(sel, half, 0), 0) > 0) & (tm == tm_count - 1)
    return e, row0, row1, tm, tn, is_half


@triton.jit
def _pointer_tile(X, W, Y, e, r0, c0, row1, N, K, stride_xm, stride_xk, stride_we, stride_wk, stride_wn,
                  stride_ym, stride_yn, BM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One output tile of BM rows from r0 (rows from row1 on are the next expert's: masked) by masked
    pointer loads."""
    rows = r0 + tl.arange(0, BM)
    cols = c0 + tl.arange(0, BLOCK_N)
    rmask = rows < row1
    cmask = cols < N
    x_ptr = X + rows.to(tl.int64)[:, None] * stride_xm
    w_ptr = W + e.to(tl.int64) * stride_we + cols.to(tl.int64)[None, :] * stride_wn
    acc = tl.zeros([BM, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        kmask = kk < K
        a = tl.load(x_ptr + kk[None, :] * stride_xk, mask=rmask[:, None] & kmask[None, :], other=0.0)
        b = tl.load(w_ptr + kk.to(tl.int64)[:, None] * stride_wk, mask=kmask[:, None] & cmask[None, :], other=0.0)
        acc = tl.dot(a, b, acc)
    y_ptr = Y + rows.to(tl.int64)[:, None] * stride_ym + cols[None, :] * stride_yn
    tl.store(y_ptr, acc.to(Y.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])


@triton.jit
def _tma_tile(x_desc, w_desc, Y, e, r0, c0, row1, N, K, stride_ym, stride_yn, BM: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    """One output tile of BM rows from r0, its loads by TMA (``x_desc`` has blocks of BM rows); only the
    store is masked."""
    acc = tl.zeros([BM, BLOCK_N], tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        a = x_desc.load([r0, k0])
        b = w_desc.load([e, k0, c0]).reshape(BLOCK_K, BLOCK_N)
        acc = tl.dot(a, b, acc)
    rows = r0 + tl.arange(0, BM)
    cols = c0 + tl.arange(0, BLOCK_N)
    y_ptr = Y + rows.to(tl.int64)[:, None] * stride_ym + cols[None, :] * stride_yn
    tl.store(y_ptr, acc.to(Y.dtype.element_ty), mask=(rows < row1)[:, None] & (cols < N)[None, :])


@triton.jit
def _grouped_gemm_kernel(
    # pointers
    X, W, Y, OFFS,
    # shapes
    E, N, K,
    # strides (elements)
    stride_xm, stride_xk, stride_we, stride_wk, stride_wn, stride_ym, stride_yn,
    # meta-parameters
    NUM_PROGRAMS: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HALF_TAIL: tl.constexpr = False,
    ORDER: tl.constexpr = 0,
):
    """The schedule with every tile loaded by masked pointer loads: any strides, any M, N and K."""
    pid = tl.program_id(0)
    ee, lo, hi, tiles_m, half, tiles, ends, tiles_h, ends_h, total = _schedule(OFFS, E, N, BLOCK_E, BLOCK_M, BLOCK_N,
                                                                               HALF_TAIL)
    for i in range(pid, total, NUM_PROGRAMS):
        tile, tiles_o, ends_o = _order(i, tiles, ends, tiles_h, ends_h, total, ORDER)
        e, row0, row1, tm, tn, is_half = _tile(tile, ee, lo, hi, tiles_m, half, tiles_o, ends_o)
        r0 = row0 + tm * BLOCK_M
        c0 = tn * BLOCK_N
        if HALF_TAIL and is_half:
            _pointer_tile(X, W, Y, e, r0, c0, row1, N, K, stride_xm, stride_xk, stride_we, stride_wk, stride_wn,
                          stride_ym, stride_yn, BLOCK_M // 2, BLOCK_N, BLOCK_K)
        else:
            _pointer_tile(X, W, Y, e, r0, c0, row1, N, K, stride_xm, stride_xk, stride_we, stride_wk, stride_wn,
                          stride_ym, stride_yn, BLOCK_M, BLOCK_N, BLOCK_K)


@triton.jit
def _tma_descriptors(X, W, T, E, N, K, stride_xm, stride_we, stride_wk, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HALF_TAIL: tl.constexpr):
    """Descriptors of x [T, K] in blocks of BLOCK_M rows and (for half tiles; without HALF_TAIL the same
    one) of BLOCK_M / 2 rows, and of w [E, K, N], built on the device: no host work per launch."""
    x_desc = tl.make_tensor_descriptor(X, shape=[T, K], strides=[stride_xm, 1], block_shape=[BLOCK_M, BLOCK_K])
    if HALF_TAIL:
        xh_desc = tl.make_tensor_descriptor(X, shape=[T, K], strides=[stride_xm, 1],
                                            block_shape=[BLOCK_M // 2, BLOCK_K])
    else:
        xh_desc = x_desc
    w_desc = tl.make_tensor_descriptor(W, shape=[E, K, N], strides=[stride_we, stride_wk, 1],
                                       block_shape=[1, BLOCK_K, BLOCK_N])
    return x_desc, xh_desc, w_desc


@triton.jit
def _tma_output_tile(tile, tiles_o, ends_o, ee, lo, hi, tiles_m, half, x_desc, xh_desc, w_desc, Y, N, K,
                     stride_ym, stride_yn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     STAGES: tl.constexpr, HALF_TAIL: tl.constexpr):
    """Tile id ``tile`` of the list whose per-expert counts and ends are ``tiles_o``, ``ends_o``: where it
    lies, then its product by TMA, at half height where it is a half tile."""
    e, row0, row1, tm, tn, is_half = _tile(tile, ee, lo, hi, tiles_m, half, tiles_o, ends_o)
    r0 = row0 + tm * BLOCK_M
    c0 = tn * BLOCK_N
    if HALF_TAIL and is_half:
        _tma_tile(xh_desc, w_desc, Y, e, r0, c0, row1, N, K, stride_ym, stride_yn, BLOCK_M // 2, BLOCK_N, BLOCK_K,
                  STAGES)
    else:
        _tma_tile(x_desc, w_desc, Y, e, r0, c0, row1, N, K, stride_ym, stride_yn, BLOCK_M, BLOCK_N, BLOCK_K, STAGES)


@triton.jit
def _grouped_gemm_tma_kernel(
    # pointers
    X, W, Y, OFFS,
    # shapes
    T, E, N, K,
    # strides (elements)
    stride_xm, stride_we, stride_wk, stride_ym, stride_yn,
    # meta-parameters
    NUM_PROGRAMS: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    STAGES: tl.constexpr, FLATTEN: tl.constexpr, HALF_TAIL: tl.constexpr = False, ORDER: tl.constexpr = 0,
):
    """The same schedule, with the tiles brought in by the tensor-memory accelerator (TMA): the unit fills
    what lies past T, K or N with zeros, so only the store is masked (rows past the expert's end belong
    to the next expert). FLATTEN: the tile loop is flattened into the K loop, so that the pipeline loads
    a program's next tile while it finishes the current one."""
    pid = tl.program_id(0)
    x_desc, xh_desc, w_desc = _tma_descriptors(X, W, T, E, N, K, stride_xm, stride_we, stride_wk, BLOCK_M, BLOCK_N,
                                               BLOCK_K, HALF_TAIL)
    ee, lo, hi, tiles_m, half, tiles, ends, tiles_h, ends_h, total = _schedule(OFFS, E, N, BLOCK_E, BLOCK_M, BLOCK_N,
                                                                               HALF_TAIL)
    for i in tl.range(pid, total, NUM_PROGRAMS, flatten=FLATTEN):
        tile, tiles_o, ends_o = _order(i, tiles, ends, tiles_h, ends_h, total, ORDER)
        _tma_output_tile(tile, tiles_o, ends_o, ee, lo, hi, tiles_m, half, x_desc, xh_desc, w_desc, Y, N, K,
                         stride_ym, stride_yn, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, HALF_TAIL)


INTERPRETED = interpreter.interpreted(_grouped_gemm_kernel)  # no GPU: see lib.kernels.interpreter


def _check(x, w, offsets, out):
    """Refuse what the kernels cannot take, from the tensors' types, shapes, strides, dtypes and devices
    alone (no values are read)."""
    launch.tensors(x=(x, "[T, K], tokens sorted by expert"), w=(w, "[E, K, N]"),
                   offsets=(offsets, "int32 [E + 1], expert e owns rows offsets[e] to offsets[e+1] - 1"))
    if x.dim() != 2 or w.dim() != 3:
        raise ValueError(f"expected x [T, K] and w [E, K, N]; got x {tuple(x.shape)}, w {tuple(w.shape)}")
    T, K = x.shape
    E, Kw, N = w.shape
    if Kw != K:
        raise ValueError(f"x has K={K} columns but w [E, K, N] has K={Kw}: pass w as [E, K, N] (a transposed view "
                         f"of an [E, N, K] weight works)")
    if x.dtype not in DTYPES or w.dtype != x.dtype:
        raise TypeError(f"x and w must share one of {DTYPES}; got {x.dtype} and {w.dtype}")
    if offsets.dtype != torch.int32 or offsets.shape != (E + 1,):
        raise ValueError(f"offsets must be int32 of shape [E + 1] = [{E + 1}] (expert e owns rows offsets[e] to "
                         f"offsets[e+1] - 1); got {offsets.dtype} {tuple(offsets.shape)}: convert with "
                         f".to(torch.int32)")
    if offsets.device != x.device or w.device != x.device:
        raise ValueError(f"x, w and offsets must be on one device; got {x.device}, {w.device}, {offsets.device}: move "
                         f"them with .to({str(x.device)!r})")
    if not offsets.is_contiguous():
        raise ValueError(f"offsets must be contiguous (the kernel reads expert e's bounds at positions e and e + 1); "
                         f"got stride {offsets.stride()}: pass offsets.contiguous()")
    if out is not None:
        launch.tensors(out=(out, f"[T, N] = [{T}, {N}] {x.dtype}"))
        if out.shape != (T, N) or out.dtype != x.dtype or out.device != x.device:
            raise ValueError(f"out must be [{T}, {N}] {x.dtype} on {x.device}; got {tuple(out.shape)} {out.dtype} on "
                             f"{out.device}")
        if launch.internal_overlap(out):
            raise ValueError(f"no two elements of out may share memory (strides {out.stride()}): several tiles would "
                             f"write one place; pass a [T, N] tensor of its own")
        launch.overlap(out, dict(x=x, w=w, offsets=offsets))


def _check_values(offsets, T):
    """Refuse offsets that decrease or leave [0, T]: an expert's rows would lie outside x and out. Reads the
    values: on a GPU a synchronisation."""
    if offsets.numel() < 2:
        return
    o = offsets.long()
    steps = o[1:] - o[:-1]
    low, high, down = torch.stack([o[0] < 0, o[-1] > T, (steps < 0).any()]).tolist()
    if low or high or down:
        where = (f"offsets[0] = {int(o[0])} < 0" if low else f"offsets[-1] = {int(o[-1])} > T = {T}" if high else
                 f"offsets[{int((steps < 0).nonzero()[0, 0]) + 1}] < offsets[{int((steps < 0).nonzero()[0, 0])}]")
        shown = offsets.tolist() if offsets.numel() <= 20 else f"{offsets[:20].tolist()} ..."
        raise ValueError(f"offsets must be non-decreasing within [0, T={T}] (expert e owns rows offsets[e] to "
                         f"offsets[e+1] - 1 of x); {where}, in {shown}")


def choose_config(T: int, E: int, K: int | None = None) -> dict:
    """Tile and launch for T routed tokens over E experts (chapter 4), from the tokens per expert T / E:

    - Few tokens per expert (below 32) make each expert's product a thin row block that streams w[e]:
      small row tiles (32 rows for at most two tokens per expert, else 64), 128 columns, and two
      programs per SM, so that more of w is in flight at once. The heavy experts' tiles (more than one
      row tile) go first (``order="heavy_first"``): with skewed routing a few experts hold most rows,
      and started first their tiles do not finish last.
    - From 32 tokens per expert on, each expert's product is a real matrix product: the largest tile
      that fits in shared memory with its pipeline (128 x 256 with 8 warps, one program per SM) and the
      plain expert order. Its tile loop is flattened into its K loop (``flatten``: the pipeline loads a
      program's next tile while it finishes the current one; TMA kernel only). Four pipeline stages
      where K is at most 4096, three for longer K (``K`` None: taken as long).
    - Half-height last row tiles (``half_tail``) stay off: chapter 4 times them against whole tiles.

    The tuning records of chapter 4's lab notes hold the evidence for each boundary."""
    per_expert = T / max(E, 1)
    if per_expert <= 2:
        return dict(block_m=32, block_n=128, block_k=64, num_warps=4, num_stages=4, programs_per_sm=2,
                    half_tail=False, order="heavy_first", flatten=False)
    if per_expert < 32:
        return dict(block_m=64, block_n=128, block_k=64, num_warps=4, num_stages=4, programs_per_sm=2,
                    half_tail=False, order="heavy_first", flatten=False)
    stages = 4 if K is not None and K <= 4096 else 3
    return dict(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=stages, programs_per_sm=1,
                half_tail=False, order="experts", flatten=True)


def tma_applies(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``grouped_gemm`` can load x and w through TMA descriptors: 16-byte aligned bases and
    strides, unit strides in the last dimension."""
    es = x.element_size()
    return (x.stride(1) == 1 and w.stride(2) == 1
            and not (x.data_ptr() % 16 or w.data_ptr() % 16)
            and not ((x.stride(0) * es) % 16 or (w.stride(0) * es) % 16 or (w.stride(1) * es) % 16))


# what the planned call compares with the plan, in the order of the layout tuple
_LAYOUT = ("x.shape", "w.shape", "offsets.shape", "x.stride()", "w.stride()", "offsets.stride()", "x.dtype",
           "w.dtype", "offsets.dtype", "x.device", "w.device", "offsets.device")


class GroupedGemm:
    """A grouped-GEMM launch planned once for fixed shapes, strides, dtypes and devices; each call only launches.

    Planning checks the arguments and resolves the launch once (``choose_config``, TMA or pointer loads).
    Calls go through ``lib.kernels.launch``: the first compiles (or finds) the kernel through Triton's
    public path, later ones on a GPU hand the new tensors straight to the compiled kernel, skipping
    host work that costs tens of microseconds per call (chapter 4 measures both). ``offsets`` may
    change from call to call: the token counts are read on the device. An ``out`` laid out otherwise
    than the planned one (contiguous [T, N] unless the plan was given another), or data not aligned to
    16 bytes, takes the public path. In Triton's interpreter (CPU) every call takes the public path.

    What planning checks: everything ``grouped_gemm`` checks (types, shapes, dtypes, devices, offsets
    contiguous, the launch parameters, an ``out`` that shares no memory with the inputs; no bf16 where the
    kernels run in Triton's interpreter, which computes ``tl.dot`` of bf16 operands wrongly), and with
    ``check`` the offsets' values (``check=None``: wherever they can be read, i.e. not on meta tensors
    nor during a CUDA graph capture; on a GPU a synchronisation).

    What a call checks, and what it assumes: a call compares x's, w's and offsets' shapes, strides,
    dtypes and devices with the planned ones and ``out``'s shape, dtype and device with [T, N], and
    refuses an ``out`` that shares memory with an input (an ``out`` of other strides is checked in full).
    It reads no values unless asked: it assumes that the offsets are non-decreasing within [0, T].
    ``check=True`` checks them at this call (a synchronisation on a GPU; refused during a CUDA graph
    capture), ``check=None`` (the default) does it on the CPU only, where it costs no synchronisation and
    Triton's interpreter would otherwise read outside the tensors, and ``check=False`` never.
    """

    def __init__(self, x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, *, out: torch.Tensor | None = None,
                 num_programs: int | None = None, block_m: int | None = None, block_n: int | None = None,
                 block_k: int | None = None, num_warps: int | None = None, num_stages: int | None = None,
                 tma: bool | None = None, flatten: bool | None = None, half_tail: bool | None = None,
                 order: str | None = None, check: bool | None = None):
        _check(x, w, offsets, out)
        interpreter.refuse_bf16(INTERPRETED, x.dtype, "x and w are")
        T, K = x.shape
        E, _, N = w.shape
        cfg = choose_config(T, E, K)
        given = dict(block_m=block_m, block_n=block_n, block_k=block_k, num_warps=num_warps, num_stages=num_stages)
        for name, value in given.items():
            if value is not None and not launch.whole(value):
                raise ValueError(f"{name} must be a whole number (None: choose_config's), got {value!r}")
        block_m, block_n, block_k, num_warps, num_stages = (cfg[k] if v is None else v for k, v in given.items())
        for name, value in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k)):
            if value < 16 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two >= 16 (the smallest tl.dot), got {value}")
        if num_warps < 1 or num_warps & (num_warps - 1):
            raise ValueError(f"num_warps must be a power of two >= 1 (Triton's warps per program), got {num_warps}")
        if num_stages < 1:
            raise ValueError(f"num_stages must be at least 1 (the software pipeline's depth), got {num_stages}")
        if half_tail is None:  # the plan's rule, where the row tile can be halved
            half_tail = cfg["half_tail"] and block_m >= 32
        if half_tail and block_m < 32:
            raise ValueError(f"half_tail needs block_m a power of two of at least 32 (half tiles of at least 16 "
                             f"rows, the smallest tl.dot); got block_m={block_m}: pass half_tail=False")
        order = cfg["order"] if order is None else order
        flatten = cfg["flatten"] if flatten is None else flatten
        if order not in ORDERS:
            raise ValueError(f"order must be one of {tuple(ORDERS)} (see tile_schedule), got {order!r}")
        if num_programs is None:
            programs = cfg["programs_per_sm"] * launch.sm_count(x.device)
        elif not launch.whole(num_programs) or num_programs < 1:
            raise ValueError(f"num_programs must be a whole number >= 1 (the persistent programs launched; None: "
                             f"choose_config's per SM), got {num_programs!r}")
        else:
            programs = num_programs
        if launch.values_readable(check, offsets):
            _check_values(offsets, T)
        self.empty = E == 0 or T == 0 or N == 0
        self.tma = bool(tma is not False and K and tma_applies(x, w))
        self.grid = (programs,)
        self.config = dict(block_m=block_m, block_n=block_n, block_k=block_k, num_warps=num_warps,
                           num_stages=num_stages, programs=programs, tma=self.tma, half_tail=half_tail, order=order,
                           flatten=bool(flatten and self.tma))
        self.meta = dict(NUM_PROGRAMS=programs, BLOCK_E=max(16, triton.next_power_of_2(E)), BLOCK_M=block_m,
                         BLOCK_N=block_n, BLOCK_K=block_k)
        if self.tma:
            kernel = _grouped_gemm_tma_kernel
            self.meta.update(STAGES=num_stages, FLATTEN=bool(flatten), HALF_TAIL=half_tail, ORDER=ORDERS[order])
            self.options = dict(num_warps=num_warps)
            self.scalars = (T, E, N, K, x.stride(0), w.stride(0), w.stride(1))
        else:
            kernel = _grouped_gemm_kernel
            self.meta.update(HALF_TAIL=half_tail, ORDER=ORDERS[order])
            self.options = dict(num_warps=num_warps, num_stages=num_stages)
            self.scalars = (E, N, K, x.stride(0), x.stride(1), w.stride(0), w.stride(1), w.stride(2))
        self.layout = (x.shape, w.shape, offsets.shape, x.stride(), w.stride(), offsets.stride(), x.dtype, w.dtype,
                       offsets.dtype, x.device, w.device, offsets.device)
        self.out_like = ((T, N), x.dtype, x.device)
        self.out_stride = out.stride() if out is not None else (N, 1)
        self.out_span = launch.span(out) if out is not None else T * N * x.element_size()
        self.spans = (launch.span(x), launch.span(w), launch.span(offsets))
        self.on_cpu = x.device.type == "cpu"
        self.on_meta = x.device.type == "meta"
        self.launch = launch.Launch(kernel, self.grid, self.meta, self.options, x.device)

    def _refuse(self, x, w, offsets, layout):
        """The error for tensors that differ from the planned ones, naming what differs."""
        _check(x, w, offsets, None)  # tensors the kernel cannot take at all: that error
        differ = [f"{name} {got} (planned {want})" for name, got, want in zip(_LAYOUT, layout, self.layout)
                  if got != want]
        raise ValueError(f"x, w or offsets differ from the planned shapes, strides, dtypes or device: "
                         f"{'; '.join(differ)}: make a new GroupedGemm (or call grouped_gemm)")

    def __call__(self, x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, out: torch.Tensor | None = None, *,
                 check: bool | None = None) -> torch.Tensor:
        try:
            layout = (x.shape, w.shape, offsets.shape, x.stride(), w.stride(), offsets.stride(), x.dtype, w.dtype,
                      offsets.dtype, x.device, w.device, offsets.device)
        except (AttributeError, TypeError):
            layout = None
        if layout != self.layout:
            self._refuse(x, w, offsets, layout or ())
        if (check or (check is None and self.on_cpu)) and launch.values_readable(check, offsets):
            _check_values(offsets, self.out_like[0][0])
        px, pw, pf = x.data_ptr(), w.data_ptr(), offsets.data_ptr()
        if out is None:
            out = torch.zeros(self.out_like[0], device=self.out_like[2], dtype=self.out_like[1])
            stride = (self.out_like[0][1], 1)
        else:
            stride = out.stride() if isinstance(out, torch.Tensor) else None
            if stride != self.out_stride or (out.shape, out.dtype, out.device) != self.out_like:
                _check(x, w, offsets, out)  # laid out otherwise than planned: checked in full
            elif not self.on_meta:  # out laid out as planned: its byte range against the inputs' (planned) ones
                o = out.data_ptr()
                e = o + self.out_span
                sx, sw, sf = self.spans
                if (px < e and o < px + sx) or (pw < e and o < pw + sw) or (pf < e and o < pf + sf):
                    launch.overlap(out, dict(x=x, w=w, offsets=offsets))
        if self.empty:
            return out
        if self.tma:
            launch.ensure_descriptor_allocator()
        direct = stride == self.out_stride and not (out.data_ptr() | px | pw | pf) % 16
        self.launch(x, w, out, offsets, *self.scalars, stride[0], stride[1], direct=direct)
        return out


def grouped_gemm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, *, out: torch.Tensor | None = None,
                 num_programs: int | None = None, block_m: int | None = None, block_n: int | None = None,
                 block_k: int | None = None, num_warps: int | None = None, num_stages: int | None = None,
                 tma: bool | None = None, flatten: bool | None = None, half_tail: bool | None = None,
                 order: str | None = None, check: bool | None = None) -> torch.Tensor:
    """y[offsets[e]:offsets[e+1]] = x[offsets[e]:offsets[e+1]] @ w[e] for every expert e, in one launch.

    x: [T, K] (tokens sorted by expert), w: [E, K, N], offsets: int32 [E + 1], non-decreasing, within
    [0, T], all on one device. Rows of ``out`` that no expert owns are left as they were (``out``
    defaults to zeros then); ``out`` shares no memory with x, w or offsets. Returns [T, N].
    Launch parameters left as None come from ``choose_config(T, E, K)``. ``tma``: load the tiles through
    tensor descriptors (Hopper's tensor-memory accelerator; None: whenever the strides allow it, i.e.
    unit stride in the last dimension and 16-byte aligned rows), else masked pointer loads (False, or
    strides TMA cannot take); ``flatten`` passes to the TMA kernel's tile loop (None: ``choose_config``'s
    rule). ``half_tail``: an expert whose rows past its last full row tile fit in half a tile computes
    that last tile at half height (``row_tiles``). ``order``: the order of the tiles in the schedule
    (``tile_schedule``).

    Everything but the offsets' values is checked before the launch, with an error that says what to
    change; offsets are made contiguous where they are not. ``check``: read the offsets and refuse them
    where they decrease or leave [0, T]. None (the default): wherever they can be read, i.e. not on meta
    tensors nor during a CUDA graph capture (on a GPU that is a synchronisation); True: always (an error
    where they cannot be read); False: never (the caller vouches for them). It plans on every call; for
    repeated calls of one shape, ``GroupedGemm`` plans once.
    """
    launch.tensors(offsets=(offsets, "int32 [E + 1], expert e owns rows offsets[e] to offsets[e+1] - 1"))
    offsets = offsets.contiguous()
    plan = GroupedGemm(x, w, offsets, out=out, num_programs=num_programs, block_m=block_m, block_n=block_n,
                       block_k=block_k, num_warps=num_warps, num_stages=num_stages, tma=tma, flatten=flatten,
                       half_tail=half_tail, order=order, check=check)
    return plan(x, w, offsets, out=out, check=False)  # the values: checked at planning


def reference(x, w, offsets, dtype=torch.float32):
    """Expert by expert in ``dtype``; rows no expert owns are zero."""
    T, _ = x.shape
    E, _, N = w.shape
    y = torch.zeros(T, N, dtype=dtype, device=x.device)
    for e in range(E):
        a, b = int(offsets[e]), int(offsets[e + 1])
        if b > a:
            y[a:b] = x[a:b].to(dtype) @ w[e].to(dtype)
    return y


def row_tiles(M: int, block_m: int, half_tail: bool = False) -> list[int]:
    """Heights of the row tiles the kernel computes for an expert of M rows: whole tiles of ``block_m``,
    the last one of ``block_m / 2`` rows where ``half_tail`` is set and the rows left fit in it."""
    full, rest = divmod(max(M, 0), block_m)
    if rest == 0:
        return [block_m] * full
    return [block_m] * full + [block_m // 2 if half_tail and rest <= block_m // 2 else block_m]


def tile_schedule(Ms, N: int, block_m: int, block_n: int, workers: int, half_tail: bool = False,
                  order: str = "experts") -> list[dict]:
    """The kernel's static schedule in plain Python: one row per output tile, in the order the workers
    take them (worker = position % workers), with its problem, tile coordinates, its height in rows
    (``row_tiles``), the worker (program) that computes it and in which of that worker's rounds.

    ``order``: ``"experts"``, problem after problem (within one, rows fastest); ``"heavy_first"``, the
    heavy problems' tiles (more than one row tile), then the light ones', each list in problem order."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {tuple(ORDERS)}, got {order!r}")
    light, heavy = [], []
    tile = 0
    for p, M in enumerate(Ms):
        heights = row_tiles(M, block_m, half_tail)
        tm_count, tn_count = len(heights), -(-N // block_n)
        for t in range(tm_count * tn_count):
            (heavy if tm_count > 1 else light).append({"tile": tile, "problem": p, "tm": t % tm_count,
                                                       "tn": t // tm_count, "rows": heights[t % tm_count]})
            tile += 1
    seq = heavy + light if order == "heavy_first" else sorted(light + heavy, key=lambda r: r["tile"])
    return [{**r, "worker": i % workers, "round": i // workers} for i, r in enumerate(seq)]
