"""The Triton twin of ``fpsim.rounding``: ``round_bits`` and its helpers, line for line.

Diff this file against ``fpsim/rounding.py``: the lines are the same algorithm on float32 bits
(the only source the kernels use), with ``xp.clamp_max`` spelled ``tl.minimum``, ``xp.where``
``tl.where`` and ``xp.astype`` ``.to``.  Everything that depends on the format alone is a
compile-time constant: the format arrives as the tuple ``format_spec`` (a
``tl.constexpr``), is rebuilt into the very ``fpsim.Format`` on the host side of the
compiler, and every ``if`` on it is resolved while compiling, so each format gets its own
branch-free code from one source.  ``decode_bits`` is the twin of
``fpsim.rounding.decode_bits``; both files number their steps alike (``# 1.`` .. ``# 7.``,
``# D1.`` .. ``# D5.``).

Deliberate differences, forced by Triton: ``inf_input`` cannot take a tensor, so both twins
pass None for "the largest finite value" and substitute ``limit`` after; the subnormal multiply
ends in ``.to(tl.float32)`` (Triton makes a constant below 2^-126 a float64).
"""

from __future__ import annotations

import triton
import triton.language as tl

from fpsim import rounding
from fpsim.formats import Format


def format_spec(fmt: Format) -> tuple:
    """The fields that define ``fmt`` (not its name): the kernels' compile-time format key."""
    return (fmt.ebits, fmt.mbits, fmt.bias, fmt.inf, fmt.nan, fmt.subnormals, fmt.signed,
            fmt.zero, fmt.p3109)


@triton.constexpr_function
def _format(spec: tuple) -> Format:
    return Format("kernel", *spec)


@triton.constexpr_function
def _f32() -> rounding.Source:
    return rounding.F32


@triton.constexpr_function
def _stochastic(mode: str) -> bool:
    return mode in rounding.STOCHASTIC


_target_bias = triton.constexpr_function(rounding.target_bias)
_inf_input = triton.constexpr_function(rounding.inf_input)
_float_bits = triton.constexpr_function(rounding.F32.float_bits)


@triton.jit
def round_bits(a, neg, FMT: tl.constexpr, MODE: tl.constexpr, SATURATE: tl.constexpr,
               SUBNORMALS: tl.constexpr, rand, WANT: tl.constexpr, SRBITS: tl.constexpr = None):
    """Round float32 magnitude bits ``a`` (int32) with signs ``neg`` to the format ``FMT``.

    Returns int32 codes (``WANT == "code"``) or float32 bits of the rounded values
    (``WANT == "value"``), exactly as ``fpsim.rounding.round_bits`` with ``src = F32``.
    Stochastic modes: ``rand`` holds uniform 30-bit integers (``SRBITS`` None), or the
    ``SRBITS`` random bits of each element (else unused).
    """
    # 1. split the source bits: exponent, significand with its implicit bit, specials
    fmt: tl.constexpr = _format(FMT)
    src: tl.constexpr = _f32()
    M: tl.constexpr = src.mbits
    W: tl.constexpr = src.width
    m: tl.constexpr = fmt.mbits
    top_exp: tl.constexpr = 2**src.ebits - 1
    exp_in = a >> M
    special = exp_in == top_exp                       # inf or NaN input
    is_nan = special & ((a & ((1 << M) - 1)) != 0)
    nz = tl.minimum(exp_in, 1)
    sig = (a & ((1 << M) - 1)) | (nz << M)            # significand with its implicit bit
    e_eff = exp_in + (1 - nz)                         # biased exponent; subnormals count as 1

    # 2. the target exponent and how many low bits to drop
    bias_t: tl.constexpr = _target_bias(fmt)
    t = e_eff + (bias_t - src.bias)                   # target biased exponent, if unbounded
    if ((top_exp + bias_t - src.bias + 2) << m) >= 2 ** (W - 2):
        t = tl.minimum(t, fmt.max_biased_exp + 2)     # keep codes in range; still overflows
    tt = tl.maximum(t, fmt.min_biased_exp)            # subnormal targets keep the least exponent
    shift = (tt - t) + (M - m)                        # low significand bits to drop
    if _stochastic(MODE):
        excess = tl.maximum(shift - (W - 2), 0)       # past W-2 bits: probability exact to 2^-(W-2)
        cut = sig >> excess
        if SRBITS is not None:                        # n bits look at most n+2 down: the rest
            cut = cut | ((cut << excess) != sig).to(sig.dtype)  # as one sticky bit
        sig = cut
        shift = shift - excess
    else:
        shift = tl.minimum(shift, W - 2)              # W-2 > M+1: dropping more changes nothing
    mask = (1 << shift) - 1
    low = sig >> shift                                # kept bits: the last one is "odd"/"even"
    if fmt.p3109 and m == 0:
        low = low + (tt - 1)                          # P3109, P=1: the code's last bit decides

    # 3. round: the mode's bias added before the shift
    if MODE == "rne":
        q = (sig + ((mask >> 1) + (low & mask & 1))) >> shift
    elif MODE == "rna":
        q = (sig + ((mask + 1) >> 1)) >> shift
    elif MODE == "rtz" or MODE == "rto":
        q = sig >> shift
        if MODE == "rto":
            q = q + (((sig & mask) != 0).to(q.dtype) & ~low & 1)  # inexact: make odd
    elif MODE == "rup":
        q = (sig + tl.where(neg, 0, mask)) >> shift
    elif MODE == "rdown":
        q = (sig + tl.where(neg, mask, 0)) >> shift
    else:
        tl.static_assert(_stochastic(MODE), "unknown rounding mode")
        q = (sig + stochastic_bias(sig & mask, shift, rand, MODE, SRBITS)) >> shift

    # 4. the code magnitude: a carry in q moves into the exponent
    code = ((tt - 1) << m) + q
    if not fmt.zero:
        code = tl.maximum(code, 0)                    # no zero: the least value absorbs underflow

    # 5. overflow beyond the largest finite value
    limit = fmt.max_code
    if fmt.is_int and fmt.signed:
        limit = neg.to(code.dtype) + limit            # two's complement reaches -2^mbits
    over = code > limit
    to_inf = None                                     # overflows that leave the finite range
    if (not SATURATE and (fmt.inf or fmt.has_nan) and MODE != "rtz"
            and (MODE != "rto" or fmt.p3109)):       # P3109: round-to-odd overflows
        if MODE == "rup":
            to_inf = over & ~neg
        elif MODE == "rdown":
            to_inf = over & neg
        else:
            to_inf = over
    code = tl.where(over, limit, code)

    # 6. subnormal results become zero when the format or the caller has none
    if fmt.zero and not fmt.is_int and (not SUBNORMALS or not fmt.subnormals):
        code = tl.where(code < (1 << m), 0, code)

    # 7. finish: specials and sign, as codes or as values
    bad_sign = None
    if not fmt.signed:
        bad_sign = neg & ~is_nan                      # negative input, unsigned format
        if fmt.zero and not fmt.is_int:               # P3109: an overflow below 0
            bad_sign = bad_sign & ((code != 0) | special)  # -0, what rounds to 0: +0
            if SATURATE or MODE == "rtz" or MODE == "rup" or (MODE == "rto" and not fmt.p3109):
                zero = bad_sign
                if not SATURATE:
                    zero = bad_sign & ~special        # saturates to 0
                code = tl.where(zero, 0, code)
                special = special & ~zero
                bad_sign = bad_sign & ~zero
    if WANT == "value":
        res = _values(FMT, a, neg, code, to_inf, special, is_nan, bad_sign, SATURATE)
    else:
        res = _codes(FMT, code, limit, to_inf, special, is_nan, neg, a, bad_sign, SATURATE)
    return res


