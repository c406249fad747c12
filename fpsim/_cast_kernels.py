"""Numba kernels of the casts in :mod:`fpsim.convert` (imported only when numba is there).

Each is a NumPy sequence of that module in one compiled pass over the elements, the same
operations in the same order; tests compare the two bit for bit.
:func:`round_to_odd_float32` is ``convert._round_to_odd_float32`` (NumPy needs about eight
passes, or a nearest cast and a midpoint test), branch-free so that LLVM vectorises it;
:func:`table_lookup` is ``convert._table_plan``'s index and gather (four passes and a take).
"""

from __future__ import annotations

import numpy as np
from numba import njit

_ONE = np.uint32(1)
_MINUS_ONE = np.uint32(0xFFFFFFFF)
_ZERO = np.uint32(0)


@njit(cache=True, fastmath=False, nogil=True)
def round_to_odd_float32(x, u):  # noqa: ANN001, ANN201 (numba infers the array types)
    """Float64 ``x`` rounded to odd into float32, written as bits into uint32 ``u``: the
    nearest-even cast, then one ulp towards ``x`` wherever it was inexact and landed on an
    even significand (beyond float32's range inf moves back to the largest float32, below it
    0 up to the least subnormal); NaN stays the cast's quiet NaN."""
    for i in range(x.size):
        xi = x[i]
        f = np.float32(xi)
        back = np.float64(f)
        b = np.uint32(f.view(np.int32))
        fix = (back != xi) & ((b & _ONE) == _ZERO) & (xi == xi)
        step = _MINUS_ONE if abs(back) > abs(xi) else _ONE
        u[i] = b + (step if fix else _ZERO)


@njit(cache=True, fastmath=False, nogil=True)
def table_lookup(u, table, shift, below, out):  # noqa: ANN001, ANN201
    """``out[i] = table[index]`` with ``convert._table_plan``'s index of the source bits
    ``u[i]``: ``(((u & below) + below) | u) >> shift``, the high bits and one sticky bit."""
    for i in range(u.size):
        v = u[i]
        out[i] = table[(((v & below) + below) | v) >> shift]
