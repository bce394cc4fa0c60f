"""Chapter 7's latency-bandwidth step model (lib.experiments.decode_step_analysis), worked by hand."""

from types import SimpleNamespace

import pandas as pd
import pytest

from lib import models
from lib.experiments import decode_step_analysis


def _copy(nbytes, us):
    return {"bytes": nbytes, "timing": {"gpu_us": {"median": us}}}


def test_alpha_is_the_intercept_of_the_cold_copies():
    # t = 2 us + bytes / (1 byte per ps): intercept 2
    cold = [_copy(n, 2.0 + n / 1e6) for n in (1 << 20, 4 << 20, 16 << 20)]
    assert decode_step_analysis.kernel_alpha_us(cold) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="two sizes"):
        decode_step_analysis.kernel_alpha_us([_copy(1 << 20, 3.0)])
    with pytest.raises(ValueError, match="does not grow"):
        decode_step_analysis.kernel_alpha_us([_copy(1 << 20, 3.0), _copy(2 << 20, 2.0)])


def test_parts_by_hand():
    c = models.LLAMA3_8B
    rows = [{"B": 1, "L": 8, "path": "fused", "part": p, "kernels": k, "measured (us)": m, "predicted (us)": 0.0}
            for p, k, m in (("layer weights", 2, 10.0), ("output head", 1, 5.0), ("attention (K/V)", 2, 4.0),
                            ("small operators", 3, 9.0), ("between kernels", float("nan"), 1.0))]
    a = SimpleNamespace(parts=pd.DataFrame(rows), cfg=c, params={"dtype": "bfloat16"}, BW=1e9, P=1e18)
    t = decode_step_analysis.parts(a, alpha_us=2.0).set_index("part")
    # Llama-3-8B in bf16 (2 bytes), worked from its architecture:
    # one layer: q 4096 x (32 x 128) = 16,777,216; k and v 2 x 4096 x (8 x 128) = 8,388,608;
    # o (32 x 128) x 4096 = 16,777,216; gate, up, down 3 x 4096 x 14336 = 176,160,768: 218,103,808 weights;
    # 32 layers: 6,979,321,856 weights, 13,958,643,712 bytes
    layer_bytes = 13_958_643_712
    # output head: 128256 x 4096 = 525,336,576 weights, 1,050,673,152 bytes
    head_weights = 525_336_576
    # K and V at B = 1, L = 8: 8 tokens x 32 layers x 2 (K, V) x 8 heads x 128 x 2 bytes = 1,048,576 bytes
    kv_bytes = 1_048_576
    assert "between kernels" not in t.index
    assert t.loc["small operators", "predicted (us)"] == pytest.approx(6.0)  # three kernels of alpha, no bytes
    # two kernels of alpha (4 us), then the bytes at 1 GB/s (1e3 bytes per us)
    assert t.loc["layer weights", "predicted (us)"] == pytest.approx(4.0 + layer_bytes / 1e3)
    assert t.loc["attention (K/V)", "predicted (us)"] == pytest.approx(4.0 + kv_bytes / 1e3)
    assert t.loc["output head", "predicted (us)"] == pytest.approx(2.0 + 2 * head_weights / 1e3)
    assert t.loc["small operators", "measured / predicted"] == pytest.approx(1.5)
    # a slow arithmetic rate (1 MFLOP/s) makes a part compute-bound: its FLOPs (2 per weight) over P, not its bytes
    a.P = 1.0e6
    t = decode_step_analysis.parts(a, alpha_us=2.0).set_index("part")
    assert t.loc["output head", "predicted (us)"] == pytest.approx(2.0 + 2 * head_weights / 1e6 * 1e6)
    assert decode_step_analysis.median_abs_err(decode_step_analysis.parts(a, 2.0), 1, 8) > 0
