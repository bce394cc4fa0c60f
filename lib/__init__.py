"""The book's shared library: machinery the chapter notebooks import.

Each module has one concern and names the chapters that explain it:

- ``lib.device``   which device runs the experiment, its properties and provenance (all chapters)
- ``lib.timing``   GPU time (CUDA-graph replay) and call time (eager) with median and spread (all)
- ``lib.compare``  two paths timed in interleaved pairs: their ratio, under drift (3)
- ``lib.results``  measure-or-replay: the results store, parameter checks, stale detection (all)
- ``lib.claims``   a chapter's claims, checked on its data, and the table that ends a notebook (all)
- ``lib.plots``    one plotting style: sizes, log axes, units, device and date in a caption (all)
- ``lib.ceilings`` the machine's measured ceilings, as chapter 0 derives them (0; read by 1-6)
- ``lib.glue``     numbers handed from a notebook to the book's prose (all)

Importing ``lib`` imports nothing heavy; torch is imported by the modules that need it.
"""
