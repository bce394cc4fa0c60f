"""One module per chapter: the sweeps that measure, importable and smoke-tested on the CPU.

Each defines ``sweep(size)`` (the parameters of a "full" or "smoke" run) and ``measure(params, device)``
(the data), called by its notebook through ``lib.bench.results.Run``.
"""
