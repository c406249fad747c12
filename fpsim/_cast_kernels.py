"""Numba kernels of the casts in ``fpsim.convert`` (imported only when numba is there).

Each is a NumPy sequence of that module in one compiled pass over the elements, the same
operations in the same order; tests compare the two bit for bit.
``round_to_odd_float32`` is ``convert._round_to_odd_float32`` (NumPy needs about eight
passes, or a nearest cast and a midpoint test), branch-free so that LLVM vectorises it;
``table_lookup`` is ``convert._table_plan``'s index and gather (four passes and a take);
``nearest_float32_field`` rounds to nearest into formats that are float32 with fewer
fraction bits (bf16, tf32), where round_bits' integer algorithm reduces to its bias-add step.
``gather_rows`` is not a cast: it builds a convolution's patch rows (im2col) for
``fpsim.emulation.conv`` in one pass, where torch needs one strided copy per kernel offset.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_ONE = np.uint32(1)
_MINUS_ONE = np.uint32(0xFFFFFFFF)
_ZERO = np.uint32(0)


@njit(inline="always", fastmath=False, nogil=True)
def _odd_bits(xi):  # noqa: ANN001, ANN202
    """One float (float64 or float32) rounded to odd into float32, as its uint32 bits (see
    ``round_to_odd_float32``; a float32 is returned as it is)."""
    f = np.float32(xi)
    back = np.float64(f)
    b = np.uint32(f.view(np.int32))
    fix = (back != xi) & ((b & _ONE) == _ZERO) & (xi == xi)
    step = _MINUS_ONE if abs(back) > abs(xi) else _ONE
    return np.uint32(b + (step if fix else _ZERO))     # numba adds uint32 in 64 bits


@njit(cache=True, fastmath=False, nogil=True)
def round_to_odd_float32(x, u):  # noqa: ANN001, ANN201 (numba infers the array types)
    """Float64 ``x`` rounded to odd into float32, written as bits into uint32 ``u``: the
    nearest-even cast, then one ulp towards ``x`` wherever it was inexact and landed on an
    even significand (beyond float32's range inf moves back to the largest float32, below it
    0 up to the least subnormal); NaN stays the cast's quiet NaN."""
    for i in range(x.size):
        u[i] = _odd_bits(x[i])


@njit(cache=True, fastmath=False, nogil=True)
def table_lookup(u, table, shift, below, out):  # noqa: ANN001, ANN201
    """``out[i] = table[index]`` with ``convert._table_plan``'s index of the source bits
    ``u[i]``: ``(((u & below) + below) | u) >> shift``, the high bits and one sticky bit."""
    for i in range(u.size):
        v = u[i]
        out[i] = table[(((v & below) + below) | v) >> shift]


@njit(cache=True, fastmath=False, nogil=True)
def nearest_float32_field(x, out, drop, away, nan_code, code):  # noqa: ANN001, ANN201
    """Float32 or float64 ``x`` rounded to nearest (ties to even, or ``away``) into a format
    with float32's sign, exponent field and bias and ``23 - drop`` fraction bits (bf16, tf32):
    float64 first rounded to odd into float32 as ``round_to_odd_float32``, then
    round_bits' step 3 with a constant shift, on the magnitude bits, is all there is (a carry
    moves into the exponent, the top one into inf; subnormals share float32's grid).  NaN:
    ``nan_code`` with the sign.  ``code``: codes, else the values (as float32, then ``out``'s
    dtype)."""
    half = np.uint32(1 << (drop - 1))
    for i in range(x.size):
        b = _odd_bits(x[i])
        sign = b >> np.uint32(31)
        mag = b & np.uint32(0x7FFFFFFF)
        bias = half if away else half - _ONE + ((mag >> drop) & _ONE)
        q = (mag + bias) >> drop
        if mag > np.uint32(0x7F800000):
            q = np.uint32(nan_code)
        if code:
            out[i] = q | (sign << np.uint32(31 - drop))
        else:
            out[i] = np.uint32((q << drop) | (sign << np.uint32(31))).view(np.float32)