@triton.jit
def stochastic_bias(dropped, shift, rand, MODE: tl.constexpr, SRBITS: tl.constexpr):
    """What a stochastic mode adds to the dropped bits: ``fpsim.rounding.stochastic_bias``."""
    if SRBITS is None:
        bias = rand & ((1 << shift) - 1)
    else:
        n: tl.constexpr = SRBITS + 1 if MODE == "stochastic_b" else SRBITS
        if MODE == "stochastic_b":
            rand = 2 * rand + 1                       # r followed by a one: n+1 bits
        below = shift - n                             # dropped bits under the random ones
        up = tl.maximum(below, 0)
        bias = (rand << up) >> tl.maximum(-below, 0)
        if MODE == "stochastic_c" or MODE == "stochastic_odd":
            half = (1 << up) >> 1
            odd = (dropped >> up) & 1                 # the last of the top n dropped bits
            if MODE == "stochastic_c":
                tie = half - 1 + odd
            else:
                tie = half - odd
            bias = bias + tl.where(below > 0, tie, 0)
    return bias


@triton.jit
def _codes(FMT: tl.constexpr, code, limit, to_inf, special, is_nan, neg, a, bad_sign,
           SATURATE: tl.constexpr):
    """Finish finite code magnitudes: overflow to inf/NaN, special inputs, sign."""
    fmt: tl.constexpr = _format(FMT)
    # 7c.1 overflow to inf (or NaN)
    if to_inf is not None:
        code = tl.where(to_inf, fmt.inf_code if fmt.inf else fmt.nan_code, code)
    # 7c.2 inf and NaN inputs
    inf_in = _inf_input(fmt, SATURATE, fmt.inf_code, fmt.nan_code, None)
    if inf_in is None:                                # None: the largest finite value
        inf_in = limit
    nan_in: tl.constexpr = fmt.nan_code if fmt.has_nan else 0
    code = tl.where(is_nan, nan_in, tl.where(special, inf_in, code))
    # 7c.3 the sign
    if fmt.is_int:
        if fmt.signed:
            code = tl.where(neg, ((1 << fmt.bits) - code) & ((1 << fmt.bits) - 1), code)
        else:
            code = tl.where(neg, 0, code)
    elif fmt.signed:
        sign = neg.to(code.dtype) << (fmt.bits - 1)
        if fmt.nan == "fnuz":                         # no -0; the NaN code already has the sign bit
            sign = tl.where((code == 0) | (code == fmt.nan_code), 0, sign)
        code = code | sign
    else:
        if not fmt.zero:                              # E8M0: zero is NaN, as negatives are
            code = tl.where(a == 0, nan_in, code)
        code = tl.where(bad_sign, nan_in, code)       # negative into an unsigned format
    return code


