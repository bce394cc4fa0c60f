"""What the kernels are given, checked before they launch: every wrong input is a clear error (what,
why, how to fix) or gets the right answer; none reaches a kernel that would read or write outside its
tensors. In Triton's interpreter on the CPU, tiny shapes.

The cases: index tensors (block table, lengths, offsets, page numbers) of the wrong type, dtype,
device, shape or strides; their values out of range (entries outside the cache, negative lengths,
lengths past the table or ``max_seq_len``, offsets that decrease or leave [0, T]); outputs that alias an
input, are too small or overlap themselves; launch parameters that are no power of two or zero; and
the planned fast path, which compares layouts at each call and reads values only where asked. Meta
tensors stand for "another device" (the only other device a CPU has).
"""

from __future__ import annotations

import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.kernels import decode_attention as da
from lib.kernels import grouped_gemm as gg
from lib.kernels import launch, stream

PAGE = 8


def attention_case(lens=(13, 5), H_kv=1, G=4, D=16, page=PAGE, seed=0, spare_pages=0):
    """q [B, G*H_kv, D] and a cache of ceil(max(lens)/page) pages per request (plus ``spare_pages`` that no
    request uses), pages in random order; lengths int32."""
    gen = torch.Generator().manual_seed(seed)
    B, L = len(lens), max(max(lens), 1)
    q = torch.randn(B, G * H_kv, D, generator=gen)
    k, v = torch.randn(2, B, H_kv, L, D, generator=gen)
    kc, bt = da.paginate(k, page, generator=gen)
    vc, _ = da.paginate(v, page, block_table=bt)
    if spare_pages:
        pad = torch.randn(spare_pages, *kc.shape[1:], generator=gen)
        kc, vc = torch.cat([kc, pad]), torch.cat([vc, pad])
    return q, kc, vc, bt, torch.tensor(lens, dtype=torch.int32)


def close(out, q, kc, vc, bt, lens, tol=1e-5):
    ref = da.reference(q, kc, vc, bt, lens)
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item() < tol


def gemm_case(Ms=(3, 0, 6), K=16, N=40, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(Ms), K, generator=gen)
    w = torch.randn(len(Ms), K, N, generator=gen)
    offsets = torch.tensor([0, *torch.tensor(Ms).cumsum(0).tolist()], dtype=torch.int32)
    return x, w, offsets


def gemm_close(out, x, w, offsets, tol=1e-5):
    ref = gg.reference(x, w, offsets)
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item() < tol


# ----------------------------------------------------------------------- decode attention: index values
@pytest.mark.parametrize("entry", [-1, 4, 10_000_000])  # 4: one past the last of the cache's 4 pages
def test_block_table_entries_outside_the_cache_are_refused(entry):
    q, kc, vc, bt, lens = attention_case()  # 2 requests x 2 pages = pages 0..3
    bad = bt.clone()
    bad[0, 1] = entry  # request 0 (13 tokens) uses both of its pages
    message = rf"block_table\[0, 1\] = {entry} names no page of the cache \(k_cache has 4 pages"
    with pytest.raises(ValueError, match=message):
        da.decode_attention(q, kc, vc, bad, lens)
    with pytest.raises(ValueError, match=message):
        da.DecodeAttention(q, kc, vc, bad, lens)
    plan = da.DecodeAttention(q, kc, vc, bt, lens)  # planned on a good table, called on the bad one
    for check in (True, None):  # on the CPU the call checks unless told not to
        with pytest.raises(ValueError, match=message):
            plan(q, kc, vc, bad, lens, check=check)
    unchecked = da.DecodeAttention(q, kc, vc, bad, lens, check=False)  # the caller vouches: planning reads nothing
    with pytest.raises(ValueError, match=message):
        unchecked(q, kc, vc, bad, lens, check=True)


def test_entries_past_a_requests_length_are_never_read():
    """Padding in the unused part of a row (-1, or anything) is fine: only the pages a length uses count."""
    q, kc, vc, bt, lens = attention_case(lens=(13, 5))  # request 1 uses its first page only
    padded = bt.clone()
    padded[1, 1] = -1
    out = da.decode_attention(q, kc, vc, padded, lens)
    assert close(out, q, kc, vc, bt, lens)
    padded[1, 1] = 10_000_000
    assert close(da.DecodeAttention(q, kc, vc, padded, lens)(q, kc, vc, padded, lens, check=True), q, kc, vc, bt, lens)


