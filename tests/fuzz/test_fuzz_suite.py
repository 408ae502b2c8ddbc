"""The fuzz suite (marker ``fuzz``, excluded by default; CI runs it after the slow
suites): a few hundred random graphs of a fixed seed, checked in a worker process,
must all pass. ``GEODE_FUZZ_N`` and ``GEODE_FUZZ_SEED`` change how many and which,
``GEODE_FUZZ_JOBS`` on how many worker processes (the cases, and so the result, do not
depend on it). CI runs 10,000 graphs of seed 2024 on two workers."""

from __future__ import annotations

import os

import pytest

from geode.fuzz import FuzzConfig, run_fuzz


@pytest.mark.fuzz
def test_random_graphs_match_the_reference_engine(tmp_path):
    n = int(os.environ.get("GEODE_FUZZ_N", "600"))
    seed = int(os.environ.get("GEODE_FUZZ_SEED", "2024"))
    jobs = int(os.environ.get("GEODE_FUZZ_JOBS", "1"))
    out = str(tmp_path / "failures")
    config = FuzzConfig(n=n, seed=seed, out=out, max_shrink=5, jobs=jobs)
    report = run_fuzz(config, log=print)
    print(report.summary())  # graphs per second and the counts, in CI's log
    assert report.checked == n
    assert report.failed == 0, report.summary()
    assert report.counts["pass"] >= 0.9 * n, report.summary()
