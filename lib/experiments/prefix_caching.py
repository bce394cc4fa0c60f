"""Chapter 5's experiment: what a prefix-cache hit saves in prefill, what it does not save in decode, and
what it leaks through the time to first token.

One Llama-style model with random weights (``lib.models``, the "1b" configuration in bf16 on a GPU, "tiny" in
float32 on a CPU smoke run) over a paged KV pool (``lib.kv_pool``) with a prefix cache (``lib.prefix_cache``).
``measure`` runs three parts, in this order (the order fixes what each draws from the seeded generators):

1. Exactness. A prompt of ``exact_len`` tokens is prefilled whole; separately, its first ``exact_frac``
   (rounded down to a block) is prefilled alone into other blocks and the rest computed on top of them, as
   after a cache hit. Both are compared with each other and with the same model in float32, over the
   positions the cached prefill computes: largest logit difference and share of equal argmax.
2. Side channel. For each prefix length and for a shared cache and a per-tenant salt in the keys: a
   victim's request (a fresh random prefix plus ``suffix`` tokens) runs and is cached; then the attacker's
   request (a guess of the same length plus its own ``suffix`` tokens) is timed from the lookup to its
   first token on the host clock (``first_token``). The guess is the victim's prefix in half of the trials,
   a random one in the other half, in a shuffled order after ``warmup`` rounds of each.
3. Savings. For each prompt length ``n`` the whole prompt is prefilled once (its K and V are then in the
   pool); for each cached fraction the ``prefill`` path computes positions ``c`` to ``n - 1`` (``c`` the
   fraction of ``n`` rounded down to a block) and is timed with ``lib.bench.timing.bench`` (GPU time and
   call time). Then one ``decode`` step (batch 1) at position ``n - 1`` is timed the same way; at the
   shortest prompt the profiler also lists the kernels of one decode step with their device times, and
   the kernels one whole prefill launches.

The timed paths are the notebook's (passed in as ``prefill``, ``decode`` and ``first_token``); before any
is timed, its output is checked against an oracle: a cached prefill's last logits and a decode step's
logits must equal the last logits of the whole prompt prefilled from position 0, within the precision of
the dtype on the device (``lib.models.LOGITS_TOLERANCE``, relative to the largest logit). A path that
computes something else raises.

Also here: ``replay_workload``, the cache-size and eviction-policy sweep of a prompt workload that the
chapter runs on the CPU in every mode.
"""

from __future__ import annotations

import random
import time

import pandas as pd
import torch

from lib import models, prefix_cache
from lib.bench import profile, timing, trace
from lib.experiments import require
from lib.prefix_cache import PrefixCache

# largest |logit difference| a checked path may show against the other way of computing the same logits, as a
# fraction of the largest |logit|, by dtype and device: float32 agrees to rounding on the CPU, while on a GPU
# Triton's dots of float32 run in TF32 (10 bits of mantissa); bf16 keeps 7 bits of mantissa everywhere
ISOLATIONS = ("shared", "salted")
PARAM_KEYS = ("config", "dtype", "block", "seed", "lengths", "fractions", "reps", "target_ms", "exact_len",
              "exact_frac", "attack")
ATTACK_KEYS = ("trials", "warmup", "prefixes", "suffix", "pool_blocks")


def sweep(size: str) -> dict:
    """The parameters of a run: "full" (the 1B model in bf16 on a GPU) or "smoke" (the tiny model in float32,
    seconds on a CPU)."""
    if size == "full":
        return {"config": "1b", "dtype": "bfloat16", "block": 16, "seed": 0,
                "lengths": [1024, 2048, 4096, 8192, 16384, 32768], "fractions": [0.0, 0.5, 0.75, 0.9, 0.97],
                "reps": 5, "target_ms": 1.0, "exact_len": 8192, "exact_frac": 0.9,
                "attack": {"trials": 200, "warmup": 10, "prefixes": [1024, 4096], "suffix": 64, "pool_blocks": 4096}}
    if size == "smoke":
        return {"config": "tiny", "dtype": "float32", "block": 4, "seed": 0, "lengths": [32, 64],
                "fractions": [0.0, 0.5, 0.9], "reps": 2, "target_ms": 0.2, "exact_len": 64, "exact_frac": 0.9,
                "attack": {"trials": 12, "warmup": 2, "prefixes": [16, 32], "suffix": 8, "pool_blocks": 256}}
    raise ValueError(f"size must be 'full' or 'smoke', got {size!r}")