@pytest.mark.parametrize("lens,message", [
    ((13, -1), r"seq_lens\[1\] = -1 is negative"),
    ((17, 5), r"seq_lens\[0\] = 17 is more than block_table's row holds \(2 pages of 8 = 16 tokens\)"),
])
def test_lengths_outside_the_table_are_refused(lens, message):
    q, kc, vc, bt, good = attention_case(lens=(13, 5))
    bad = torch.tensor(lens, dtype=torch.int32)
    with pytest.raises(ValueError, match=message):
        da.decode_attention(q, kc, vc, bt, bad)
    with pytest.raises(ValueError, match=message):
        da.DecodeAttention(q, kc, vc, bt, good)(q, kc, vc, bt, bad)


def test_a_length_of_zero_gives_zeros():
    q, kc, vc, bt, lens = attention_case(lens=(13, 0))
    out = da.decode_attention(q, kc, vc, bt, lens)
    assert torch.equal(out[1], torch.zeros_like(out[1])) and close(out[:1], q[:1], kc, vc, bt[:1], lens[:1])


def test_max_seq_len_below_the_lengths_is_refused():
    """max_seq_len sets the splits' length: below a real length the tokens past it would be skipped."""
    q, kc, vc, bt, lens = attention_case(lens=(13, 5))
    with pytest.raises(ValueError, match=r"seq_lens\[0\] = 13 is more than max_seq_len = 12.*max_seq_len >= max"):
        da.decode_attention(q, kc, vc, bt, lens, max_seq_len=12, num_splits=2)
    plan = da.DecodeAttention(q, kc, vc, bt, lens, max_seq_len=13, num_splits=2)  # exactly the longest: right
    assert close(plan(q, kc, vc, bt, lens), q, kc, vc, bt, lens)
    with pytest.raises(ValueError, match="more than max_seq_len = 13"):
        plan(q, kc, vc, bt, torch.tensor([14, 5], dtype=torch.int32))
    for bad in (-1, 2.5, True, "13"):
        with pytest.raises(ValueError, match="max_seq_len must be a whole number"):
            da.DecodeAttention(q, kc, vc, bt, lens, max_seq_len=bad)


# ------------------------------------------------------------------ decode attention: types and layouts
def test_lengths_and_tables_as_lists_say_how_to_make_a_tensor():
    q, kc, vc, bt, lens = attention_case()
    with pytest.raises(TypeError, match=r"seq_lens must be a torch.Tensor \(int32 \[B\]\); got list.*torch.as_tensor"):
        da.decode_attention(q, kc, vc, bt, lens.tolist())
    with pytest.raises(TypeError, match="block_table must be a torch.Tensor"):
        da.decode_attention(q, kc, vc, bt.tolist(), lens)
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        da.decode_attention(q.numpy(), kc, vc, bt, lens)
    plan = da.DecodeAttention(q, kc, vc, bt, lens)
    with pytest.raises(TypeError, match="seq_lens must be a torch.Tensor"):
        plan(q, kc, vc, bt, lens.tolist())
    with pytest.raises(TypeError, match="int32 tensors.*to\\(torch.int32\\)"):
        da.decode_attention(q, kc, vc, bt, lens.long())


def test_strided_lengths_and_tables():
    """The plain function copies strided index tensors into contiguous ones (the right answer); a plan,
    which keeps its layout, refuses them and says what to pass."""
    q, kc, vc, bt, lens = attention_case(lens=(13, 5))
    lens2 = torch.tensor([13, -7, 5, -7], dtype=torch.int32)[::2]  # a stride-2 view: every other entry
    bt_cols = bt.t().contiguous().t()  # columns contiguous, rows not
    assert lens2.stride() == (2,) and bt_cols.stride(1) != 1
    assert close(da.decode_attention(q, kc, vc, bt, lens2), q, kc, vc, bt, lens)
    assert close(da.decode_attention(q, kc, vc, bt_cols, lens), q, kc, vc, bt, lens)
    with pytest.raises(ValueError, match=r"seq_lens must be contiguous.*seq_lens.contiguous\(\)"):
        da.DecodeAttention(q, kc, vc, bt, lens2)
    with pytest.raises(ValueError, match=r"block_table must be contiguous.*block_table.contiguous\(\)"):
        da.DecodeAttention(q, kc, vc, bt_cols, lens)
    plan = da.DecodeAttention(q, kc, vc, bt, lens)
    with pytest.raises(ValueError, match="seq_lens must be contiguous"):
        plan(q, kc, vc, bt, lens2)


