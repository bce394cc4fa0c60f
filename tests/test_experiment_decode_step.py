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


# ---------------------------------------------------------------------------- the chapter's tables and page

def _rounds(*medians):
    return [{"gpu_us": {"median": m}} for m in medians]


def test_sampling_costs_and_spread_by_hand():
    from types import SimpleNamespace

    from lib.experiments import decode_step_analysis

    steps = [{"B": 1, "L": 8, "rounds": {"unfused": _rounds(100.0, 104.0, 102.0), "fused": _rounds(80.0, 81.0, 79.0)},
              "greedy_rounds": {"unfused": _rounds(110.0, 112.0, 111.0), "fused": _rounds(81.0, 80.0, 82.0)},
              "top_p_rounds": {"unfused": _rounds(130.0, 140.0, 135.0), "fused": _rounds(90.0, 91.0, 92.0)}},
             {"B": 64, "L": 16, "rounds": {"unfused": _rounds(300.0), "fused": _rounds(200.0)},
              "greedy_rounds": {"unfused": _rounds(301.0), "fused": _rounds(203.0)},
              "top_p_rounds": {"unfused": _rounds(330.0), "fused": _rounds(210.0)}}]
    # the step's time: the median of its rounds (unfused 102, fused 80 at the first shape)
    times = {(1, 8, "unfused"): 102.0, (1, 8, "fused"): 80.0, (64, 16, "unfused"): 300.0, (64, 16, "fused"): 200.0}
    a = SimpleNamespace(time=lambda B, L, path: times[(B, L, path)])
    t = decode_step_analysis.sampling_costs(a, steps).set_index(["B", "path"])
    assert t.loc[(1, "unfused"), "greedy sampling (us)"] == 9.0  # median 111 - 102
    assert t.loc[(1, "fused"), "greedy sampling (us)"] == 1.0  # median 81 - 80
    assert t.loc[(1, "unfused"), "top-p sampling (us)"] == 33.0  # median 135 - 102
    assert t.loc[(64, "fused"), "top-p sampling (us)"] == 10.0
    # the largest range of any path's medians over the rounds: the unfused top-p rounds, 140 - 130
    assert decode_step_analysis.sampling_spread_us(steps) == {(1, 8): 10.0, (64, 16): 0.0}
    named = decode_step_analysis.sampling_numbers(decode_step_analysis.sampling_costs(a, steps), [(1, 8), (64, 16)])
    assert named["sampling_fused_b1_us"] == 1.0 and named["top_p_unfused_b64_us"] == 30.0
    assert len(named) == 8  # two kinds x two paths x two shapes


def test_fusion_by_group_by_hand():
    from lib.experiments import decode_step_analysis

    fused = [{"name": "_rmsnorm_kernel", "us": 2.5}, {"name": "_rope_write_kernel", "us": 1.7},
             {"name": "_silu_mul_kernel", "us": 1.1}, {"name": "nvjet_head", "us": 200.0}]
    t = decode_step_analysis.fusion_by_group({"unfused": STEP, "fused": fused}, t0=2.0).set_index("fusion")
    assert list(t.index) == list(ex.FUSIONS[:-1])
    # the norms: 2 kernels (11 us) become 1 (2.5 us): one launch time predicted, 8.5 us measured
    assert t.loc["RMSNorm and residual add"].tolist() == [2, 1, 2.0, 8.5]
    # RoPE and the K/V write: 3 kernels (5 us) become 1 (1.7 us)
    assert t.loc["RoPE and the K/V write", "predicted saving (us)"] == 4.0
    assert t.loc["RoPE and the K/V write", "measured saving (us)"] == pytest.approx(3.3)
    assert t.loc["copies", "kernels fused"] == 0 and t.loc["copies", "measured saving (us)"] == 1.0
    assert decode_step_analysis.fusion_by_group({"unfused": STEP, "fused": []}, t0=2.0).empty  # no profile: no table


def test_logit_checks_greedy_agreement_and_targets_by_hand():
    from lib.experiments import decode_step_analysis

    cc = {"max_abs": 0.5, "ref_absmax": 5.0, "argmax_agree": 1.0}
    steps = [{"B": 1, "L": 8, "checks": {"fused": cc, "float32": {"unfused": cc, "fused": {**cc, "max_abs": 0.25}}}}]
    t = decode_step_analysis.logit_checks(steps)
    assert list(zip(t["path"], t["against"])) == [("fused", "unfused"), ("unfused", "float32"), ("fused", "float32")]
    assert t["max_abs"].tolist() == [0.5, 0.5, 0.25]
    g = decode_step_analysis.greedy_agreement([{"lead": 1.0, "tokens unfused": [3], "tokens fused": [3]},
                                     {"lead": 0.5, "tokens unfused": [3], "tokens fused": [4]}])
    assert g["agree"].tolist() == [True, False]
    n = {"step_over_floor_b1": 1.15, "step_over_floor_b64": 1.09, "fused_vs_compile_b1": 1.2, "fused_vs_compile_b64": 0.9,
         "prefill_8k_frac_of_bf16": 0.7}
    t = decode_step_analysis.targets(n, {"alpha_model_median_abs_err_b1": 0.1, "alpha_model_median_abs_err_b64": 0.3},
                           [(1, 1024), (64, 4096)])
    # a goal met at its bound counts as met; the step model's error is the worse shape's (0.3 > 0.2)
    assert t["met"].tolist() == [True, False, True, False, True, False]
    assert t["target"].iloc[1] == "fused graph step over the floor, batch 64, context 4,096"


