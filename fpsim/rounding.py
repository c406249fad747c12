"""The rounding algorithm: one integer-only routine for every format, mode and backend.

The input is the bit pattern of an IEEE binary float (float32 or float64, "the source"), split
into sign and magnitude bits.  Rounding to a target format with fewer mantissa bits drops
``shift`` low bits of the significand; each rounding mode is a *bias added before the shift*
(ties-to-even adds ``half - 1 + lsb``), so a carry out of the mantissa flows into the exponent by
itself, exactly as in ml_dtypes.  Subnormal targets just drop more bits.  Integers are formats
whose values are all "subnormal" with unit spacing.  Everything is integer arithmetic on the
float's bits: exact, vectorised, and the same in NumPy, torch and (as a twin) Triton.

Only operators and the handful of helpers in ``fpsim.backend`` are used, so NumPy arrays and
torch tensors run the very same lines.  ``decode_bits``, the inverse, sits here too.  The
Triton twin, ``fpsim_kernels.rounding``, has the same functions in the same order with the same
numbered steps (``# 1.`` .. ``# 7.``, ``# D1.`` .. ``# D5.``): read the two side by side.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import names
from .formats import Format

#: The stochastic modes: the P3109 draft's StochasticA (``"stochastic"``, also PTX's ``cvt.rs``),
#: StochasticB and StochasticC, and gfloat's StochasticOdd; they differ only with ``srbits``
#: (docs/stochastic.md: how the n random bits meet the dropped bits).
STOCHASTIC = ("stochastic", "stochastic_b", "stochastic_c", "stochastic_odd")
MODES = ("rne", "rna", "rtz", "rup", "rdown", "rto") + STOCHASTIC


# names people reach for, pointed to the mode they mean (a hint, not an alias); gfloat's
# RoundMode names too (its plain "Stochastic" is P3109's StochasticC: see docs/stochastic.md)
_MODE_HINTS = {"nearest": "rne", "nearest_even": "rne", "round_nearest": "rne", "even": "rne",
               "rn": "rne", "ties_away": "rna", "nearest_away": "rna", "truncate": "rtz",
               "toward_zero": "rtz", "trunc": "rtz", "ceil": "rup", "floor": "rdown",
               "odd": "rto", "sr": "stochastic", "stochasticfastest": "stochastic",
               "stochastic_fastest": "stochastic", "stochasticfast": "stochastic_b",
               "stochastic_fast": "stochastic_b", "stochasticodd": "stochastic_odd",
               "rs": "stochastic"}


def check_mode(rounding: str) -> str:
    """The canonical rounding mode (case and white space ignored), or a ValueError listing
    ``MODES``; ``"stochastic_a"`` (P3109's name) is ``"stochastic"``."""
    return names.resolve("rounding mode", rounding, {m: m for m in MODES},
                         aliases={"stochastic_a": "stochastic"}, hints=_MODE_HINTS)


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


def target_bias(fmt: Format) -> int:
    """The exponent bias rounding uses for ``fmt`` (integers: all values subnormal)."""
    # integers: unit spacing everywhere, i.e. a format whose values are all subnormal
    return 1 - fmt.mbits if fmt.is_int else fmt.bias


def round_bits(xp: Any, a: Any, neg: Any, src: Source, fmt: Format, mode: str, *,
               saturate: bool = False, subnormals: bool = True, rand: Any = None,
               srbits: int | None = None, want: str = "code") -> Any:
    """Round magnitudes ``a`` (source bits with the sign cleared) with signs ``neg`` to ``fmt``.

    Returns the target codes (sign included, two's complement for integers) when ``want ==
    "code"``, or the rounded values as source bits (sign included) when ``want == "value"``.
    Stochastic modes: ``rand`` holds uniform random integers of ``src.width - 2`` bits (every
    dropped bit meets one, ``srbits`` None), or the ``srbits`` random bits of each element
    (``stochastic_bias`` says how the variants combine them with the dropped bits).
    NaN inputs become the format's NaN, or a zero when it has none (callers decide beforehand).
    """
    # 1. split the source bits: exponent, significand with its implicit bit, specials
    M, W, m = src.mbits, src.width, fmt.mbits
    top_exp = 2**src.ebits - 1
    exp_in = a >> M
    special = exp_in == top_exp                       # inf or NaN input
    is_nan = special & ((a & ((1 << M) - 1)) != 0)
    nz = xp.clamp_max(exp_in, 1)
    sig = (a & ((1 << M) - 1)) | (nz << M)            # significand with its implicit bit
    e_eff = exp_in + (1 - nz)                         # biased exponent; subnormals count as 1

    # 2. the target exponent and how many low bits to drop
    bias_t = target_bias(fmt)
    t = e_eff + (bias_t - src.bias)                   # target biased exponent, if unbounded
    if ((top_exp + bias_t - src.bias + 2) << m) >= 2 ** (W - 2):
        t = xp.clamp_max(t, fmt.max_biased_exp + 2)   # keep codes in range; still overflows
    tt = xp.clamp_min(t, fmt.min_biased_exp)          # subnormal targets keep the least exponent
    shift = (tt - t) + (M - m)                        # low significand bits to drop
    if mode in STOCHASTIC:
        excess = xp.clamp_min(shift - (W - 2), 0)     # past W-2 bits: probability exact to 2^-(W-2)
        cut = sig >> excess
        if srbits is not None:                        # n bits look at most n+2 down: the rest
            cut = cut | xp.astype((cut << excess) != sig, sig.dtype)  # as one sticky bit
        sig = cut
        shift = shift - excess
    else:
        shift = xp.clamp_max(shift, W - 2)            # W-2 > M+1: dropping more changes nothing
    mask = (1 << shift) - 1
    low = sig >> shift                                # kept bits: the last one is "odd"/"even"
    if fmt.p3109 and m == 0:
        low = low + (tt - 1)                          # P3109, P=1: the code's last bit decides

    # 3. round: the mode's bias added before the shift
    if mode == "rne":
        q = (sig + ((mask >> 1) + (low & mask & 1))) >> shift
    elif mode == "rna":
        q = (sig + ((mask + 1) >> 1)) >> shift
    elif mode == "rtz" or mode == "rto":
        q = sig >> shift
        if mode == "rto":
            q = q + (xp.astype((sig & mask) != 0, q.dtype) & ~low & 1)  # inexact: make odd
    elif mode == "rup":
        q = (sig + xp.where(neg, 0, mask)) >> shift
    elif mode == "rdown":
        q = (sig + xp.where(neg, mask, 0)) >> shift
    elif mode in STOCHASTIC:
        q = (sig + stochastic_bias(xp, sig & mask, shift, rand, mode, srbits)) >> shift
    else:
        raise ValueError(check_mode(mode))

    # 4. the code magnitude: a carry in q moves into the exponent
    code = ((tt - 1) << m) + q
    if not fmt.zero:
        code = xp.clamp_min(code, 0)                  # no zero: the least value absorbs underflow

    # 5. overflow beyond the largest finite value
    limit = fmt.max_code
    if fmt.is_int and fmt.signed:
        limit = xp.astype(neg, code.dtype) + limit    # two's complement reaches -2^mbits
    over = code > limit
    to_inf = None                                     # overflows that leave the finite range
    if (not saturate and (fmt.inf or fmt.has_nan) and mode != "rtz"
            and (mode != "rto" or fmt.p3109)):       # P3109: round-to-odd overflows
        if mode == "rup":
            to_inf = over & ~neg
        elif mode == "rdown":
            to_inf = over & neg
        else:
            to_inf = over
    code = xp.where(over, limit, code)

    # 6. subnormal results become zero when the format or the caller has none
    if fmt.zero and not fmt.is_int and (not subnormals or not fmt.subnormals):
        code = xp.where(code < (1 << m), 0, code)

    # 7. finish: specials and sign, as codes or as values
    bad_sign = None
    if not fmt.signed:
        bad_sign = neg & ~is_nan                      # negative input, unsigned format
        if fmt.zero and not fmt.is_int:               # P3109: an overflow below 0
            bad_sign = bad_sign & ((code != 0) | special)  # -0, what rounds to 0: +0
            if saturate or mode == "rtz" or mode == "rup" or (mode == "rto" and not fmt.p3109):
                zero = bad_sign
                if not saturate:
                    zero = bad_sign & ~special        # saturates to 0
                code = xp.where(zero, 0, code)
                special = special & ~zero
                bad_sign = bad_sign & ~zero
    if want == "value":
        res = _values(xp, src, fmt, a, neg, code, to_inf, special, is_nan, bad_sign, saturate)
    else:
        res = _codes(xp, fmt, code, limit, to_inf, special, is_nan, neg, a, bad_sign, saturate)
    return res


def stochastic_bias(xp: Any, dropped: Any, shift: Any, rand: Any, mode: str,
                    srbits: int | None) -> Any:
    """What a stochastic mode adds to the ``shift`` dropped bits before they are shifted out: a
    carry out of them rounds up.  Every dropped bit (``srbits`` None): the random integer's low
    ``shift`` bits, probability exactly dropped / 2^shift, in every variant.  With n random bits
    r the dropped fraction f is first cut to n bits, in the P3109 draft's words:
    StochasticA (``stochastic``): floor(f 2^n) + r >= 2^n; StochasticB: floor(f 2^(n+1)) + 2r + 1
    >= 2^(n+1); StochasticC: f 2^n rounded to nearest even, + r >= 2^n; ``stochastic_odd``
    (gfloat): nearest, ties to odd.  As a bias: r aligned under the top n dropped bits (or cut
    when fewer bits are dropped), plus the tie rule's half - 1 + parity below them."""
    if srbits is None:
        return rand & ((1 << shift) - 1)
    n = srbits
    if mode == "stochastic_b":
        rand, n = 2 * rand + 1, n + 1                 # r followed by a one: n+1 bits
    below = shift - n                                 # dropped bits under the random ones
    up = xp.clamp_min(below, 0)
    bias = (rand << up) >> xp.clamp_min(-below, 0)
    if mode == "stochastic_c" or mode == "stochastic_odd":
        half = (1 << up) >> 1
        odd = (dropped >> up) & 1                     # the last of the top n dropped bits
        tie = half - 1 + odd if mode == "stochastic_c" else half - odd
        bias = bias + xp.where(below > 0, tie, 0)
    return bias


def inf_input(fmt: Format, saturate: bool | str, inf: int, nan: int, big: Any) -> Any:
    """What an infinite input becomes: inf (unless ``saturate="finite"``), else NaN unless
    saturating, else the largest value."""
    if fmt.inf and saturate != "finite":
        return inf
    return nan if (fmt.has_nan and not saturate) else big


def _codes(xp: Any, fmt: Format, code: Any, limit: Any, to_inf: Any, special: Any,
           is_nan: Any, neg: Any, a: Any, bad_sign: Any, saturate: bool) -> Any:
    """Finish finite code magnitudes: overflow to inf/NaN, special inputs, sign."""
    # 7c.1 overflow to inf (or NaN)
    if to_inf is not None:
        code = xp.where(to_inf, fmt.inf_code if fmt.inf else fmt.nan_code, code)
    # 7c.2 inf and NaN inputs
    inf_in = inf_input(fmt, saturate, fmt.inf_code, fmt.nan_code, None)
    if inf_in is None:                                # None: the largest finite value
        inf_in = limit
    nan_in = fmt.nan_code if fmt.has_nan else 0
    code = xp.where(is_nan, nan_in, xp.where(special, inf_in, code))
    # 7c.3 the sign
    if fmt.is_int:
        if fmt.signed:
            code = xp.where(neg, ((1 << fmt.bits) - code) & ((1 << fmt.bits) - 1), code)
        else:
            code = xp.where(neg, 0, code)
    elif fmt.signed:
        sign = xp.astype(neg, code.dtype) << (fmt.bits - 1)
        if fmt.nan == "fnuz":                         # no -0; the NaN code already has the sign bit
            sign = xp.where((code == 0) | (code == fmt.nan_code), 0, sign)
        code = code | sign
    else:
        if not fmt.zero:                              # E8M0: zero is NaN, as negatives are
            code = xp.where(a == 0, nan_in, code)
        code = xp.where(bad_sign, nan_in, code)       # negative into an unsigned format
    return code


def _values(xp: Any, src: Source, fmt: Format, a: Any, neg: Any, code: Any, to_inf: Any,
            special: Any, is_nan: Any, bad_sign: Any, saturate: bool) -> Any:
    """Decode finite code magnitudes into the source's bits, then specials and sign."""
    M, m = src.mbits, fmt.mbits
    fdt = xp.float64 if src.width == 64 else xp.float32
    # 7v.1 the finite value's bits
    if fmt.is_int:
        val = xp.view(xp.astype(code, fdt), code.dtype)
    else:
        e = code >> m
        frac = code & ((1 << m) - 1)
        val = ((e + (src.bias - fmt.bias)) << M) | (frac << (M - m))
        if fmt.zero:                                  # subnormal codes: one exact multiply
            sub = xp.view(xp.astype(frac, fdt) * (2.0 ** (fmt.emin - m)), code.dtype)
            val = xp.where(e == 0, sub, val)
    # 7v.2 overflow to inf (or NaN)
    inf_bits = (2**src.ebits - 1) << M
    nan_bits = inf_bits | (1 << (M - 1))
    if to_inf is not None:
        val = xp.where(to_inf, inf_bits if fmt.inf else nan_bits, val)
    if not fmt.zero and fmt.has_nan:                  # no zero: 0 is NaN (else the least value)
        val = xp.where(a == 0, nan_bits, val)
    # 7v.3 inf and NaN inputs
    inf_in = inf_input(fmt, saturate, inf_bits, nan_bits, src.float_bits(fmt.max))
    if fmt.is_int and fmt.signed:
        inf_in = inf_in + xp.astype(neg, val.dtype) * (src.float_bits(-fmt.min) - inf_in)
    val = xp.where(is_nan, nan_bits, xp.where(special, inf_in, val))
    # 7v.4 the sign
    if bad_sign is not None:
        val = xp.where(bad_sign, nan_bits if fmt.has_nan else 0, val)
    else:
        sign = xp.astype(neg, val.dtype) << (src.width - 1)
        if fmt.nan == "fnuz":
            sign = xp.where((val == 0) | (val == nan_bits), 0, sign)  # no -0; one unsigned NaN
        elif fmt.is_int:
            sign = xp.where(val == 0, 0, sign)        # no negative zero
        val = val | sign
    return val


def decode_bits(xp: Any, c: Any, src: Source, fmt: Format) -> Any:
    """The source bits (float32 or float64, sign included) of the values of codes ``c``.

    ``c``: integer lanes of the source's width (64-bit codes as their two's complement bit
    pattern).  Integer-only, except one exact multiply for subnormal codes; every code decodes,
    NaN and inf included.  ``src`` must hold every value of ``fmt`` (``Source.holds``).
    """
    # D1. sign and magnitude
    m = fmt.mbits
    fdt = xp.float64 if src.width == 64 else xp.float32
    inf_bits = (2**src.ebits - 1) << src.mbits
    nan_bits = inf_bits | (1 << (src.mbits - 1))
    mag = c
    if fmt.signed:
        mag = c & ((1 << (fmt.bits - 1)) - 1)
        neg = ((c >> (fmt.bits - 1)) & 1) != 0        # the sign bit (the top lane bit included)
    # D2. integers: the value itself
    if fmt.is_int:
        if fmt.signed:
            mag = xp.where(neg, mag - (1 << (fmt.bits - 1)), mag)
        val = xp.view(xp.astype(mag, fdt), c.dtype)
    else:
        # D3. floats: normal codes by moving the fields, subnormal ones by one exact multiply
        e = mag >> m
        f = mag & ((1 << m) - 1)
        normal_bits = ((e - fmt.bias + src.bias) << src.mbits) | (f << (src.mbits - m))
        fbits = xp.astype(f, fdt) * (2.0 ** (fmt.emin - m))
        if fmt.zero:
            val = xp.where(e >= 1, xp.clamp_min(normal_bits, 0), xp.view(fbits, c.dtype))
        else:
            val = normal_bits
        # D4. inf and NaN codes
        if fmt.nan == "ieee":
            top = e == (2**fmt.ebits - 1)
            val = xp.where(top, xp.where(f == 0, inf_bits, nan_bits), val)
        elif fmt.nan == "fn":
            val = xp.where(mag == fmt.nan_code, nan_bits, val)
        if fmt.inf and fmt.nan != "ieee":             # P3109 extended: inf on the top code
            val = xp.where(mag == fmt.inf_code, inf_bits, val)
        # D5. the sign (FNUZ: the negative-zero code is the one NaN)
        if fmt.signed:
            val = val | (xp.astype(neg, c.dtype) << (src.width - 1))
        if fmt.nan == "fnuz":
            val = xp.where(c == fmt.nan_code, nan_bits, val)
    return val
