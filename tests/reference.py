"""A slow, independent reference for scalar rounding, written from the definitions.

Nothing here looks at bit patterns: values are ``fractions.Fraction``, the grid of a binade is
computed from the exponent, and each rounding mode is the textbook choice between the two
neighbours.  It returns a Fraction, ``"inf"``/``"-inf"`` or ``"nan"``.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

from fpsim import Format


def _floor_log2(x: Fraction) -> int:
    e = x.numerator.bit_length() - x.denominator.bit_length()
    if Fraction(2) ** e > x:
        e -= 1
    if Fraction(2) ** (e + 1) <= x:
        e += 1
    return e


def neighbours(x: Fraction, fmt: Format) -> tuple[Fraction, Fraction]:
    """The grid points ``lo <= |x| <= hi`` of ``fmt`` with unbounded exponent range above."""
    ax = abs(x)
    if fmt.is_int:
        ulp = Fraction(1)
    else:
        e = max(_floor_log2(ax), fmt.emin) if ax else fmt.emin
        ulp = Fraction(2) ** (e - fmt.mbits)
    k = math.floor(ax / ulp)
    return k * ulp, (k + 1) * ulp if k * ulp != ax else k * ulp


def round_ref(x: float | int | Fraction, fmt: Format, mode: str = "rne",
              saturate: bool = False) -> Fraction | str:
    """Round ``x`` to ``fmt`` from first principles (no stochastic mode)."""
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            if x < 0 and not fmt.signed:
                return Fraction(0) if fmt.is_int else "nan"
            if fmt.inf:
                return "inf" if x > 0 else "-inf"
            if fmt.has_nan and not saturate:
                return "nan"
            return Fraction(fmt.max if x > 0 else fmt.min)
    x = Fraction(x)
    neg = x < 0
    if neg and not fmt.signed:
        return Fraction(0) if fmt.is_int else "nan"
    if x == 0 and not fmt.zero:
        return "nan"
    lo, hi = neighbours(x, fmt)
    ax = abs(x)
    if lo == hi:
        r = lo
    else:
        ulp = hi - lo
        away = {
            "rne": ax - lo > hi - ax or (ax - lo == hi - ax and (lo / ulp) % 2 == 1),
            "rna": ax - lo >= hi - ax,
            "rtz": False,
            "rup": not neg,
            "rdown": neg,
            "rto": (lo / ulp) % 2 == 0,
        }[mode]
        r = hi if away else lo
    if not fmt.zero and r < Fraction(fmt.min_normal):
        r = Fraction(fmt.min_normal)
    big = Fraction(-fmt.min) if (neg and fmt.is_int) else Fraction(fmt.max)
    if r > big:
        leaves = not saturate and (fmt.inf or fmt.has_nan) and (
            mode in ("rne", "rna") or (mode == "rup" and not neg) or (mode == "rdown" and neg))
        if leaves:
            if fmt.inf:
                return "-inf" if neg else "inf"
            return "nan"
        r = big
    if neg and r == 0 and fmt.nan == "fnuz":
        return Fraction(0)
    return -r if neg else r


def special_inputs(fmt: Format) -> list[float]:
    """Values where emulators break: zeros, ties, boundaries, max and beyond, subnormals."""
    out = [0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, -1.0]
    mx, mn, sub = fmt.max, fmt.min_normal, fmt.min_subnormal
    ulp_max = math.ldexp(1.0, fmt.emax - (0 if fmt.is_int else fmt.mbits)) if not fmt.is_int else 1.0
    for v in (mx, mn, sub):
        for f in (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0):
            out += [v * f, -v * f]
    for d in (ulp_max / 2, ulp_max / 4, ulp_max, 3 * ulp_max / 4):
        out += [mx + d, -(mx + d)]
    out += [mn - sub / 2, sub / 2, sub * 1.5, sub * 2.5]
    return out


def random_doubles(n: int, lo_exp: int, hi_exp: int, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [rng.choice((-1, 1)) * math.ldexp(rng.random() + 0.5, rng.randint(lo_exp, hi_exp))
            for _ in range(n)]