@triton.jit
def _values(FMT: tl.constexpr, a, neg, code, to_inf, special, is_nan, bad_sign,
            SATURATE: tl.constexpr):
    """Decode finite code magnitudes into the source's bits, then specials and sign."""
    fmt: tl.constexpr = _format(FMT)
    src: tl.constexpr = _f32()
    M: tl.constexpr = src.mbits
    m: tl.constexpr = fmt.mbits
    # 7v.1 the finite value's bits
    if fmt.is_int:
        val = code.to(tl.float32).to(code.dtype, bitcast=True)
    else:
        e = code >> m
        frac = code & ((1 << m) - 1)
        val = ((e + (src.bias - fmt.bias)) << M) | (frac << (M - m))
        if fmt.zero:                                  # subnormal codes: one exact multiply
            sub = (frac.to(tl.float32) * (2.0 ** (fmt.emin - m))).to(tl.float32)
            val = tl.where(e == 0, sub.to(code.dtype, bitcast=True), val)
    # 7v.2 overflow to inf (or NaN)
    inf_bits: tl.constexpr = (2**src.ebits - 1) << M
    nan_bits: tl.constexpr = inf_bits | (1 << (M - 1))
    if to_inf is not None:
        val = tl.where(to_inf, inf_bits if fmt.inf else nan_bits, val)
    if not fmt.zero and fmt.has_nan:                  # no zero: 0 is NaN (else the least value)
        val = tl.where(a == 0, nan_bits, val)
    # 7v.3 inf and NaN inputs
    inf_in = _inf_input(fmt, SATURATE, inf_bits, nan_bits, _float_bits(fmt.max))
    if fmt.is_int and fmt.signed:
        inf_in = inf_in + neg.to(val.dtype) * (_float_bits(-fmt.min) - inf_in)
    val = tl.where(is_nan, nan_bits, tl.where(special, inf_in, val))
    # 7v.4 the sign
    if bad_sign is not None:
        val = tl.where(bad_sign, nan_bits if fmt.has_nan else 0, val)
    else:
        sign = neg.to(val.dtype) << (src.width - 1)
        if fmt.nan == "fnuz":
            sign = tl.where((val == 0) | (val == nan_bits), 0, sign)  # no -0; one unsigned NaN
        elif fmt.is_int:
            sign = tl.where(val == 0, 0, sign)        # no negative zero
        val = val | sign
    return val


@triton.jit
def decode_bits(c, FMT: tl.constexpr):
    """Float32 bits (int32) of the int32 codes ``c``: the twin of ``fpsim.rounding.decode_bits``
    with ``src = F32``."""
    # D1. sign and magnitude
    fmt: tl.constexpr = _format(FMT)
    src: tl.constexpr = _f32()
    m: tl.constexpr = fmt.mbits
    inf_bits: tl.constexpr = (2**src.ebits - 1) << src.mbits
    nan_bits: tl.constexpr = inf_bits | (1 << (src.mbits - 1))
    mag = c
    if fmt.signed:
        mag = c & ((1 << (fmt.bits - 1)) - 1)
        neg = ((c >> (fmt.bits - 1)) & 1) != 0        # the sign bit (the top lane bit included)
    # D2. integers: the value itself
    if fmt.is_int:
        if fmt.signed:
            mag = tl.where(neg, mag - (1 << (fmt.bits - 1)), mag)
        val = mag.to(tl.float32).to(tl.int32, bitcast=True)
    else:
        # D3. floats: normal codes by moving the fields, subnormal ones by one exact multiply
        e = mag >> m
        f = mag & ((1 << m) - 1)
        normal_bits = ((e - fmt.bias + src.bias) << src.mbits) | (f << (src.mbits - m))
        fbits = (f.to(tl.float32) * (2.0 ** (fmt.emin - m))).to(tl.float32)
        if fmt.zero:
            val = tl.where(e >= 1, tl.maximum(normal_bits, 0), fbits.to(tl.int32, bitcast=True))
        else:
            val = normal_bits
        # D4. inf and NaN codes
        if fmt.nan == "ieee":
            top = e == (2**fmt.ebits - 1)
            val = tl.where(top, tl.where(f == 0, inf_bits, nan_bits), val)
        elif fmt.nan == "fn":
            val = tl.where(mag == fmt.nan_code, nan_bits, val)
        if fmt.inf and fmt.nan != "ieee":             # P3109 extended: inf on the top code
            val = tl.where(mag == fmt.inf_code, inf_bits, val)
        # D5. the sign (FNUZ: the negative-zero code is the one NaN)
        if fmt.signed:
            val = val | (neg.to(tl.int32) << (src.width - 1))
        if fmt.nan == "fnuz":
            val = tl.where(c == fmt.nan_code, nan_bits, val)
    return val