def check_params(p: dict) -> None:
    """Reject parameters ``measure`` cannot run, saying which and why."""
    require(p, PARAM_KEYS)
    require(p["attack"], ATTACK_KEYS)
    models.config_for(p["config"], p["dtype"])
    bs = p["block"]
    if not (isinstance(bs, int) and bs >= 1):
        raise ValueError(f"block must be a positive int (tokens per KV block), got {bs!r}")
    if any(not (isinstance(n, int) and n >= 2) for n in p["lengths"]):
        raise ValueError(f"every prompt length must be an int >= 2 (a prefill leaves one token to compute), got {p['lengths']}")
    if any(not 0 <= f < 1 for f in p["fractions"]):
        raise ValueError(f"cached fractions must lie in [0, 1): at least one token is computed, got {p['fractions']}")
    if p["exact_len"] < 2 * bs or not 0 < p["exact_frac"] < 1:
        raise ValueError(f"exact_len ({p['exact_len']}) must hold two blocks of {bs} and exact_frac "
                         f"({p['exact_frac']}) lie in (0, 1), so that a cached prefix and a computed rest exist")
    a = p["attack"]
    if a["trials"] < 2 or a["trials"] % 2:
        raise ValueError(f"attack trials must be even and >= 2 (half right guesses, half wrong), got {a['trials']}")


