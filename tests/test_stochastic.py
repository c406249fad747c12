"""Stochastic rounding's probabilities, exact from first principles, counted in 5-sigma windows.

Rounding ``x`` stochastically goes up with probability ``(|x| - lo) / (hi - lo)`` for the grid
neighbours ``lo <= |x| <= hi``; fpsim draws ``W - 2`` random bits for a ``W``-bit source, so
that probability is exact whenever it is a multiple of 2^-(W-2).  Each count below must fall
within 5 standard deviations of its exact expectation, both bounds: a routine that draws too
few bits, or ignores part of the exact sum, misses one of them.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

import fpsim
from reference import neighbours

N = 400_000


def assert_count(k: int, n: int, p: Fraction, what: str) -> None:
    """``k`` successes out of ``n`` draws, each with probability ``p``, within 5 sigma."""
    mean, sd = n * float(p), math.sqrt(n * float(p) * (1 - float(p)))
    assert abs(k - mean) <= 5 * sd, f"{what}: {k} of {n}, expected {mean:.1f} +- {5 * sd:.1f}"


def up_probability(x: float, fmt: str) -> tuple[Fraction, Fraction, Fraction]:
    """(lo, hi, P(round up)) of positive ``x`` from the Fraction reference's grid."""
    lo, hi = neighbours(Fraction(x), fpsim.get_format(fmt))
    return lo, hi, (Fraction(x) - lo) / (hi - lo)


def rounded(x: float, dtype: str, fmt: str, backend: str, seed: int) -> np.ndarray:
    """N stochastic roundings of ``x`` held in ``dtype``, as float64 NumPy values."""
    xs = np.full(N, x, dtype)
    if backend == "torch":
        torch = pytest.importorskip("torch")
        xs = torch.from_numpy(xs)
    q = fpsim.quantize(xs, fmt, rounding="stochastic", seed=seed, backend=backend)
    return np.asarray(q.numpy() if backend == "torch" else q, np.float64)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_random_bit_counts_at_the_shift_cap(dtype, backend):
    """1.5·2^-20 to e4m3: 1.5·2^-11 of the smallest subnormal 2^-9, so the rounding drops more
    than W-2 bits (34 of float32's, 63 of float64's) and every random bit decides: with one bit
    fewer it would never round up."""
    x = 1.5 * 2.0**-20
    lo, hi, p = up_probability(x, "e4m3")
    assert (lo, hi, p) == (0, Fraction(1, 2**9), Fraction(3, 2**12))
    q = rounded(x, dtype, "e4m3", backend, seed=7)
    assert set(np.unique(q)) <= {0.0, 2.0**-9}
    assert_count(int((q > 0).sum()), N, p, f"{dtype} {backend}")


CASES = [(3 * 2.0**-17, "e4m3"), (0.75 * 2.0**-15, "e4m3"), (5 * 2.0**-30, "fp16"),
         (1 + 0.75 * 2.0**-7, "bf16"), (7 * 2.0**-130 + 3 * 2.0**-141, "bf16"),
         (3 * 2.0**-140, "bf16")]


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("x, fmt", CASES)
def test_probabilities_match_the_exact_reference(x, fmt, backend):
    """Drops of 14 to 30 float32 bits, normal and subnormal targets: the share of round-ups is
    the exact distance from the Fraction reference's neighbours."""
    lo, hi, p = up_probability(x, fmt)
    assert Fraction(x) == Fraction(float(np.float32(x))) and 0 < p < 1
    q = rounded(x, "float32", fmt, backend, seed=11)
    assert set(np.unique(q)) == {float(lo), float(hi)}
    assert_count(int((q == float(hi)).sum()), N, p, f"{x} to {fmt}")


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_stochastic_accumulation_uses_the_exact_sum(backend):
    """1·1 + 2^-12·2^-12 = 1 + 2^-24 into an e8m21 accumulator (ulp 2^-21 at 1): it rounds up
    with probability 2^-24 / 2^-21 = 1/8.  The float32 lanes round 1 + 2^-24 to 1, so only
    the sum's error term (TwoSum) carries the 2^-24."""
    lo, hi, p = up_probability(1 + 2.0**-24, "e8m21")
    assert (lo, hi, p) == (1, 1 + Fraction(1, 2**21), Fraction(1, 8))
    a = np.tile(np.float32([1.0, 2.0**-12]), (N, 1))
    b = np.float32([[1.0], [2.0**-12]])
    if backend == "torch":
        torch = pytest.importorskip("torch")
        a, b = torch.from_numpy(a), torch.from_numpy(b)
    r = fpsim.matmul(a, b, accum="e8m21", rounding="stochastic", seed=3)
    r = np.asarray(r.numpy() if backend == "torch" else r, np.float64)
    assert set(np.unique(r)) == {float(lo), float(hi)}
    assert_count(int((r == float(hi)).sum()), N, p, f"{backend} e8m21 sum")
