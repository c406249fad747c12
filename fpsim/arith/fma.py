"""A correctly rounded FP64 fused multiply-add, vectorised in NumPy (which has no ``fma``).

``fma(a, b, c)`` is RN(a·b + c), the exact value rounded once to float64 with ties to even,
as IEEE 754's fusedMultiplyAdd (C's ``fma``) computes it.  The FP64 matrix instructions (NVIDIA
DMMA, AMD's FP64 MFMA) are chains of these (MMA-Sim, arXiv 2511.10909, ``simulator/*.py``).

The algorithm works on integers, as a hardware FMA does:

1. Non-finite operands, a zero product (a or b zero) and a zero c are left to float64 itself,
   whose ``a*b + c`` (``a*b`` where only c is zero) is then already the correctly rounded
   answer with IEEE's signs of zero; an infinite c with finite a and b gives c (the exact product is finite even
   where the float product overflows).
2. Otherwise every operand is sign, significand M normalised to [2^52, 2^53) and exponent E
   (subnormals are normalised too, E going below -1074).  The product's significand
   Ma·Mb < 2^106 is formed exactly in two 64-bit words from 32-bit halves.
3. Product and c are placed in a 128-bit window whose least bit is L = T - 124, T the higher
   of their leading-bit positions: the larger term then needs at most 126 bits.  The smaller
   term is shifted right into the window; the bits that fall out leave a *sticky* flag, so the
   exact value is known to lie strictly between Z and Z + 1 units of 2^L.  A sticky term is at
   least 2^70 units below the other, so the rounding position is far above the sticky bits.
4. Equal signs add; opposite signs subtract the smaller from the larger, and a sticky
   subtrahend takes one more unit off (Z - δ = (Z - 1) + (1 - δ)), the flag staying set.  An
   exact zero is +0 (round to nearest).
5. The sum is rounded once to 53 bits, or to the subnormal grid 2^-1074: the bits below the
   rounding position give the round bit and, with the flag, the sticky bit; ties go to even.
   ``ldexp`` rebuilds the float exactly, overflowing to ±inf as rounding to nearest does.

``tests/test_fma.py`` checks it bit for bit against ``fractions.Fraction`` on ties, subnormal
results, overflow, cancellation and inf/NaN operands.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_U = np.uint64
_FRAC = _U((1 << 52) - 1)
_LOW32 = _U(0xFFFFFFFF)
WINDOW = 124            # the window's least bit lies this far below the larger term's top bit


def fma(a: Any, b: Any, c: Any) -> np.ndarray:
    """RN(a·b + c) in float64, elementwise with NumPy broadcasting, rounded once (ties to
    even); NaN results are NumPy's."""
    a, b, c = np.broadcast_arrays(*(np.asarray(x, np.float64) for x in (a, b, c)))
    with np.errstate(all="ignore"):
        out = a * b + c                          # non-finite operands, zero products
        # RN(ab + 0) == RN(ab) for non-zero a and b, underflow to the sign's zero included
        out = np.where((c == 0) & (a != 0) & (b != 0), a * b, out)
        finite_ab = np.isfinite(a) & np.isfinite(b)
        out = np.where(finite_ab & np.isinf(c), c, out)
        general = finite_ab & np.isfinite(c) & (a != 0) & (b != 0) & (c != 0)
        if general.any():
            out[general] = _general(a[general], b[general], c[general])
    return out


def _bitlen(x: np.ndarray) -> np.ndarray:
    """The bit length of uint64 values (0 for 0): the float conversion may round up to the
    next power of two, which the shift test corrects."""
    n = np.frexp(x.astype(np.float64))[1].astype(np.int64)
    over = (n > 0) & ((x >> np.maximum(n - 1, 0).astype(_U)) == 0)
    return n - over


