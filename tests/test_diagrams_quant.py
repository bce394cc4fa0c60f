"""The int4 storage diagram (lib.diagrams.quant): every value, byte and scale printed from the weight itself,
bad input refused."""

import matplotlib.pyplot as plt
import pytest
import torch

from lib import quant
from lib.diagrams import quant as qd


def test_storage_figure_prints_the_weights_own_values_bytes_and_scales():
    # column 0: q = 7 (row 0) and -1 (row 1) share byte 0: low nibble 7, high nibble F -> 0xF7; column 1: q = -7
    # at row 4, the low nibble of byte row 2 -> 0x09
    q = torch.zeros(8, 2, dtype=torch.int8)
    q[0, 0], q[1, 0], q[4, 1] = 7, -1, -7
    qw = quant.Int4Weight(quant.pack_int4(q), torch.tensor([[0.1, 1.0], [1.0, 0.05]]), 4)
    fig = qd.storage_figure(qw, "int4 storage")
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts.count("7") == 1 and texts.count("-1") == 1 and texts.count("-7") == 1 and texts.count("0") == 13
    assert "F7" in texts and "09" in texts and texts.count("00") == 6
    assert "0.100" in texts and "0.050" in texts
    # 8 bytes of packed weights and 4 float32 scales for 16 weights: 1.5 bytes a weight
    assert any(t.startswith("24 bytes for 16 weights: 1.5000 a weight") for t in texts)
    plt.close(fig)


def test_example_is_what_the_quantizer_makes_at_a_book_group():
    qw = qd.example(K=32, N=3, group=32, seed=1)
    w = torch.randn(32, 3, generator=torch.Generator().manual_seed(1))
    ref = quant.quantize_int4(w, 32)
    assert torch.equal(qw.packed, ref.packed) and torch.allclose(qw.scale, ref.scale)


def test_bad_input_is_refused():
    with pytest.raises(TypeError, match="Int4Weight"):
        qd.storage_figure(quant.quantize_int8(torch.randn(8, 2)), "t")
    with pytest.raises(ValueError, match="too large"):
        qd.storage_figure(quant.quantize_int4(torch.randn(64, 2), 32), "t")
    with pytest.raises(ValueError, match="multiple of the group"):
        qd.example(K=6, group=4)
