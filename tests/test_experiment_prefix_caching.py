"""lib.experiments.prefix_caching (chapter 5): the smoke sweep measured on the CPU, the structure of its data,
its checks of the timed paths, and the workload replay."""

from __future__ import annotations

import math
import re
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from lib import costs, models
from lib.experiments import prefix_caching as pc


def cached_prefill(m, pool, tokens, blocks, cached):
    return m.prefill(tokens, pool, blocks, cached, last_only=True)


def decode_step(m, pool, tokens, table, lens):
    return m.decode(tokens, pool, table, lens, check=False)


def first_token(m, cache, tokens, extra):
    lease = cache.acquire(tokens, extra)
    return lease, int(m.prefill(tokens, cache.pool, lease.blocks, lease.hit_tokens, last_only=True)[0].argmax())


PATHS = {"prefill": cached_prefill, "decode": decode_step, "first_token": first_token}


@pytest.fixture(scope="module")
def smoke():
    p = pc.sweep("smoke")
    return p, pc.measure(p, "cpu", **PATHS)


def test_smoke_data_structure(smoke):
    p, d = smoke
    assert set(d) == {"params_count", "exactness", "savings", "attack"}
    assert d["params_count"] == models.CONFIGS["tiny"].params()
    ex = d["exactness"]
    assert ex["n"] == 64 and ex["cached"] == 56  # 90% of 64 is 57.6, rounded down to blocks of 4
    # in float32 the reused prefix gives the whole prompt's logits, and the float32 model is the same model
    assert ex["reused_vs_whole"] <= 1e-5 * ex["logit_absmax"] and ex["whole_vs_fp32"] <= 1e-5 * ex["logit_absmax"]
    assert ex["argmax_agree"] == ex["argmax_agree_fp32"] == 1.0


