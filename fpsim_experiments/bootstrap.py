"""Uncertainty of end-to-end metrics: a seeded bootstrap over held-out windows.

Windows are resampled with replacement (``RESAMPLES`` times, a fixed seed, so the same numbers
come out every run); a metric is the ratio of resampled per-window sums (e.g. KL summed over
positions / positions), and a ratio of two runs' metrics is resampled *paired* (the same
windows for both runs), so window-to-window variation that both runs share cancels.  Intervals
are 95% percentile intervals.  A report calls one side worse only when the ratio's interval
excludes 1 (``verdict``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

RESAMPLES = 1000
SEED = 0
LEVEL = 0.95
# metric -> the per-window count it is divided by ("positions": the same for every window)
DENOMINATOR = {"loss": "positions", "kl": "positions", "top1": "positions",
               "finite": "positions", "kl_finite": "finite"}


def draws(windows: int, resamples: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """Window indices ``[resamples, windows]`` drawn with replacement (deterministic)."""
    if windows < 1:
        raise ValueError("the bootstrap needs at least one window")
    return np.random.default_rng(seed).integers(0, windows, size=(resamples, windows))


def _sums(windows: dict, key: str) -> np.ndarray:
    """Per-window sums of ``key``; ``positions`` is one number, repeated per window."""
    if key == "positions":
        return np.full(len(windows["loss"]), float(windows["positions"]))
    return np.asarray(windows[key], dtype=np.float64)


def percentile_interval(samples: np.ndarray) -> list[float]:
    """The 95% percentile interval of bootstrap ``samples`` (NaN bounds when one is NaN)."""
    if np.isnan(samples).any():
        return [math.nan, math.nan]
    lo, hi = np.percentile(samples, [50 * (1 - LEVEL), 50 * (1 + LEVEL)])
    return [float(lo), float(hi)]


def resampled(windows: dict, key: str, idx: np.ndarray) -> np.ndarray:
    """The metric ``key`` on each resample of windows ``idx`` (ratio of resampled sums)."""
    num, den = _sums(windows, key), _sums(windows, DENOMINATOR[key])
    with np.errstate(invalid="ignore", divide="ignore"):
        return num[idx].sum(1) / den[idx].sum(1)


def interval(windows: dict, key: str) -> list[float]:
    """95% bootstrap interval of metric ``key`` from a run's per-window sums."""
    return percentile_interval(resampled(windows, key, draws(len(windows["loss"]))))


def intervals(windows: dict, keys: Sequence[str] = ("loss", "kl", "top1", "kl_finite")) -> dict:
    """``interval`` of each metric in ``keys``."""
    return {k: interval(windows, k) for k in keys}


def ratio(a: dict, b: dict, key: str = "kl") -> tuple[float, list[float]]:
    """Ratio ``metric(a) / metric(b)`` of two runs' ``e2e`` dicts and its paired 95% interval."""
    wa, wb = a["windows"], b["windows"]
    if len(wa["loss"]) != len(wb["loss"]):
        raise ValueError("paired bootstrap needs both runs on the same windows")
    idx = draws(len(wa["loss"]))
    with np.errstate(invalid="ignore", divide="ignore"):
        samples = resampled(wa, key, idx) / resampled(wb, key, idx)
        point = a[key] / b[key] if b[key] else math.nan
    return float(point), percentile_interval(samples)


def excludes_one(ci: Sequence[float]) -> bool:
    """Whether a ratio's interval lies wholly above or wholly below 1."""
    lo, hi = ci
    return math.isfinite(lo) and math.isfinite(hi) and (lo > 1 or hi < 1)


def verdict(ci: Sequence[float], above: str, below: str,
            same: str = "no measurable difference") -> str:
    """``above`` when the ratio's CI lies above 1, ``below`` when below, else ``same``."""
    if not excludes_one(ci):
        return same
    return above if ci[0] > 1 else below


def digits_apart(lo: float, hi: float, digits: int = 3) -> int:
    """Significant digits that print ``lo`` and ``hi`` apart when they differ (``digits`` at
    least, 6 at most): a narrow interval is not printed as a degenerate ``[x, x]``.

    >>> digits_apart(1.2201, 1.2249), digits_apart(1.0, 1.0)
    (4, 3)
    """
    while lo != hi and digits < 6 and f"{lo:.{digits}g}" == f"{hi:.{digits}g}":
        digits += 1
    return digits


