"""The fuzz suite (marker ``fuzz``, excluded by default; CI runs it after the slow
suites): random graphs of a fixed seed, checked in worker processes, must all pass.
``GEODE_FUZZ_N`` (600 by default; CI sets 10000), ``GEODE_FUZZ_SEED`` (2024) and
``GEODE_FUZZ_JOBS`` (worker processes; default: the cores, at most 2) change how many,
which and on how many workers (the results do not depend on the workers)."""

from __future__ import annotations

import os

import pytest

from geode.fuzz import FuzzConfig, run_fuzz


def _jobs() -> int:
    default = min(2, os.cpu_count() or 1)
    return int(os.environ.get("GEODE_FUZZ_JOBS", str(default)))


@pytest.mark.fuzz
def test_random_graphs_match_the_reference_engine(tmp_path):
    n = int(os.environ.get("GEODE_FUZZ_N", "600"))
    seed = int(os.environ.get("GEODE_FUZZ_SEED", "2024"))
    config = FuzzConfig(n=n, seed=seed, out=str(tmp_path / "failures"), max_shrink=5, jobs=_jobs())
    report = run_fuzz(config, log=print)
    print(report.summary())  # graphs per second and the counts, in CI's log
    assert report.checked == n
    assert report.failed == 0, report.summary()
    assert report.counts["pass"] >= 0.9 * n, report.summary()
