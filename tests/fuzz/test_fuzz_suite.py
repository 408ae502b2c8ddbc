"""The fuzz suite (marker ``fuzz``, excluded by default; CI runs it after the slow
suites): a few hundred random graphs of a fixed seed, checked in a worker process,
must all pass. ``GEODE_FUZZ_N`` and ``GEODE_FUZZ_SEED`` change how many and which."""

from __future__ import annotations

import os

import pytest

from geode.fuzz import FuzzConfig, run_fuzz


@pytest.mark.fuzz
def test_random_graphs_match_the_reference_engine(tmp_path):
    n = int(os.environ.get("GEODE_FUZZ_N", "600"))
    seed = int(os.environ.get("GEODE_FUZZ_SEED", "2024"))
    config = FuzzConfig(n=n, seed=seed, out=str(tmp_path / "failures"), max_shrink=5)
    report = run_fuzz(config, log=print)
    print(report.summary())  # graphs per second and the counts, in CI's log
    assert report.checked == n
    assert report.failed == 0, report.summary()
    assert report.counts["pass"] >= 0.9 * n, report.summary()
