"""Rank correlation, relative error and the held-out split."""

from __future__ import annotations

import math

import numpy as np
import pytest

from geode.costmodel import stats


def test_ranks_average_ties():
    assert stats.ranks([3, 1, 3]).tolist() == [2.5, 1.0, 2.5]
    assert stats.ranks([5, 4, 3, 2]).tolist() == [4.0, 3.0, 2.0, 1.0]


def test_spearman_known_values():
    assert stats.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert stats.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # one swap among five: 1 - 6 * 2 / (5 * 24) = 0.9
    assert stats.spearman([1, 2, 3, 4, 5], [1, 3, 2, 4, 5]) == pytest.approx(0.9)
    # monotone transforms do not change it
    x = np.random.default_rng(0).random(50)
    assert stats.spearman(x, np.exp(7 * x)) == pytest.approx(1.0)
    assert math.isnan(stats.spearman([1.0], [2.0]))
    assert math.isnan(stats.spearman([1, 1, 1], [1, 2, 3]))
    with pytest.raises(ValueError, match="2 predictions for 3"):
        stats.spearman([1, 2], [1, 2, 3])


def test_spearman_with_ties_matches_pearson_on_average_ranks():
    p = [1, 2, 2, 3, 5]
    m = [2, 1, 4, 4, 6]
    rp, rm = stats.ranks(p), stats.ranks(m)
    expected = np.corrcoef(rp, rm)[0, 1]
    assert stats.spearman(p, m) == pytest.approx(expected)


def test_relative_errors_and_median():
    assert stats.relative_errors([1.5, 1.0, 0.5], [1.0, 2.0, 1.0]).tolist() == [0.5, 0.5, 0.5]
    assert stats.median_rel_error([1.1, 2.0, 4.0], [1.0, 2.0, 2.0]) == pytest.approx(0.1)
    assert math.isnan(stats.median_rel_error([], []))
    with pytest.raises(ValueError, match="> 0"):
        stats.relative_errors([1.0], [0.0])
    with pytest.raises(ValueError, match="shapes"):
        stats.relative_errors([1.0, 2.0], [1.0])


def test_split_is_seeded_disjoint_and_complete():
    fit, held = stats.split(10, 0.3, seed=4)
    assert len(held) == 3 and len(fit) == 7
    assert sorted([*fit, *held]) == list(range(10))
    again = stats.split(10, 0.3, seed=4)
    assert again[0].tolist() == fit.tolist() and again[1].tolist() == held.tolist()
    assert stats.split(10, 0.3, seed=5)[1].tolist() != held.tolist()
    assert [len(x) for x in stats.split(2, 0.01, 0)] == [1, 1]
    assert [len(x) for x in stats.split(2, 0.99, 0)] == [1, 1]
    with pytest.raises(ValueError, match="holdout"):
        stats.split(10, 1.0, 0)
    with pytest.raises(ValueError, match="at least 2"):
        stats.split(1, 0.5, 0)