def test_queries_of_any_strides_in_heads_and_requests():
    """q as a slice of a fused projection [B, H_q + 2 H_kv, d] (rows not contiguous) or broadcast over
    heads (stride 0): read through its strides, written into a contiguous output. A q whose last
    dimension is strided is refused with what to pass."""
    q, kc, vc, bt, lens = attention_case(G=4)
    fused = torch.cat([q, torch.randn(2, 2, 16)], dim=1)
    sliced = fused[:, :4]
    assert not sliced.is_contiguous()
    assert close(da.decode_attention(sliced, kc, vc, bt, lens), q, kc, vc, bt, lens)
    plan = da.DecodeAttention(sliced, kc, vc, bt, lens)
    assert close(plan(sliced, kc, vc, bt, lens), q, kc, vc, bt, lens)
    wide = q[:, :1].expand(2, 4, 16)
    assert close(da.decode_attention(wide, kc, vc, bt, lens), wide.contiguous(), kc, vc, bt, lens)
    with pytest.raises(ValueError, match=r"last dimension \(d\) of q.*\.contiguous\(\)"):
        da.decode_attention(torch.randn(2, 4, 32)[..., ::2], kc, vc, bt, lens)


def test_tensors_on_another_device_are_refused():
    q, kc, vc, bt, lens = attention_case()
    with pytest.raises(ValueError, match="block_table is on meta but q on cpu.*move it with .to"):
        da.decode_attention(q, kc, vc, bt.to("meta"), lens)
    with pytest.raises(ValueError, match="seq_lens is on meta"):
        da.DecodeAttention(q, kc, vc, bt, lens.to("meta"))
    with pytest.raises(ValueError, match="v_cache is on meta"):
        da.decode_attention(q, kc, vc.to("meta"), bt, lens)


def test_a_planned_call_names_what_differs_from_the_plan():
    """Lengths of another shape (the kernel would read past them), a q of another dtype (the compiled kernel
    would read it as the planned one): refused, naming the difference."""
    q, kc, vc, bt, lens = attention_case(lens=(13, 5))
    plan = da.DecodeAttention(q, kc, vc, bt, lens)
    with pytest.raises(ValueError, match=r"differ from the planned.*q.dtype torch.float16 \(planned torch.float32\)"):
        plan(q.half(), kc.half(), vc.half(), bt, lens)
    padded = torch.zeros(*vc.shape[:3], 32)[..., :16]  # the same shape, rows 32 elements apart
    padded.copy_(vc)
    with pytest.raises(ValueError, match=r"v_cache.stride\(\) \(256, 256, 32, 1\) \(planned \(128, 128, 16, 1\)\)"):
        plan(q, kc, padded, bt, lens)
    assert close(da.decode_attention(q, kc, padded, bt, lens), q, kc, vc, bt, lens)  # planned for it: right
    with pytest.raises(ValueError, match=r"seq_lens \[B=2\]; got \(2, 2\), \(1,\)"):  # not even a valid call on its own
        plan(q, kc, vc, bt, lens[:1])


@pytest.mark.parametrize("page", [3, 5, 12, 24, 48])
def test_pages_of_any_size(page):
    """Pages that are not powers of two: the lookups one entry per token (or per tile, where a tile lies
    inside a page) give the reference, whatever tile the plan takes."""
    q, kc, vc, bt, lens = attention_case(lens=(2 * page + 1, page, 1), H_kv=2, G=2, page=page, seed=page)
    for block_n in (16, 64):
        plan = da.DecodeAttention(q, kc, vc, bt, lens, block_n=block_n, num_splits=2)
        assert plan.meta["PER_PAGE"] is False  # one entry per page needs pages that tile a tile
        assert close(plan(q, kc, vc, bt, lens), q, kc, vc, bt, lens), (page, block_n)
    assert close(da.decode_attention(q, kc, vc, bt, lens), q, kc, vc, bt, lens)