@njit(cache=True, fastmath=False, nogil=True)
def scaled_table_quantize(x, scale, table, shift, below, values, out):  # noqa: ANN001, ANN201
    """One pass of ``fpsim.scaled_quantize``'s element step for one float64 ``scale``:
    ``t = float64(x[i]) / scale`` rounded by ``table`` (``convert._table_plan``'s float64 index
    and gather, as ``table_lookup``), decoded by ``values`` (every code's float64 value),
    times ``scale``, written in ``out``'s dtype (one rounding, as a cast)."""
    for i in range(x.size):
        v = np.float64(np.float64(x[i]) / scale).view(np.uint64)
        out[i] = values[table[(((v & below) + below) | v) >> shift]] * scale


@njit(cache=True, fastmath=False, nogil=True)
def block_dequantize(codes, table, factor, block, out):  # noqa: ANN001, ANN201
    """``out[r, j] = table[codes[r, j]] * factor[r, j // block]``: ``fpsim.mx.dequantize``
    of blocks along the last axis (``table``: every element code's value, ``factor``: each
    block's multiplier, both in ``out``'s dtype) in one pass, the same multiply."""
    n = codes.shape[1]
    for r in range(codes.shape[0]):
        for b in range(factor.shape[1]):
            f = factor[r, b]
            for j in range(b * block, min(n, (b + 1) * block)):
                out[r, j] = table[codes[r, j]] * f


@njit(cache=True, fastmath=False, nogil=True)
def block_amax_bits(x, block, out):  # noqa: ANN001, ANN201
    """``out[r, b]``: the largest magnitude bits (``bits & 0x7FFFFFFF``, 0 for an empty
    block) of float32 ``x[r]``'s block ``b`` of ``block`` elements (NaN above inf, as
    ``fpsim.blockrules.row_amax_bits`` orders them)."""
    n = x.shape[1]
    for r in range(x.shape[0]):
        for b in range(out.shape[1]):
            m = np.int32(0)
            for j in range(b * block, min(n, (b + 1) * block)):
                m = max(m, np.float32(x[r, j]).view(np.int32) & np.int32(0x7FFFFFFF))
            out[r, b] = m


@njit(cache=True, fastmath=False, nogil=True)
def block_scaled_quantize(x, block, factor, div, nan, scale, table, shift, below, values,
                          out):  # noqa: ANN001, ANN201
    """Block-format elements in one pass: float32 ``x[r, j]`` times its block's ``factor`` (MX)
    or divided by it (``div``: NVFP4), one float32 operation (0 in a ``nan`` block), rounded by
    ``table`` (``convert._table_plan``'s float32 index and gather, as ``table_lookup``),
    decoded by ``values`` and times the block's ``scale`` value: ``mx.quantize`` then
    ``mx.dequantize`` of blocks along the last axis."""
    n = x.shape[1]
    for r in range(x.shape[0]):
        for b in range(factor.shape[1]):
            f, s, skip = factor[r, b], scale[r, b], nan[r, b]
            for j in range(b * block, min(n, (b + 1) * block)):
                v = np.float32(x[r, j] / f if div else x[r, j] * f).view(np.uint32)
                if skip:
                    v = _ZERO
                out[r, j] = values[table[(((v & below) + below) | v) >> shift]] * s


@njit(cache=True, fastmath=False, nogil=True)
def gather_rows(src, base, off, out):  # noqa: ANN001, ANN201
    """``out[r, k] = src[base[r] + off[k]]``: flat ``src`` read at a row offset plus a column
    offset (a convolution's patch rows: ``base`` each output position's corner, ``off`` each
    reduction index's channel and kernel offset)."""
    for r in range(base.size):
        b = base[r]
        for k in range(off.size):
            out[r, k] = src[b + off[k]]
