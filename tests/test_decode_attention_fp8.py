"""Decode attention over an FP8 (e4m3) KV cache (lib.kernels.decode_attention_fp8, in Triton's interpreter):
the output against float64 attention over the cache's dequantized values, the scales really used, the
plan equal to the 16-bit kernel's default, and bad input refused."""

import pytest
import torch

from lib import quant
from lib.kernels import decode_attention as da
from lib.kernels import decode_attention_fp8 as fp8
from tests.test_decode_attention import TOL, paged_case, rel_err


def fp8_case(lens, H_kv, G, D, page, dtype, seed):
    q, kc, vc, bt, sl = paged_case(lens, H_kv, G, D, page, dtype, torch.Generator().manual_seed(seed))
    k8, ks = quant.quantize_kv_fp8(kc * 3.0)  # scales far from 1: a lost scale shows
    v8, vs = quant.quantize_kv_fp8(vc * 0.01)
    return q, k8, v8, ks, vs, bt, sl


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("lens,G,page,sms,combine", [([1, 19, 64, 97], 4, 16, None, "inline"),
                                                     ([700, 1000], 8, 64, None, "inline"),
                                                     ([3000], 4, 16, 132, "kernel"),  # planned for an H200
                                                     ([40, 7], 32, 8, None, "inline"),
                                                     ([5000], 4, 16, None, "inline")])  # wider tiles
def test_equals_attention_over_the_dequantized_cache(dtype, lens, G, page, sms, combine, monkeypatch):
    if sms:  # the plan of a GPU of that many SMs: many splits, combined by the second kernel
        monkeypatch.setattr(fp8.launch, "sm_count", lambda device: sms)
    q, k8, v8, ks, vs, bt, sl = fp8_case(lens, 2, G, 32, page, dtype, seed=sum(lens) + G)
    ref = da.reference(q, k8.float() * ks, v8.float() * vs, bt, sl, dtype=torch.float64)
    plan = fp8.DecodeAttentionFP8(q, k8, v8, bt, sl, k_scale=ks, v_scale=vs)
    assert plan.combine == combine
    assert (plan.meta["BLOCK_N"], plan.options["num_warps"]) == (fp8.WIDE_TILE if max(lens) == 5000 else
                                                                 (plan.meta["BLOCK_N"], plan.options["num_warps"]))
    buf = torch.full((len(lens) + 2, *q.shape[1:]), float("nan"), dtype=dtype)
    out = plan(q, k8, v8, bt, sl, out=buf[1:-1])
    assert torch.isnan(buf[0]).all() and torch.isnan(buf[-1]).all() and not torch.isnan(out).any()
    assert out.dtype == dtype and rel_err(out, ref) < TOL[dtype]
    # without its scales the same cache gives something else: the scales are used
    wrong = fp8.decode_attention_fp8(q, k8, v8, bt, sl, k_scale=1.0, v_scale=1.0)
    assert rel_err(wrong, ref) > 0.5


@pytest.mark.parametrize("sms", [None, 132])
def test_the_plan_is_the_16_bit_kernels_default(sms, monkeypatch):
    # short, long, one request and many: the same tile, warps, splits, head blocks and combine
    if sms:
        monkeypatch.setattr(fp8.launch, "sm_count", lambda device: sms)
    seen = set()
    for lens, G, page in (([1, 19, 64, 97], 4, 16), ([3000], 4, 16), ([40, 7], 32, 8), ([5000] * 3, 8, 16),
                          ([4096] * 40, 4, 16)):
        q, k8, v8, ks, vs, bt, sl = fp8_case(lens, 2, G, 32, page, torch.float16, seed=1)
        mine = fp8.DecodeAttentionFP8(q, k8, v8, bt, sl, k_scale=ks, v_scale=vs)
        ref = da.DecodeAttention(q, k8.half(), v8.half(), bt, sl)
        mine_meta = {k: v for k, v in mine.meta.items() if k != "DOT"}  # the products' dtype: this kernel's own
        wide = fp8.wider_tiles(ref.meta["BLOCK_N"], ref.options["num_warps"], -(-max(lens) // ref.splits))
        if wide:  # the one departure: wider tiles over long splits
            assert (mine.meta["BLOCK_N"], mine.options["num_warps"]) == fp8.WIDE_TILE
            mine_meta["BLOCK_N"], mine_meta["PER_PAGE"] = ref.meta["BLOCK_N"], ref.meta["PER_PAGE"]
            mine.options = {**mine.options, "num_warps": ref.options["num_warps"]}
        assert (mine_meta, mine.options, mine.grid, mine.combine) == (ref.meta, ref.options, ref.grid, ref.combine)
        seen.add(wide)
    assert seen == {True, False} or sms is None  # planned for an H200, both kinds of plan occur


def test_round_trip_of_the_quantizer():
    x = torch.tensor([[1.0, -448.0], [0.5, 0.0]]) * 2.0
    x8, s = quant.quantize_kv_fp8(x)
    assert x8.dtype == torch.float8_e4m3fn and s == pytest.approx(2.0)
    assert torch.equal(x8.float() * s, x)  # these values are exact in e4m3
    g = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    g8, s = quant.quantize_kv_fp8(g)
    # e4m3 keeps 3 bits of mantissa: within 1/16 of each value (relative), or a denormal step near zero
    assert bool(((g8.float() * s - g).abs() <= g.abs() / 16 + s * 2.0 ** -9).all())
    assert quant.quantize_kv_fp8(torch.zeros(3))[1] == 1.0
    with pytest.raises(ValueError, match="NaN"):
        quant.quantize_kv_fp8(torch.tensor([float("nan")]))
    with pytest.raises(TypeError, match="floating-point"):
        quant.quantize_kv_fp8(torch.ones(3, dtype=torch.int32))


def test_bad_input_is_refused():
    q, k8, v8, ks, vs, bt, sl = fp8_case([5], 1, 1, 16, 4, torch.float32, seed=0)
    with pytest.raises(TypeError, match="e4m3|float8"):
        fp8.decode_attention_fp8(q, k8, v8.float(), bt, sl, k_scale=ks, v_scale=vs)  # V not in 8 bits
    with pytest.raises(ValueError, match="k_scale"):
        fp8.decode_attention_fp8(q, k8, v8, bt, sl, k_scale=0.0, v_scale=vs)
    with pytest.raises(ValueError, match="v_scale"):
        fp8.decode_attention_fp8(q, k8, v8, bt, sl, k_scale=ks, v_scale=float("inf"))
    with pytest.raises(ValueError, match="head dimension"):
        fp8.decode_attention_fp8(q[..., :8], k8[..., :8], v8[..., :8], bt, sl, k_scale=ks, v_scale=vs)
    with pytest.raises(TypeError, match="int32"):
        fp8.decode_attention_fp8(q, k8, v8, bt.long(), sl, k_scale=ks, v_scale=vs)
    with pytest.raises(ValueError, match="num_stages"):
        fp8.DecodeAttentionFP8(q, k8, v8, bt, sl, k_scale=ks, v_scale=vs, num_stages=0)
    with pytest.raises(ValueError, match="block_n"):
        fp8.DecodeAttentionFP8(q, k8, v8, bt, sl, k_scale=ks, v_scale=vs, block_n=24)
    plan = fp8.DecodeAttentionFP8(q, k8, v8, bt, sl, k_scale=ks, v_scale=vs)
    with pytest.raises(ValueError, match="planned"):
        plan(q.repeat(2, 1, 1), k8, v8, bt.repeat(2, 1), sl.repeat(2))
