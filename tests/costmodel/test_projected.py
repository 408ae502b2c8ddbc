"""The projected model: its terms, its fit (relative and log loss) and its JSON form."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from test_costmodel import round_spec

from geode.costmodel import projected
from geode.costmodel.device import MIB
from geode.costmodel.projected import TERMS, ProjectedModel, ScheduleFeatures


def random_features(rng: np.random.Generator, n: int) -> list[ScheduleFeatures]:
    """Kernels of every kind the terms tell apart."""
    out = []
    for _ in range(n):
        elems = float(2 ** rng.integers(10, 25))
        total = elems * 4 * int(rng.integers(2, 5))
        dram = bool(total > 8 * MIB)
        vec = bool(rng.random() < 0.7)
        ops = elems * float(rng.choice([1, 4, 16]))
        trans = elems * float(rng.choice([0, 0, 1, 3]))
        par = int(rng.choice([1, 3, 64, 4096]))
        out.append(
            ScheduleFeatures(
                bytes_read=total - elems * 4,
                bytes_written=elems * 4,
                flops=ops,
                transcendentals=trans,
                dram_bytes=total if dram else 0.0,
                cache_bytes=0.0 if dram else total,
                reuse_bytes=elems * float(rng.choice([0, 0, 4, 8])),
                strided_bytes=elems * float(rng.choice([0, 0, 0, 64])),
                vec_flops=ops if vec else 0.0,
                scalar_flops=0.0 if vec else ops,
                vec_div=elems * float(rng.choice([0, 1])),
                vec_trans=trans if vec else 0.0,
                scalar_trans=0.0 if vec else trans,
                lanes=int(rng.choice([8, 16])),
                parallel_extent=par,
                parallel_regions=1 if par > 1 else 0,
                threads=int(rng.choice([0, 1])),
                loop_iters=elems / 8 * float(rng.choice([1, 2])),
                loop_entries=float(rng.integers(1, 1000)),
            )
        )
    return out


TRUTH = dict(zip(TERMS, [1.3, 0.5, 0.8, 0.4, 0.2, 3.0, 0.7, 2.0, 0.3, 0.9, 1.5, 2.0, 0.5]))


@pytest.mark.parametrize("loss", ["relative", "log"])
def test_fit_recovers_known_coefficients(loss):
    spec = round_spec()
    truth = ProjectedModel(TRUTH)
    feats = random_features(np.random.default_rng(1), 200)
    samples = [(f, truth.predict(f, spec)) for f in feats]
    fitted = projected.fit(samples, spec, loss=loss, ridge=0.0)
    for f in feats[:50]:
        assert fitted.predict(f, spec) == pytest.approx(truth.predict(f, spec), rel=1e-3)
    assert fitted.fit_error < 1e-3 and fitted.n_samples == 200
    assert fitted.device == spec.key()


def test_fit_with_noise_and_slowed_samples_predicts_within_the_noise():
    """Lognormal noise of 5% and 15% of the samples slowed down 4x (another process on
    the cores): the relative fit (the default) still predicts the undisturbed truth
    within 5% at the median, and better than the log fit, which slowed samples pull
    further (their log error is unbounded, their relative error at most 100%)."""
    spec = round_spec()
    truth = ProjectedModel(TRUTH)
    rng = np.random.default_rng(2)
    feats = random_features(rng, 400)
    ys = []
    for f in feats:
        y = truth.predict(f, spec) * rng.lognormal(0, 0.05)
        ys.append(y * 4 if rng.random() < 0.15 else y)
    samples = [(f.to_dict(), y) for f, y in zip(feats, ys)]
    test = random_features(np.random.default_rng(3), 100)
    errors = {}
    for loss in ("log", "relative"):
        m = projected.fit(samples, spec, loss=loss)
        errors[loss] = np.median(
            [abs(m.predict(f, spec) / truth.predict(f, spec) - 1) for f in test]
        )
    assert errors["relative"] < 0.05
    assert errors["log"] < 0.15
    assert errors["relative"] < errors["log"]


def test_fit_keeps_prior_for_unexercised_terms_and_stays_nonnegative():
    spec = round_spec()
    feats = [
        ScheduleFeatures(4.0 * n, 4.0 * n, dram_bytes=8.0 * n)
        for n in (1 << 12, 1 << 16, 1 << 20, 1 << 24)
    ]
    samples = [(f, 0.5 * projected.feature_terms(f, spec)["dram"] + 3e-6) for f in feats]
    fitted = projected.fit(samples, spec)
    for t in ("fork", "cache", "strided", "reuse", "arith", "divide", "trans", "scalar", "loops"):
        assert fitted.coefficients[t] == projected.DEFAULT_COEFFICIENTS[t], t
    assert all(c >= 0 for c in fitted.coefficients.values())
    for f, y in samples:
        assert fitted.predict(f, spec) == pytest.approx(y, rel=0.05)


def test_fit_validates_its_input():
    spec = round_spec()
    f = ScheduleFeatures.simple(1e6, 1e6, 1e6)
    with pytest.raises(ValueError, match="at least one sample"):
        projected.fit([], spec)
    with pytest.raises(ValueError, match="sample 0"):
        projected.fit([(f, 0.0)], spec)
    with pytest.raises(ValueError, match="loss"):
        projected.fit([(f, 1e-3)], spec, loss="l1")
    with pytest.raises(ValueError, match="ridge"):
        projected.fit([(f, 1e-3)], spec, ridge=-1)


def test_terms_follow_the_device_and_the_schedule():
    spec = round_spec()
    serial = ScheduleFeatures(bytes_read=5e8, bytes_written=0, dram_bytes=5e8)
    par = ScheduleFeatures(
        bytes_read=5e8, bytes_written=0, dram_bytes=5e8, parallel_extent=1000, parallel_regions=1
    )
    assert projected.feature_terms(serial, spec)["dram"] == pytest.approx(0.1)  # 5 GB/s
    assert projected.feature_terms(par, spec)["dram"] == pytest.approx(0.05)  # 10 GB/s
    assert projected.feature_terms(par, spec)["fork"] == pytest.approx(10e-6)
    # two threads of a run limited to them: a third of the way from 5 to 10 GB/s
    two = ScheduleFeatures(bytes_read=5e8, bytes_written=0, dram_bytes=5e8, parallel_extent=2)
    assert projected.bandwidth(spec, 2) == pytest.approx(5e9 + 5e9 / 3)
    assert projected.feature_terms(two, spec)["dram"] == pytest.approx(5e8 / (5e9 + 5e9 / 3))
    # 5 iterations over 4 threads: two rounds, a speedup of 2.5
    assert projected.threads_used(ScheduleFeatures(0, 0, parallel_extent=5), spec) == (4, 2.5)
    one = ScheduleFeatures(0, 0, parallel_extent=64, threads=1)
    assert projected.threads_used(one, spec) == (1, 1.0)
    vec = ScheduleFeatures(0, 0, vec_flops=1e9, lanes=8)
    scalar = ScheduleFeatures(0, 0, scalar_flops=1e9, lanes=8)
    t_vec = projected.feature_terms(vec, spec)["arith"]
    assert projected.feature_terms(scalar, spec)["scalar"] == pytest.approx(8 * t_vec)
    assert "dram" in projected.DEFAULT_MODEL.explain(par, spec)
    assert projected.predict(par, spec) < projected.predict(serial, spec)
    strided = ScheduleFeatures(5e8, 0, dram_bytes=5e8, strided_bytes=5e8)
    assert projected.predict(strided, spec) > projected.predict(serial, spec)


def test_features_validation():
    with pytest.raises(ValueError, match="unknown schedule features"):
        ScheduleFeatures.from_mapping({"bytes_read": 1, "bytes_written": 1, "flop": 2})
    with pytest.raises(ValueError, match="parallel_extent"):
        ScheduleFeatures(bytes_read=1, bytes_written=1, parallel_extent=-2)
    with pytest.raises(ValueError, match="dram_bytes"):
        ScheduleFeatures(bytes_read=1, bytes_written=1, dram_bytes=math.inf)
    with pytest.raises(ValueError, match="lanes"):
        ScheduleFeatures(bytes_read=1, bytes_written=1, lanes=0)
    f = ScheduleFeatures(1, 2, flops=3)
    assert ScheduleFeatures.from_mapping(f.to_dict()) == f


def test_model_json_round_trip_and_defects():
    spec = round_spec()
    m = projected.fit(
        [(f, 1e-4 * (i + 1)) for i, f in enumerate(random_features(np.random.default_rng(4), 30))],
        spec,
    )
    back = ProjectedModel.from_dict(json.loads(json.dumps(m.to_dict())))
    assert back == m or (back.coefficients == m.coefficients and back.device == m.device)
    assert ProjectedModel.from_dict(projected.DEFAULT_MODEL.to_dict()).coefficients == dict(
        projected.DEFAULT_COEFFICIENTS
    )
    good = m.to_dict()
    for bad, match in [
        ([], "JSON object"),
        ({**good, "format": 1}, "format"),
        ({**good, "extra": 1}, "unknown fields"),
        ({**good, "coefficients": {**good["coefficients"], "launch": -1.0}}, "launch"),
        ({**good, "coefficients": {"launch": 1.0}}, "missing"),
        ({**good, "coefficients": {**good["coefficients"], "launch": "x"}}, "launch"),
        ({**good, "n_samples": -3}, "n_samples"),
        ({**good, "device": 7}, "device"),
    ]:
        with pytest.raises(ValueError, match=match):
            ProjectedModel.from_dict(bad)