def test_launch_parameters_are_checked_not_replaced():
    q, kc, vc, bt, lens = attention_case()
    for kw, name in [(dict(num_splits=0), "num_splits"), (dict(num_splits=3), "num_splits"),
                     (dict(block_n=0), "block_n"), (dict(block_n=24), "block_n"), (dict(head_block=0), "head_block"),
                     (dict(num_warps=3), "num_warps"), (dict(num_warps=0), "num_warps"),
                     (dict(num_splits=True), "num_splits")]:
        with pytest.raises(ValueError, match=f"{name} must be a power of two"):
            da.DecodeAttention(q, kc, vc, bt, lens, **kw)
    with pytest.raises(ValueError, match="num_stages must be"):
        da.DecodeAttention(q, kc, vc, bt, lens, num_stages=0)
    with pytest.raises(ValueError, match="scale must be a finite number"):
        da.DecodeAttention(q, kc, vc, bt, lens, scale=float("nan"))
    with pytest.raises(ValueError, match="page size"):
        da.DecodeAttention(q, kc[:, :, :0], vc[:, :, :0], bt, lens)


# ------------------------------------------------------------------------------- decode attention: out
def test_an_output_one_row_short_is_refused_before_anything_is_written():
    q, kc, vc, bt, lens = attention_case()
    plan = da.DecodeAttention(q, kc, vc, bt, lens)
    buf = torch.full((3, 4, 16), float("nan"))  # out = buf[1:]: one row short, its end the buffer's end
    with pytest.raises(ValueError, match=r"out must be like q: \(2, 4, 16\).*got \(1, 4, 16\)"):
        plan(q, kc, vc, bt, lens, out=buf[2:])
    with pytest.raises(ValueError, match="out must be like q"):
        da.decode_attention(q, kc, vc, bt, lens, out=buf[2:])
    with pytest.raises(ValueError, match="out must be like q"):
        plan(q, kc, vc, bt, lens, out=torch.empty(2, 4, 16, dtype=torch.float16))
    assert torch.isnan(buf).all()


def test_an_output_sharing_memory_with_an_input_is_refused():
    q, kc, vc, bt, lens = attention_case()
    plan = da.DecodeAttention(q, kc, vc, bt, lens)
    page_view = kc.view(-1)[: q.numel()].view_as(q)  # an output laid over the cache's first pages
    for call in (plan, da.decode_attention):
        with pytest.raises(ValueError, match="out shares memory with q"):
            call(q, kc, vc, bt, lens, out=q)
        with pytest.raises(ValueError, match="out shares memory with k_cache.*pass a separate tensor"):
            call(q, kc, vc, bt, lens, out=page_view)
    overlapping = torch.empty(2, 1, 16).expand(2, 4, 16)  # every head written into one row
    with pytest.raises(ValueError, match="no two of its elements may share memory"):
        plan(q, kc, vc, bt, lens, out=overlapping)
    buf = torch.full((2, 6, 16), float("nan"))  # an output of other strides (heads 1..4 of 6): checked, right
    out = plan(q, kc, vc, bt, lens, out=buf[:, 1:5])
    assert close(out, q, kc, vc, bt, lens) and torch.isnan(buf[:, 0]).all() and torch.isnan(buf[:, 5]).all()


# ---------------------------------------------------------------- decode attention: the planned fast path
def test_the_planned_call_reads_values_only_where_asked(monkeypatch):
    """On a GPU a value check is a synchronisation: the planned call reads no values unless check=True
    (on the CPU, where reading costs nothing, it checks unless check=False)."""
    q, kc, vc, bt, lens = attention_case()
    plan = da.DecodeAttention(q, kc, vc, bt, lens)
    seen = []
    monkeypatch.setattr(da, "_check_values", lambda *a, **k: seen.append(a))
    plan(q, kc, vc, bt, lens, check=False)
    assert seen == []
    plan(q, kc, vc, bt, lens)
    assert len(seen) == 1  # the CPU
    plan.on_cpu = False  # as a plan on a GPU
    plan(q, kc, vc, bt, lens)
    assert len(seen) == 1
    plan(q, kc, vc, bt, lens, check=True)
    assert len(seen) == 2


