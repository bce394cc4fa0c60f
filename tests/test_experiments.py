"""What every chapter's experiment module shares: its full sweep is what the reference set was measured
with (a change to a sweep shows here before anyone re-measures), and it refuses sizes it does not know."""

from __future__ import annotations

import json

import pytest

from lib.bench import results
from lib.experiments import (
    batching,
    decode_step,
    grouped_gemm,
    kv_cache,
    machine,
    matrix_shapes,
    parallelism,
    prefix_caching,
    quantization,
    roofline,
)
from lib.experiments import (
    engine as engine_experiment,
)

EXPERIMENTS = {"00-the-machine": machine, "01-matrix-shapes": matrix_shapes, "02-roofline": roofline,
               "03-kv-cache": kv_cache, "04-grouped-gemm": grouped_gemm, "05-prefix-caching": prefix_caching,
               "06-batching": batching, "07-decode-step": decode_step, "08-serving-engine": engine_experiment,
               "09-quantization": quantization, "10-parallelism": parallelism}


@pytest.mark.parametrize("notebook", sorted(EXPERIMENTS))
def test_the_full_sweep_is_what_the_reference_set_was_measured_with(notebook):
    stored = dict(results.load(notebook)["params"])
    assert stored.pop("size") == "full"
    assert json.loads(json.dumps(EXPERIMENTS[notebook].sweep("full"))) == stored


@pytest.mark.parametrize("notebook", sorted(EXPERIMENTS))
def test_an_unknown_size_is_refused(notebook):
    with pytest.raises(ValueError, match="full"):
        EXPERIMENTS[notebook].sweep("medium")


def test_the_engine_experiment_stores_floats_to_a_tenth_of_a_microsecond_and_nan_as_none():
    f = engine_experiment._none_for_nan
    assert f(float("nan")) is None
    assert f(0.032338243999987526) == 0.0323382 and f(12.34567891) == 12.3456789
    assert f(7) == 7 and f(True) is True and f(None) is None and f("chat") == "chat"


def test_ratio_table_keeps_the_measurement_and_the_ratios_under_short_names():
    import pandas as pd

    from lib.experiments import engine_analysis as ea

    frame = pd.DataFrame({"measured (ms)": [10.0], "calibrated (ms)": [9.0], "calibrated / measured": [0.9],
                          "service fit (ms)": [11.0], "service fit / measured": [1.1]})
    out = ea.ratio_table(frame)
    assert list(out.columns) == ["measured (ms)", "calibrated", "service fit"]
    assert out.iloc[0].tolist() == [10.0, 0.9, 1.1]
