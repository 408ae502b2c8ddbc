"""pytest-benchmark suite: ``python -m pytest bench/test_bench.py --benchmark-only``.

One benchmark per (workload, system); systems that are not installed are reported
as skipped with the import error (install them with ``pip install -e ".[bench]"``).
``GEODE_BENCH_SCALE`` shrinks the inputs (default 1.0: 64 MiB per input).
"""

import os

import pytest

import geode.codegen.backends  # noqa: F401  (numba's target set up before any compile)
from bench.workloads import SYSTEMS, build, load_runtimes, workloads

SCALE = float(os.environ.get("GEODE_BENCH_SCALE", "1.0"))
THREADS = int(os.environ.get("GEODE_BENCH_THREADS", str(os.cpu_count() or 1)))
load_runtimes(list(SYSTEMS), THREADS)  # before geode's first kernel: see load_runtimes
WORKLOADS = {w.name: w for w in workloads(SCALE)}


@pytest.mark.parametrize("system", SYSTEMS)
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_workload(benchmark, name, system):
    w = WORKLOADS[name]
    try:
        fn = build(system, w, THREADS)
    except ImportError as exc:
        pytest.skip(f"{system} is not installed: {exc}")
    benchmark.group = name
    benchmark(fn)