def _sync(dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


def measure_exactness(m, m32, p: dict, gen: torch.Generator) -> dict:
    """Logits of a prompt's last positions: whole prompt, reused prefix, and float32, compared."""
    bs, n = p["block"], p["exact_len"]
    c = int(p["exact_frac"] * n) // bs * bs
    tokens = torch.randint(0, m.cfg.vocab, (n,), generator=gen).tolist()
    pool = m.new_pool(2 * (n // bs + 1), bs)
    whole = m.prefill(tokens, pool, pool.allocate(pool.blocks_for(n)), 0)[c:].float()
    blocks = pool.allocate(pool.blocks_for(n))
    m.prefill(tokens[:c], pool, blocks, 0)  # the prefix, as an earlier request computed it
    reused = m.prefill(tokens, pool, blocks, c).float()
    del pool
    pool32 = m32.new_pool(n // bs + 1, bs)
    ref = m32.prefill(tokens, pool32, pool32.allocate(pool32.blocks_for(n)), 0)[c:].double()
    del pool32
    return {"n": n, "cached": c, "logit_absmax": float(ref.abs().max()),
            "reused_vs_whole": float((reused - whole).abs().max()),
            "whole_vs_fp32": float((whole.double() - ref).abs().max()),
            "reused_vs_fp32": float((reused.double() - ref).abs().max()),
            "argmax_agree": float((reused.argmax(-1) == whole.argmax(-1)).float().mean()),
            "argmax_agree_fp32": float((whole.argmax(-1) == ref.argmax(-1)).float().mean())}


def measure_attack(m, p: dict, dev: str, first_token) -> list[dict]:
    """The attacker's time to first token after a victim's request, right and wrong guesses (see the module)."""
    a, bs = p["attack"], p["block"]
    rng = random.Random(p["seed"])

    def rand(k):
        return [rng.randrange(m.cfg.vocab) for _ in range(k)]

    rows = []
    for plen, isolation in [(pl, iso) for pl in a["prefixes"] for iso in ISOLATIONS]:
        victim_extra = ("tenant", "victim") if isolation == "salted" else ()
        attacker_extra = ("tenant", "attacker") if isolation == "salted" else ()
        pool = m.new_pool(a["pool_blocks"], bs)
        cache = PrefixCache(pool)
        order = [True, False] * (a["trials"] // 2)
        rng.shuffle(order)
        for i, positive in enumerate([True, False] * a["warmup"] + order):
            prefix = rand(plen)
            lv = cache.acquire(prefix + rand(a["suffix"]), victim_extra)
            m.prefill(lv.tokens, pool, lv.blocks, lv.hit_tokens, last_only=True)
            cache.commit(lv)
            cache.release(lv)
            guess = prefix if positive else rand(plen)
            attack = guess + rand(a["suffix"])
            _sync(dev)
            t0 = time.perf_counter()
            la, first = first_token(m, cache, attack, attacker_extra)
            ttft = (time.perf_counter() - t0) * 1e6
            cache.commit(la)
            cache.release(la)
            if i >= 2 * a["warmup"]:
                rows.append({"prefix": plen, "isolation": isolation, "positive": positive, "hit_tokens": la.hit_tokens,
                             "ttft_us": ttft, "first_token": first})
        del pool, cache
    return rows


def measure_savings(m, p: dict, dev: str, gen: torch.Generator, prefill, decode) -> list[dict]:
    """Timings of the cached prefill at every (length, fraction), and of one decode step at every length,
    each path checked against the whole prompt's last logits first."""
    bs = p["block"]
    pool = m.new_pool(max(p["lengths"]) // bs + 1, bs)
    rows = []
    for n in p["lengths"]:
        tokens = torch.randint(0, m.cfg.vocab, (n,), generator=gen, dtype=torch.long).to(dev)
        blocks = torch.tensor(pool.allocate(pool.blocks_for(n)), device=dev)
        whole = m.prefill(tokens, pool, blocks, 0)[-1:].float()  # the whole prompt's KV is in the pool
        for frac in p["fractions"]:
            c = int(frac * n) // bs * bs
            models.check_logits(f"prefill of {n} tokens after {c} cached", prefill(m, pool, tokens, blocks, c), whole,
                               p["dtype"], dev)
            t = timing.bench([lambda c=c, tokens=tokens, blocks=blocks: prefill(m, pool, tokens, blocks, c)],
                             device=dev, reps=p["reps"], warmup=1, target_ms=p["target_ms"])
            rows.append({"n": n, "fraction": frac, "cached": c, "timing": t.to_dict()})
        # one decode step after the prompt: its token is at position n - 1 (overwrites that slot's K and V), so
        # its logits are the whole prompt's last ones
        table = blocks.to(torch.int32)[None, :]
        lens = torch.tensor([n], dtype=torch.int32, device=dev)
        tok = tokens[-1:].clone()
        models.check_logits(f"decode step at position {n - 1}", decode(m, pool, tok, table, lens), whole, p["dtype"], dev)
        t = timing.bench([lambda tok=tok, table=table, lens=lens: decode(m, pool, tok, table, lens)], device=dev,
                         reps=p["reps"], warmup=1, target_ms=p["target_ms"])
        row = {"n": n, "fraction": None, "cached": None, "decode": True, "timing": t.to_dict()}
        if n == p["lengths"][0]:  # where the time of the shortest prompt's decode step goes, kernel by kernel
            row["kernels"] = trace.kernel_times(lambda tok=tok, table=table, lens=lens: decode(m, pool, tok, table, lens),
                                                  dev)
            row["prefill_kernels"] = profile.kernel_names(
                lambda tokens=tokens, blocks=blocks: prefill(m, pool, tokens, blocks, 0), dev)
        rows.append(row)
        pool.decref(blocks.tolist())
        pool.free(blocks.tolist())
        print(f"n={n} done", flush=True)
    return rows


def measure(params: dict, device: str, *, prefill, decode, first_token) -> dict:
    """Run the three parts (see the module) on ``device`` ("cuda" or "cpu") with the timed paths:

    - ``prefill(m, pool, tokens, blocks, cached)``: logits [1, vocab] of the last token, computing positions
      ``cached`` to n - 1 and reading the earlier K and V from the pool;
    - ``decode(m, pool, token, table, lens)``: logits [1, vocab] of one decode step;
    - ``first_token(m, cache, tokens, extra)``: the cache lease and the first output token of a request.

    Returns {"params_count", "exactness", "savings", "attack"}."""
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    check_params(params)
    p = params
    gen = torch.Generator().manual_seed(p["seed"])
    cfg = models.CONFIGS[p["config"]]
    m = models.Llama.random(cfg, seed=p["seed"], dtype=getattr(torch, p["dtype"]), device=device)
    m32 = models.Llama.random(cfg, seed=p["seed"], dtype=torch.float32, device=device)
    exact = measure_exactness(m, m32, p, gen)
    del m32
    print(exact, flush=True)
    attack = measure_attack(m, p, device, first_token)
    savings = measure_savings(m, p, device, gen, prefill, decode)
    return {"params_count": cfg.params(), "exactness": exact, "savings": savings, "attack": attack}


def replay_workload(prompts, pool_blocks, cases, block_size: int) -> pd.DataFrame:
    """Replay ``prompts`` (token lists) through caches of each size in ``pool_blocks`` (blocks of
    ``block_size`` tokens) for each ``(policy, running)`` case (``lib.prefix_cache.replay``): one row per
    replay with its hits, lookups, turned-away requests and evictions, its case's name, and ``saved``: the
    hit tokens as a fraction of all prompt tokens (turned-away requests included)."""
    if block_size < 1 or not pool_blocks or not cases:
        raise ValueError(f"need a positive block size and at least one pool size and case, got {block_size}, "
                         f"{pool_blocks}, {cases}")
    total = sum(len(t) for t in prompts)
    rows = []
    for blocks in pool_blocks:
        for policy, live in cases:
            r = prefix_cache.replay(prompts, blocks, block_size, policy=policy, live=live)
            rows.append({"pool blocks": blocks, "pool tokens": blocks * block_size, "policy": policy, "running": live, **r})
    table = pd.DataFrame(rows)
    table["case"] = [f"{p.upper()}, {n} running" for p, n in zip(table["policy"], table["running"])]
    table["saved"] = table["hit_tokens"] / total
    return table


# Kernels one prefill launches (``Llama.prefill`` on a GPU), as the profiler counts them on the H200 (the
# chapter's data, ``prefill_kernels``): per layer the attention input (RMSNorm, QKV GEMM, 8 elementwise
# kernels of RoPE, 2 copies of the strided K and V rows, 2 index_copy_ into the pool), the gather (2 memsets
# and 2 index_select of whole pages), the attention kernel, the concatenation of RoPE's halves, and the
# output and MLP (copy of the attention output, O GEMM with the residual, RMSNorm, gate-up GEMM, SiLU,
# product, down GEMM with the residual); once per call the slot and page indices, the RoPE tables, the
# embedding, the final RMSNorm and the output head.
KERNELS_PER_LAYER = 26
KERNELS_PER_CALL = 21

# how a decode step's kernels are grouped by name (the first group whose words the name contains)
KERNEL_GROUPS = (("GEMM (cuBLAS)", ("nvjet", "gemm", "gemv", "splitkreduce", "cutlass", "xmma")),
                 ("attention (chapter 3's kernel)", ("_decode_kernel", "_combine_kernel")),
                 ("RMSNorm", ("layer_norm", "rms_norm")),
                 ("copies and indexing", ("memcpy", "memset", "index", "gather", "copy", "cat")))
OTHER_GROUP = "elementwise (RoPE, SiLU, products)"


def kernel_group(name: str) -> str:
    """The group of ``KERNEL_GROUPS`` a GPU activity's name falls in (``OTHER_GROUP`` if none)."""
    low = name.lower()
    for group, words in KERNEL_GROUPS:
        if any(w in low for w in words):
            return group
    return OTHER_GROUP


def weight_bytes(cfg, b: int = 2) -> int:
    """Bytes of the weights one decode step reads: every layer's projections and the output head (the
    embedding only for the new token's row, left out)."""
    qkv_n = (cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim
    per_layer = cfg.hidden * qkv_n + cfg.heads * cfg.head_dim * cfg.hidden + cfg.hidden * 2 * cfg.mlp + cfg.mlp * cfg.hidden
    return b * (cfg.layers * per_layer + cfg.vocab * cfg.hidden)


def decode_breakdown(kernels: list[dict], gpu_us: float, weights: int, read_bw: float, launch_us: float):
    """Where one decode step's GPU time goes: (table, numbers).

    ``kernels``: the profiled activities of one step ({"name", "us"}); ``gpu_us``: the step's GPU time by
    CUDA-graph replay; ``weights``: the bytes of weights it reads (``weight_bytes``); ``read_bw``: chapter
    0's read rate (bytes/s); ``launch_us``: its GPU time of one kernel in a graph. The table has one row per
    group (kernels, device time, share of the step, time per kernel) and one for the time between kernels
    (the step's GPU time minus the kernels' sum). The numbers add the weights' read time, the GEMMs' share
    of the read rate, and chapter 2's prediction for kernels run one after another: the sum over kernels of
    max(bytes / BW, t_launch), i.e. the weights' read plus one launch time for every other kernel."""
    if not kernels:
        raise ValueError("no kernels: the profile of a decode step is measured on a GPU only")
    frame = pd.DataFrame(kernels)
    frame["group"] = [kernel_group(n) for n in frame["name"]]
    g = frame.groupby("group", sort=False)["us"].agg(["count", "sum"])
    order = [name for name, _ in KERNEL_GROUPS] + [OTHER_GROUP]
    g = g.reindex([o for o in order if o in g.index])
    busy = float(frame["us"].sum())
    table = pd.DataFrame({"kernels": g["count"].astype(int), "device time (us)": g["sum"],
                          "share of the step": g["sum"] / gpu_us, "us per kernel": g["sum"] / g["count"]})
    table.loc["between kernels"] = [None, gpu_us - busy, (gpu_us - busy) / gpu_us, None]
    table.loc["step (CUDA-graph replay)"] = [len(frame), gpu_us, 1.0, None]
    table.index.name = "kernels of one decode step"
    gemm = "GEMM (cuBLAS)"
    gemm_us = float(g.loc[gemm, "sum"]) if gemm in g.index else float("nan")
    gemm_n = int(g.loc[gemm, "count"]) if gemm in g.index else 0
    read_us = weights / read_bw * 1e6
    small = frame[frame["group"] != gemm]
    predicted = read_us + len(small) * launch_us
    numbers = {"decode_kernels": len(frame), "decode_gemm_kernels": gemm_n, "decode_gemm_us": gemm_us,
               "decode_weight_read_us": read_us, "decode_gemm_read_frac": read_us / gemm_us,
               "decode_small_kernels": len(small), "decode_small_us": float(small["us"].sum()),
               "decode_small_us_per_kernel": float(small["us"].mean()), "decode_gaps_us": gpu_us - busy,
               "decode_gpu_us": gpu_us, "decode_over_weight_read": gpu_us / read_us,
               "decode_predicted_us": predicted, "decode_over_predicted": gpu_us / predicted}
    return table, numbers


def prefill_cost(cfg, n: int, cached: int, *, b: int = 2) -> dict:
    """FLOPs, bytes and kernels of a prefill of positions ``cached`` .. n - 1 of an n-token prompt whose first
    ``cached`` tokens' K and V are in the pool (chapter 2's terms, for ``lib.models``' prefill):

    - F: two FLOPs per weight of the layers for each computed token, attention over the positions before and
      at each one (4 H_q d per position and layer), and the output head for the last token only;
    - Q: the weights read once (layers and head), per layer the K and V of all n tokens read and written by
      the gather and read again by attention (3 times 2 n H_kv d b), the new tokens' K and V written, and
      each GEMM's input and output (b m (K + N) for m computed tokens);
    - kernels: ``KERNELS_PER_LAYER`` per layer plus ``KERNELS_PER_CALL``."""
    if not (isinstance(n, int) and isinstance(cached, int) and 0 <= cached < n):
        raise ValueError(f"need 0 <= cached < n (at least one token computed), got cached={cached}, n={n}")
    m, c = n - cached, cfg
    qkv_n = (c.heads + 2 * c.kv_heads) * c.head_dim
    linears = [(c.hidden, qkv_n), (c.heads * c.head_dim, c.hidden), (c.hidden, 2 * c.mlp), (c.mlp, c.hidden)]
    w_layers = sum(k * nn for k, nn in linears) * c.layers
    attn_pos = n * (n + 1) / 2 - cached * (cached + 1) / 2  # positions attended, summed over computed tokens
    flops = 2 * w_layers * m + 4 * c.layers * c.heads * c.head_dim * attn_pos + 2 * c.vocab * c.hidden
    kv_token = 2 * c.kv_heads * c.head_dim * b  # K and V of one token in one layer
    nbytes = (b * (w_layers + c.vocab * c.hidden) + c.layers * (3 * n + m) * kv_token
              + c.layers * sum(b * m * (k + nn) for k, nn in linears))
    return {"flops": flops, "bytes": nbytes, "kernels": c.layers * KERNELS_PER_LAYER + KERNELS_PER_CALL}


def predict_prefill(cfg, n: int, cached: int, roof, *, b: int = 2) -> dict:
    """Chapter 2's model of the prefill (``prefill_cost``) on ``roof`` (a ``lib.costs.Roofline``): the time
    max(F/P, Q/BW, k t_launch) in ms and the term that sets it."""
    cost = prefill_cost(cfg, n, cached, b=b)
    return {**cost, "ms": roof.time(cost["flops"], cost["bytes"], cost["kernels"]) * 1e3,
            "bound": roof.bound(cost["flops"], cost["bytes"], cost["kernels"])}


# ---------------------------------------------------------------------------- the page

# the numbers of the CPU demonstrations that the page quotes (the notebook computes them in every mode)
CPU_NUMBERS = ("example_reusable_tokens", "example_suffix_reuse", "cpu_hit_tokens", "max_logit_diff_fp32",
               "hit_15_b16", "hit_100_b64", "wl_prompts", "wl_mean_tokens")
# the tables the page shows, by glue name, and the decimals each is rounded to (None: shown as it is)
TABLE_DECIMALS = {"keys_table": None, "exact_table": None, "savings_table": 3, "prediction_table": 3,
                  "decode_breakdown": 3, "decode_table": 3, "auc_table": 3, "attack_table": 1, "targets_table": 3}


def _layer_weights(layers: int, linears) -> int:
    """Weights of ``layers`` layers of the products ``linears`` ((K, N) pairs)."""
    return layers * sum(k * nn for k, nn in linears)


def page(res, ceil: dict, pre: pd.DataFrame, decode_table: pd.DataFrame, attack: pd.DataFrame,
         auc_table: pd.DataFrame, targets: pd.DataFrame, workload: pd.DataFrame, cpu: dict, tables: dict,
         decode_numbers: dict | None = None, prefill_profiled: list | None = None):
    """Every number, word and table chapter 5's page quotes, by name: a ``Page`` (``lib.bench.page``).

    ``res``: the results (params, data, provenance, date); ``ceil``: chapter 0's ceilings; ``pre``: the
    prefill rows of the savings with their predictions and speedups (the notebook's table, one row per
    (n, fraction)); ``decode_table``: the decode step by prompt length (indexed by n); ``attack``: the
    attack's trials (one row each); ``auc_table``: the attack's AUC by prefix and isolation; ``targets``:
    the chapter's targets (a "met" column); ``workload``: ``replay_workload``'s table; ``cpu``: the numbers
    of the CPU demonstrations (``CPU_NUMBERS``, each), handed on as given; ``tables``: the tables by glue name (``TABLE_DECIMALS``
    says how each is rounded; a table given as None is left off); ``decode_numbers``: ``decode_breakdown``'s
    numbers and ``prefill_profiled``: the kernels of one profiled prefill (both absent off a GPU)."""
    from lib import costs
    from lib.bench.page import Page

    unknown = set(tables) - set(TABLE_DECIMALS)
    if unknown:
        raise ValueError(f"tables {sorted(unknown)} are not tables of the page ({sorted(TABLE_DECIMALS)})")
    if set(cpu) != set(CPU_NUMBERS):
        raise ValueError(f"the CPU demonstrations' numbers are {CPU_NUMBERS}, got {sorted(cpu)}")
    cfg, ex, at = models.CONFIGS[res.params["config"]], res.data["exactness"], attack
    n8 = res.params["exact_len"]
    row = pre[(pre["n"] == n8) & (pre["fraction"] == res.params["exact_frac"])].iloc[0]
    full = pre[pre["cached"] == 0].set_index("n")
    full_time, full_pred = full["GPU time (ms)"], full["predicted (ms)"]
    cached_rows = pre[pre["cached"] > 0]
    nmax, nmin = pre["n"].max(), pre["n"].min()
    plen_max, plen_min = int(at["prefix"].max()), int(at["prefix"].min())
    auc = auc_table.loc[plen_max].to_dict()
    auc_short = auc_table.loc[plen_min, "shared"]
    med = at[at["prefix"] == plen_max].groupby(["isolation", "positive"])["ttft_us"].median()
    med_short = at[at["prefix"] == plen_min].groupby(["isolation", "positive"])["ttft_us"].median()
    short_full = pre[(pre["n"] == nmin) & (pre["cached"] == 0)].iloc[0]
    hit = workload.pivot(index="pool tokens", columns="case", values="saved")
    rejected = workload.pivot(index="pool tokens", columns="case", values="rejected")
    lru, fifo, pinned = (hit[c] for c in ("LRU, 1 running", "FIFO, 1 running", "LRU, 32 running"))
    l8b = costs.LLAMA3_8B
    linears = [(cfg.hidden, (cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim), (cfg.heads * cfg.head_dim, cfg.hidden),
               (cfg.hidden, 2 * cfg.mlp), (cfg.mlp, cfg.hidden)]
    texts = {
        "device_name": res.provenance["name"], "measured_date": res.date,
        # which way the short prefix's hits went, and how much an attacker reads from it (AUC read either
        # way: 0.5 nothing, 1 everything; "little" up to 0.65)
        "short_hit_direction": "later" if med_short[("shared", True)] > med_short[("shared", False)] else "sooner",
        "short_leak": "little" if max(auc_short, 1 - auc_short) <= 0.65 else "a good deal"}
    numbers = {
        **(decode_numbers or {}),
        "prefill_kernels_model": cfg.layers * KERNELS_PER_LAYER + KERNELS_PER_CALL,
        "prefill_kernels_profiled": len(prefill_profiled) if prefill_profiled is not None else float("nan"),
        **cpu,
        "hit_lru_max": lru.max(),
        "hit_lru_small": lru.iloc[0],
        "hit_fifo_small": fifo.iloc[0],
        "lru_minus_fifo_max": (lru - fifo).max(),
        "pinned_loss_max": (lru - pinned).max(),
        "rejected_pinned_small": rejected["LRU, 32 running"].iloc[0],
        "pool_tokens_small": hit.index[0],
        "params_billion": res.data["params_count"] / 1e9,
        "max_logit_diff_bf16": ex["reused_vs_whole"],
        "bf16_vs_fp32_diff": ex["whole_vs_fp32"],
        "reused_vs_fp32_diff": ex["reused_vs_fp32"],
        "logit_absmax": ex["logit_absmax"],
        "argmax_agree": ex["argmax_agree"],
        "speedup_90pct_8k": float(row["speedup"]),
        "predicted_speedup_90pct_8k": float(row["predicted speedup"]),
        "full_8k_ms": full_time[n8],
        "cached_8k_ms": float(row["GPU time (ms)"]),
        "full_max_ms": full_time[nmax],
        "n_max": nmax,
        "of_peak_full_max": full.loc[nmax, "of peak"],
        "of_peak_short": pre[(pre["n"] == nmin) & (pre["fraction"] == pre["fraction"].max())]["of peak"].iloc[0],
        "flop_speedup_90pct_8k": float(row["FLOP-only speedup"]),
        "pred_8k_ms": row["predicted (ms)"],  # chapter 2's model at 90% of n8, as the table predicts it
        "pred_full_8k_ms": full_pred[n8],
        "pred_over_meas_min": cached_rows["predicted / measured"].min(),
        "pred_over_meas_max": cached_rows["predicted / measured"].max(),
        "kernels_per_prefill": cfg.layers * KERNELS_PER_LAYER + KERNELS_PER_CALL,
        "kernels_per_layer": KERNELS_PER_LAYER,
        "launch_graph_us": ceil["launch_graph_us"],
        "read_bw_GBps": ceil["read_bw_GBps"],
        "bf16_tflops": ceil["bf16_tflops"],
        "gqa_group": cfg.heads // cfg.kv_heads,
        "cfg_layers": cfg.layers,
        "cfg_heads": cfg.heads,
        "cfg_kv_heads": cfg.kv_heads,
        "weights_ratio_8b": _layer_weights(l8b["layers"], l8b["linears"].values()) / _layer_weights(cfg.layers, linears),
        "meas_over_pred_min": cached_rows["measured / predicted"].min(),
        "meas_over_pred_max": cached_rows["measured / predicted"].max(),
        "decode_us_min": decode_table["decode GPU time (us)"].iloc[0],
        "decode_prompt_min": int(decode_table.index[0]),
        "decode_call_ms_min": decode_table["decode call time (us)"].iloc[0] / 1e3,
        "decode_us_max": decode_table["decode GPU time (us)"].iloc[-1],
        "decode_growth": decode_table["vs shortest prompt"].iloc[-1],
        "side_channel_auc_shared": auc["shared"],
        "side_channel_auc_salted": auc["salted"],
        "attack_prefix": plen_max,
        "attack_prefix_short": plen_min,
        "auc_short_shared": auc_short,
        "call_floor_ms": pre["call time (ms)"].min(),
        "gpu_short_full_ms": short_full["GPU time (ms)"],
        "gpu_short_cached_ms": pre[pre["n"] == nmin]["GPU time (ms)"].min(),
        "attack_trials": res.params["attack"]["trials"],
        "ttft_hit_ms": med[("shared", True)] / 1e3,
        "ttft_miss_ms": med[("shared", False)] / 1e3,
        "ttft_short_hit_ms": med_short[("shared", True)] / 1e3,
        "ttft_short_miss_ms": med_short[("shared", False)] / 1e3,
        "auc_short_either_way": max(auc_short, 1 - auc_short),  # an AUC below 0.5 informs as much, inverted
        "targets_met": int(targets["met"].sum()),
    }
    shown = {name: t if TABLE_DECIMALS[name] is None else t.round(TABLE_DECIMALS[name])
             for name, t in tables.items() if t is not None}
    return Page(numbers=numbers, texts=texts, tables=shown)
