"""fusethrottle's benchmark harness: backup throughput, dirty memory and a neighbour's latency.

``python -m bench run`` builds a slow target, runs every arm (no FUSE, the in-application fsync
fix, the kernel's per-device dirty limit, each fusethrottle mode) interleaved on it, and writes raw
samples, a summary and plots to one directory. See bench/README.md.

Kept import-free on purpose: the worker processes (``bench.writer``, ``bench.victim``) start with
``python -m`` and must not pay for matplotlib or the harness.
"""
