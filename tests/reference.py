"""A slow, independent reference for scalar rounding, written from the definitions.

Nothing here looks at bit patterns: values are ``fractions.Fraction``, the grid of a binade is
computed from the exponent, and each rounding mode is the textbook choice between the two
neighbours.  It returns a Fraction, ``"inf"``/``"-inf"`` or ``"nan"``.
"""

from __future__ import annotations

import functools
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
              saturate: bool = False, subnormals: bool = True) -> Fraction | str:
    """Round ``x`` to ``fmt`` from first principles (no stochastic mode); ``subnormals=False``
    flushes a result below the least normal magnitude to zero (after rounding)."""
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
    if not subnormals and not fmt.is_int and 0 < r < Fraction(fmt.min_normal):
        r = Fraction(0)
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


# --------------------------------------------------------------------------------------------
# IEEE P3109 (draft), from the width K, the precision P, signedness and domain alone: the
# draft's Decode and its Project = RoundToPrecision, then Saturate, then Encode.  Codes in,
# codes out; nothing here reads an fpsim.Format.
# --------------------------------------------------------------------------------------------
P3109_MODES = {"rne": "NearestTiesToEven", "rna": "NearestTiesToAway", "rtz": "TowardZero",
               "rup": "TowardPositive", "rdown": "TowardNegative", "rto": "ToOdd"}
#: fpsim's ``saturate=`` for each of the draft's saturation modes.
P3109_SATURATION = {"SatNone": False, "SatPropagate": True, "SatFinite": "finite"}


def _p3109_bias(k: int, p: int, signed: bool) -> int:
    return 2 ** (k - p - 1) if signed else 2 ** (k - p)


def p3109_specials(k: int, signed: bool, extended: bool) -> dict[int, str]:
    """The codes of NaN and the infinities."""
    out = {2 ** (k - 1) if signed else 2**k - 1: "nan"}
    if extended:
        out[2 ** (k - 1) - 1 if signed else 2**k - 2] = "inf"
        if signed:
            out[2**k - 1] = "-inf"
    return out


def p3109_decode(code: int, k: int, p: int, signed: bool, extended: bool) -> Fraction | str:
    """The value of ``code``: a Fraction, ``"nan"``, ``"inf"`` or ``"-inf"``."""
    special = p3109_specials(k, signed, extended).get(code)
    if special:
        return special
    if signed and code > 2 ** (k - 1):
        return -p3109_decode(code - 2 ** (k - 1), k, p, signed, extended)
    b, t, e = _p3109_bias(k, p, signed), code % 2 ** (p - 1), code // 2 ** (p - 1)
    frac = Fraction(t, 2 ** (p - 1))
    return frac * Fraction(2) ** (1 - b) if e == 0 else (1 + frac) * Fraction(2) ** (e - b)


@functools.lru_cache(maxsize=None)
def p3109_max(k: int, p: int, signed: bool, extended: bool) -> Fraction:
    code = (2 ** (k - 1) if signed else 2**k) - 1 - int(not signed) - int(extended)
    return p3109_decode(code, k, p, signed, extended)


@functools.lru_cache(maxsize=1 << 16)
def _round_to_precision(x: float, p: int, b: int, mode: str) -> Fraction:
    """RoundToPrecision of the finite float ``x`` (exponent unbounded above)."""
    if x == 0:
        return Fraction(0)
    q = max(_floor_log2(abs(Fraction(x))), 1 - b) - p + 1
    s = abs(Fraction(x)) / Fraction(2) ** q
    i = math.floor(s)
    nu = s - i
    even = i % 2 == 0 if p > 1 else (i == 0 or (q + b) % 2 == 0)   # the code's last bit
    if mode == "rne":
        away = nu > Fraction(1, 2) or (nu == Fraction(1, 2) and not even)
    elif mode == "rna":
        away = nu >= Fraction(1, 2)
    elif mode == "rto":
        away = nu > 0 and even
    else:
        away = nu > 0 and {"rtz": False, "rup": x > 0, "rdown": x < 0}[mode]
    return (1 if x > 0 else -1) * (i + away) * Fraction(2) ** q


def _saturate(x: Fraction | str, m: Fraction, sat: str, mode: str, signed: bool,
              extended: bool) -> Fraction | str:
    lo = -m if signed else Fraction(0)
    if x == "nan" or (not isinstance(x, str) and lo <= x <= m):
        return x
    above = x == "inf" or (not isinstance(x, str) and x > m)     # else below lo
    if sat == "SatFinite" or (sat == "SatPropagate" and not (extended and (above or signed)
                                                              and isinstance(x, str))):
        return m if above else lo
    if not isinstance(x, str):                                   # SatNone, finite overflow
        if above and mode in ("rtz", "rdown"):
            return m
        if not above and mode in ("rtz", "rup"):
            return lo
    if not extended or (not above and not signed):
        return "nan"
    return "inf" if above else "-inf"


@functools.lru_cache(maxsize=1 << 16)
def _p3109_encode(x: Fraction | str, k: int, p: int, signed: bool, extended: bool) -> int:
    codes = {v: c for c, v in p3109_specials(k, signed, extended).items()}
    if isinstance(x, str):
        return codes[x]
    if x < 0:
        return _p3109_encode(-x, k, p, signed, extended) + 2 ** (k - 1)
    if x == 0:
        return 0
    b = _p3109_bias(k, p, signed)
    e = max(_floor_log2(x), 1 - b)
    s = x / Fraction(2) ** e * 2 ** (p - 1)
    assert s.denominator == 1, (x, k, p)
    s = int(s)
    t = s % 2 ** (p - 1)
    return t if s < 2 ** (p - 1) else t + (e + b) * 2 ** (p - 1)


def p3109_project(x: float, k: int, p: int, signed: bool, extended: bool, mode: str = "rne",
                  sat: str = "SatNone") -> int:
    """The code of the float ``x`` projected to binary{k}p{p} (fpsim mode names, draft
    saturation names)."""
    if math.isnan(x):
        r: Fraction | str = "nan"
    elif math.isinf(x):
        r = "inf" if x > 0 else "-inf"
    else:
        r = _round_to_precision(x, p, _p3109_bias(k, p, signed), mode)
    r = _saturate(r, p3109_max(k, p, signed, extended), sat, mode, signed, extended)
    return _p3109_encode(r, k, p, signed, extended)
