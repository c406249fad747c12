"""The window bootstrap: seeded (same numbers every run), paired, honest about overlap with 1."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fpsim_experiments import bootstrap


def windows(sums: list[float], positions: int = 10) -> dict:
    n = len(sums)
    return {"positions": positions, "loss": [1.0] * n, "kl": sums, "top1": [positions] * n,
            "finite": [positions] * n, "kl_finite": sums}


def e2e(sums: list[float], positions: int = 10) -> dict:
    return {"kl": sum(sums) / (positions * len(sums)), "windows": windows(sums, positions)}


def test_draws_are_seeded_and_cover_the_windows() -> None:
    a, b = bootstrap.draws(7), bootstrap.draws(7)
    assert a.shape == (bootstrap.RESAMPLES, 7) >= (1000, 7) and np.array_equal(a, b)
    assert set(np.unique(a)) == set(range(7))
    assert not np.array_equal(a, bootstrap.draws(7, seed=1))
    with pytest.raises(ValueError, match="at least one window"):
        bootstrap.draws(0)


def test_interval_is_a_percentile_interval_of_the_resampled_means() -> None:
    w = windows([1.0, 2.0, 3.0, 10.0])
    lo, hi = bootstrap.interval(w, "kl")
    idx = bootstrap.draws(4)
    means = np.array([1.0, 2.0, 3.0, 10.0])[idx].sum(1) / 40
    assert (lo, hi) == tuple(np.percentile(means, [2.5, 97.5]))
    assert 0.1 <= lo < sum([1, 2, 3, 10]) / 40 < hi <= 1.0
    assert bootstrap.interval(windows([5.0] * 6), "kl") == [0.5, 0.5]  # no spread, no width
    assert all(math.isnan(c) for c in bootstrap.interval(windows([1.0, math.nan]), "kl"))


def test_paired_ratio_cancels_shared_window_variation() -> None:
    base = [1.0, 5.0, 0.5, 9.0, 2.0, 7.0]
    r, ci = bootstrap.ratio(e2e([2 * v for v in base]), e2e(base))
    assert r == 2 and ci == [2.0, 2.0]  # unpaired resampling would give a wide interval
    r, ci = bootstrap.ratio(e2e([1.0, 1.2, 0.9, 1.1]), e2e([1.05, 1.0, 1.0, 1.05]))
    assert ci[0] < 1 < ci[1] and not bootstrap.excludes_one(ci)
    assert bootstrap.verdict(ci, "worse", "better") == "no measurable difference"
    assert bootstrap.verdict([1.1, 1.3], "worse", "better") == "worse"
    assert bootstrap.verdict([0.5, 0.9], "worse", "better") == "better"
    with pytest.raises(ValueError, match="same windows"):
        bootstrap.ratio(e2e([1.0, 2.0]), e2e([1.0]))


def test_fmt_ci() -> None:
    assert bootstrap.fmt_ci([0.98765, 1.1111]) == "[0.988, 1.11]"
    assert bootstrap.fmt_ci([math.nan, math.nan]) == "[CI undefined]"
