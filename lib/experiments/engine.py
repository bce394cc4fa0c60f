"""Chapter 8's experiment: the book's serving engine (``lib.engine``) run for real, and chapter 6's simulator
against it.

``measure(params, device)`` builds the model with random weights (``lib.models.Llama.random``; the weights
mean nothing, the timings hold) and one engine runner (its KV pool in the memory left, its decode graphs
captured), then:

1. **calibrates** the engine's cost model on its own steps (``calibrate``): a prefill of M tokens alone
   ("stack"), a prefill of M tokens after ``ctx`` cached ones ("context"), decode-only steps of B
   requests of ``ctx`` tokens ("decode"); each point the median wall time of ``reps`` engine steps (the
   prefills one token longer each time, so that every one meets a new shape, as in service);
2. times **chapter 7's fused step** alone at the offline run's batch and mean context (CUDA-graph replay,
   GPU time), what the offline run's decode steps are compared with;
3. runs the **offline** workload (every request at once, fixed lengths), recording every step;
4. runs chapter 6's **incident** configurations (before: 32 running, whole prompts first; after: 64
   running, a larger budget and a batching window; the fix: chunked prefill and queues by length) on the
   chat plus long-document mix, each all at once (what a throughput benchmark reports) and open loop at a
   production rate (``open_loop``: Poisson arrivals in real time through the asyncio front end);
5. runs chat-only workloads open loop at a light and a near-capacity rate.

It does the same on a second, smaller configuration first (``params["small"]``, laid over the main
parameters: chapter 6's 1.1B model on a GPU, with shorter open-loop spans), whose steps are shorter, so the
host's share is larger.

Rates are fractions of a capacity the simulator computes from the calibrated costs (requests/s at which
a configuration's queue would grow without bound); an open-loop run sends the requests that arrive in a
fixed span at its rate, within fixed bounds (``requests_for``), so that no measured cost can make a run
long; a smoke run uses fixed rates and a few requests. Every run's requests (per-request metrics without the
token gaps), ITL percentiles, and compact step records are returned; a chat request's timeline is kept
from the incident's "before" run. Prompts are random tokens, so the prefix cache finds nothing to share
and the simulator, which has no prefix cache, runs the same work.

Chapters: 8.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import statistics

import numpy as np
import torch

from lib import models, simulator, workloads
from lib.bench import timing
from lib.engine import EngineConfig, LLMEngine, SamplingParams, cost
from lib.engine.metrics import summary
from lib.engine.server import AsyncEngine, open_loop
from lib.experiments import require

PARAMS = ("config", "dtype", "block", "max_model_len", "kv_gib", "seed", "cal", "offline", "incident", "chat_rates",
          "reps", "small")
CONFIGS = models.CONFIGS
MIX = (("chat", workloads.CHAT, 0.85), ("doc", workloads.LONG_DOC, 0.15))
CHAT_ONLY = (("chat", workloads.CHAT, 1.0),)
STEP_KEYS = ("start", "end", "batch", "prefill_tokens", "decode_tokens", "decode_kv", "decode_ctx_max", "prefill_work",
             "kv_blocks", "queued", "running", "gpu_s", "host_s", "graph")


def sweep(size: str) -> dict:
    """"full": Llama-3-8B in bf16 on a GPU; "smoke": the tiny configuration in float32, seconds on a CPU."""
    if size == "full":
        return {"config": "8b", "dtype": "bfloat16", "block": 16, "max_model_len": 34816, "kv_gib": 64, "seed": 0,
                "reps": 5,
                "cal": {"stack": [16, 64, 256, 1024, 2048, 4096, 8192], "context": {"new": [256, 1024],
                                                                                     "ctx": [4096, 16384]},
                        "decode": {"B": [1, 8, 32, 64], "ctx": [512, 2048]}},
                "offline": {"n": 256, "input": 512, "output": 256, "max_num_seqs": 64},
                "incident": {"n_bench": 128, "prod_load": 0.3, "span_s": 40.0, "n_max": 200},
                "chat_rates": {"light": {"load": 0.3, "span_s": 20.0, "n_max": 200},
                               "near": {"load": 0.8, "span_s": 15.0, "n_max": 400}},
                "small": {"config": "1b", "kv_gib": 16,
                          "incident": {"n_bench": 128, "prod_load": 0.3, "span_s": 15.0, "n_max": 300},
                          "chat_rates": {"light": {"load": 0.3, "span_s": 12.0, "n_max": 300},
                                         "near": {"load": 0.8, "span_s": 10.0, "n_max": 500}}}}
    if size == "smoke":
        return {"config": "tiny", "dtype": "float32", "block": 4, "max_model_len": 256, "kv_gib": 0.01, "seed": 0,
                "reps": 2,
                "cal": {"stack": [4, 16], "context": {"new": [4], "ctx": [8]}, "decode": {"B": [1, 2], "ctx": [8]}},
                "offline": {"n": 4, "input": 6, "output": 3, "max_num_seqs": 4},
                "incident": {"n_bench": 4, "prod_rate": 40.0, "span_s": 0.1, "n_max": 4},
                "chat_rates": {"light": {"rate": 40.0, "span_s": 0.1, "n_max": 3},
                               "near": {"rate": 80.0, "span_s": 0.05, "n_max": 4}},
                "small": {"kv_gib": 0.005, "chat_rates": {"light": {"rate": 40.0, "span_s": 0.05, "n_max": 2}}}}
    raise ValueError(f"size must be 'full' or 'smoke', got {size!r}")


def smoke_lengths(spec: dict, size_cap: int) -> dict:
    """A length spec (workloads' {"input", "output"}) clipped for a smoke run's tiny model."""
    return {k: (min(v[0], size_cap), v[1], min(v[2], size_cap), min(v[3], size_cap)) for k, v in spec.items()}


def mixes(params: dict) -> tuple:
    """The chat plus document mix and the chat-only mix of the run (clipped to 12 tokens on a smoke run)."""
    if params["config"] != "tiny":
        return MIX, CHAT_ONLY
    return ((("chat", smoke_lengths(workloads.CHAT, 12), 0.85), ("doc", smoke_lengths(workloads.LONG_DOC, 24), 0.15)),
            (("chat", smoke_lengths(workloads.CHAT, 12), 1.0),))


def configs(params: dict) -> dict:
    """Chapter 6's incident as engine settings: "before", "after" (the batch limit raised) and "fix"."""
    base = dict(block_size=params["block"], max_model_len=params["max_model_len"])
    window = 0.05
    return {
        "before": EngineConfig(**base, max_num_seqs=32, max_num_batched_tokens=4096, enable_chunked_prefill=False,
                               prefill_first=True),
        "after": EngineConfig(**base, max_num_seqs=64, max_num_batched_tokens=16384, enable_chunked_prefill=False,
                              max_wait=window, prefill_first=True),
        "fix": EngineConfig(**base, max_num_seqs=64, max_num_batched_tokens=2048, long_prefill_token_threshold=1024,
                            buckets=(simulator.Bucket("chat", 2048, priority=0, max_wait=0.0),
                                     simulator.Bucket("doc", 10 ** 9, priority=1, max_wait=window))),
    }


def base_config(params: dict) -> EngineConfig:
    """The engine's default settings for the offline run, the calibration and the chat-only runs."""
    return EngineConfig(block_size=params["block"], max_model_len=params["max_model_len"],
                        max_num_seqs=params["offline"]["max_num_seqs"], max_num_batched_tokens=8192,
                        long_prefill_token_threshold=2048, enable_prefix_caching=True)


def prompts_for(reqs: list[dict], vocab: int, seed: int) -> list[list[int]]:
    """Random prompts of each request's input length (one stream of tokens: no two share a block)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, r["input"]).tolist() for r in reqs]


def _none_for_nan(v):
    """JSON has no NaN: a value that does not exist (the GPU time of a CPU step, the TPOT of a one-token
    request) is stored as None. Other floats (seconds, and ratios of them) are kept to 7 decimals: 0.1 us,
    far below any step's noise, and half the characters of a full float."""
    if isinstance(v, float):
        return None if v != v else round(v, 7)
    return v


def _compact(engine: LLMEngine, t0: float) -> list[list]:
    """The run's step records as rows of ``STEP_KEYS``, times relative to ``t0``."""
    return [[_none_for_nan(s[k] - t0 if k in ("start", "end") else s[k]) for k in STEP_KEYS] for s in engine.steps]


def _stored(results: list[dict]) -> list[dict]:
    """Per-request metrics without the token gaps (the ITL percentiles are kept apart)."""
    return [{k: _none_for_nan(v) for k, v in r.items() if k != "itl"} for r in results]


def _itl(results: list[dict]) -> dict:
    s = summary(results)
    return {f"itl_p{p}": _none_for_nan(s[f"itl_p{p}"]) for p in (50, 95, 99)}


def _timeline(engine: LLMEngine, results: list[dict], t0: float, engine_id: dict) -> dict:
    """One chat request's timeline: the median-TTFT chat request with more than one token."""
    chats = sorted((r for r in results if r["kind"] == "chat" and r["output"] > 1), key=lambda r: r["ttft"])
    if not chats:
        return {}
    pick = chats[len(chats) // 2]
    x = engine.requests[engine_id[pick["id"]]]
    r = _none_for_nan
    steps = [(r(s["start"] - t0), r(s["end"] - t0)) for s in engine.steps if x.id in s["prefill"]]
    return {"id": pick["id"], "arrival": r(x.arrival - t0), "admitted": r(x.first_admitted - t0),
            "prefill_steps": steps, "token_times": [r(t - t0) for t in x.token_times]}


def run_offline(runner, config: EngineConfig, reqs: list[dict], prompts) -> dict:
    """Every request at once (arrival 0), each asking for exactly its output tokens; the run's results."""
    e = LLMEngine.from_runner(runner, config)
    t0 = e.clock()
    ids = [e.add_request(p, SamplingParams(max_tokens=r["output"], ignore_eos=True), kind=r.get("kind", ""),
                         arrival=t0) for r, p in zip(reqs, prompts)]
    e.close()
    e.run()
    by = {x: r["id"] for x, r in zip(ids, reqs)}
    res = [{**r, "id": by[r["id"]], "arrival": r["arrival"] - t0} for r in e.results()]
    return {"requests": _stored(res), **_itl(res), "steps": _compact(e, t0), "span_s": e.clock() - t0}


def run_open_loop(runner, config: EngineConfig, reqs: list[dict], prompts, *, keep_timeline: bool = False) -> dict:
    """The requests sent at their arrival times through the asyncio front end (in a thread of its own, so
    that it runs inside a notebook's event loop too); the run's results."""
    e = LLMEngine.from_runner(runner, config)

    async def go():
        async with AsyncEngine(e, until_close=True) as a:  # open_loop closes it after the last request
            return await open_loop(a, reqs, prompts)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        out = pool.submit(asyncio.run, go()).result()
    res, t0 = out["results"], out["start"]
    bad = [r["id"] for r in reqs if len(out["tokens"][r["id"]]) != r["output"]]
    if bad or len(res) != len(reqs):
        raise RuntimeError(f"requests {bad[:5]} got another number of tokens than they asked for, or were lost")
    d = {"requests": _stored(res), **_itl(res), "steps": _compact(e, t0), "rejects": dict(e.rejects)}
    if keep_timeline:
        d["timeline"] = _timeline(e, res, t0, {w: x for x, w in out["ids"].items()})
    return d


def calibrate(runner, params: dict) -> list[dict]:
    """The engine's steps timed alone (see the module): {"kind", "new", "ctx", "B", "seconds"} per point."""
    c, vocab, reps = params["cal"], runner.m.cfg.vocab, params["reps"]
    rng = np.random.default_rng(params["seed"] + 7)
    cfg = EngineConfig(block_size=params["block"], max_model_len=params["max_model_len"],
                       max_num_seqs=max(c["decode"]["B"]), max_num_batched_tokens=max(c["stack"] + c["context"]["ctx"]) + reps)

    def prefill_time(prompt, cached: int) -> float:
        """Median over ``reps`` prefills, each one token longer than the last: a serving engine sees a new
        length at almost every prefill, and a new shape costs host work (library heuristics) a repeated one
        does not."""
        times = []
        for r in range(reps):
            e = LLMEngine.from_runner(runner, cfg)
            if cached:
                e.add_request(prompt[:cached], SamplingParams(max_tokens=1))
                e.run()
            e.add_request(prompt[: len(prompt) - reps + 1 + r], SamplingParams(max_tokens=1))
            e.step()
            s = e.steps[-1]
            if s["prefill_tokens"] != len(prompt) - reps + 1 + r - cached:
                raise RuntimeError(f"a calibration prefill computed {s['prefill_tokens']} tokens, expected "
                                   f"{len(prompt) - reps + 1 + r - cached}: the prefix cache did not hold the context")
            times.append(s["end"] - s["start"])
        return statistics.median(times)

    points = []
    for M in c["stack"]:
        points.append({"kind": "stack", "new": M, "ctx": 0, "B": 1,
                       "seconds": prefill_time(rng.integers(0, vocab, M + reps - 1).tolist(), 0)})
    for ctx in c["context"]["ctx"]:
        for new in c["context"]["new"]:
            points.append({"kind": "context", "new": new, "ctx": ctx, "B": 1,
                           "seconds": prefill_time(rng.integers(0, vocab, ctx + new + reps - 1).tolist(), ctx)})
    for B in c["decode"]["B"]:
        for ctx in c["decode"]["ctx"]:
            e = LLMEngine.from_runner(runner, cfg)
            for _ in range(B):
                e.add_request(rng.integers(0, vocab, ctx).tolist(), SamplingParams(max_tokens=reps + 3, ignore_eos=True))
            while not e.steps or e.steps[-1]["prefill_tokens"] or not e.steps[-1]["decode_tokens"]:
                e.step()
            for _ in range(reps + 1):
                e.step()
            dec = [s["end"] - s["start"] for s in e.steps if not s["prefill_tokens"]][1:]  # the first: warm-up
            points.append({"kind": "decode", "new": B, "ctx": ctx, "B": B, "seconds": statistics.median(dec)})
            e.run()
    return points


def fused_step_time(m, pool_src, B: int, L: int, block: int, device: str, reps: int) -> dict:
    """Chapter 7's fused step alone, greedy, at B requests of L tokens (random KV, shuffled pages): GPU time by
    CUDA-graph replay and call time (``lib.bench.timing``), in seconds."""
    gen = torch.Generator(device=m.device).manual_seed(1)
    pages = -(-L // block)
    perm = torch.randperm(B * pages, generator=gen, device=m.device) + 1  # block 0 is the runner's padding
    table = perm.view(B, pages).to(torch.int32)
    for kv in (pool_src.k, pool_src.v):  # never time on zeros
        kv[:, 1: B * pages + 1].normal_(generator=gen)
    lens = torch.full((B,), L, dtype=torch.int32, device=m.device)
    tokens = torch.randint(0, m.cfg.vocab, (B,), generator=gen, device=m.device)
    step = m.with_parts(models.FUSED)
    t = timing.bench(lambda: step.greedy(tokens, pool_src, table, lens), device=device, reps=reps,
                     warmup=2, target_ms=20.0 if device == "cuda" else 0.2)
    return {"B": B, "L": L, "gpu_s": _none_for_nan(t.gpu_us.median / 1e6), "call_s": t.call_us.median / 1e6,
            "method": t.method}


def requests_for(rate: float, spec: dict) -> int:
    """How many requests an open-loop run sends: as many as arrive in ``span_s`` seconds at ``rate``, at least
    4 and at most ``n_max`` (so that the run's length is bounded whatever the measured costs)."""
    return int(min(spec["n_max"], max(4, round(rate * spec["span_s"]))))


def capacity(cm, config: EngineConfig, mix, n: int, seed: int = 0) -> float:
    """Requests/s a configuration sustains under the cost model ``cm``: the simulator's tokens/s with every
    request queued at once, over the mean output of a request."""
    reqs = workloads.requests(n, 1e6, mix=mix, seed=seed)
    tps = simulator.summary(simulator.simulate(reqs, cm, config.as_policy()))["tokens_per_s"]
    return tps / (sum(r["output"] for r in reqs) / n)


def _build(p: dict, device: str):
    """The model of ``p["config"]`` with random weights, its KV pool and one engine runner (decode graphs
    captured on a GPU)."""
    from lib.engine.runner import ModelRunner, kv_bytes_per_block

    cfg_m = CONFIGS[p["config"]]
    dtype = getattr(torch, p["dtype"])
    m = models.Llama.random(cfg_m, seed=p["seed"], dtype=dtype, device=device)
    base = base_config(p)
    pool = m.new_pool(int(p["kv_gib"] * 2 ** 30 // kv_bytes_per_block(cfg_m, p["block"], dtype)), p["block"])
    runner = ModelRunner(m, pool, base)
    if device == "cuda":
        runner.capture([b for b in base.graph_batch_sizes if b <= max(base.max_num_seqs, 64)])
    return m, pool, runner


def measure_config(p: dict, device: str) -> dict:
    """One configuration: calibration, chapter 7's step alone, the offline run, the incident and the
    chat-only open-loop runs (see the module)."""
    m, pool, runner = _build(p, device)
    cfg_m, base = m.cfg, base_config(p)
    mix, chat = mixes(p)
    points = calibrate(runner, p)
    cm = cost.fit(points, base.graph_batch_sizes)
    o = p["offline"]
    off_reqs = [{"id": i, "arrival": 0.0, "kind": "chat", "input": o["input"], "output": o["output"]} for i in range(o["n"])]
    mean_ctx = o["input"] + o["output"] // 2
    ch7 = fused_step_time(m, pool, o["max_num_seqs"], mean_ctx, p["block"], device, p["reps"])
    offline = run_offline(runner, base, off_reqs, prompts_for(off_reqs, cfg_m.vocab, p["seed"] + 1))
    n_cap = 1000 if device == "cuda" else 20
    out = {"params_count": cfg_m.params(), "pool_blocks": pool.num_blocks, "cal_points": points, "ch7_step": ch7,
           "offline": offline, "step_keys": list(STEP_KEYS)}
    inc, cfgs = p["incident"], configs(p)
    cap_before = capacity(cm, cfgs["before"], mix, n_cap)
    prod_rate = inc.get("prod_rate") or inc["prod_load"] * cap_before
    bench_reqs = workloads.requests(inc["n_bench"], 1e6, mix=mix, seed=p["seed"] + 2)
    prod_reqs = workloads.requests(requests_for(prod_rate, inc), prod_rate, mix=mix, seed=p["seed"] + 3)
    out["incident"] = {}
    for name, c in cfgs.items():
        out["incident"][name] = {
            "bench": run_offline(runner, c, [{**r, "arrival": 0.0} for r in bench_reqs],
                                 prompts_for(bench_reqs, cfg_m.vocab, p["seed"] + 4)),
            "prod": run_open_loop(runner, c, prod_reqs, prompts_for(prod_reqs, cfg_m.vocab, p["seed"] + 5),
                                  keep_timeline=name == "before")}
    out["capacity_before_rps"], out["prod_rate"] = cap_before, prod_rate
    out["capacity_chat_rps"] = cap_chat = capacity(cm, base, chat, n_cap)
    out["chat_runs"] = {}
    for name, spec in p["chat_rates"].items():
        rate = spec.get("rate") or spec["load"] * cap_chat
        reqs = workloads.requests(requests_for(rate, spec), rate, mix=chat, seed=p["seed"] + 6)
        out["chat_runs"][name] = {"rate": rate, **run_open_loop(runner, base, reqs,
                                                                prompts_for(reqs, cfg_m.vocab, p["seed"] + 7))}
    return out


def small_params(params: dict) -> dict:
    """The second, smaller configuration's parameters: the main ones with ``params["small"]`` laid over."""
    return {**params, **params["small"], "small": None}


def measure(params: dict, device: str) -> dict:
    """Everything the module lists, on ``device`` ("cuda" or "cpu"): the smaller configuration first, then
    the main one."""
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    require(params, PARAMS)
    small = None
    if params["small"]:
        small = measure_config(small_params(params), device)
        gc.collect()  # the runner and its graphs refer to each other: free the smaller model's memory now
        if device == "cuda":
            torch.cuda.empty_cache()
    return {**measure_config(params, device), "small": small}
