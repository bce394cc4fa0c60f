"""The book's measuring machinery: what every chapter uses to time, store, check and show its numbers.

- ``lib.bench.device``      which device runs an experiment, its properties and provenance
- ``lib.bench.timing``      GPU time (CUDA-graph replay) and call time (eager); two paths in interleaved pairs
- ``lib.bench.profile``     the kernels one call launches, seen by the profiler
- ``lib.bench.fit``         a least-squares line, the same to the last bit on every machine
- ``lib.bench.results``     measure or replay: the results store, parameter checks, stale results
- ``lib.bench.fingerprint`` which code produced a result: the measure cells' import closure, as code only
- ``lib.bench.ceilings``    the machine's ceilings, derived from chapter 0's data
- ``lib.bench.claims``      a chapter's claims, checked on its data (book side)
- ``lib.bench.glue``        numbers handed from a notebook to the prose (book side)
- ``lib.bench.plots``       one plotting style for every figure (book side)

The book side (claims, glue, plots) is imported only by notebooks: nothing in ``lib`` imports it.
"""