def test_meta_tensors_plan_without_values():
    """Meta tensors (shapes, no memory: how the compile check plans the book's calls) plan and launch-plan
    without reading values; asking for a check on them is refused."""
    meta = [t.to("meta") for t in attention_case()]
    plan = da.DecodeAttention(*meta)
    assert plan.grid[0] == 2
    with pytest.raises(ValueError, match="check=True.*meta tensors hold no values"):
        da.DecodeAttention(*meta, check=True)


def test_values_readable(monkeypatch):
    cpu, meta = torch.zeros(2, dtype=torch.int32), torch.zeros(2, dtype=torch.int32, device="meta")
    assert launch.values_readable(None, cpu) and launch.values_readable(True, cpu)
    assert not launch.values_readable(False, cpu) and not launch.values_readable(False, meta)
    assert not launch.values_readable(None, cpu, meta)
    with pytest.raises(ValueError, match="meta tensors hold no values"):
        launch.values_readable(True, meta)
    # a CUDA tensor while the current stream captures a graph (stood in for: no GPU here)
    on_gpu = types.SimpleNamespace(device=torch.device("cuda", 0), is_cuda=True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert not launch.values_readable(None, on_gpu)
    with pytest.raises(ValueError, match="capturing a graph.*pass check=False"):
        launch.values_readable(True, on_gpu)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert launch.values_readable(None, on_gpu)


# --------------------------------------------------------------------------- grouped GEMM
def test_strided_offsets():
    """Offsets as a stride-2 view: the plain function copies them (the right answer); a plan refuses."""
    x, w, offsets = gemm_case()
    spread = torch.stack([offsets, torch.full_like(offsets, 99)], 1).flatten()[::2]
    assert spread.stride() == (2,) and torch.equal(spread, offsets)
    assert gemm_close(gg.grouped_gemm(x, w, spread, num_programs=2), x, w, offsets)
    with pytest.raises(ValueError, match=r"offsets must be contiguous.*offsets.contiguous\(\)"):
        gg.GroupedGemm(x, w, spread)
    plan = gg.GroupedGemm(x, w, offsets, num_programs=2)
    with pytest.raises(ValueError, match=r"offsets must be contiguous"):
        plan(x, w, spread)


def test_an_output_aliasing_an_input_is_refused():
    x, w, offsets = gemm_case(K=40, N=40)
    plan = gg.GroupedGemm(x, w, offsets, num_programs=2)
    for call in (plan, gg.grouped_gemm):
        with pytest.raises(ValueError, match="out shares memory with x"):
            call(x, w, offsets, out=x)
        with pytest.raises(ValueError, match="out shares memory with w"):
            call(x, w, offsets, out=w[0, : x.shape[0]])
    with pytest.raises(ValueError, match="out shares memory with x"):
        gg.GroupedGemm(x, w, offsets, out=x)
    buf = torch.zeros(2 * x.shape[0], 40)  # x and out halves of one buffer: disjoint, accepted
    buf[: x.shape[0]] = x
    out = gg.grouped_gemm(buf[: x.shape[0]], w, offsets, out=buf[x.shape[0]:], num_programs=2)
    assert gemm_close(out, x, w, offsets)
    with pytest.raises(ValueError, match="no two elements of out may share memory"):
        gg.grouped_gemm(x, w, offsets, out=torch.zeros(1, 40).expand(9, 40))


def test_gemm_launch_parameters_are_checked_not_replaced():
    x, w, offsets = gemm_case()
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="num_programs must be a whole number >= 1"):
            gg.GroupedGemm(x, w, offsets, num_programs=bad)
    for name in ("block_m", "block_n", "block_k"):
        for bad in (0, 24):
            with pytest.raises(ValueError, match=f"{name} must be a power of two >= 16"):
                gg.grouped_gemm(x, w, offsets, **{name: bad})
    with pytest.raises(ValueError, match="num_warps must be a power of two"):
        gg.GroupedGemm(x, w, offsets, num_warps=0)
    with pytest.raises(ValueError, match="num_stages must be at least 1"):
        gg.GroupedGemm(x, w, offsets, num_stages=0)
    assert gg.GroupedGemm(x, w, offsets, num_programs=1).grid == (1,)