def _split(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sign bit, significand normalised to [2^52, 2^53) and exponent (value = M·2^E)."""
    bits = x.view(_U)
    field = ((bits >> _U(52)) & _U(0x7FF)).astype(np.int64)
    m = np.where(field > 0, (bits & _FRAC) | _U(1 << 52), bits & _FRAC)
    shift = 53 - _bitlen(m)                      # subnormals: normalise
    return bits >> _U(63), m << shift.astype(_U), np.maximum(field, 1) - 1075 - shift


def _mul(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The exact 128-bit product of two values below 2^53, as (high, low) words."""
    xh, xl, yh, yl = x >> _U(32), x & _LOW32, y >> _U(32), y & _LOW32
    mid = xl * yh + xh * yl                      # < 2^54
    ll = xl * yl
    lo = ll + (mid << _U(32))
    return xh * yh + (mid >> _U(32)) + (lo < ll), lo


def _shl(hi: np.ndarray, lo: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(hi, lo) << s for 0 <= s < 128 (NumPy shifts by 64 or more give 0)."""
    small = s < 64
    s_, t = np.minimum(s, 63).astype(_U), np.clip(64 - s, 0, 64).astype(_U)
    u = np.clip(s - 64, 0, 63).astype(_U)
    return (np.where(small, (hi << s_) | (lo >> t), lo << u), np.where(small, lo << s_, _U(0)))


def _shr(hi: np.ndarray, lo: np.ndarray,
         s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hi, lo) >> s for any s >= 0, and whether a non-zero bit fell out."""
    small, mid = s < 64, (s >= 64) & (s < 128)
    s_, t = np.minimum(s, 63).astype(_U), np.clip(64 - s, 0, 64).astype(_U)
    u, v = np.clip(s - 64, 0, 63).astype(_U), np.clip(128 - s, 0, 64).astype(_U)
    new_lo = np.where(small, (lo >> s_) | (hi << t), np.where(mid, hi >> u, _U(0)))
    new_hi = np.where(small, hi >> s_, _U(0))
    lost = np.where(small, (lo << t) != 0,
                    np.where(mid, (lo != 0) | ((hi << v) != 0), (hi | lo) != 0))
    return new_hi, new_lo, lost


def _general(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """fma for finite, non-zero a, b and c (steps 2 to 5 of the module's description)."""
    sa, ma, ea = _split(a)
    sb, mb, eb = _split(b)
    sc, mc, ec = _split(c)
    ph, pl = _mul(ma, mb)                        # in [2^104, 2^106)
    ep = ea + eb
    tp = ep + 104 + (ph >> _U(41)).astype(np.int64)
    tc = ec + 52
    low = np.maximum(tp, tc) - WINDOW
    sp = ep - low                                # <= 20: left shifts stay below 2^126
    xh, xl = _shl(ph, pl, np.maximum(sp, 0))
    rh, rl, x_lost = _shr(ph, pl, np.maximum(-sp, 0))
    xh, xl, x_lost = np.where(sp >= 0, xh, rh), np.where(sp >= 0, xl, rl), (sp < 0) & x_lost
    sy = ec - low                                # <= 72
    yh, yl = _shl(np.zeros_like(mc), mc, np.maximum(sy, 0))
    rh, rl, y_lost = _shr(np.zeros_like(mc), mc, np.maximum(-sy, 0))
    yh, yl, y_lost = np.where(sy >= 0, yh, rh), np.where(sy >= 0, yl, rl), (sy < 0) & y_lost

    neg_p = (sa ^ sb) == 1
    same = neg_p == (sc == 1)
    x_big = (xh > yh) | ((xh == yh) & (xl >= yl))
    # the larger minus the smaller (the smaller is the sticky one, if either is)
    bh, bl = np.where(x_big, xh, yh), np.where(x_big, xl, yl)
    sh, sl = np.where(x_big, yh, xh), np.where(x_big, yl, xl)
    small_lost = np.where(x_big, y_lost, x_lost)
    dl = bl - sl
    dh = bh - sh - (bl < sl)
    borrow = small_lost & (dl == 0)              # minus one more unit where bits fell out
    dl, dh = dl - small_lost, dh - borrow
    sl_ = xl + yl
    zh = np.where(same, xh + yh + (sl_ < xl), dh)
    zl = np.where(same, sl_, dl)
    lost = x_lost | y_lost
    neg = np.where(same, neg_p, np.where(x_big, neg_p, sc == 1))

    n = np.where(zh != 0, 64 + _bitlen(zh), _bitlen(zl))
    q = np.maximum(low + n - 1 - 52, -1074)      # the result's least bit
    k = q - low
    # k <= 0: Z has at most 53 bits, exact; else shift to keep the round bit as the last
    hh, hl, below = _shr(zh, zl, np.maximum(k - 1, 0))
    rbit = np.where(k > 0, hl & _U(1), _U(0))
    m = np.where(k > 0, hl >> _U(1), zl)
    sticky = (below & (k > 0)) | lost
    m = m + (rbit & ((sticky | ((m & _U(1)) == 1)).astype(_U)))
    r = np.ldexp(m.astype(np.float64), np.where(k > 0, q, low))
    exact_zero = ((zh | zl) == 0) & ~lost        # exact cancellation: +0
    return np.where(neg & ~exact_zero, -r, r)
