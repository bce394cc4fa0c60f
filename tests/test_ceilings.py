"""lib.bench.ceilings: what chapter 0's data supports, computed on a small synthetic record."""

import pytest

from lib.bench import ceilings, results

L2 = 10 << 20  # 10 MiB


def t(gpu_us, call_us=None):
    s = lambda m: {"median": m, "q1": m, "q3": m, "min": m, "max": m, "n": 1}  # noqa: E731
    return {"gpu_us": s(gpu_us), "call_us": s(call_us or gpu_us), "calls_per_sample": 1, "buffers": 1, "method": "x"}


def data():
    mib = 1 << 20
    return {
        "l2_bytes": L2,
        # 2 MiB copy: footprint 4 MiB, inside the L2 -> ignored however fast
        "copy": [{"bytes": 2 * mib, "timing": t(0.1)}, {"bytes": 40 * mib, "timing": t(40.0)}],
        "copy_kernel": [{"bytes": 40 * mib, "timing": t(50.0)}],
        "read": [{"bytes": 20 * mib, "timing": t(1.0)}, {"bytes": 80 * mib, "timing": t(40.0)}],
        "matmul": [
            {"dtype": dt, "n": n, "timing": t(tt)}
            for dt, n, tt in [("bf16", 1024, 10.0), ("bf16", 2048, 40.0), ("fp16", 1024, 20.0),
                              ("tf32", 1024, 40.0), ("fp32", 1024, 400.0)]
        ],
        "launch": {"timing": t(1.0, 5.0)},
    }


def test_from_data():
    c = ceilings.from_data(data())
    mib = 1 << 20
    assert c["copy_bw_GBps"] == pytest.approx(80 * mib / 40.0 / 1e3)  # the memcpy, faster than the kernel
    assert c["read_bw_GBps"] == pytest.approx(80 * mib / 40.0 / 1e3)  # the 20 MiB read is not beyond 4x L2
    assert c["bf16_tflops"] == pytest.approx(2 * 2048**3 / 40.0 / 1e6)
    assert c["fp32_tflops"] == pytest.approx(2 * 1024**3 / 400.0 / 1e6)
    assert (c["launch_eager_us"], c["launch_graph_us"]) == (5.0, 1.0)
    assert c["ridge_flop_per_byte"] == pytest.approx(c["bf16_tflops"] * 1e12 / (c["copy_bw_GBps"] * 1e9))


def test_the_best_read_and_product_of_any_kind_set_the_ceilings():
    mib = 1 << 20
    d = data()
    # the read kernel: faster than torch.sum at 80 MiB (36 us), and fastest of all inside the L2 (ignored)
    d["read_kernel"] = [{"bytes": 80 * mib, "launch": [1024, 4096, 4, ""], "timing": t(36.0)},
                        {"bytes": 80 * mib, "launch": [8192, 2048, 4, ""], "timing": t(38.0)},
                        {"bytes": 20 * mib, "launch": [1024, 4096, 4, ""], "timing": t(0.5)}]
    # a rectangular bf16 product faster than any square one: 2*2048*4096*14336 FLOP in 150 us
    d["matmul_shapes"] = [{"shape": [2048, 14336, 4096], "timing": t(150.0)}]
    c = ceilings.from_data(d)
    assert c["read_bw_GBps"] == pytest.approx(80 * mib / 36.0 / 1e3)
    assert c["bf16_tflops"] == pytest.approx(2 * 2048 * 14336 * 4096 / 150.0 / 1e6)
    assert c["fp16_tflops"] == ceilings.from_data(data())["fp16_tflops"]  # only bf16 takes the shapes
    d["matmul_shapes"] = [{"shape": [2048, 14336, 4096], "timing": t(1e6)}]  # slower: the squares still win
    assert ceilings.from_data(d)["bf16_tflops"] == pytest.approx(2 * 2048**3 / 40.0 / 1e6)


def test_no_buffer_beyond_the_l2_is_an_error():
    d = data()
    d["copy"] = d["copy"][:1]
    d["copy_kernel"] = []
    with pytest.raises(ValueError, match="no buffer of at least 4x the L2"):
        ceilings.from_data(d)


def test_units():
    assert ceilings.gbps(2e9, 1e6) == pytest.approx(2.0)  # 2 GB in one second
    assert ceilings.tflops(3e12, 1e6) == pytest.approx(3.0)


def test_reference_ceilings_load():
    c = ceilings.load(results.REFERENCE)
    assert c["copy_bw_GBps"] > 0 and c["bf16_tflops"] > 0 and c["l2_bytes"] > 0