def test_offsets_as_a_list_or_on_another_device():
    x, w, offsets = gemm_case()
    with pytest.raises(TypeError, match=r"offsets must be a torch.Tensor.*got list.*torch.as_tensor"):
        gg.grouped_gemm(x, w, offsets.tolist())
    with pytest.raises(TypeError, match="offsets must be a torch.Tensor"):
        gg.GroupedGemm(x, w, offsets)(x, w, offsets.tolist())
    with pytest.raises(ValueError, match="one device.*meta"):
        gg.grouped_gemm(x, w, offsets.to("meta"))
    with pytest.raises(ValueError, match=r"differ from the planned.*x.dtype torch.float16 \(planned torch.float32\)"):
        gg.GroupedGemm(x, w, offsets)(x.half(), w.half(), offsets)


@pytest.mark.parametrize("bad,where", [([0, 5, 3, 9], r"offsets\[2\] < offsets\[1\]"), ([-1, 3, 3, 9], r"offsets\[0\] = -1"),
                                        ([0, 3, 3, 10], r"offsets\[-1\] = 10 > T = 9")])
def test_offsets_out_of_range(bad, where):
    x, w, offsets = gemm_case()  # T = 9
    bad = torch.tensor(bad, dtype=torch.int32)
    with pytest.raises(ValueError, match="non-decreasing within \\[0, T=9\\].*" + where):
        gg.grouped_gemm(x, w, bad)
    plan = gg.GroupedGemm(x, w, offsets, num_programs=2)
    for check in (True, None):
        with pytest.raises(ValueError, match=where):
            plan(x, w, bad, check=check)
    unchecked = gg.GroupedGemm(x, w, bad, check=False)
    with pytest.raises(ValueError, match=where):
        unchecked(x, w, bad, check=True)


# --------------------------------------------------------------------------- stream
def test_page_numbers_outside_the_caches_are_refused():
    k = torch.randn(4, 1, 4, 4)
    for bad in (-1, 4, 10_000_000):
        pages = torch.tensor([0, bad, 2], dtype=torch.int32)
        with pytest.raises(ValueError, match=rf"pages\[1\] = {bad} names no page of the caches \(they have 4 pages"):
            stream.read_pages_sum(k, k, pages, programs=2, block=16)
    spread = torch.tensor([3, -5, 1, -5], dtype=torch.int32)[::2]  # a strided view: copied
    got = stream.read_pages_sum(k, k, spread, programs=2, block=16).double().sum()
    assert abs(got - 2 * k[[3, 1]].double().sum()) < 1e-4


def test_read_kernels_refuse_lists_aliases_and_zero_programs():
    a = torch.randn(64)
    with pytest.raises(TypeError, match="b must be a torch.Tensor"):
        stream.read_sum(a, a.tolist())
    with pytest.raises(ValueError, match="out shares memory with a"):
        stream.read_sum(a, a, programs=4, block=16, out=a[:4])
    with pytest.raises(ValueError, match="out must be float32 of shape"):
        stream.read_sum(a, a, programs=4, block=16, out=torch.empty(4, device="meta"))
    for bad in (0, True):
        with pytest.raises(ValueError, match="programs must be a whole number >= 1"):
            stream.read_sum(a, a, programs=bad)
    with pytest.raises(ValueError, match="num_warps must be a power of two"):
        stream.read_sum(a, a, num_warps=3)
    k = torch.randn(4, 1, 4, 4)
    with pytest.raises(TypeError, match="pages must be a torch.Tensor"):
        stream.read_pages_sum(k, k, [0, 1])


