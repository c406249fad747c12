"""The Numba kernels of :mod:`fpsim.arith.jit` (imported only when that engine runs).

``spec`` tuples (``jit._spec``) carry the accumulator format and mode: fields 0-5 for the
magic-constant rounding to nearest even, 6-15 for the integer algorithm of
:func:`fpsim.rounding.round_bits`.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange
from numba.core import types
from numba.extending import intrinsic


#: numba's options for every kernel: exact IEEE arithmetic (no fastmath, so no FMA
#: contraction), compiled code cached on disk.  (Kept here, with the block sizes: numba's disk
#: cache is invalidated by changes to this file only.)
JIT_OPTIONS = dict(cache=True, fastmath=False, nogil=True)
ROWS = 8            # output rows of a block: each step reuses one row of b ROWS times
COLS = 256          # output columns of a block (sequential): ROWS x COLS float64 sums in L1
PAIR_COLS = 64      # columns of a pairwise block: its tree holds K/2 x PAIR_COLS float64s
_SIGN = -(1 << 63)
_MAG = (1 << 63) - 1
_EXP = 0x7FF << 52
_FRAC = (1 << 52) - 1
_NAN = 0x7FF8 << 48


@intrinsic
def _bits(typingctx, x):  # noqa: ANN001, ANN202 (numba's intrinsic protocol)
    """The bit pattern of a float64 as an int64 (a register move, which vectorises)."""
    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        return builder.bitcast(args[0], context.get_value_type(types.int64))
    return types.int64(types.float64), codegen


@intrinsic
def _float(typingctx, x):  # noqa: ANN001, ANN202
    """The float64 whose bit pattern is an int64."""
    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        return builder.bitcast(args[0], context.get_value_type(types.float64))
    return types.float64(types.int64), codegen


@njit(inline="always", **JIT_OPTIONS)
def _nearest(s, f):
    """``s`` rounded to nearest even in the format of ``f``: (s + C) - C with C = 1.5 *
    2^(k + 52 - m) rounds to multiples of 2^(k - m), ``k`` the binade of ``s`` clamped to the
    format's (below emin: its subnormal spacing); then overflow, NaN and the sign."""
    b = _bits(s)
    sign = b & _SIGN
    c = _float(min(max(b & _EXP, f[0]), f[1]) + f[2])
    r = (s + c) - c
    rb = _bits(r) | sign                      # a result rounded to zero keeps the sign of s
    if abs(r) > f[3]:
        rb = f[4] | sign
    if s != s:
        rb = _NAN | sign
    if f[5] and ((rb & _MAG) == 0 or (rb & _MAG) == _NAN):     # FNUZ: no -0, one NaN
        rb = rb & _MAG
    return _float(rb)


@njit(inline="always", **JIT_OPTIONS)
def _rounded(s, f):
    """``s`` rounded to the format in mode ``f[10]``: round_bits' steps 1-7 (want="value") for
    one float64, formats signed, with a zero, not P3109."""
    m, bias, limit, top, mode = f[6], f[7], f[8], f[9], f[10]
    # 1. split
    b = _bits(s)
    neg = b < 0
    a = b & _MAG
    exp_in = a >> 52
    special = exp_in == 2047
    is_nan = special and (a & _FRAC) != 0
    nz = min(exp_in, 1)
    sig = (a & _FRAC) | (nz << 52)
    # 2. target exponent, bits to drop
    t = min(exp_in + (1 - nz) + (bias - 1023), top + 2)
    tt = max(t, 1)
    shift = min((tt - t) + (52 - m), 62)
    mask = (1 << shift) - 1
    low = sig >> shift
    # 3. the mode's bias before the shift
    if mode == 0:                              # ties to even: half - 1 + the last kept bit
        q = (sig + (mask >> 1) + (low & mask & 1)) >> shift
    elif mode == 1:                            # ties away: half
        q = (sig + (1 << (shift - 1))) >> shift
    elif mode == 3:
        q = (sig + (0 if neg else mask)) >> shift
    elif mode == 4:
        q = (sig + (mask if neg else 0)) >> shift
    else:
        q = low
        if mode == 5 and (sig & mask) != 0:
            q = q | 1
    # 4-6. code, overflow, subnormals
    code = ((tt - 1) << m) + q
    over = code > limit
    to_inf = over and f[12] != 0 and (mode <= 1 or (mode == 3 and not neg)
                                      or (mode == 4 and neg))
    if over:
        code = limit
    if f[14] == 0 and code < (1 << m):
        code = 0
    # 7. value, specials, sign
    e = code >> m
    frac = code & ((1 << m) - 1)
    if e == 0:
        val = _bits(float(frac) * f[15])
    else:
        val = ((e + (1023 - bias)) << 52) | (frac << (52 - m))
    if to_inf:
        val = f[11]
    if is_nan:
        val = _NAN
    elif special:
        val = f[13]
    if f[5] and (val == 0 or val == _NAN):
        return _float(val)
    return _float(val | (b & _SIGN))


@njit(inline="always", **JIT_OPTIONS)
def _sum(x, y, fast, rdown):
    """x + y as the NumPy adder forms it before its one rounding: float64's sum (``fast``), or
    that sum made round-to-odd by TwoSum's error; under rdown -((-x) - y) (IEEE 754 §6.3)."""
    s = -((-x) - y) if rdown else x + y
    if x != x:
        s = x                                 # x86: the first operand's NaN
    if fast:
        return s
    t = s - x
    e = (x - (s - t)) + (y - t)
    if abs(e) > 0:
        sb = _bits(s)
        s = _float((sb + ((_bits(e) ^ sb) >> 63)) | 1)
    return s


