"""The report's computation: fit on part of the samples, score every model on the rest."""

from __future__ import annotations

import numpy as np
import pytest

from geode.costmodel import accuracy, projected
from geode.costmodel.device import MIB, DeviceSpec
from geode.costmodel.profiling import Sample
from geode.costmodel.projected import ProjectedModel, ScheduleFeatures


def spec() -> DeviceSpec:
    return DeviceSpec(
        name="test-cpu",
        cores=2,
        mem_bandwidth_gbs=20.0,
        mem_bandwidth_1t_gbs=12.0,
        peak_gflops_fp32=100.0,
        l1_bytes=32 * 1024,
        l2_bytes=MIB,
        l3_bytes=8 * MIB,
        launch_overhead_us=1.0,
        parallel_overhead_us=5.0,
        transcendental_gops=2.0,
        numba_version="0.0",
        method="full",
    )


def synthetic_samples(n: int, seed: int, truth: ProjectedModel) -> list[Sample]:
    """Kernels whose 'measured' time is a known model's, with 10% lognormal noise:
    compute-heavy ones make the bytes-only baseline miss."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        elems = float(2 ** rng.uniform(10, 23))
        total = elems * 4 * int(rng.integers(2, 4))
        trans = elems * float(rng.choice([0, 0, 2, 8]))
        par = int(rng.choice([1, 64, 2048]))
        f = ScheduleFeatures(
            bytes_read=total - 4 * elems,
            bytes_written=4 * elems,
            flops=elems * 3 + trans,
            transcendentals=trans,
            dram_bytes=total if total > 8 * MIB else 0.0,
            cache_bytes=0.0 if total > 8 * MIB else total,
            vec_flops=elems * 3,
            vec_trans=trans,
            parallel_extent=par,
            parallel_regions=1 if par > 1 else 0,
            loop_iters=elems / 8,
            loop_entries=1.0,
        )
        y = truth.predict(f, spec()) * rng.lognormal(0, 0.1)
        out.append(Sample(f"k{i}", y, features=f))
    return out


TRUTH = ProjectedModel({**projected.DEFAULT_COEFFICIENTS, "trans": 3.0, "cache": 0.2})


def test_evaluate_scores_held_out_samples_with_real_thresholds():
    samples = synthetic_samples(200, 0, TRUTH)
    ev = accuracy.evaluate(samples, spec(), holdout=0.3, seed=1)
    assert ev.n_fit == 140 and ev.n_held_out == 60
    assert set(ev.models) == {"sol", "projected-prior", "projected", "bytes-baseline"}
    fitted = ev.models["projected"]
    assert fitted.n == 60
    assert fitted.spearman >= 0.95
    assert fitted.median_rel_error <= 0.12  # the noise is 10%
    assert fitted.median_rel_error < ev.models["projected-prior"].median_rel_error
    assert fitted.median_rel_error < ev.models["bytes-baseline"].median_rel_error
    assert ev.fitted.coefficients["trans"] == pytest.approx(3.0, rel=0.25)
    table = ev.table()
    assert "spearman" in table and all(name in table for name in ev.models)


def test_evaluate_is_deterministic_and_skips_featureless_samples():
    samples = synthetic_samples(60, 3, TRUTH) + [Sample("none", 1e-3)]
    a = accuracy.evaluate(samples, spec(), seed=7)
    b = accuracy.evaluate(samples, spec(), seed=7)
    assert a.models == b.models and a.n_fit + a.n_held_out == 60


def test_bytes_baseline_fits_a_line_through_the_bytes():
    samples = [
        Sample(f"k{n}", 2e-6 + n * 1e-10, features=ScheduleFeatures(n / 2, n / 2))
        for n in (1e3, 1e5, 1e6, 1e7)
    ]
    predict = accuracy.fit_bytes_baseline(samples)
    for s in samples:
        assert predict(s) == pytest.approx(s.measured_s, rel=1e-6)
    score = accuracy.score("line", predict, samples)
    assert score.spearman == pytest.approx(1.0) and score.median_rel_error < 1e-6