# --------------------------------------------------------------------------- the shared checks
def test_span_and_internal_overlap_by_hand():
    t = torch.zeros(2, 3)
    assert launch.span(t) == 6 * 4
    assert launch.span(t[:, :2]) == (1 * 3 + 1 * 1 + 1) * 4  # elements 0..4 of the buffer
    assert launch.span(t[:0]) == 0
    assert launch.span(torch.zeros(1, 3).expand(5, 3)) == 3 * 4
    assert not launch.internal_overlap(t) and not launch.internal_overlap(t.t())
    assert not launch.internal_overlap(t[:, ::2])
    assert launch.internal_overlap(torch.zeros(1, 3).expand(5, 3))
    assert launch.internal_overlap(torch.zeros(4).as_strided((2, 2), (1, 1)))  # elements 0,1 / 1,2
    assert not launch.internal_overlap(torch.zeros(1, 3).expand(1, 3))


def test_overlap_by_hand():
    buf = torch.zeros(10)
    launch.overlap(buf[5:], dict(a=buf[:5]))  # adjacent, disjoint
    with pytest.raises(ValueError, match="out shares memory with a"):
        launch.overlap(buf[4:], dict(a=buf[:5]))
    with pytest.raises(ValueError, match="y shares memory with b"):  # interleaved: a range test refuses it too
        launch.overlap(buf[::2], dict(b=buf[1::2]), out_name="y")
    launch.overlap(buf[:0], dict(a=buf))  # an empty output touches nothing
    launch.overlap(torch.zeros(3, device="meta"), dict(a=torch.zeros(3, device="meta")))