@njit(inline="always", **JIT_OPTIONS)
def _add(x, y, fast, rdown, magic, f):
    """x + y rounded once to the accumulator."""
    s = _sum(x, y, fast, rdown)
    return _nearest(s, f) if magic else _rounded(s, f)


@njit(inline="always", **JIT_OPTIONS)
def _step(row, x, brow, n, fast, rdown, magic, f):
    """row[j] = round(row[j] + x * brow[j]) for j < n, with separate loops per variant so that
    each vectorises."""
    if x != x:                                 # x86: a * b is a's NaN when a is NaN
        for j in range(n):
            row[j] = _add(row[j], x, fast, rdown, magic, f)
    elif fast and magic and not rdown:
        for j in range(n):
            acc = row[j]
            s = acc + x * brow[j]
            s = acc if acc != acc else s
            row[j] = _nearest(s, f)
    elif magic:
        for j in range(n):
            row[j] = _nearest(_sum(row[j], x * brow[j], False, rdown), f)
    else:
        for j in range(n):
            row[j] = _rounded(_sum(row[j], x * brow[j], fast, rdown), f)


@njit(inline="always", **JIT_OPTIONS)
def _promote(tot, acc, rows, n, identity, f32):
    """tot = RN_fp32(tot + acc) (the chunk's sum into the FP32 outer sum); acc restarts."""
    for r in range(rows):
        for j in range(n):
            tot[r, j] = _nearest(_sum(tot[r, j], acc[r, j] * 1.0, False, False), f32)
            acc[r, j] = identity


@njit(parallel=True, **JIT_OPTIONS)
def sequential(a3, b3, ia, ib, c, has_init, out, chunk, identity, fast, rdown, magic, f, f32):
    """Sequential (and fma, chunked) sums: blocks of ROWS x COLS outputs, over K."""
    B, M, K, N = len(ia), a3.shape[1], a3.shape[2], b3.shape[2]
    nrb = (M + ROWS - 1) // ROWS
    for task in prange(B * nrb):
        bi = task // nrb
        i0 = (task - bi * nrb) * ROWS
        rows = min(ROWS, M - i0)
        A, Bm, O = a3[ia[bi]], b3[ib[bi]], out[bi]
        acc = np.empty((ROWS, COLS))
        tot = np.empty((ROWS, COLS))
        for j0 in range(0, N, COLS):
            n = min(COLS, N - j0)
            for r in range(rows):
                for j in range(n):
                    start = c[bi, i0 + r, j0 + j] if has_init else identity
                    acc[r, j] = identity if chunk else start
                    tot[r, j] = start if has_init else -0.0
            for k in range(K):
                if chunk and k and k % chunk == 0:
                    _promote(tot, acc, rows, n, identity, f32)
                brow = Bm[k, j0:j0 + n]
                for r in range(rows):
                    _step(acc[r], A[i0 + r, k], brow, n, fast, rdown, magic, f)
            if chunk:
                _promote(tot, acc, rows, n, identity, f32)
            res = tot if chunk else acc
            for r in range(rows):
                for j in range(n):
                    O[i0 + r, j0 + j] = res[r, j]


@njit(inline="always", **JIT_OPTIONS)
def _product(x, y):
    """x * y with the NumPy engine's NaN (the first operand's when both are NaN)."""
    return x if x != x else x * y


@njit(parallel=True, **JIT_OPTIONS)
def pairwise(a3, b3, ia, ib, c, has_init, out, identity, fast1, fast, rdown, magic, f):
    """Balanced trees, level by level as accumulate.pairwise builds them (an odd last term
    moves up as is): level 1 adds two products (``fast1``), the others accumulator values."""
    B, M, K, N = len(ia), a3.shape[1], a3.shape[2], b3.shape[2]
    for task in prange(B * M):
        bi = task // M
        i = task - bi * M
        A, Bm, O = a3[ia[bi]], b3[ib[bi]], out[bi]
        lev = np.empty((K // 2 + 1, PAIR_COLS))
        for j0 in range(0, N, PAIR_COLS):
            n = min(PAIR_COLS, N - j0)
            if K == 1:
                x = A[i, 0]
                for j in range(n):
                    lev[0, j] = _add(identity, _product(x, Bm[0, j0 + j]), fast, rdown,
                                     magic, f)
            else:
                h = K // 2
                for t in range(h):
                    x0, x1 = A[i, 2 * t], A[i, 2 * t + 1]
                    b0, b1 = Bm[2 * t, j0:j0 + n], Bm[2 * t + 1, j0:j0 + n]
                    row = lev[t]
                    for j in range(n):
                        row[j] = _add(_product(x0, b0[j]), _product(x1, b1[j]), fast1, rdown,
                                      magic, f)
                size = h
                if K % 2:
                    x = A[i, K - 1]
                    for j in range(n):
                        lev[h, j] = _product(x, Bm[K - 1, j0 + j])
                    size = h + 1
                while size > 1:
                    h = size // 2
                    for t in range(h):
                        r0, r1, row = lev[2 * t], lev[2 * t + 1], lev[t]
                        for j in range(n):
                            row[j] = _add(r0[j], r1[j], fast, rdown, magic, f)
                    if size % 2:
                        for j in range(n):
                            lev[h, j] = lev[size - 1, j]
                    size = h + size % 2
            for j in range(n):
                s = lev[0, j]
                if has_init:
                    s = _add(c[bi, i, j0 + j], s, False, rdown, magic, f)
                O[i, j0 + j] = s