def fmt_ci(ci: Sequence[float], digits: int = 3) -> str:
    """``[lo, hi]`` with ``digits`` significant digits, more where they would print alike
    (``digits_apart``; ``[CI undefined]`` when not finite)."""
    if not all(math.isfinite(c) for c in ci):
        return "[CI undefined]"
    d = digits_apart(ci[0], ci[1], digits)
    return f"[{ci[0]:.{d}g}, {ci[1]:.{d}g}]"


# --------------------------------------------------------------------------------------------
# Beyond one ratio of two runs: clusters of windows, functions of several runs, and p-values
# --------------------------------------------------------------------------------------------
def window_weights(windows: int, resamples: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """The window bootstrap of ``draws`` as counts ``[resamples, windows]``: how often
    each window is drawn in each resample."""
    idx = draws(windows, resamples, seed)
    out = np.zeros((resamples, windows))
    np.add.at(out, (np.arange(resamples)[:, None], idx), 1.0)
    return out


def cluster_weights(groups: Sequence[int], resamples: int = RESAMPLES,
                    seed: int = SEED) -> np.ndarray:
    """A cluster bootstrap as counts ``[resamples, windows]``: the clusters (``groups[w]``: the
    cluster of window ``w``, e.g. its held-out topic) are drawn with replacement and each
    drawn cluster brings all its windows.  Windows of one topic are not independent samples
    of text; this resamples what is (the topics), at the price of having few of them."""
    labels = np.asarray(groups)
    names = np.unique(labels)
    pick = np.random.default_rng(seed).integers(0, len(names), size=(resamples, len(names)))
    chosen = np.zeros((resamples, len(names)))
    np.add.at(chosen, (np.arange(resamples)[:, None], pick), 1.0)
    member = (labels[None, :] == names[:, None]).astype(np.float64)      # [clusters, windows]
    return chosen @ member


def weighted(windows: dict, key: str, weights: np.ndarray) -> np.ndarray:
    """The metric ``key`` on each resample given as window counts (ratio of weighted sums)."""
    num, den = _sums(windows, key), _sums(windows, DENOMINATOR[key])
    with np.errstate(invalid="ignore", divide="ignore"):
        return (weights @ num) / (weights @ den)


def sums_ratio(num: Sequence[float], den: Sequence[float], weights: np.ndarray) -> np.ndarray:
    """A metric ``sum(num) / sum(den)`` over independent units (clips, sentences, windows) on
    each resample given as unit counts ``weights`` (:func:`window_weights`)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return (weights @ np.asarray(num, np.float64)) / (weights @ np.asarray(den, np.float64))


def combine(runs: Sequence[dict], fn, weights: np.ndarray,
            key: str = "kl") -> tuple[float, list[float], np.ndarray]:
    """``fn`` of several runs' metric ``key`` (e.g. a ratio, or a product of ratios), its
    point value, 95% percentile interval and resampled values, every run resampled on the same
    ``weights`` (paired)."""
    if len({len(r["windows"]["loss"]) for r in runs}) != 1:
        raise ValueError("a paired bootstrap needs every run on the same windows")
    with np.errstate(invalid="ignore", divide="ignore"):
        samples = np.asarray(fn(*[weighted(r["windows"], key, weights) for r in runs]),
                             dtype=np.float64)
        point = float(fn(*[np.float64(r[key]) for r in runs]))
    return point, percentile_interval(samples), samples


def p_value(samples: np.ndarray, point: float) -> float:
    """Two-sided p-value of "the ratio is 1" from a ratio's bootstrap samples: the normal
    approximation of the bootstrap distribution of its logarithm (z = log(point) / sd).  Used
    for the Holm correction, where the percentile counts of 1,000 resamples cannot reach the
    small levels a family of many comparisons needs."""
    logs = np.log(samples)
    if not (math.isfinite(point) and point > 0 and np.isfinite(logs).all()):
        return math.nan
    sd = float(np.std(logs, ddof=1))
    if sd == 0:
        return 1.0 if point == 1 else 0.0
    return math.erfc(abs(math.log(point)) / sd / math.sqrt(2))


def holm(pvalues: Sequence[float], level: float = 1 - LEVEL) -> list[bool]:
    """Holm's step-down procedure: which of the hypotheses with ``pvalues`` are rejected at
    family-wise error ``level`` (NaN p-values are never rejected and do not count)."""
    order = sorted((p, i) for i, p in enumerate(pvalues) if math.isfinite(p))
    m, out = len(order), [False] * len(pvalues)
    for k, (p, i) in enumerate(order):
        if p > level / (m - k):
            break
        out[i] = True
    return out
