"""Chapter 7's analysis (lib.experiments.decode_step) on hand-made kernel lists and runs: the parts of a
step, the fusion groups, the floor and the bytes, worked by hand."""

import pytest

from lib import models
from lib.experiments import decode_step as ex

STEP = [{"name": "void at::native::indexSelectSmallIndex", "us": 1.0},  # the embedding's gather
        {"name": "vectorized_layer_norm_kernel", "us": 6.0}, {"name": "nvjet_qkv", "us": 15.0},
        {"name": "elementwise_kernel Mul", "us": 2.0}, {"name": "CatArrayBatchedCopy", "us": 1.0},
        {"name": "index_copy_kernel_impl", "us": 2.0}, {"name": "_decode_kernel", "us": 4.0},
        {"name": "_combine_kernel", "us": 2.0}, {"name": "Memcpy DtoD (Device -> Device)", "us": 1.0},
        {"name": "nvjet_o", "us": 10.0}, {"name": "silu_kernel", "us": 1.5},
        {"name": "vectorized_elementwise_kernel BinaryFunctor MulFunctor", "us": 1.2}, {"name": "nvjet_down", "us": 30.0},
        {"name": "vectorized_layer_norm_kernel", "us": 5.0}, {"name": "nvjet_head", "us": 200.0},
        {"name": "splitKreduce_kernel", "us": 3.0}]


def test_parts_by_hand():
    p = ex.kernel_parts(STEP)
    assert p["output head"] == {"kernels": 2, "us": 203.0}  # the GEMMs at the end of the list
    assert p["layer weights"] == {"kernels": 3, "us": 55.0}
    assert p["attention (K/V)"] == {"kernels": 2, "us": 6.0}
    assert p["small operators"]["kernels"] == 9 and p["small operators"]["us"] == pytest.approx(20.7)


def test_fusion_groups_by_hand():
    g = ex.fusion_groups(STEP)
    assert g["RMSNorm and residual add"] == {"kernels": 2, "us": 11.0}
    assert g["SwiGLU"]["kernels"] == 2 and g["SwiGLU"]["us"] == pytest.approx(2.7)  # SiLU and the product after it
    assert g["RoPE and the K/V write"] == {"kernels": 3, "us": 5.0}
    assert g["copies"] == {"kernels": 1, "us": 1.0} and g["other"] == {"kernels": 1, "us": 1.0}
    fused = ex.fusion_groups([{"name": "_rmsnorm_kernel", "us": 2.5}, {"name": "_rope_write_kernel", "us": 1.7},
                              {"name": "_silu_mul_kernel", "us": 1.1}])
    assert [fused[k]["kernels"] for k in ex.FUSIONS] == [1, 1, 1, 0, 0]


def test_bytes_and_flops_of_llama3_8b():
    c = models.LLAMA3_8B
    q = ex.step_bytes(c, 1, 1024)
    # per layer: QKV 4096 x 6144, O 4096 x 4096, MLP 3 x 4096 x 14336; head 4096 x 128256; bf16
    assert q["layer weights"] == 2 * 32 * (4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336)
    assert q["output head"] == 2 * 128256 * 4096
    assert q["attention (K/V)"] == 2 * 1024 * 32 * 2 * 8 * 128
    assert ex.step_flops(c, 1, 0) == (q["layer weights"] + q["output head"])  # 2 FLOPs per weight, 2 bytes per weight
    assert ex.prefill_flops(c, 1) == 2 * (q["layer weights"] / 2) + 2 * 32 * 32 * 128 * 2 + 2 * 128256 * 4096


def _tiny_case():
    import torch

    m = models.Llama.random(models.CONFIGS["tiny"], dtype=torch.float32, device="cpu")
    gen = torch.Generator().manual_seed(1)
    pool, table = ex._pool(m, 2, 12 + 6, 4, gen)
    lens = torch.full((2,), 12, dtype=torch.int32)
    tokens = torch.tensor([5, 60])
    return m, pool, table, lens, tokens, gen


def test_successor_greedy_agrees_and_restores_the_weights():
    import torch

    m, pool, table, lens, tokens, gen = _tiny_case()
    before = {k: [L[k].clone() for L in m.layers] for k in ("wo", "wd")}
    head = m.weights.head.clone()
    fused = m.with_parts(models.FUSED)
    unfused = lambda *a: m.decode(*a, check=False)  # noqa: E731
    samplers = {"unfused": lambda *a: unfused(*a).argmax(-1), "fused": fused.greedy}
    rows = ex._successor_greedy(m, unfused, samplers, pool, tokens, table, lens, 6, gen)
    assert len(rows) == 6 and all(r["tokens unfused"] == r["tokens fused"] for r in rows)
    assert min(r["lead"] for r in rows) > 0.1 and sum(r["successor"] for r in rows) / 6 > 0.5
    assert torch.equal(m.weights.head, head)  # the head and the scaled projections are back as they were, exactly
    assert all(torch.equal(L[k], b) for k in before for L, b in zip(m.layers, before[k]))


def test_fused_top_p_draws_inside_the_kept_set_and_repeats_with_the_seed():
    import torch

    from lib.kernels import sampling

    m, pool, table, lens, tokens, _ = _tiny_case()
    step = m.with_parts(models.FUSED)
    p, T, seed = torch.tensor([0.9, 0.5]), torch.tensor([0.8, 1.0]), torch.tensor([3])
    kept = sampling.top_p_mask(step(tokens, pool, table, lens), p, T)
    a = step.sample(tokens, pool, table, lens, p, T, seed)
    assert bool(kept.gather(1, a[:, None]).all())
    assert torch.equal(a, step.sample(tokens, pool, table, lens, p, T, seed))
