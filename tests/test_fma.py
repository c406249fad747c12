"""fpsim.arith.fma.fma, the FP64 fused multiply-add, bit for bit against exact rationals."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from fpsim import get_format
from fpsim.arith.fma import fma
from reference import round_ref

FP64 = get_format("fp64")
TINY = 2.0**-1074


def ref_fma(a: float, b: float, c: float) -> float:
    """RN(a·b + c) from IEEE 754's rules: NaN and inf first, then the exact value (Fraction)
    rounded once by ``reference.round_ref``; an exact zero sum is +0 unless both a·b and c
    are -0; a non-zero value rounded to zero keeps its sign."""
    if math.isnan(a) or math.isnan(b) or math.isnan(c):
        return math.nan
    if math.isinf(a) or math.isinf(b):
        if a == 0 or b == 0:
            return math.nan
        p = math.copysign(math.inf, a) * math.copysign(1.0, b)
        return math.nan if math.isinf(c) and c != p else p
    if math.isinf(c):
        return c
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact == 0:
        neg_p = (math.copysign(1, a) * math.copysign(1, b)) < 0
        zero_p = a == 0 or b == 0
        both_neg = zero_p and neg_p and math.copysign(1, c) < 0
        return -0.0 if both_neg else 0.0
    r = round_ref(exact, FP64)
    if isinstance(r, str):
        return float(r)
    return math.copysign(float(r), exact)


def check(a, b, c) -> int:
    a, b, c = (np.asarray(x, np.float64).ravel() for x in (a, b, c))
    got = fma(a, b, c)
    want = np.array([ref_fma(float(x), float(y), float(z)) for x, y, z in zip(a, b, c)])
    nan = np.isnan(want)
    bad = np.flatnonzero((np.isnan(got) != nan) | (~nan & (got.view(np.uint64) !=
                                                           want.view(np.uint64))))
    assert bad.size == 0, (f"{bad.size} of {a.size} wrong, first fma({a[bad[0]].hex()}, "
                           f"{b[bad[0]].hex()}, {c[bad[0]].hex()}) = {got[bad[0]].hex()}, "
                           f"exact rounding {want[bad[0]].hex()}")
    return a.size


def signed(rng, n):
    return rng.choice([-1.0, 1.0], n)


def odd(rng, n, bits):
    """Odd integers of exactly ``bits`` bits, as floats."""
    return (rng.integers(1 << (bits - 2), 1 << (bits - 1), n) * 2 + 1).astype(np.float64)


def test_random_bit_patterns():
    """Every class at random: NaN, inf, subnormal, zero-free normals over the whole range."""
    rng = np.random.default_rng(1)
    a, b, c = (rng.integers(0, 2**64, 6000, dtype=np.uint64).view(np.float64) for _ in "abc")
    assert check(a, b, c) == 6000


def test_products_near_c():
    """Exponents of a·b and c within a few binades of each other (deep cancellation), and c
    set to -RN(a·b) so that the result is the product's rounding error."""
    rng = np.random.default_rng(2)
    n = 4000
    e = rng.integers(-1000, 1000, n)
    a = np.ldexp(rng.uniform(1, 2, n), e // 2) * signed(rng, n)
    b = np.ldexp(rng.uniform(1, 2, n), e - e // 2) * signed(rng, n)
    c = np.ldexp(rng.uniform(1, 2, n), e + rng.integers(-3, 4, n)) * signed(rng, n)
    c[::2] = -(a[::2] * b[::2])
    c[1::4] = np.nextafter(c[1::4], np.inf)
    assert check(a, b, c) == n


def test_far_apart_terms():
    """The smaller term 50 to 200 binades below the larger: its bits only decide ties and
    the sticky bit (both directions, both signs)."""
    rng = np.random.default_rng(3)
    n = 4000
    a, b = rng.uniform(1, 2, n) * signed(rng, n), rng.uniform(1, 2, n) * signed(rng, n)
    gap = rng.integers(50, 200, n) * signed(rng, n).astype(np.int64)
    c = np.ldexp(rng.uniform(1, 2, n), gap) * signed(rng, n)
    c[:8] = [1.0, -1.0, 2.0, -2.0, 4.0, -4.0, 0.5, -0.5]      # powers of two: gap below
    a[:8], b[:8] = 2.0**-60, -2.0**-60
    assert check(a, b, c) == n


def test_ties():
    """Exact halfway cases, normal and subnormal: a·b an odd integer times 2^(e-53) added to
    ±2^e (ties to even in both directions), and odd multiples of 2^-1075 added to
    subnormal c."""
    rng = np.random.default_rng(4)
    n = 3000
    x, y = rng.integers(-500, 400, n), rng.integers(-500, 400, n)
    a, b = np.ldexp(odd(rng, n, 26), x), np.ldexp(odd(rng, n, 26), y) * signed(rng, n)
    c = np.ldexp(signed(rng, n), x + y + 53 + 53 - 1)          # tie: product odd at 2^(e-53)
    c = np.where(rng.random(n) < 0.5, c, c + np.ldexp(signed(rng, n), x + y + 53 + 53 - 1 - 52))
    m = 1000                                                     # subnormal ties
    a2 = np.ldexp(odd(rng, m, 20), -537)
    b2 = np.ldexp(odd(rng, m, 20), -538) * signed(rng, m)      # odd multiple of 2^-1075
    c2 = rng.integers(1, 1 << 40, m) * TINY * signed(rng, m)
    assert check(np.r_[a, a2], np.r_[b, b2], np.r_[c, c2]) == n + m


def test_ties_decided_by_far_terms():
    """a·b exactly halfway between two doubles (odd 54-bit products) plus a c of either sign
    60 to 400 binades below: c lies outside the integer window, and only its sticky bit,
    taken off or added, breaks the tie (to even it would go without c)."""
    rng = np.random.default_rng(7)
    n = 3000
    A, B = odd(rng, 4 * n, 28), odd(rng, 4 * n, 27)
    keep = A * B < 2.0**54                                  # exactly 54 bits: a tie
    A, B = A[keep][:n], B[keep][:n]
    x, y = rng.integers(-300, 300, n), rng.integers(-300, 300, n)
    a, b = np.ldexp(A, x) * signed(rng, n), np.ldexp(B, y) * signed(rng, n)
    c = np.ldexp(rng.uniform(1, 2, n), x + y + 54 - rng.integers(60, 400, n)) * signed(rng, n)
    assert check(a, b, c) == n
    even = 2.0**53 + 2.0**27 + 2.0**26                      # the product is even + 1: a tie
    assert fma(2.0**27 + 1, 2.0**26 + 1, 0.0) == even
    assert fma(2.0**27 + 1, 2.0**26 + 1, 2.0**-200) == even + 2
    assert fma(2.0**27 + 1, 2.0**26 + 1, -2.0**-200) == even


def test_subnormal_results_and_operands():
    rng = np.random.default_rng(5)
    n = 3000
    ea = rng.integers(-1074, -400, n)
    a = np.ldexp(rng.uniform(1, 2, n), ea) * signed(rng, n)
    b = np.ldexp(rng.uniform(1, 2, n), -1060 - ea + rng.integers(-30, 40, n)) * signed(rng, n)
    c = rng.integers(0, 1 << 53, n) * TINY * signed(rng, n)     # subnormal or small c
    c[::3] = -(a[::3] * b[::3])
    assert check(a, b, c) == n
    got = fma(-1.25 * 2.0**-537, 2.0**-537, TINY)           # -2^-1076 rounds to -0
    assert got == 0 and np.signbit(got)


def test_overflow_and_largest_values():
    """Products beyond float64's range that c brings back, results that round up to inf,
    and the largest finite value."""
    big = np.finfo(np.float64).max
    rng = np.random.default_rng(6)
    n = 2000
    a = np.ldexp(rng.uniform(1, 2, n), rng.integers(500, 524, n)) * signed(rng, n)
    b = np.ldexp(rng.uniform(1, 2, n), rng.integers(490, 524, n)) * signed(rng, n)
    c = big * rng.uniform(0.5, 1, n) * signed(rng, n)
    c[::2] = -np.sign(a[::2]) * np.sign(b[::2]) * big
    special = [(2.0**512, 2.0**512, -big), (2.0**512, -2.0**512, big), (big, 1.0, big),
               (big, 1.0, 2.0**970), (big, 1.0, 2.0**969), (big, 1.0, 2.0**970 - 2.0**917),
               (big, -1.0, -(2.0**970)), (1.5, big, -big / 2)]
    sa, sb, sc = zip(*special)
    assert check(np.r_[a, sa], np.r_[b, sb], np.r_[c, sc]) == n + len(special)
    assert fma(big, 1.0, 2.0**970)[()] == np.inf and fma(big, 1.0, 2.0**969)[()] == big


def test_zeros_and_specials():
    """Every combination of signed zeros, infinities, NaN, tiny and ordinary values."""
    vals = [0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, -1.0, TINY, -TINY, 2.0**-600,
            -3.0, np.finfo(np.float64).max, 1e300]
    grid = np.array(np.meshgrid(vals, vals, vals)).reshape(3, -1)
    assert check(*grid) == len(vals) ** 3
    assert np.signbit(fma(-0.0, 1.0, -0.0)) and not np.signbit(fma(-0.0, 1.0, 0.0))
    assert not np.signbit(fma(2.0, 3.0, -6.0))               # exact cancellation: +0
    assert fma(1e300, 1e300, -math.inf)[()] == -math.inf    # the exact product is finite


@pytest.mark.parametrize("shape", [(), (3,), (2, 4)])
def test_broadcasting(shape):
    a = np.full(shape, 1.0 + 2.0**-30)
    got = fma(a, 1.0 + 2.0**-30, -1.0)
    assert got.shape == shape and np.all(got == 2.0**-29 + 2.0**-60)
