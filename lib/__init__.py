"""The library behind the book: the measuring machinery, the kernels, the ideas, one experiment per chapter.

    lib/bench/        machinery every chapter uses: device, timing (GPU and call time, paired rounds),
                      profile, fit, results (measure or replay), fingerprint (the import closure),
                      ceilings (chapter 0's), and the book side: claims, glue, plots
    lib/kernels/      the Triton kernels the book runs: decode_attention (3), grouped_gemm (4),
                      stream (3, the read-only floor), fused, skinny_gemm and sampling (7), quant_gemm and
                      decode_attention_fp8 (9), launch (the planned fast launch they share)
    lib/diagrams/     figures drawn from the library's own objects (every chapter)
    lib/costs.py      FLOPs, bytes, intensity and the roofline (1, 2, 3)
    lib/moe.py        mixture-of-experts routing (4, 10)
    lib/kv_pool.py    a paged KV pool with reference counts (5, 6, 8)
    lib/prefix_cache.py   exact reuse of a shared prefix's KV, chained block keys, eviction (5, 8)
    lib/models/       the one Llama decoder, its configurations and swappable parts: eager, fused,
                      compiled, quantized, tensor-parallel (5-10)
    lib/workloads.py  seeded request workloads (5, 6, 8)
    lib/sidechannel.py    the prefix cache's timing side channel, scored (5)
    lib/quant.py      int8, int4 and fp8 quantization and its cost model (9)
    lib/parallel/     tensor and expert parallelism, the process-group runner (10)
    lib/engine/       the serving engine: policy and scheduler (the one set of scheduling rules), KV,
                      step costs and their fits, runner, loop, metrics, asyncio front end (6, 8)
    lib/simulator/    the engine's scheduler on a virtual clock, a cost model timing each step (6)
    lib/experiments/  one module per chapter: the sweeps its notebook runs (machine 0, matrix_shapes 1,
                      roofline 2, kv_cache 3, grouped_gemm 4, prefix_caching 5, batching 6, decode_step 7,
                      engine and engine_analysis 8, quantization 9, parallelism 10) and analysis-only
                      modules beside them

Layers: the ideas and the kernels never import the book side of the machinery (claims, glue, plots);
an experiment imports the ideas, the kernels and the measuring half of ``lib.bench``. Each module's
docstring names the chapters that explain it. Importing ``lib`` imports nothing heavy.
"""
