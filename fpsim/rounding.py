"""The rounding algorithm: one integer-only routine for every format, mode and backend.

The input is the bit pattern of an IEEE binary float (float32 or float64, "the source"), split
into sign and magnitude bits.  Rounding to a target format with fewer mantissa bits drops
``shift`` low bits of the significand; each rounding mode is a *bias added before the shift*
(ties-to-even adds ``half - 1 + lsb``), so a carry out of the mantissa flows into the exponent by
itself, exactly as in ml_dtypes.  Subnormal targets just drop more bits.  Integers are formats
whose values are all "subnormal" with unit spacing.  Everything is integer arithmetic on the
float's bits: exact, vectorised, and the same in NumPy, torch and (as a twin) Triton.

Only operators and the handful of helpers in :mod:`fpsim.backend` are used, so NumPy arrays and
torch tensors run the very same lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .formats import Format, unknown_name_error

MODES = ("rne", "rna", "rtz", "rup", "rdown", "rto", "stochastic")


def check_mode(rounding: str) -> str:
    if rounding not in MODES:
        raise unknown_name_error("rounding mode", rounding, list(MODES))
    return rounding


def check_saturate(saturate: bool | str) -> bool | str:
    """``saturate=``: False (overflow to inf/NaN, P3109's SatNone), True (finite overflow to
    +-max, inf stays inf: SatPropagate) or ``"finite"`` (inf inputs to +-max too: SatFinite)."""
    if isinstance(saturate, str) and saturate.strip().lower() == "finite":
        return "finite"
    if saturate in (False, True) and not isinstance(saturate, str):
        return bool(saturate)
    raise ValueError(f"saturate={saturate!r}: choose False (overflow to inf/NaN), True (to the "
                     "largest finite value; inf stays inf) or 'finite' (inf too)")


@dataclass(frozen=True)
class Source:
    """The IEEE binary float whose bits are rounded: float32 (int32 lanes) or float64."""

    ebits: int
    mbits: int

    @property
    def width(self) -> int:
        return 1 + self.ebits + self.mbits

    @property
    def bias(self) -> int:
        return 2 ** (self.ebits - 1) - 1

    @property
    def emin(self) -> int:
        return 1 - self.bias

    @property
    def emax(self) -> int:
        return 2**self.ebits - 2 - self.bias

    def holds(self, fmt: Format) -> bool:
        """Whether rounding from this source to ``fmt`` stays exact in its integer lanes.

        Needs every value of ``fmt`` representable here, the source's subnormals no finer than
        the target's normal binades (else they would need normalising), and codes that fit.
        """
        if fmt.is_int:
            return fmt.mbits <= self.mbits and fmt.bits <= self.width - 1
        lowest = fmt.emin - (fmt.mbits if fmt.subnormals else 0)
        return (fmt.mbits <= self.mbits and fmt.emax <= self.emax and fmt.emin >= self.emin
                and lowest >= self.emin - self.mbits and fmt.bits <= self.width)

    def float_bits(self, value: float) -> int:
        """Bit pattern of a finite non-negative float ``value`` in this source format."""
        import struct

        if self.width == 64:
            return struct.unpack("<q", struct.pack("<d", value))[0]
        return struct.unpack("<i", struct.pack("<f", value))[0]


F32 = Source(8, 23)
F64 = Source(11, 52)


def _target_bias(fmt: Format) -> int:
    # integers: unit spacing everywhere, i.e. a format whose values are all subnormal
    return 1 - fmt.mbits if fmt.is_int else fmt.bias


def round_bits(xp: Any, a: Any, neg: Any, src: Source, fmt: Format, mode: str, *,
               saturate: bool = False, subnormals: bool = True, rand: Any = None,
               want: str = "code") -> Any:
    """Round magnitudes ``a`` (source bits with the sign cleared) with signs ``neg`` to ``fmt``.

    Returns the target codes (sign included, two's complement for integers) when ``want ==
    "code"``, or the rounded values as source bits (sign included) when ``want == "value"``.
    ``rand`` holds uniform random integers of ``src.width - 2`` bits for stochastic rounding.
    NaN inputs become the format's NaN, or a zero when it has none (callers decide beforehand).
    """
    M, W, m = src.mbits, src.width, fmt.mbits
    top_exp = 2**src.ebits - 1
    exp_in = a >> M
    special = exp_in == top_exp                       # inf or NaN input
    is_nan = special & ((a & ((1 << M) - 1)) != 0)
    nz = xp.clamp_max(exp_in, 1)
    sig = (a & ((1 << M) - 1)) | (nz << M)            # significand with its implicit bit
    e_eff = exp_in + (1 - nz)                         # biased exponent; subnormals count as 1

    bias_t = _target_bias(fmt)
    t = e_eff + (bias_t - src.bias)                   # target biased exponent, if unbounded
    if ((top_exp + bias_t - src.bias + 2) << m) >= 2 ** (W - 2):
        t = xp.clamp_max(t, fmt.max_biased_exp + 2)   # keep codes in range; still overflows
    tt = xp.clamp_min(t, fmt.min_biased_exp)          # subnormal targets keep the least exponent
    shift = (tt - t) + (M - m)                        # low significand bits to drop
    if mode == "stochastic":
        excess = xp.clamp_min(shift - (W - 2), 0)     # past W-2 bits: probability exact to 2^-(W-2)
        sig = sig >> excess
        shift = shift - excess
    else:
        shift = xp.clamp_max(shift, W - 2)            # W-2 > M+1: dropping more changes nothing
    mask = (1 << shift) - 1
    low = sig >> shift                                # kept bits: the last one is "odd"/"even"
    if fmt.p3109 and m == 0:
        low = low + (tt - 1)                          # P3109, P=1: the code's last bit decides

    if mode == "rne":
        q = (sig + ((mask >> 1) + (low & mask & 1))) >> shift
    elif mode == "rna":
        q = (sig + ((mask + 1) >> 1)) >> shift
    elif mode in ("rtz", "rto"):
        q = sig >> shift
        if mode == "rto":
            q = q + (xp.astype((sig & mask) != 0, q.dtype) & ~low & 1)  # inexact: make odd
    elif mode == "rup":
        q = (sig + xp.where(neg, 0, mask)) >> shift
    elif mode == "rdown":
        q = (sig + xp.where(neg, mask, 0)) >> shift
    elif mode == "stochastic":
        q = (sig + (rand & mask)) >> shift
    else:
        raise ValueError(check_mode(mode))

    code = ((tt - 1) << m) + q                        # a carry in q moves into the exponent
    if not fmt.zero:
        code = xp.clamp_min(code, 0)                  # no zero: the least value absorbs underflow

    # overflow beyond the largest finite value
    limit = fmt.max_code
    if fmt.is_int and fmt.signed:
        limit = xp.astype(neg, code.dtype) + limit    # two's complement reaches -2^mbits
    over = code > limit
    to_inf = None                                     # overflows that leave the finite range
    if (not saturate and (fmt.inf or fmt.has_nan) and mode != "rtz"
            and (mode != "rto" or fmt.p3109)):       # P3109: round-to-odd overflows
        to_inf = {"rup": over & ~neg, "rdown": over & neg}.get(mode, over)

    code = xp.where(over, limit, code)
    if fmt.zero and not fmt.is_int and (not subnormals or not fmt.subnormals):
        code = xp.where(code < (1 << m), 0, code)     # subnormal results become zero

    bad_sign = (neg & ~is_nan) if not fmt.signed else None   # negative input, unsigned format
    if bad_sign is not None and fmt.zero and not fmt.is_int:  # P3109: an overflow below 0
        bad_sign = bad_sign & ((code != 0) | special)          # -0, what rounds to 0: +0
        if saturate or mode in ("rtz", "rup") or (mode == "rto" and not fmt.p3109):
            zero = bad_sign if saturate else bad_sign & ~special   # saturates to 0
            code, special, bad_sign = xp.where(zero, 0, code), special & ~zero, bad_sign & ~zero
    if want == "value":
        return _values(xp, src, fmt, a, neg, code, to_inf, special, is_nan, bad_sign, saturate)
    return _codes(xp, fmt, code, limit, to_inf, special, is_nan, neg, a, bad_sign, saturate)


def _inf_input(fmt: Format, saturate: bool, inf: int, nan: int, big: int) -> int:
    """What an infinite input becomes: inf (unless ``saturate="finite"``), else NaN unless
    saturating, else the largest value."""
    if fmt.inf and saturate != "finite":
        return inf
    return nan if (fmt.has_nan and not saturate) else big


def _codes(xp: Any, fmt: Format, code: Any, limit: Any, to_inf: Any, special: Any,
           is_nan: Any, neg: Any, a: Any, bad_sign: Any, saturate: bool) -> Any:
    """Finish finite code magnitudes: overflow to inf/NaN, special inputs, sign."""
    if to_inf is not None:
        code = xp.where(to_inf, fmt.inf_code if fmt.inf else fmt.nan_code, code)
    inf_in = _inf_input(fmt, saturate, fmt.inf_code, fmt.nan_code, limit)
    nan_in = fmt.nan_code if fmt.has_nan else 0
    code = xp.where(is_nan, nan_in, xp.where(special, inf_in, code))
    if fmt.is_int:
        if fmt.signed:
            code = xp.where(neg, ((1 << fmt.bits) - code) & ((1 << fmt.bits) - 1), code)
        else:
            code = xp.where(neg, 0, code)
        return code
    if fmt.signed:
        sign = xp.astype(neg, code.dtype) << (fmt.bits - 1)
        if fmt.nan == "fnuz":                         # no -0; the NaN code already has the sign bit
            sign = xp.where((code == 0) | (code == fmt.nan_code), 0, sign)
        return code | sign
    if not fmt.zero:                                  # E8M0: zero is NaN, as negatives are
        code = xp.where(a == 0, nan_in, code)
    return xp.where(bad_sign, nan_in, code)               # negative into an unsigned format


def _values(xp: Any, src: Source, fmt: Format, a: Any, neg: Any, code: Any, to_inf: Any,
            special: Any, is_nan: Any, bad_sign: Any, saturate: bool) -> Any:
    """Decode finite code magnitudes into the source's bits, then specials and sign."""
    M, m = src.mbits, fmt.mbits
    fdt = xp.float64 if src.width == 64 else xp.float32
    if fmt.is_int:
        val = xp.view(xp.astype(code, fdt), code.dtype)
    else:
        e = code >> m
        frac = code & ((1 << m) - 1)
        val = ((e + (src.bias - fmt.bias)) << M) | (frac << (M - m))
        if fmt.zero:                                  # subnormal codes: one exact multiply
            sub = xp.view(xp.astype(frac, fdt) * (2.0 ** (fmt.emin - m)), code.dtype)
            val = xp.where(e == 0, sub, val)
    inf_bits = (2**src.ebits - 1) << M
    nan_bits = inf_bits | (1 << (M - 1))
    if to_inf is not None:
        val = xp.where(to_inf, inf_bits if fmt.inf else nan_bits, val)
    if not fmt.zero and fmt.has_nan:                  # no zero: 0 is NaN (else the least value)
        val = xp.where(a == 0, nan_bits, val)
    inf_in = _inf_input(fmt, saturate, inf_bits, nan_bits, src.float_bits(fmt.max))
    if fmt.is_int and fmt.signed:
        inf_in = inf_in + xp.astype(neg, val.dtype) * (src.float_bits(-fmt.min) - inf_in)
    val = xp.where(is_nan, nan_bits, xp.where(special, inf_in, val))
    if bad_sign is not None:
        return xp.where(bad_sign, nan_bits if fmt.has_nan else 0, val)
    sign = xp.astype(neg, val.dtype) << (src.width - 1)
    if fmt.nan == "fnuz":
        sign = xp.where((val == 0) | (val == nan_bits), 0, sign)  # no -0; one unsigned NaN
    elif fmt.is_int:
        sign = xp.where(val == 0, 0, sign)            # no negative zero
    return val | sign