def test_savings_rows_cover_every_length_and_fraction(smoke):
    p, d = smoke
    expected = []
    for n in p["lengths"]:  # 32 and 64 tokens, fractions 0, 0.5, 0.9, blocks of 4
        expected += [(n, f, int(f * n) // 4 * 4, None) for f in p["fractions"]] + [(n, None, None, True)]
    assert [(r["n"], r["fraction"], r["cached"], r.get("decode")) for r in d["savings"]] == expected
    assert [r["cached"] for r in d["savings"] if r["n"] == 32] == [0, 16, 28, None]
    for r in d["savings"]:
        t = r["timing"]
        assert t["gpu_us"]["n"] == t["call_us"]["n"] == p["reps"] and t["gpu_us"]["median"] > 0


def test_attack_rows_hit_exactly_the_victims_prefix(smoke):
    p, d = smoke
    a = p["attack"]
    rows = d["attack"]
    assert len(rows) == len(a["prefixes"]) * 2 * a["trials"]  # warm-up rounds are not kept
    for plen in a["prefixes"]:
        for iso in ("shared", "salted"):
            g = [r for r in rows if r["prefix"] == plen and r["isolation"] == iso]
            assert sum(r["positive"] for r in g) == a["trials"] // 2
            for r in g:
                # a right guess on a shared cache finds the whole prefix (whole blocks; the suffixes differ);
                # a wrong guess, or any guess under a per-tenant salt, finds nothing
                assert r["hit_tokens"] == (plen if r["positive"] and iso == "shared" else 0)
                assert 0 <= r["first_token"] < models.CONFIGS["tiny"].vocab and r["ttft_us"] > 0


def savings_with(prefill=cached_prefill, decode=decode_step):
    p = {**pc.sweep("smoke"), "lengths": [32]}
    m = models.Llama.random(models.CONFIGS["tiny"], seed=0)
    return pc.measure_savings(m, p, "cpu", torch.Generator().manual_seed(0), prefill, decode)


def test_a_prefill_that_forgets_the_cached_prefix_raises():
    def forgets_prefix(m, pool, tokens, blocks, cached):  # computes the suffix as if it were the whole prompt
        return m.prefill(tokens[cached:], pool, blocks, 0, last_only=True)

    with pytest.raises(AssertionError, match="prefill of 32 tokens after 16 cached.*computes something else"):
        savings_with(prefill=forgets_prefix)


def test_a_decode_step_at_the_wrong_position_raises():
    def one_short(m, pool, tokens, table, lens):  # the new token one position early, over one token less
        return m.decode(tokens, pool, table, lens - 1, check=False)

    with pytest.raises(AssertionError, match="decode step at position 31"):
        savings_with(decode=one_short)


def test_a_path_returning_every_position_raises():
    def all_logits(m, pool, tokens, blocks, cached):
        return m.prefill(tokens, pool, blocks, cached)

    with pytest.raises(AssertionError, match=r"shape \(32, 97\), expected \(1, 97\)"):
        savings_with(prefill=all_logits)


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="'full' or 'smoke'"):
        pc.sweep("tiny")
    p = pc.sweep("smoke")
    with pytest.raises(ValueError, match="device must be"):
        pc.measure(p, "tpu", **PATHS)
    with pytest.raises(ValueError, match="lack.*fractions"):
        pc.measure({k: v for k, v in p.items() if k != "fractions"}, "cpu", **PATHS)
    with pytest.raises(ValueError, match="dtype must be one of"):
        pc.measure({**p, "dtype": "int8"}, "cpu", **PATHS)
    with pytest.raises(ValueError, match=r"cached fractions must lie in \[0, 1\)"):
        pc.measure({**p, "fractions": [0.0, 1.0]}, "cpu", **PATHS)
    with pytest.raises(ValueError, match="trials must be even"):
        pc.measure({**p, "attack": {**p["attack"], "trials": 7}}, "cpu", **PATHS)


def test_replay_workload_hand_worked():
    # two identical prompts of 8 tokens in blocks of 4: the second finds both blocks cached but must compute
    # its last token, so it reuses one block (4 tokens) of the 16 prompt tokens; a 3-token prompt has no full
    # block and reuses nothing
    table = pc.replay_workload([[1, 2, 3, 4, 5, 6, 7, 8]] * 2 + [[1, 2, 3]], pool_blocks=(8, 16),
                               cases=(("lru", 1), ("fifo", 2)), block_size=4)
    assert list(table["pool tokens"]) == [32, 32, 64, 64]
    assert list(table["case"]) == ["LRU, 1 running", "FIFO, 2 running"] * 2
    assert list(table["hit_tokens"]) == [4, 4, 4, 4]
    assert list(table["saved"]) == [4 / 19] * 4
    with pytest.raises(ValueError, match="positive block size"):
        pc.replay_workload([[1, 2]], pool_blocks=(), cases=(("lru", 1),), block_size=4)


def test_prefill_cost_by_hand():
    cfg = models.ModelConfig(vocab=10, hidden=4, layers=2, heads=2, kv_heads=1, head_dim=2, mlp=8)
    # linears per layer: qkv 4x8=32, o 4x4=16, gate_up 4x16=64, down 8x4=32 -> 144; two layers: 288 weights
    # n=4, cached=2: m=2 tokens at positions 2, 3 attend 3 + 4 = 7 positions
    c = pc.prefill_cost(cfg, 4, 2, b=2)
    assert c["flops"] == 2 * 288 * 2 + 4 * 2 * 2 * 2 * 7 + 2 * 10 * 4
    kv_token = 2 * 1 * 2 * 2  # K and V, one head of 2, 2 bytes
    acts = 2 * 2 * ((4 + 8) + (4 + 4) + (4 + 16) + (8 + 4))  # b m (K + N) per linear
    assert c["bytes"] == 2 * (288 + 40) + 2 * (3 * 4 + 2) * kv_token + 2 * acts
    assert c["kernels"] == 2 * pc.KERNELS_PER_LAYER + pc.KERNELS_PER_CALL
    # the layer weights agree with the model's own count (params less embeddings, head and norms)
    assert 2 * 288 == cfg.flops_per_token(0) - 2 * cfg.vocab * cfg.hidden  # its head counted once per token


def test_predict_prefill_takes_the_largest_term():
    cfg = models.CONFIGS["tiny"]
    c = pc.prefill_cost(cfg, 64, 32)
    roof = costs.Roofline(c["flops"] / 1e-3, c["bytes"] / 2e-3, 1e-9)  # compute 1 ms, memory 2 ms
    p = pc.predict_prefill(cfg, 64, 32, roof)
    assert p["ms"] == pytest.approx(2.0) and p["bound"] == "memory"
    with pytest.raises(ValueError, match="cached < n"):
        pc.prefill_cost(cfg, 8, 8)


def test_kernel_groups_by_name():
    assert pc.kernel_group("nvjet_sm90_tst_128x8_64x12_2x1_v_bz_NNT") == "GEMM (cuBLAS)"
    assert pc.kernel_group("void cublasLt::splitKreduce_kernel<32, 16>") == "GEMM (cuBLAS)"
    assert pc.kernel_group("_decode_kernel") == "attention (chapter 3's kernel)"
    assert pc.kernel_group("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel") == "RMSNorm"
    assert pc.kernel_group("Memcpy DtoD (Device -> Device)") == "copies and indexing"
    assert pc.kernel_group("void at::native::silu_kernel") == pc.OTHER_GROUP


def test_decode_breakdown_worked_by_hand():
    # 2 GEMMs of 40 us reading 80 bytes at 1 B/us (read 80 us): read fraction 80 / 80 = 1; 3 small kernels of
    # 2 us; step 100 us: 14 us between kernels; prediction 80 + 3 * 1.5 = 84.5 us
    kernels = [{"name": "nvjet_a", "us": 40.0}, {"name": "silu", "us": 2.0}, {"name": "nvjet_b", "us": 40.0},
               {"name": "_decode_kernel", "us": 2.0}, {"name": "Memset (Device)", "us": 2.0}]
    table, n = pc.decode_breakdown(kernels, 100.0, weights=80, read_bw=1e6, launch_us=1.5)
    assert n["decode_kernels"] == 5 and n["decode_gemm_kernels"] == 2 and n["decode_small_kernels"] == 3
    assert n["decode_weight_read_us"] == pytest.approx(80) and n["decode_gemm_read_frac"] == pytest.approx(1.0)
    assert n["decode_gaps_us"] == pytest.approx(14) and n["decode_predicted_us"] == pytest.approx(84.5)
    assert n["decode_over_predicted"] == pytest.approx(100 / 84.5)
    assert table.loc["GEMM (cuBLAS)", "kernels"] == 2 and table.loc["between kernels", "device time (us)"] == pytest.approx(14)
    assert table.loc["step (CUDA-graph replay)", "share of the step"] == 1.0
    with pytest.raises(ValueError, match="profile"):
        pc.decode_breakdown([], 1.0, 1, 1.0, 1.0)


def test_weight_bytes_of_the_1b_model():
    c = models.CONFIGS["1b"]
    per_layer = 2048 * (32 + 16) * 64 + 32 * 64 * 2048 + 2048 * 2 * 8192 + 8192 * 2048
    assert pc.weight_bytes(c) == 2 * (16 * per_layer + 32000 * 2048)


# ---------------------------------------------------------------------------- the page's numbers

BOOK = Path(__file__).resolve().parents[1] / "book"
CLAIMS_NAMES = {"claims_table", "claims_held", "claims_total", "book_targets", "book_targets_table"}


def pasted(notebook: str) -> set[str]:
    """The glue names the book's pages paste from ``notebook``: by its path, and ``{glue:figure}`` on its own
    page; less its figures (glued where they are drawn) and its claims (glued by ``Claims.glue``)."""
    names = set()
    for md in BOOK.rglob("*.md"):
        text = md.read_text(encoding="utf-8")
        names |= set(re.findall(rf"{re.escape(notebook)}\.ipynb::(\w+)", text))
        if md.parent == BOOK and md.stem == notebook:
            names |= set(re.findall(r"```\{glue:figure\}\s+(\w+)", text))
    return {n for n in names if not n.startswith("fig_")} - CLAIMS_NAMES


def synthetic_page(**changes):
    """A page from a small made-up run of the tiny model: prompts of 32 and 64 tokens (none and 90% cached),
    an attack at prefixes of 16 and 256 tokens, two pool sizes of the workload replay."""
    res = SimpleNamespace(
        params={"config": "tiny", "exact_len": 64, "exact_frac": 0.9, "attack": {"trials": 4}},
        data={"params_count": 2.5e9, "exactness": {"reused_vs_whole": 0.01, "whole_vs_fp32": 0.02,
                                                    "reused_vs_fp32": 0.015, "logit_absmax": 10.0, "argmax_agree": 1.0}},
        provenance={"name": "Made-up GPU"}, date="2025-01-02")
    cols = ["n", "fraction", "cached", "GPU time (ms)", "call time (ms)", "of peak", "predicted (ms)",
            "predicted / measured", "speedup", "predicted speedup", "measured / predicted", "FLOP-only speedup"]
    pre = pd.DataFrame([(32, 0.0, 0, 2.0, 3.0, 0.1, 1.0, 0.5, 1.0, 1.0, 1.0, 1.0),
                        (32, 0.9, 28, 1.0, 2.5, 0.05, 0.4, 0.4, 2.0, 2.5, 0.8, 6.0),
                        (64, 0.0, 0, 8.0, 9.0, 0.3, 4.0, 0.5, 1.0, 1.0, 1.0, 1.0),
                        (64, 0.9, 56, 2.0, 2.2, 0.2, 1.0, 0.5, 4.0, 3.2, 1.25, 8.0)], columns=cols)
    decode_table = pd.DataFrame({"decode GPU time (us)": [100.0, 150.0], "decode call time (us)": [400.0, 450.0],
                                 "vs shortest prompt": [1.0, 1.5]}, index=pd.Index([32, 64], name="n"))
    # time to first token (us): long prefix, shared cache: hits 1000 and 1200, misses 3000 and 3400; short prefix:
    # hits 2100 and 2300, misses 2000 and 2200 (a hit comes later); the salted trials do not enter the page
    trials = [(256, "shared", True, 1000), (256, "shared", True, 1200), (256, "shared", False, 3000),
              (256, "shared", False, 3400), (16, "shared", True, 2100), (16, "shared", True, 2300),
              (16, "shared", False, 2000), (16, "shared", False, 2200), (256, "salted", True, 1.0),
              (16, "salted", False, 1.0)]
    attack = pd.DataFrame(trials, columns=["prefix", "isolation", "positive", "ttft_us"])
    auc_table = pd.DataFrame({"shared": [0.3, 1.0], "salted": [0.5, 0.55]}, index=pd.Index([16, 256], name="prefix"))
    targets = pd.DataFrame({"met": [True, False, True]})
    workload = pd.DataFrame([(256, "LRU, 1 running", 0.30, 0), (256, "FIFO, 1 running", 0.20, 0),
                             (256, "LRU, 32 running", 0.10, 5), (512, "LRU, 1 running", 0.60, 0),
                             (512, "FIFO, 1 running", 0.55, 0), (512, "LRU, 32 running", 0.58, 0)],
                            columns=["pool tokens", "case", "saved", "rejected"])
    cpu = {name: float(i) for i, name in enumerate(pc.CPU_NUMBERS)}  # handed on: 0, 1, 2, ...
    tables = {"savings_table": pd.DataFrame({"x": [1.23456]}), "attack_table": pd.DataFrame({"x": [1.23456]}),
              "keys_table": pd.DataFrame({"x": [1.23456]}), "decode_breakdown": None}
    args = dict(res=res, ceil={"launch_graph_us": 2.0, "read_bw_GBps": 4000.0, "bf16_tflops": 700.0}, pre=pre,
                decode_table=decode_table, attack=attack, auc_table=auc_table, targets=targets, workload=workload,
                cpu=cpu, tables=tables, decode_numbers={"decode_kernels": 10}, prefill_profiled=["k"] * 3)
    return pc.page(**{**args, **changes})


def test_the_page_of_a_small_run_worked_by_hand():
    page = synthetic_page()
    n, t = page.numbers, page.texts
    # the row of 90% of 64 tokens: 8 ms whole, 2 ms with 56 cached; the model's 1 ms against 4 ms whole
    assert (n["speedup_90pct_8k"], n["predicted_speedup_90pct_8k"], n["flop_speedup_90pct_8k"]) == (4.0, 3.2, 8.0)
    assert (n["full_8k_ms"], n["cached_8k_ms"], n["pred_8k_ms"], n["pred_full_8k_ms"]) == (8.0, 2.0, 1.0, 4.0)
    assert (n["n_max"], n["full_max_ms"], n["of_peak_full_max"], n["of_peak_short"]) == (64, 8.0, 0.3, 0.05)
    assert (n["gpu_short_full_ms"], n["gpu_short_cached_ms"], n["call_floor_ms"]) == (2.0, 1.0, 2.2)
    # over the cached rows only: predicted / measured 0.4 and 0.5, measured / predicted 0.8 and 1.25
    assert (n["pred_over_meas_min"], n["pred_over_meas_max"]) == (0.4, 0.5)
    assert (n["meas_over_pred_min"], n["meas_over_pred_max"]) == (0.8, 1.25)
    # the tiny model: 2 layers of 26 kernels and 21 per call; its layers hold 2 (64 * 128 + 64 * 64 + 64 * 192
    # + 96 * 64) = 61,440 weights, Llama-3-8B's 32 * 4096 * (6144 + 4096 + 28672 + 14336)
    assert n["kernels_per_prefill"] == n["prefill_kernels_model"] == 73 and n["gqa_group"] == 2
    assert n["weights_ratio_8b"] == pytest.approx(32 * 4096 * 53248 / 61440)
    assert (n["decode_us_min"], n["decode_prompt_min"], n["decode_call_ms_min"]) == (100.0, 32, 0.4)
    assert (n["decode_us_max"], n["decode_growth"]) == (150.0, 1.5)
    # the attack: medians of two trials each; the short prefix's AUC of 0.3 reads as 0.7 the other way round
    assert (n["ttft_hit_ms"], n["ttft_miss_ms"], n["ttft_short_hit_ms"], n["ttft_short_miss_ms"]) == (1.1, 3.2, 2.2, 2.1)
    assert (n["side_channel_auc_shared"], n["side_channel_auc_salted"], n["auc_short_shared"]) == (1.0, 0.55, 0.3)
    assert n["auc_short_either_way"] == 0.7 and (n["attack_prefix"], n["attack_prefix_short"]) == (256, 16)
    assert t["short_hit_direction"] == "later" and t["short_leak"] == "a good deal"  # 0.7 is above 0.65
    # the workload at 256 tokens: LRU 0.3, FIFO 0.2, LRU with 32 running 0.1 and 5 turned away
    assert (n["hit_lru_max"], n["hit_lru_small"], n["hit_fifo_small"]) == (0.6, 0.3, 0.2)
    assert n["lru_minus_fifo_max"] == pytest.approx(0.1) and n["pinned_loss_max"] == pytest.approx(0.2)
    assert (n["rejected_pinned_small"], n["pool_tokens_small"]) == (5, 256)
    # handed on as given
    assert [n[name] for name in pc.CPU_NUMBERS] == list(range(8))
    assert (n["decode_kernels"], n["prefill_kernels_profiled"]) == (10, 3)
    assert (n["params_billion"], n["targets_met"], n["attack_trials"], n["read_bw_GBps"]) == (2.5, 2, 4, 4000.0)
    assert (t["device_name"], t["measured_date"]) == ("Made-up GPU", "2025-01-02")
    # tables rounded as the page shows them; one given as None (no profile off a GPU) is left off
    assert set(page.tables) == {"savings_table", "attack_table", "keys_table"}
    assert [page.tables[k]["x"].iloc[0] for k in ("savings_table", "attack_table", "keys_table")] == [1.235, 1.2, 1.23456]


def test_the_page_off_a_gpu_and_a_short_prefix_that_leaks_little():
    auc_table = pd.DataFrame({"shared": [0.6, 1.0], "salted": [0.5, 0.5]}, index=pd.Index([16, 256], name="prefix"))
    page = synthetic_page(decode_numbers=None, prefill_profiled=None, auc_table=auc_table)
    assert math.isnan(page.numbers["prefill_kernels_profiled"]) and "decode_kernels" not in page.numbers
    assert page.texts["short_leak"] == "little" and page.numbers["auc_short_either_way"] == 0.6
    with pytest.raises(ValueError, match="not tables of the page"):
        synthetic_page(tables={"typo_table": pd.DataFrame({"x": [1]})})
    with pytest.raises(ValueError, match="CPU demonstrations"):
        synthetic_page(cpu={"example_reusable_tokens": 3})


def test_the_page_holds_every_name_the_book_pastes():
    names = pasted("05-prefix-caching")
    assert {"speedup_90pct_8k", "short_leak", "prediction_table", "decode_breakdown"} <= names  # the search works
    decode_numbers = pc.decode_breakdown([{"name": "nvjet", "us": 1.0}, {"name": "silu", "us": 1.0}], 3.0, 2, 1e6, 1.0)[1]
    page = synthetic_page(decode_numbers=decode_numbers,
                          tables={name: pd.DataFrame({"x": [1]}) for name in pc.TABLE_DECIMALS})
    missing = names - set(page.numbers) - set(page.texts) - set(page.tables)
    assert not missing, f"the book pastes {sorted(missing)}, which the page lacks"