def _stored_page():
    from types import SimpleNamespace

    from lib.bench import ceilings, results
    from lib.experiments import decode_step_analysis

    stored = results.load("07-decode-step")
    prov = stored["provenance"]
    res = SimpleNamespace(data=stored["data"], params=stored["params"], provenance=prov, date=prov["date"][:10])
    c = ceilings.load()
    a = ex.Analysis(res.data, res.params, c)
    alpha = decode_step_analysis.kernel_alpha_us(results.load("00-the-machine")["data"]["copy_cold"])
    return decode_step_analysis.page(res, c, a, alpha), res, c, alpha


def test_the_page_holds_every_name_the_book_pastes():
    import re
    from pathlib import Path

    page, _, _, _ = _stored_page()
    book = (Path(__file__).parents[1] / "book" / "07-decode-step.md").read_text()
    pasted = set(re.findall(r"07-decode-step\.ipynb::(\w+)", book))
    elsewhere = {"claims_table", "claims_held", "claims_total", "book_targets", "book_targets_table"}  # Claims.glue
    on_page = set(page.numbers) | set(page.texts) | set(page.tables)
    assert pasted and not {p for p in pasted - on_page if not p.startswith("fig_")} - elsewhere


def test_the_page_of_the_stored_h200_results_worked_by_hand():
    page, res, c, alpha = _stored_page()
    n, t = page.numbers, page.texts
    BW = c["read_bw_GBps"] * 1e9
    # Llama-3-8B in bf16: layer weights 13,958,643,712 bytes, output head 1,050,673,152
    weights = 13_958_643_712 + 1_050_673_152
    assert n["weights_GB"] == pytest.approx(weights / 1e9)
    assert n["weights_read_b1_ms"] == pytest.approx(weights / BW * 1e3)
    # the exercise's shape, batch 16 at context 8192: K and V 16 x 8192 x 32 layers x 2 x 8 heads x 128 x 2 bytes
    kv = 16 * 8192 * 32 * 2 * 8 * 128 * 2
    assert n["ex_kv_GB"] == pytest.approx(kv / 1e9)  # 17.18
    assert n["ex_total_GB"] == pytest.approx((weights + kv + 2 * 16 * 4096) / 1e9)  # and the embedding rows
    # batch 1, context 1024: the floor reads the weights, 1024 tokens of K and V, one embedding row;
    # 1.15 times it leaves this much beside the weights' read
    floor_b1 = weights + 1024 * 32 * 2 * 8 * 128 * 2 + 2 * 4096
    assert n["step_floor_b1_ms"] == pytest.approx(floor_b1 / BW * 1e3)
    assert n["rest_allowed_b1_us"] == pytest.approx((1.15 * floor_b1 - weights) / BW * 1e6)
    assert n["kernels_allowed_b1"] == pytest.approx(0.15 * floor_b1 / BW * 1e6 / alpha)
    assert n["ridge_flop_per_byte"] == pytest.approx(c["bf16_tflops"] * 1e12 / BW)
    # read from the stored data: the first shape's float32 checks, the greedy run, the top-p check
    f32 = res.data["steps"][0]["checks"]["float32"]
    assert n["unfused_vs_fp32"] == f32["unfused"]["max_abs"]
    assert n["fused_fp32_over_unfused_fp32"] == pytest.approx(f32["fused"]["max_abs"] / f32["unfused"]["max_abs"])
    assert n["greedy_steps"] == res.params["greedy_steps"] == len(res.data["greedy"])
    assert n["top_p_kept_b1"] == res.data["steps"][0]["top_p_check"]["kept"]
    assert n["kernel_alpha_us"] == alpha
    # the words agree with the numbers
    assert t["device_name"].startswith("NVIDIA H200") and len(t["measured_date"]) == 10
    verdicts = [t[f"target_{i + 1}_verdict"] for i in range(int(n["targets_total"]))]
    assert n["targets_total"] == 6 and verdicts.count("met") == n["targets_met"]
    assert (t["room_words"] == "leaves room for") == (n["floor_plus_alpha_b1_over_floor"] <= 1.15)
    assert page.tables["targets_table"]["met"].tolist() == [v == "met" for v in verdicts]


def test_fusion_savings_by_hand():
    from types import SimpleNamespace

    import pandas as pd

    from lib.experiments import decode_step_analysis

    # (part, kernels, measured us) of the unfused and the fused step at one shape
    parts = {"unfused": [("layer weights", 3, 50.0), ("output head", 2, 20.0), ("attention (K/V)", 2, 6.0),
                         ("small operators", 12, 30.0), ("between kernels", float("nan"), 10.0)],
             "fused": [("layer weights", 3, 45.0), ("output head", 2, 20.0), ("attention (K/V)", 2, 6.0),
                       ("small operators", 4, 8.0), ("between kernels", float("nan"), 4.0)]}
    rows = [{"B": 1, "L": 8, "path": path, "part": p, "kernels": k, "measured (us)": m, "predicted (us)": 0.0}
            for path, ps in parts.items() for p, k, m in ps]
    a = SimpleNamespace(params={"shapes": [[1, 8]]}, parts=pd.DataFrame(rows), t0=2.0)
    r = decode_step_analysis.fusion_savings(a).iloc[0]
    assert r["kernels removed"] == 8 and r["predicted saving (us)"] == 16.0  # 12 - 4 kernels, one launch time each
    assert r["measured saving (us)"] == 28.0  # (30 + 10) - (8 + 4): small operators and the time between them
    assert r["measured per kernel removed (us)"] == 3.5
    assert (r["GEMMs: cuBLAS (us)"], r["GEMMs: fused step (us)"]) == (70.0, 65.0)