# ----------------------------------------------------------------------- random inputs, right or refused
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_decode_attention_is_right_or_refuses(data):
    """Random lengths and block tables, some entries or lengths out of range: the plain function gives
    the reference where every length lies in 0 .. the table's capacity and every entry a length uses
    names a page, and a ValueError otherwise (an oracle written out here, request by request)."""
    B, W, spare = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3)), data.draw(st.integers(0, 2))
    P = B * W + spare
    lens = data.draw(st.lists(st.integers(-2, W * PAGE + 2), min_size=B, max_size=B))
    table = data.draw(st.lists(st.lists(st.integers(-2, P + 1), min_size=W, max_size=W), min_size=B, max_size=B))
    gen = torch.Generator().manual_seed(B * 100 + W * 10 + spare)
    q = torch.randn(B, 4, 16, generator=gen)
    kc, vc = torch.randn(2, P, 1, PAGE, 16, generator=gen)
    bt, sl = torch.tensor(table, dtype=torch.int32), torch.tensor(lens, dtype=torch.int32)
    valid = all(0 <= n <= W * PAGE and all(0 <= e < P for e in row[: -(-n // PAGE)]) for n, row in zip(lens, table))
    if not valid:
        with pytest.raises(ValueError, match="seq_lens|block_table"):
            da.decode_attention(q, kc, vc, bt, sl)
        return
    out = da.decode_attention(q, kc, vc, bt, sl)
    assert (out - da.reference(q, kc, vc, bt, sl)).abs().max().item() < 1e-5


@settings(max_examples=15, deadline=None)
@given(offsets=st.lists(st.integers(-2, 11), min_size=2, max_size=4))
def test_grouped_gemm_is_right_or_refuses(offsets):
    """Random offsets over T = 9 rows: the reference where they are non-decreasing within [0, 9], a
    ValueError otherwise."""
    gen = torch.Generator().manual_seed(len(offsets))
    x, w = torch.randn(9, 16, generator=gen), torch.randn(len(offsets) - 1, 16, 24, generator=gen)
    o = torch.tensor(offsets, dtype=torch.int32)
    if not (offsets[0] >= 0 and offsets[-1] <= 9 and offsets == sorted(offsets)):
        with pytest.raises(ValueError, match="non-decreasing"):
            gg.grouped_gemm(x, w, o)
        return
    assert gemm_close(gg.grouped_gemm(x, w, o, num_programs=2), x, w, o)


# ----------------------------------------------------------------------- bf16 in Triton's interpreter
def _bf16_calls():
    """Each wrapper whose kernel multiplies with tl.dot, called with bf16 tensors (tiny shapes)."""
    from lib import quant
    from lib.kernels import quant_gemm, skinny_gemm

    bf = torch.bfloat16
    q, kc, vc, bt, lens = attention_case()
    x, w, offsets = gemm_case()
    a, b = torch.randn(2, 64), torch.randn(64, 32)
    i8, i4 = quant.quantize_int8(torch.randn(64, 32) * 0.02), quant.quantize_int4(torch.randn(64, 32) * 0.02, 32)
    return {
        "decode_attention": (da, lambda: da.decode_attention(q.to(bf), kc.to(bf), vc.to(bf), bt, lens)),
        "DecodeAttention": (da, lambda: da.DecodeAttention(q.to(bf), kc.to(bf), vc.to(bf), bt, lens)),
        "grouped_gemm": (gg, lambda: gg.grouped_gemm(x.to(bf), w.to(bf), offsets)),
        "GroupedGemm": (gg, lambda: gg.GroupedGemm(x.to(bf), w.to(bf), offsets)),
        "skinny_mm": (skinny_gemm, lambda: skinny_gemm.skinny_mm(a.to(bf), b.to(bf))),
        "skinny_argmax": (skinny_gemm, lambda: skinny_gemm.skinny_argmax(a.to(bf), b.to(bf))),
        "w8_mm": (quant_gemm, lambda: quant_gemm.w8_mm(a.to(bf), i8, swap=True)),
        "w4_mm": (quant_gemm, lambda: quant_gemm.w4_mm(a.to(bf), i4, swap=False)),
    }


@pytest.mark.parametrize("name", list(_bf16_calls()))
def test_bf16_is_refused_where_the_interpreter_would_run_it(name):
    """Triton's interpreter computes tl.dot of bf16 operands wrongly (relative errors near 1e9, not a rounding):
    every kernel with a tl.dot refuses bf16 where it would run interpreted, saying what to pass instead."""
    module, call = _bf16_calls()[name]
    assert module.INTERPRETED  # this test process runs the kernels in the interpreter (no GPU)
    with pytest.raises(TypeError, match=r"bfloat16, but the kernel runs in Triton's interpreter.*computes tl.dot of "
                                        r"bfloat16 operands wrongly.*float16 or float32.*or run on a GPU"):
        call()


def test_bf16_is_planned_where_the_kernels_are_compiled(monkeypatch):
    """The refusal is the interpreter's alone: kernels compiled for a GPU take bf16 (here only planned, as on a
    GPU: nothing is launched)."""
    bf = torch.bfloat16
    q, kc, vc, bt, lens = attention_case()
    x, w, offsets = gemm_case()
    monkeypatch.setattr(da, "INTERPRETED", False)
    monkeypatch.setattr(gg, "INTERPRETED", False)
    assert da.DecodeAttention(q.to(bf), kc.to(bf), vc.to(bf), bt, lens).grid[0] == 2
    assert gg.GroupedGemm(x.to(bf), w.to(bf), offsets).config["block_m"] >= 16


def test_kernels_without_tl_dot_take_bf16_in_the_interpreter():
    """The fused kernels, the draws, the read-only kernels and the FP8 cache's attention (which multiplies in
    fp16) compute bf16 right in the interpreter: not refused."""
    from lib import quant
    from lib.kernels import decode_attention_fp8 as fp8
    from lib.kernels import fused, sampling

    bf = torch.bfloat16
    x = torch.randn(2, 32).to(bf)
    assert fused.silu_mul(x).dtype == bf and fused.rmsnorm(x, torch.ones(32, dtype=bf), 1e-5)[0].dtype == bf
    assert sampling.top_p_sample(x, 0.9).shape == (2,)
    assert float(stream.read_sum(x, x, programs=1, block=64)[0]) == pytest.approx(2 * float(x.float().sum()), rel=1e-2)
    q, kc, vc, bt, lens = attention_case()
    (k8, ks), (v8, vs) = quant.quantize_kv_fp8(kc), quant.quantize_kv_fp8(vc)
    out = fp8.decode_attention_fp8(q.to(bf), k8, v8, bt, lens, k_scale=ks, v_scale=vs)
    assert close(out.float(), q.to(bf).float(), k8.float() * ks, v8.float() * vs, bt, lens, tol=1e-2)
