"""Chapter 7's latency-bandwidth step model (lib.experiments.step_model), worked by hand."""

from types import SimpleNamespace

import pandas as pd
import pytest

from lib import models
from lib.experiments import decode_step, step_model


def _copy(nbytes, us):
    return {"bytes": nbytes, "timing": {"gpu_us": {"median": us}}}


def test_alpha_is_the_intercept_of_the_cold_copies():
    # t = 2 us + bytes / (1 byte per ps): intercept 2
    cold = [_copy(n, 2.0 + n / 1e6) for n in (1 << 20, 4 << 20, 16 << 20)]
    assert step_model.kernel_alpha_us(cold) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="two sizes"):
        step_model.kernel_alpha_us([_copy(1 << 20, 3.0)])
    with pytest.raises(ValueError, match="does not grow"):
        step_model.kernel_alpha_us([_copy(1 << 20, 3.0), _copy(2 << 20, 2.0)])


def test_parts_by_hand():
    c = models.CONFIGS["tiny"]
    rows = [{"B": 1, "L": 8, "path": "fused", "part": p, "kernels": k, "measured (us)": m, "predicted (us)": 0.0}
            for p, k, m in (("layer weights", 2, 10.0), ("output head", 1, 5.0), ("attention (K/V)", 2, 4.0),
                            ("small operators", 3, 9.0), ("between kernels", float("nan"), 1.0))]
    a = SimpleNamespace(parts=pd.DataFrame(rows), cfg=c, params={"dtype": "bfloat16"}, BW=1e9, P=1e18)
    t = step_model.parts(a, alpha_us=2.0).set_index("part")
    q = decode_step.step_bytes(c, 1, 8)
    assert "between kernels" not in t.index
    assert t.loc["small operators", "predicted (us)"] == pytest.approx(6.0)  # three kernels of alpha, no bytes
    assert t.loc["layer weights", "predicted (us)"] == pytest.approx(4.0 + q["layer weights"] / 1e3)  # bytes at 1 GB/s
    assert t.loc["attention (K/V)", "predicted (us)"] == pytest.approx(4.0 + q["attention (K/V)"] / 1e3)
    assert t.loc["small operators", "measured / predicted"] == pytest.approx(1.5)
    # a slow arithmetic rate makes a part compute-bound: its FLOPs over P, not its bytes
    a.P = 1.0e6
    t = step_model.parts(a, alpha_us=2.0).set_index("part")
    assert t.loc["output head", "predicted (us)"] == pytest.approx(2.0 + 2 * c.vocab * c.hidden / 1e6 * 1e6)
    assert step_model.median_abs_err(step_model.parts(a, 2.0), 1, 8) > 0
