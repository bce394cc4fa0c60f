"""The decode-step strip (lib.diagrams.decode_step): one layer found between attention kernels, kernels
sorted into parts by name, bad input refused."""

import matplotlib.pyplot as plt
import pytest

from lib.diagrams import decode_step as strip

STEP = [{"name": "embed", "us": 1.0}] + [
    k for layer in range(3) for k in (
        {"name": "_rmsnorm_kernel", "us": 2.0}, {"name": "nvjet_qkv", "us": 15.0}, {"name": "_rope_write_kernel", "us": 1.5},
        {"name": "_decode_kernel", "us": 4.0}, {"name": "_combine_kernel", "us": 2.0}, {"name": "nvjet_o", "us": 11.0})]


def test_one_layer_is_the_period_between_attention_kernels():
    layer = strip.one_layer(STEP, 1)
    assert [k["name"] for k in layer] == ["_decode_kernel", "_combine_kernel", "nvjet_o", "_rmsnorm_kernel", "nvjet_qkv",
                                          "_rope_write_kernel"]
    with pytest.raises(ValueError, match="attention kernels"):
        strip.one_layer(STEP, 2)


def test_parts_by_name():
    assert strip.part_of("nvjet_sm90_tst_128x8") == "layer weights"
    assert strip.part_of("void cublasLt::splitKreduce_kernel") == "layer weights"
    assert strip.part_of("_combine_kernel") == "attention (K/V)"
    assert strip.part_of("_silu_mul_kernel") == "small operators"


def test_figure_draws_one_box_per_kernel():
    fig = strip.figure({"unfused": STEP, "fused": STEP[:7] + STEP[13:]}, "test", layer=0)
    boxes = [p for p in fig.axes[0].patches]
    assert len(boxes) == 6 + 6  # one layer of each path, six kernels each
    plt.close(fig)
    with pytest.raises(ValueError):
        strip.figure({}, "empty")
