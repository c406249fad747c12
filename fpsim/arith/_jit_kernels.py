"""The Numba kernels of ``fpsim.arith.jit`` (imported only when that engine runs).

``spec`` tuples (``jit._spec``) carry the accumulator format and mode: fields 0-5 for the
magic-constant rounding to nearest even, 6-15 for the integer algorithm of
``fpsim.rounding.round_bits``.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import types
from numba.extending import intrinsic


#: numba's options for every kernel: exact IEEE arithmetic (no fastmath, so no FMA
#: contraction), compiled code cached on disk.  (Kept here, with the block sizes: numba's disk
#: cache is invalidated by changes to this file only.)
JIT_OPTIONS = dict(cache=True, fastmath=False, nogil=True)    # nogil: one Python thread a core
ROWS = 8            # output rows of a block: each step reuses one row of b ROWS times
COLS = 1024         # output columns of a block (sequential): long inner loops measured fastest
PAIR_COLS = 256     # columns of a pairwise block: its stack holds log2(K) rows of them
_SIGN = -(1 << 63)
_MAG = (1 << 63) - 1
_EXP = 0x7FF << 52
_FRAC = (1 << 52) - 1
_NAN = 0x7FF8 << 48
WIDE = '"prefer-vector-width"="512"'     # the LLVM function attribute ``_wide`` adds


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


@intrinsic
def _wide(typingctx):  # noqa: ANN001, ANN202
    """Let LLVM vectorise the calling kernel with the host's widest registers: the function
    attribute of clang's -mprefer-vector-width=512.  x86's tuning otherwise keeps AVX-512
    hosts at 256 bits; 512 measured 1.17-1.32x on the sequential and pairwise kernels
    (docs/speed.md).  Each lane's arithmetic, so every bit, is unchanged; other targets
    ignore the attribute.  llvmlite checks attribute names against a list without string
    attributes, so the set is added to directly (test_jit_matmul checks the IR)."""
    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        set.add(builder.function.attributes, WIDE)
        return context.get_dummy_value()
    return types.none(), codegen


@intrinsic
def _fmuladd(typingctx, x, y, z):  # noqa: ANN001, ANN202
    """x * y + z as LLVM's ``fmuladd``: one fused multiply-add where the host has one, else a
    multiply and an add.  Called only where x * y is exact in float64 (the engine's products,
    ``Profile.fits``), so that both give the bits of z + x * y: one instruction fewer in the
    loops."""
    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        f64 = ir.DoubleType()
        fn = builder.module.declare_intrinsic("llvm.fmuladd", [f64],
                                              ir.FunctionType(f64, [f64, f64, f64]))
        return builder.call(fn, args)
    return types.float64(types.float64, types.float64, types.float64), codegen


@njit(inline="always", **JIT_OPTIONS)
def _nearest(s, f):
    """``s`` rounded to nearest even in the format of ``f``: (s + C) - C with C = 1.5 *
    2^(k + 52 - m) rounds to multiples of 2^(k - m), ``k`` the binade of ``s`` clamped to the
    format's (below emin: its subnormal spacing); then overflow and the sign.  NaN payloads
    and FNUZ's zeros are left to ``finish`` (a zero's sign never changes a later sum that
    is not zero, nor a NaN's payload anything but the final NaN)."""
    b = _bits(s)
    sign = b & _SIGN
    c = _float(min(max(b & _EXP, f[0]), f[1]) + f[2])
    r = (s + c) - c
    rb = _bits(r) | sign                      # a result rounded to zero keeps the sign of s
    if abs(r) > f[3]:
        rb = f[4] | sign
    return _float(rb)


@njit(inline="always", **JIT_OPTIONS)
def _nearest_within(s, f):
    """``_nearest`` of an ``s`` at most the format's largest value in magnitude (``within``:
    the caller's bound, ``jit.bounded``): its binade needs no clamp at the top and the result
    cannot overflow, so both steps go (a third of the FP16 loop's instructions; what that
    gains is docs/speed.md's bound table)."""
    b = _bits(s)
    c = _float(max(b & _EXP, f[0]) + f[2])
    r = (s + c) - c
    return _float(_bits(r) | (b & _SIGN))


@njit(inline="always", **JIT_OPTIONS)
def _near(s, f, within):
    """``_nearest_within`` if ``within``, else ``_nearest`` (``within`` is the same for a
    whole loop, which LLVM then compiles once for each)."""
    return _nearest_within(s, f) if within else _nearest(s, f)


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
    if f[13] == 0 and code < (1 << m):
        code = 0
    # 7. value, specials, sign
    e = code >> m
    frac = code & ((1 << m) - 1)
    if e == 0:
        val = _bits(float(frac) * f[14])
    else:
        val = ((e + (1023 - bias)) << 52) | (frac << (52 - m))
    if to_inf:
        val = f[11]
    if is_nan:
        val = _NAN
    elif special:                              # an input inf: what overflow gives
        val = f[4]
    if f[5] and (val == 0 or val == _NAN):
        return _float(val)
    return _float(val | (b & _SIGN))


@njit(inline="always", **JIT_OPTIONS)
def _sum(x, y, fast, rdown, nan):
    """x + y as the NumPy adder forms it before its one rounding: float64's sum (``fast``), or
    that sum made round-to-odd by TwoSum's error; under rdown -((-x) - y) (IEEE 754 §6.3).
    ``nan``: NaNs may meet, and x86 (NumPy) returns the first operand's, so that is chosen
    explicitly (LLVM may swap the operands of an add; the choice costs a third of the speed)."""
    s = -((-x) - y) if rdown else x + y
    if nan and x != x:
        s = x
    if fast:
        return s
    t = s - x
    e = (x - (s - t)) + (y - t)
    if abs(e) > 0:
        sb = _bits(s)
        s = _float((sb + ((_bits(e) ^ sb) >> 63)) | 1)
    return s


@njit(inline="always", **JIT_OPTIONS)
def _madd(s, x, y, fast, rdown):
    """``_sum(s, x * y, fast, rdown, False)`` (finite operands): one fused multiply-add where
    that is float64's own sum (``fast``, not ``rdown``), x * y being exact."""
    if fast and not rdown:
        return _fmuladd(x, y, s)
    return _sum(s, x * y, fast, rdown, False)


@njit(inline="always", **JIT_OPTIONS)
def _add(x, y, fast, rdown, magic, f):
    """x + y rounded once to the accumulator, NaNs of either operand possible."""
    s = _sum(x, y, fast, rdown, True)
    return _nearest(s, f) if magic else _rounded(s, f)


@njit(inline="always", **JIT_OPTIONS)
def _product(x, y, nan):
    """x * y with the NumPy engine's NaN (x86: the first operand's when both are NaN)."""
    return x if nan and x != x else x * y


@njit(inline="always", **JIT_OPTIONS)
def _step(row, x, brow, n, finite, fast, rdown, magic, within, f):
    """row[j] = round(row[j] + x * brow[j]) for j < n; a loop per variant, each vectorised.
    ``finite``: no NaN or inf in the operands, so no two NaNs can meet; ``within``: no
    partial sum beyond the format's largest value (``_nearest_within``)."""
    if x != x:                                 # a * b is a's NaN
        for j in range(n):
            row[j] = _add(row[j], x, fast, rdown, magic, f)
    elif finite and fast and magic and not rdown:
        for j in range(n):
            row[j] = _near(_madd(row[j], x, brow[j], True, False), f, within)
    elif finite and magic:
        for j in range(n):
            row[j] = _near(_sum(row[j], x * brow[j], False, rdown, False), f, within)
    else:
        for j in range(n):
            row[j] = _rounded(_sum(row[j], x * brow[j], fast, rdown, True), f)


@njit(inline="always", **JIT_OPTIONS)
def _pair(dst, x, y, n, finite, fast, rdown, magic, within, f):
    """dst[j] = round(x[j] + y[j]) for j < n (dst may be x); variants as in ``_step``."""
    if finite and magic and fast and not rdown:
        for j in range(n):
            dst[j] = _near(x[j] + y[j], f, within)
    elif finite and magic:
        for j in range(n):
            dst[j] = _near(_sum(x[j], y[j], False, rdown, False), f, within)
    else:
        for j in range(n):
            dst[j] = _add(x[j], y[j], fast, rdown, magic, f)


@njit(inline="always", **JIT_OPTIONS)
def _count(sw, pk, j, y, old, new):
    """accumulate.counted for one output: a non-zero ``y`` swallowed (``new == old``, ``old``
    finite) adds one to ``sw[j]``; ``pk[j]`` keeps the largest ``|new|`` (NaN aside).  Without
    a branch, so that the loops around it vectorise."""
    _swamp(sw, j, y, old, new)
    a = abs(new)
    pk[j] = a if a > pk[j] else pk[j]


@njit(inline="always", **JIT_OPTIONS)
def _swamp(sw, j, y, old, new):
    """``_count``'s swamped additions alone."""
    sw[j] += (y != 0) & (new == old) & (abs(old) < np.inf)


@njit(inline="always", **JIT_OPTIONS)
def _promote(tot, acc, rows, n, identity, fnuz, f32, sw, pk, stats):
    """tot = RN_fp32(tot + acc) (the chunk's sum into the FP32 outer sum); acc restarts.
    ``fnuz``: the chunk's zeros and NaNs are unsigned (the accumulator has no -0 and one NaN;
    ``_nearest`` leaves that to the end, which comes here).  ``stats``: counted in the
    blocks ``sw`` / ``pk`` (``_count``)."""
    for r in range(rows):
        for j in range(n):
            v = acc[r, j] * 1.0
            if fnuz and (v == 0 or v != v):
                v = abs(v)
            old = tot[r, j]
            tot[r, j] = _nearest(_sum(old, v, False, False, True), f32)
            if stats:
                _count(sw[r], pk[r], j, v, old, tot[r, j])
            acc[r, j] = identity


@njit(inline="always", **JIT_OPTIONS)
def _tally(sw, pk, j, old, new, nonzero):
    """``_count`` where ``old`` is known finite (see ``_step_counted``) and ``nonzero`` says
    whether the addend is: one comparison and one maximum."""
    sw[j] += (new == old) & nonzero
    a = abs(new)
    pk[j] = a if a > pk[j] else pk[j]


@njit(inline="always", **JIT_OPTIONS)
def _counted(sw, pk, j, y, old, new, peak):
    """``_count``, or without ``peak`` its swamped additions alone (``_swamp``)."""
    if peak:
        _count(sw, pk, j, y, old, new)
    else:
        _swamp(sw, j, y, old, new)


@njit(inline="always", **JIT_OPTIONS)
def _quick(row, x, brow, n, fast, rdown, f, sw, pk, peak, zeros, within):
    """``_step_counted``'s finite cases where they count by ``_tally`` (with ``peak``; else by
    its comparison alone).  ``zeros``: an addend may be zero (``x`` is, or ``brow`` holds
    one), so each is tested, as a sum that a zero leaves unchanged is not swamped; ``within``
    as in ``_step``.  A loop for each, as a branch inside one would not vectorise."""
    if zeros and peak:
        for j in range(n):
            old = row[j]
            p = x * brow[j]
            row[j] = _near(_sum(old, p, fast, rdown, False), f, within)
            _tally(sw, pk, j, old, row[j], p != 0)
    elif zeros:
        for j in range(n):
            old = row[j]
            p = x * brow[j]
            row[j] = _near(_sum(old, p, fast, rdown, False), f, within)
            sw[j] += (row[j] == old) & (p != 0)
    elif peak:
        for j in range(n):
            old = row[j]
            row[j] = _near(_madd(old, x, brow[j], fast, rdown), f, within)
            _tally(sw, pk, j, old, row[j], True)
    else:
        for j in range(n):
            old = row[j]
            row[j] = _near(_madd(old, x, brow[j], fast, rdown), f, within)
            sw[j] += row[j] == old


@njit(inline="always", **JIT_OPTIONS)
def _quick_within(row, x, brow, n, fast, rdown, f, sw, pk, peak, zeros, within):
    """``_quick`` with ``within`` a constant in each copy: with ``within`` a value inside
    them LLVM left the counted loops scalar (capture's swamped count 1.1-1.3x faster so)."""
    if within:
        _quick(row, x, brow, n, fast, rdown, f, sw, pk, peak, zeros, True)
    else:
        _quick(row, x, brow, n, fast, rdown, f, sw, pk, peak, zeros, False)


@njit(inline="always", **JIT_OPTIONS)
def _step_counted(row, x, brow, n, finite, fast, rdown, magic, within, f, sw, pk, careful,
                  zeros, peak):
    """``_step`` (its two finite cases, else its general form: the same bits) with the
    statistics of each addition (``peak``: the largest sums too, else the swamped additions
    alone).  Unless ``careful`` (the caller's: the block is run again because a partial sum
    overflowed), a finite case counts by ``_quick``: its products are exact, and a partial
    sum is finite until it overflows; ``zeros``: ``brow`` holds a zero."""
    quick = not careful
    zeros = zeros or x == 0
    if finite and fast and magic and not rdown:
        if quick:
            _quick_within(row, x, brow, n, True, False, f, sw, pk, peak, zeros, within)
            return
        for j in range(n):
            old = row[j]
            p = x * brow[j]
            row[j] = _nearest(old + p, f)
            _counted(sw, pk, j, p, old, row[j], peak)
        return
    if finite and magic:
        if quick:
            _quick_within(row, x, brow, n, False, rdown, f, sw, pk, peak, zeros, within)
            return
        for j in range(n):
            old = row[j]
            p = x * brow[j]
            row[j] = _nearest(_sum(old, p, False, rdown, False), f)
            _counted(sw, pk, j, p, old, row[j], peak)
        return
    for j in range(n):
        old = row[j]
        p = _product(x, brow[j], True)
        row[j] = _add(old, p, fast, rdown, magic, f)
        _counted(sw, pk, j, p, old, row[j], peak)


@njit(inline="always", **JIT_OPTIONS)
def _sweep(A, Bm, acc, tot, bsw, bpk, i0, j0, rows, n, K, chunk, identity, finite, fast, rdown,
           magic, within, f, f32, stats, careful, peak):
    """A block's sums over the K products (with ``chunk``: promoted every chunk); with
    ``stats`` counted (``_step_counted``; ``careful``: every addition checked; ``peak``: the
    largest sums too)."""
    for k in range(K):
        if chunk > 0 and k > 0 and k % chunk == 0:
            _promote(tot, acc, rows, n, identity, f[5] != 0, f32, bsw, bpk, stats)
        brow = Bm[k, j0:j0 + n]
        if stats:
            zeros = 0
            if not careful:
                for j in range(n):
                    zeros += brow[j] == 0
            for r in range(rows):
                _step_counted(acc[r], A[i0 + r, k], brow, n, finite, fast, rdown, magic,
                              within, f, bsw[r], bpk[r], careful, zeros > 0, peak)
        else:
            for r in range(rows):
                _step(acc[r], A[i0 + r, k], brow, n, finite, fast, rdown, magic, within, f)


@njit(inline="always", **JIT_OPTIONS)
def _overflowed(bpk, acc, tot, rows, n, chunk, peak):
    """Whether a partial sum of the block may have reached inf: with ``peak`` its largest
    magnitude is inf; without, a sum is not finite (on finite operands a sum that reached inf
    stays inf or becomes NaN, and with ``chunk`` makes the outer sum so: the last chunk's is
    in ``acc``, the others' in ``tot``)."""
    hit = 0
    for r in range(rows):
        for j in range(n):
            if peak:
                hit += bpk[r, j] == np.inf
            else:
                hit += not (abs(acc[r, j]) < np.inf and (chunk == 0 or abs(tot[r, j]) < np.inf))
    return hit > 0


@njit(inline="always", **JIT_OPTIONS)
def _block_out(tot, acc, bsw, bpk, Ob, sw, pk, bi, i0, j0, rows, n, identity, fnuz, f32,
               chunk, stats):
    """A block's results (with ``chunk``: its last chunk promoted, the outer sums) and
    statistics into the result's arrays."""
    if chunk:
        _promote(tot, acc, rows, n, identity, fnuz, f32, bsw, bpk, stats)
    res = tot if chunk else acc
    for r in range(rows):
        for j in range(n):
            Ob[i0 + r, j0 + j] = res[r, j]
            if stats:
                sw[bi, i0 + r, j0 + j] = bsw[r, j]
                pk[bi, i0 + r, j0 + j] = bpk[r, j]


@njit(inline="always", **JIT_OPTIONS)
def _task(task, nrb, M):
    """Batch entry, first row and row count of block ``task`` (``nrb`` blocks per entry)."""
    bi = task // nrb
    i0 = (task - bi * nrb) * ROWS
    return bi, i0, min(ROWS, M - i0)


@njit(inline="always", **JIT_OPTIONS)
def _start(acc, tot, bsw, bpk, c, has_init, bi, i0, j0, rows, n, identity, chunk):
    """A block's sums at their start: C (else ``identity``) in ``acc``, or with ``chunk`` in
    the outer sum ``tot`` (else -0); statistics zero."""
    for r in range(rows):
        for j in range(n):
            start = c[bi, i0 + r, j0 + j] if has_init else identity
            acc[r, j] = identity if chunk else start
            tot[r, j] = start if has_init else -0.0
            bsw[r, j] = 0
            bpk[r, j] = 0.0


@njit(**JIT_OPTIONS)
def sequential(a3, b3, ia, ib, c, has_init, out, chunk, identity, finite, fast, rdown, magic,
               within, f, f32, sw, pk, stats, peak, first, last):
    """Sequential (and fma, chunked) sums: blocks of ROWS x COLS outputs, over K; the blocks
    of rows first..last-1 (counted over the batch), so that threads share the work; with
    ``stats``, accumulate.counted's swamped additions and (with ``peak``; else ``pk`` is left
    undefined) largest sums in ``sw`` and ``pk``."""
    _wide()
    M, K, N = a3.shape[1], a3.shape[2], b3.shape[2]
    nrb = (M + ROWS - 1) // ROWS
    for task in range(first, last):
        bi, i0, rows = _task(task, nrb, M)
        A, Bm, Ob = a3[ia[bi]], b3[ib[bi]], out[bi]
        acc = np.empty((ROWS, COLS))
        tot = np.empty((ROWS, COLS))
        bsw = np.zeros((ROWS, COLS), np.int32)     # counts up to K < 2^31: narrower lanes
        bpk = np.zeros((ROWS, COLS))
        for j0 in range(0, N, COLS):
            n = min(COLS, N - j0)
            _start(acc, tot, bsw, bpk, c, has_init, bi, i0, j0, rows, n, identity, chunk)
            _sweep(A, Bm, acc, tot, bsw, bpk, i0, j0, rows, n, K, chunk, identity, finite, fast,
                   rdown, magic, within, f, f32, stats, False, peak)
            # the quick counts are wrong after inf
            if stats and _overflowed(bpk, acc, tot, rows, n, chunk, peak):
                _start(acc, tot, bsw, bpk, c, has_init, bi, i0, j0, rows, n, identity, chunk)
                _sweep(A, Bm, acc, tot, bsw, bpk, i0, j0, rows, n, K, chunk, identity, finite,
                       fast, rdown, magic, within, f, f32, stats, True, peak)
            _block_out(tot, acc, bsw, bpk, Ob, sw, pk, bi, i0, j0, rows, n, identity,
                       f[5] != 0, f32, chunk, stats)


@njit(**JIT_OPTIONS)
def pairwise(a3, b3, ia, ib, c, has_init, out, identity, finite, fast1, fast, rdown, magic,
             within, f, first, last):
    """accumulate.pairwise's balanced tree (level by level, an odd last term moving up as is),
    built as a stack: after the t-th sum of two products (level 1, ``fast1``), as many merges
    of equal-sized neighbours (``fast``) as t has trailing zero bits; at the end the partial
    sums left on the stack merge right to left (the carried terms join from the right, as
    they do level by level).  Blocks of ROWS x PAIR_COLS outputs, each step's b rows reused;
    the blocks of rows first..last-1, as in ``sequential``."""
    _wide()
    M, K, N = a3.shape[1], a3.shape[2], b3.shape[2]
    nrb = (M + ROWS - 1) // ROWS
    depth = 2
    while (1 << depth) <= K:
        depth += 1
    for task in range(first, last):
        bi = task // nrb
        i0 = (task - bi * nrb) * ROWS
        rows = min(ROWS, M - i0)
        A, Bm, Ob = a3[ia[bi]], b3[ib[bi]], out[bi]
        stack = np.empty((ROWS, depth, PAIR_COLS))
        p0 = np.empty(PAIR_COLS)
        p1 = np.empty(PAIR_COLS)
        for j0 in range(0, N, PAIR_COLS):
            n = min(PAIR_COLS, N - j0)
            sp = 0
            for t in range(K // 2):
                b0, b1 = Bm[2 * t, j0:j0 + n], Bm[2 * t + 1, j0:j0 + n]
                merges = 0
                while (((t + 1) >> merges) & 1) == 0:
                    merges += 1
                for r in range(rows):
                    x0, x1 = A[i0 + r, 2 * t], A[i0 + r, 2 * t + 1]
                    if finite:
                        for j in range(n):
                            p0[j] = x0 * b0[j]
                            p1[j] = x1 * b1[j]
                    else:
                        for j in range(n):
                            p0[j] = _product(x0, b0[j], True)
                            p1[j] = _product(x1, b1[j], True)
                    st = stack[r]
                    _pair(st[sp], p0, p1, n, finite, fast1, rdown, magic, within, f)
                    for q in range(merges):
                        _pair(st[sp - q - 1], st[sp - q - 1], st[sp - q], n, finite, fast,
                              rdown, magic, within, f)
                sp += 1 - merges
            if K % 2:                           # the odd last product (K = 1: identity + it)
                for r in range(rows):
                    x = A[i0 + r, K - 1]
                    for j in range(n):
                        stack[r, sp, j] = _product(x, Bm[K - 1, j0 + j], True)
                    if K == 1:
                        for j in range(n):
                            p0[j] = identity
                        _pair(stack[r, 0], p0, stack[r, 0], n, finite, fast, rdown, magic,
                              within, f)
                sp += 1
            for r in range(rows):
                st = stack[r]
                for q in range(sp - 1, 0, -1):
                    _pair(st[q - 1], st[q - 1], st[q], n, finite, fast, rdown, magic, within,
                          f)
                for j in range(n):
                    s = st[0, j]
                    if has_init:
                        s = _add(c[bi, i0 + r, j0 + j], s, False, rdown, magic, f)
                    Ob[i0 + r, j0 + j] = s


# ----------------------------------------------------------------------------------------------
# binary16 sums on the host's own binary16 unit (``compiled.native_half``)
# ----------------------------------------------------------------------------------------------
_HALF_MAG = np.uint16(0x7FFF)     # a binary16 code's magnitude bits
_HALF_INF = np.uint16(0x7C00)     # inf's


@intrinsic
def _half_fma(typingctx, x, y, z):  # noqa: ANN001, ANN202
    """x * y + z on binary16 codes (uint16), the exact product and sum rounded once to nearest
    even (IEEE 754's fusedMultiplyAdd): one step of a binary16 sequential sum.  By the host's
    own instruction (AVX512-FP16's ``vfmadd...ph``, 32 lanes a register) only where
    ``compiled.native_half`` says so: elsewhere LLVM computes it in float32 and rounds twice."""
    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        h = ir.HalfType()
        fn = builder.module.declare_intrinsic("llvm.fma", [h], ir.FunctionType(h, [h, h, h]))
        r = builder.call(fn, [builder.bitcast(v, h) for v in args])
        return builder.bitcast(r, ir.IntType(16))
    return types.uint16(types.uint16, types.uint16, types.uint16), codegen


@intrinsic
def _half_value(typingctx, x):  # noqa: ANN001, ANN202
    """The float64 value of a binary16 code (exact)."""
    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.DoubleType())
    return types.float64(types.uint16), codegen


@intrinsic
def _half_code(typingctx, x):  # noqa: ANN001, ANN202
    """The binary16 code of a float64 rounded to nearest even (exact for binary16 values)."""
    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))
    return types.uint16(types.float64), codegen


@njit(**JIT_OPTIONS)
def half_codes(x, out):
    """``out`` (uint16, flat) = the binary16 codes of ``x`` (float64, flat), binary16 values."""
    _wide()
    for i in range(x.size):
        out[i] = _half_code(x[i])


@njit(inline="always", **JIT_OPTIONS)
def _half_swamped(live, b, old, new):
    """1 (as uint16) where a binary16 step was swamped as ``_swamp`` counts it in float64: a
    non-zero product (``live``: its element of a is non-zero, and ``b``) that left a finite
    sum ``old`` equal to ``new`` as floats (-0 == +0), else 0."""
    same = (new == old) | (((new | old) & _HALF_MAG) == 0)
    return np.uint16(live & same & ((b & _HALF_MAG) != 0) & ((old & _HALF_MAG) < _HALF_INF))


@njit(inline="always", **JIT_OPTIONS)
def _half_peak(pk, j, new):
    """``pk[j]`` raised to the magnitude of the binary16 code ``new`` (codes of non-negative
    values order as their values)."""
    m = np.uint16(new & _HALF_MAG)
    pk[j] = m if m > pk[j] else pk[j]


@intrinsic
def _half_same(typingctx, x, y):  # noqa: ANN001, ANN202
    """Whether two binary16 codes hold equal values (-0 == +0, NaN unequal): one compare."""
    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        h = ir.HalfType()
        return builder.fcmp_ordered("==", *(builder.bitcast(v, h) for v in args))
    return types.boolean(types.uint16, types.uint16), codegen


@njit(inline="always", **JIT_OPTIONS)
def _half_swamped_step(live, b, old, new, quick):
    """A step's swamped count (uint16): ``_half_swamped``'s five tests, or with ``quick`` (the
    product non-zero: ``x`` and ``b`` non-zero; the sum ``old`` finite, which ``_half_sums``
    checks at a block's end, summing the block again without ``quick`` where one
    overflowed) whether the sum kept its value, one compare (``_half_same``)."""
    return np.uint16(_half_same(new, old)) if quick else _half_swamped(live, b, old, new)


@njit(inline="always", **JIT_OPTIONS)
def _half_counted(row, x, brow, n, sw, pk, peak, quick):
    """``row[j] = _half_fma(x, brow[j], row[j])`` for j < n, the swamped steps counted in
    ``sw[j]`` (``_half_swamped_step``; uint16: 16-bit lanes throughout, 1.7x the rate of int32
    counts, emptied by ``sequential_half`` every HALF_COUNTS steps); with ``peak`` ``pk[j]``
    keeps the largest magnitude (``_half_peak``).  ``quick`` is a constant at each call, so
    each copy compiles one count (measured as fast as a function of its own for each)."""
    live = (x & _HALF_MAG) != 0
    if peak:
        for j in range(n):
            old = row[j]
            new = _half_fma(x, brow[j], old)
            row[j] = new
            sw[j] += _half_swamped_step(live, brow[j], old, new, quick)
            _half_peak(pk, j, new)
    else:
        for j in range(n):
            old = row[j]
            new = _half_fma(x, brow[j], old)
            row[j] = new
            sw[j] += _half_swamped_step(live, brow[j], old, new, quick)


@njit(inline="always", **JIT_OPTIONS)
def _half_nonzero(brow, n):
    """Whether ``brow[:n]`` (binary16 codes) holds no zero (a min-reduction of magnitudes)."""
    least = _HALF_MAG
    for j in range(n):
        least = min(least, np.uint16(brow[j] & _HALF_MAG))
    return least != 0


@njit(inline="always", **JIT_OPTIONS)
def _half_finite(acc, rows, n):
    """Whether every sum of ``acc[:rows, :n]`` (binary16 codes) is finite."""
    top = np.uint16(0)
    for r in range(rows):
        for j in range(n):
            top = max(top, np.uint16(acc[r, j] & _HALF_MAG))
    return top < _HALF_INF


HALF_COUNTS = 65535     # steps between emptyings of ``_half_counted``'s uint16 counts


@njit(inline="always", **JIT_OPTIONS)
def _half_block(A, Bm, c, has_init, bi, i0, j0, rows, n, K, identity, acc, bsw, tsw, bpk,
                stats, peak, quick):
    """One block's sums (rows i0.., columns j0..) in ``acc``, with ``stats`` the swamped counts
    in ``tsw`` and with ``peak`` the largest magnitudes in ``bpk``; ``quick``: a step of a
    non-zero element of a and a row of b without zeros counted by the quick test
    (``_half_swamped_step``; the test of the row, once for the block's rows, measured faster
    than a test of each element of b in the quick loop: LLVM then vectorised the loops at
    about half the rate)."""
    for r in range(rows):
        for j in range(n):
            acc[r, j] = c[bi, i0 + r, j0 + j] if has_init else identity
            if stats:
                tsw[r, j] = 0
                bpk[r, j] = 0
    for k0 in range(0, K, HALF_COUNTS):
        if stats:
            for r in range(rows):
                for j in range(n):
                    bsw[r, j] = 0
        for k in range(k0, min(K, k0 + HALF_COUNTS)):
            brow = Bm[k, j0:j0 + n]
            if stats:
                nonzero = quick and _half_nonzero(brow, n)
                for r in range(rows):
                    x = A[i0 + r, k]
                    if nonzero and (x & _HALF_MAG) != 0:
                        _half_counted(acc[r], x, brow, n, bsw[r], bpk[r], peak, True)
                    else:
                        _half_counted(acc[r], x, brow, n, bsw[r], bpk[r], peak, False)
            else:
                for r in range(rows):
                    x = A[i0 + r, k]
                    row = acc[r]
                    for j in range(n):
                        row[j] = _half_fma(x, brow[j], row[j])
        if stats:
            for r in range(rows):
                for j in range(n):
                    tsw[r, j] += bsw[r, j]


@njit(inline="always", **JIT_OPTIONS)
def _half_sums(a3, b3, ia, ib, c, has_init, out, identity, sw, pk, stats, peak, first, last):
    """``sequential_half``'s sums, with ``stats`` and ``peak`` constants in each copy (a loop
    for each: with both loops behind a branch on ``stats`` LLVM vectorised the counted one at
    half its rate).  With ``stats`` a block whose sums overflowed is summed again, counted
    by ``_half_counted`` without ``quick`` (which counts the steps of an infinite sum)."""
    M, K, N = a3.shape[1], a3.shape[2], b3.shape[2]
    nrb = (M + ROWS - 1) // ROWS
    acc = np.empty((ROWS, COLS), np.uint16)
    bsw = np.zeros((ROWS, COLS), np.uint16)
    tsw = np.zeros((ROWS, COLS), np.int64)
    bpk = np.zeros((ROWS, COLS), np.uint16)
    for task in range(first, last):
        bi, i0, rows = _task(task, nrb, M)
        A, Bm, Ob = a3[ia[bi]], b3[ib[bi]], out[bi]
        for j0 in range(0, N, COLS):
            n = min(COLS, N - j0)
            _half_block(A, Bm, c, has_init, bi, i0, j0, rows, n, K, identity, acc, bsw, tsw,
                        bpk, stats, peak, True)
            if stats and not _half_finite(acc, rows, n):
                _half_block(A, Bm, c, has_init, bi, i0, j0, rows, n, K, identity, acc, bsw,
                            tsw, bpk, stats, peak, False)
            for r in range(rows):
                for j in range(n):
                    Ob[i0 + r, j0 + j] = _half_value(acc[r, j])
                    if stats:
                        sw[bi, i0 + r, j0 + j] = tsw[r, j]
                    if peak:
                        pk[bi, i0 + r, j0 + j] = _half_value(bpk[r, j])


@njit(**JIT_OPTIONS)
def sequential_half(a3, b3, ia, ib, c, has_init, out, identity, sw, pk, stats, peak, first,
                    last):
    """``sequential`` for a binary16 accumulator rounding to nearest even on finite binary16
    operands: ``a3``, ``b3``, ``c`` and ``identity`` as codes (uint16), each step one
    ``_half_fma``; ``out`` gets the sums' values (float64), with ``stats`` ``sw`` the swamped
    additions and with ``peak`` ``pk`` the largest partial sums (``_half_counted``), as
    ``sequential`` gives them.  Blocks of ROWS x COLS outputs, rows first..last-1."""
    _wide()
    if not stats:
        _half_sums(a3, b3, ia, ib, c, has_init, out, identity, sw, pk, False, False, first, last)
    elif peak:
        _half_sums(a3, b3, ia, ib, c, has_init, out, identity, sw, pk, True, True, first, last)
    else:
        _half_sums(a3, b3, ia, ib, c, has_init, out, identity, sw, pk, True, False, first, last)


# ----------------------------------------------------------------------------------------------
# tensor-core models (fpsim.arith.tensor_core's GroupStep, scalar by scalar)
# ----------------------------------------------------------------------------------------------
# Compile time: the group structures (``_fused_group``, ``_cdna3_group``, ``_tree_group``) and
# ``_rounded_call`` are functions of their own, called by ``tensor_core``, not inlined into it
# (numba's inlining copies a callee's IR into each call site: one kernel with all of them
# inlined took 2.5 to 5 minutes of CPU to compile, these four apart about one minute).
TC_COLS = 256       # output columns of a tensor-core block: a group of b rows stays in L1
FUSED, CDNA3, TREE = 0, 1, 2          # GroupStep's structures the kernel runs
_LOW = -(1 << 30)   # below every exponent


@njit(inline="always", **JIT_OPTIONS)
def _pow2(n):
    """2**n for integer n in [-1022, 1023] (tensor_core._pow2)."""
    return _float((n + 1023) << 52)


@njit(inline="always", **JIT_OPTIONS)
def _exponent(x, emin):
    """tensor_core.exponents of one float64: the exponent field clamped at ``emin``; zeros
    count as -126."""
    e = max(((_bits(x) >> 52) & 0x7FF) - 1023, emin)
    return -126 if x == 0 else e


@njit(inline="always", **JIT_OPTIONS)
def _truncated(s, f):
    """``s`` cut toward zero to the format of ``f`` (no overflow: the caller's), by clearing
    the bits below its precision (below emin: below its subnormal spacing)."""
    b = _bits(s)
    drop = (52 - f[6]) + max((f[0] - (b & _EXP)) >> 52, 0)
    if drop > 52:
        return _float(b & _SIGN)
    return _float(b & ~((1 << drop) - 1))


@njit(**JIT_OPTIONS)
def _rounded_call(s, f):
    """``_rounded`` compiled once and called, not inlined: the tensor-core kernels' rare modes
    (no preset needs it), kept out of their many inlined ``_result`` (compile time)."""
    return _rounded(s, f)


@njit(inline="always", **JIT_OPTIONS)
def _result(s, f, to):
    """``s`` rounded to the format of ``f``: ``to`` 1 to nearest even by the magic constant
    (formats with subnormals), 2 toward zero below the overflow threshold, 0 in f's mode."""
    if to == 1:
        return _nearest(s, f)
    if to == 2:
        return _truncated(s, f)
    return _rounded_call(s, f)


@njit(**JIT_OPTIONS)
def exponents(x, emin):
    """``_exponent`` of every element of a float64 array, as int64."""
    _wide()
    flat = x.reshape(-1)
    out = np.empty(flat.size, np.int64)
    for i in range(flat.size):
        out[i] = _exponent(flat[i], emin)
    return out.reshape(x.shape)


@njit(**JIT_OPTIONS)
def profile(flat):
    """``lanes.measure`` of a flat float32 or float64 array in one pass: (sig, low, high) of
    its finite non-zero values (sig 0: none).  A value is s * 2^base with s an integer of
    ``L`` bits (float64's significand, subnormals' without the hidden bit) and ``tz``
    trailing zeros, read off the exponents of s and of its lowest set bit as floats."""
    _wide()
    sig, low, high = 0, 1 << 20, -(1 << 20)
    for i in range(flat.size):
        v = abs(np.float64(flat[i]))
        if v == 0 or not v < np.inf:
            continue
        b = _bits(v)
        e = b >> 52
        s = (b & _FRAC) | (1 << 52) if e else b & _FRAC
        base = max(e, 1) - 1075
        size = ((_bits(float(s)) >> 52) - 1022)
        tz = ((_bits(float(s & -s)) >> 52) - 1023)
        sig = max(sig, size - tz)
        low = min(low, base + tz)
        high = max(high, base + size - 1)
    return sig, low, high


@njit(**JIT_OPTIONS)
def flushed(x, ex):
    """A copy of ``x`` with +0 where ``|x| < 2^ex`` (``ex``: its ``exponents``, clamped at the
    format's least normal: so its subnormals and -0; CDNA2 reads them as +0)."""
    _wide()
    out = np.empty_like(x)
    fx, fe, fo = x.reshape(-1), ex.reshape(-1), out.reshape(-1)
    for i in range(fx.size):
        v = fx[i]
        fo[i] = 0.0 if abs(v) < _pow2(fe[i]) else v
    return out


@njit(inline="always", **JIT_OPTIONS)
def _cut(x, mode):
    """An aligned term cut to an integer: 0 toward zero, 1 toward -inf, 2 to nearest even."""
    if mode == 0:
        return np.trunc(x)
    if mode == 1:
        return np.floor(x)
    return np.rint(x)


@njit(inline="always", **JIT_OPTIONS)
def _floor_to(x, top, bits):
    """``x`` cut toward -inf to ``bits`` fraction bits below exponent ``top`` (GroupStep._floor)."""
    return np.floor(x * _pow2(bits - top)) * _pow2(top - bits)


@njit(inline="always", **JIT_OPTIONS)
def _align(acc, EA, EB, k0, k1, step, j0, n, tops, emin, align):
    """The group's largest exponent per column (the accumulator's too with ``align``);
    ``step`` RUN: one exponent per run of products (block scales)."""
    if align:
        for j in range(n):
            tops[j] = _exponent(acc[j], emin)
    else:
        for j in range(n):
            tops[j] = _LOW
    _raise_to(EA, EB, k0, k1, step, j0, n, tops)


@njit(inline="always", **JIT_OPTIONS)
def _raise_to(EA, EB, k0, k1, step, j0, n, tops):
    """tops[j] = max(tops[j], EA[k] + EB[k, j0 + j]) over products k0, k0 + step, ... < k1."""
    for k in range(k0, k1, step):
        e = EA[k]
        erow = EB[k, j0:j0 + n]
        for j in range(n):
            tops[j] = max(tops[j], e + erow[j])


@njit(inline="always", **JIT_OPTIONS)
def _raise4(EA, EB, k, j0, n, tops):
    """``_raise_to`` over the four products k..k+3 in one pass over the columns (``tops`` read
    and written once, not four times)."""
    e0, e1, e2, e3 = EA[k], EA[k + 1], EA[k + 2], EA[k + 3]
    r0, r1 = EB[k, j0:j0 + n], EB[k + 1, j0:j0 + n]
    r2, r3 = EB[k + 2, j0:j0 + n], EB[k + 3, j0:j0 + n]
    for j in range(n):
        tops[j] = max(max(tops[j], max(e0 + r0[j], e1 + r1[j])), max(e2 + r2[j], e3 + r3[j]))


@njit(inline="always", **JIT_OPTIONS)
def _cut4(A, Bm, k, j0, n, up, s):
    """s[j] += the four finite products k..k+3 times ``up[j]``, each cut toward zero, in one
    pass (the integers' float64 sum is exact, so their order does not matter)."""
    x0, x1, x2, x3 = A[k], A[k + 1], A[k + 2], A[k + 3]
    r0, r1 = Bm[k, j0:j0 + n], Bm[k + 1, j0:j0 + n]
    r2, r3 = Bm[k + 2, j0:j0 + n], Bm[k + 3, j0:j0 + n]
    for j in range(n):
        u = up[j]
        s[j] += ((np.trunc(x0 * r0[j] * u) + np.trunc(x1 * r1[j] * u))
                 + (np.trunc(x2 * r2[j] * u) + np.trunc(x3 * r3[j] * u)))


@njit(inline="always", **JIT_OPTIONS)
def _cut4_sum(A, Bm, k, j0, n, up, s, ps):
    """``_cut4``, and the four products added to ``ps`` in the order k..k+3 (``_cut_sum``'s, so
    the statistics' test of that sum against zero is the same)."""
    x0, x1, x2, x3 = A[k], A[k + 1], A[k + 2], A[k + 3]
    r0, r1 = Bm[k, j0:j0 + n], Bm[k + 1, j0:j0 + n]
    r2, r3 = Bm[k + 2, j0:j0 + n], Bm[k + 3, j0:j0 + n]
    for j in range(n):
        u = up[j]
        p0, p1, p2, p3 = x0 * r0[j], x1 * r1[j], x2 * r2[j], x3 * r3[j]
        s[j] += (np.trunc(p0 * u) + np.trunc(p1 * u)) + (np.trunc(p2 * u) + np.trunc(p3 * u))
        ps[j] = (((ps[j] + p0) + p1) + p2) + p3


@njit(inline="always", **JIT_OPTIONS)
def _nv_fours(acc, A, EA, Bm, EB, k0, k1, j0, n, tops, up, s, ps, sums, f, emin, beyond, spec,
              to):
    """``_fused_group`` for NVIDIA's common case (finite operands, C aligned, terms cut toward
    zero) on a group of a multiple of four products: the exponents and the cut products four
    at a time (``_raise4``, ``_cut4``; with ``sums`` the statistics' products sum in ``ps``
    too, ``_cut4_sum``), ``to`` a constant at each call."""
    for j in range(n):
        c = acc[j]
        tops[j] = _exponent(c, emin)
    for k in range(k0, k1, 4):
        _raise4(EA, EB, k, j0, n, tops)
    for j in range(n):
        up[j] = _pow2(f - tops[j])
        s[j] = 0.0
    if sums:
        for j in range(n):
            ps[j] = 0.0
        for k in range(k0, k1, 4):
            _cut4_sum(A, Bm, k, j0, n, up, s, ps)
    else:
        for k in range(k0, k1, 4):
            _cut4(A, Bm, k, j0, n, up, s)
    for j in range(n):
        acc[j] = _nv_result(acc[j], s[j], up[j], tops[j], f, beyond, spec, to)


@njit(inline="always", **JIT_OPTIONS)
def _cut_sum(A, Bm, k0, k1, run, j0, n, up, cut, s, ps, finite, sums):
    """s = sum of the products (runs of ``run`` summed exactly first) times ``up``, each cut
    to an integer; ps = their float64 sum when NaN or inf may occur or ``sums`` (the
    statistics' products sum; else left alone).  The common cases have loops of their own (a
    branch inside a loop keeps it from vectorising)."""
    for j in range(n):
        s[j] = 0.0
    if sums or not finite:
        for j in range(n):
            ps[j] = 0.0
    for k in range(k0, k1, run):
        if run == 1:
            x = A[k]
            brow = Bm[k, j0:j0 + n]
            if finite and cut == 0 and sums:
                for j in range(n):
                    p = x * brow[j]
                    s[j] += np.trunc(p * up[j])
                    ps[j] += p
            elif finite and cut == 0:
                for j in range(n):
                    s[j] += np.trunc(x * brow[j] * up[j])
            elif finite and sums:
                for j in range(n):
                    p = x * brow[j]
                    s[j] += _cut(p * up[j], cut)
                    ps[j] += p
            elif finite:
                for j in range(n):
                    s[j] += _cut(x * brow[j] * up[j], cut)
            else:
                for j in range(n):
                    p = _product(x, brow[j], True)
                    s[j] += _cut(p * up[j], cut)
                    ps[j] += p
        else:
            for j in range(n):
                p = 0.0
                for q in range(k, k + run):
                    p += A[q] * Bm[q, j0 + j]
                s[j] += _cut(p * up[j], cut)
                if sums or not finite:
                    ps[j] += p


@njit(inline="always", **JIT_OPTIONS)
def _nv_result(c, s, up, top, f, beyond, spec, to):
    """NVIDIA's D from finite operands: C aligned and truncated beside the products' cut sum
    ``s``, rounded to the result (``to`` as in ``_result``); inf beyond its exponents."""
    t = (s + np.trunc(c * up)) * _pow2(top - f)
    if not np.isfinite(c):                     # an overflowed C: psum + C is C
        t = c
    v = _result(t, spec, to)
    if abs(t) >= beyond:
        v = t * np.inf
    return v + 0.0                             # a zero result is +0


@njit(inline="always", **JIT_OPTIONS)
def _fused_group(acc, A, EA, Bm, EB, k0, k1, j0, n, tops, up, s, ps, finite, sums, f, run,
                 cut, align, emin, beyond, spec, rdown, to):
    """GroupStep._step: products and (``align``) C aligned to the largest exponent, cut, summed
    exactly, rounded to the result (or, unaligned, added to C with one rounding); ``sums``:
    the products' float64 sum in ``ps`` too (``_cut_sum``)."""
    if finite and align and cut == 0 and run == 1 and (k1 - k0) % 4 == 0:
        if to == 2:                                         # NVIDIA's FP32 and E8M13 results
            _nv_fours(acc, A, EA, Bm, EB, k0, k1, j0, n, tops, up, s, ps, sums, f, emin, beyond,
                      spec, 2)
            return
        if to == 1:                                         # and its FP16 results
            _nv_fours(acc, A, EA, Bm, EB, k0, k1, j0, n, tops, up, s, ps, sums, f, emin, beyond,
                      spec, 1)
            return
    _align(acc, EA, EB, k0, k1, run, j0, n, tops, emin, align)
    for j in range(n):
        up[j] = _pow2(f - tops[j])
    _cut_sum(A, Bm, k0, k1, run, j0, n, up, cut, s, ps, finite, sums)
    if finite and align and cut == 0 and to == 2:          # NVIDIA's FP32 and E8M13 results
        for j in range(n):
            acc[j] = _nv_result(acc[j], s[j], up[j], tops[j], f, beyond, spec, 2)
        return
    if finite and align and cut == 0 and to == 1:          # and its FP16 results
        for j in range(n):
            acc[j] = _nv_result(acc[j], s[j], up[j], tops[j], f, beyond, spec, 1)
        return
    for j in range(n):
        c = acc[j]
        t = s[j]
        if align:
            t += _cut(c * up[j], cut)
        t *= _pow2(tops[j] - f)
        if not finite:                         # inf and NaN propagate
            raw = ps[j] + c if align else ps[j]
            if not np.isfinite(raw):
                t = raw
        elif align and not np.isfinite(c):      # an overflowed C: psum + C is C
            t = c
        if align:
            v = _result(t, spec, to)
            if abs(t) >= beyond:
                v = t * np.inf
            acc[j] = v + 0.0
        else:
            acc[j] = _result(_sum(c, t, False, rdown, True), spec, to & 1)


@njit(inline="always", **JIT_OPTIONS)
def _half(A, EA, Bm, EB, k0, k1, step, j0, n, tops, v, f, cut):
    """GroupStep._fused over products k0, k0 + step, ... < k1: their largest exponent
    (``tops``) and the cut sum's value (``v``)."""
    for j in range(n):
        tops[j] = _LOW
    _raise_to(EA, EB, k0, k1, step, j0, n, tops)
    for j in range(n):
        v[j] = 0.0
    for k in range(k0, k1, step):
        x = A[k]
        brow = Bm[k, j0:j0 + n]
        for j in range(n):
            v[j] += _cut(_product(x, brow[j], True) * _pow2(f - tops[j]), cut)
    for j in range(n):
        v[j] *= _pow2(tops[j] - f)


@njit(inline="always", **JIT_OPTIONS)
def _cdna3_group(acc, A, EA, Bm, EB, k0, k1, j0, n, t0, t1, v0, v1, ps, u0, u1, f, cut, halves,
                 sum_bits, c_bits, emin, spec, to, tame):
    """GroupStep._cdna3_step: the products fused (with ``halves``: even and odd apart), their
    sum and C cut toward -inf below the larger exponent, added, rounded (the presets' cut and
    rounding as constants, so that the loops compile without a branch); ``tame`` (the
    kernel's): ``_cdna3_tame``."""
    if tame and cut == 0 and (not halves or (k1 - k0) % 2 == 0):
        if to & 1:
            _cdna3_tame(acc, A, EA, Bm, EB, k0, k1, j0, n, t0, t1, v0, v1, u0, u1, f, halves,
                        sum_bits, c_bits, emin, spec, 1)
        else:
            _cdna3_tame(acc, A, EA, Bm, EB, k0, k1, j0, n, t0, t1, v0, v1, u0, u1, f, halves,
                        sum_bits, c_bits, emin, spec, 0)
        return
    if cut == 0 and to & 1:
        _cdna3_sums(acc, A, EA, Bm, EB, k0, k1, j0, n, t0, t1, v0, v1, ps, f, 0, halves,
                    sum_bits, c_bits, emin, spec, 1)
    else:
        _cdna3_sums(acc, A, EA, Bm, EB, k0, k1, j0, n, t0, t1, v0, v1, ps, f, cut, halves,
                    sum_bits, c_bits, emin, spec, to & 1)


@njit(inline="always", **JIT_OPTIONS)
def _merge_halves(t0, t1, v0, v1, n, f):
    """The even and odd halves' cut sums brought to the larger of their exponents and added
    (into ``t0``, ``v0``)."""
    for j in range(n):
        top = max(t0[j], t1[j])
        t0[j] = top
        v0[j] = _floor_to(v0[j], top, f) + _floor_to(v1[j], top, f)


@njit(inline="always", **JIT_OPTIONS)
def _with_c(c, top_sum, v, emin, halves, sum_bits, c_bits):
    """CDNA3: the products' cut sum ``v`` (exponent ``top_sum``) and C, each cut toward -inf
    below the larger exponent (``sum_bits`` and ``c_bits`` bits), added; with ``halves`` a C
    more than 25 binades below is dropped."""
    ec = _exponent(c, emin)
    top = max(top_sum, ec)
    cc = _floor_to(c, top, c_bits)
    if halves and ec < top - 25:
        cc = 0.0
    return (_floor_to(v, top, sum_bits) + cc) + 0.0


@njit(inline="always", **JIT_OPTIONS)
def _tame_half(A, EA, Bm, EB, k0, k1, step, j0, n, tops, up, v, f):
    """``_half`` with cut 0 on products known finite: the scale 2^(f - top) once per column
    (``up``), and with ``step`` 1 on a multiple of four products four at a time."""
    fours = step == 1 and (k1 - k0) % 4 == 0
    for j in range(n):
        tops[j] = _LOW
    if fours:
        for k in range(k0, k1, 4):
            _raise4(EA, EB, k, j0, n, tops)
    else:
        _raise_to(EA, EB, k0, k1, step, j0, n, tops)
    for j in range(n):
        up[j] = _pow2(f - tops[j])
        v[j] = 0.0
    if fours:
        for k in range(k0, k1, 4):
            _cut4(A, Bm, k, j0, n, up, v)
    else:
        for k in range(k0, k1, step):
            x = A[k]
            brow = Bm[k, j0:j0 + n]
            for j in range(n):
                v[j] += np.trunc(x * brow[j] * up[j])
    for j in range(n):
        v[j] *= _pow2(tops[j] - f)


@njit(inline="always", **JIT_OPTIONS)
def _cdna3_tame(acc, A, EA, Bm, EB, k0, k1, j0, n, t0, t1, v0, v1, u0, u1, f, halves,
                sum_bits, c_bits, emin, spec, to):
    """``_cdna3_sums`` with cut 0 where the products are tame (finite, below 2^128: no flags
    to raise; an inf or NaN C comes through its cut as itself, the result before rounding)
    and, with ``halves``, both halves hold products."""
    if halves:
        _tame_half(A, EA, Bm, EB, k0, k1, 2, j0, n, t0, u0, v0, f)
        _tame_half(A, EA, Bm, EB, k0 + 1, k1, 2, j0, n, t1, u1, v1, f)
        _merge_halves(t0, t1, v0, v1, n, f)
    else:
        _tame_half(A, EA, Bm, EB, k0, k1, 1, j0, n, t0, u0, v0, f)
    for j in range(n):
        acc[j] = _result(_with_c(acc[j], t0[j], v0[j], emin, halves, sum_bits, c_bits), spec,
                         to)


@njit(inline="always", **JIT_OPTIONS)
def _cdna3_sums(acc, A, EA, Bm, EB, k0, k1, j0, n, t0, t1, v0, v1, ps, f, cut, halves,
                sum_bits, c_bits, emin, spec, to):
    """``_cdna3_group`` for one cut and rounding."""
    big = 2.0 ** 128
    lone = halves and k1 - k0 == 1
    if halves:
        _half(A, EA, Bm, EB, k0, k1, 2, j0, n, t0, v0, f, cut)
        if lone:                                   # an empty odd half: 0 at the same exponent
            for j in range(n):
                t1[j] = t0[j]
                v1[j] = 0.0
        else:
            _half(A, EA, Bm, EB, k0 + 1, k1, 2, j0, n, t1, v1, f, cut)
        _merge_halves(t0, t1, v0, v1, n, f)
    else:
        _half(A, EA, Bm, EB, k0, k1, 1, j0, n, t0, v0, f, cut)
    for j in range(n):              # the products' sum; flags: a product >= 2^128 (1), <= (2)
        ps[j] = 0.0
        t1[j] = 0
    for k in range(k0, k1):
        x = A[k]
        brow = Bm[k, j0:j0 + n]
        for j in range(n):
            p = _product(x, brow[j], True)
            ps[j] += p
            if p >= big:
                t1[j] |= 1
            elif p <= -big:
                t1[j] |= 2
    if lone:
        for j in range(n):
            ps[j] += _product(A[k0], Bm[k0, j0 + j], True) * 0
    for j in range(n):
        c = acc[j]
        t = _with_c(c, t0[j], v0[j], emin, halves, sum_bits, c_bits)
        flags = t1[j]
        if flags == 3:
            t = np.nan
        elif flags == 1:
            t = np.inf
        elif flags == 2:
            t = -np.inf
        raw = ps[j] + c
        if not np.isfinite(raw):
            t = raw
        acc[j] = _result(t, spec, to)


@njit(inline="always", **JIT_OPTIONS)
def _flushed(x, tiny, spec, to):
    """GroupStep._tree_step's ``rounded``: to the result format, results below ``tiny`` to ±0
    (CDNA2's subnormals; 0 where they stay)."""
    x = _result(x, spec, to)
    return x * 0.0 if abs(x) < tiny else x


@njit(inline="always", **JIT_OPTIONS)
def _tree_sums(acc, A, Bm, k0, j0, n, tree, buf, tiny, flush, spec, to):
    """``_tree_group`` for one rounding ``to`` (a constant where it is called, so that
    each loop compiles without a branch)."""
    for t in range(tree.shape[0]):
        leaf, d, o = tree[t, 0], tree[t, 1], tree[t, 2]
        dst = buf[d]
        if leaf:
            x = A[k0 + d]
            brow = Bm[k0 + d, j0:j0 + n]
            for j in range(n):
                dst[j] = _flushed(_product(x, brow[j], True) + 0.0, tiny, spec, to)
        else:
            src = buf[o]
            for j in range(n):
                dst[j] = _tree_add(dst[j], src[j], tiny, spec, to)
    g = buf[0]
    for j in range(n):
        acc[j] = _onto_c(acc[j], g[j], tiny, flush, spec, to)


@njit(inline="always", **JIT_OPTIONS)
def _tree_add(x, y, tiny, spec, to):
    """An addition of the FMA tree: x + y rounded (``_flushed``)."""
    return _flushed(_sum(x, y, True, False, True), tiny, spec, to)


@njit(inline="always", **JIT_OPTIONS)
def _onto_c(c, g, tiny, flush, spec, to):
    """A group's sum ``g`` added to C (with ``flush``, C below ``tiny`` is 0 first), rounded."""
    if flush and abs(c) < tiny:
        c = 0.0
    return _flushed(_sum(c, g, True, False, True), tiny, spec, to)


@njit(inline="always", **JIT_OPTIONS)
def _tree_tame(acc, A, Bm, k0, j0, n, group, low, flush, spec, to):
    """``_tree_sums`` for a full group of 2 or 4 tame products (values of the result format,
    none below ``low``: a leaf is the product itself) in one pass, the partial sums in
    registers: (p0 + p1) + (p2 + p3), each addition rounded, then C + that."""
    x0, x1 = A[k0], A[k0 + 1]
    r0, r1 = Bm[k0, j0:j0 + n], Bm[k0 + 1, j0:j0 + n]
    if group == 2:
        for j in range(n):
            g = _tree_add(x0 * r0[j] + 0.0, x1 * r1[j] + 0.0, low, spec, to)
            acc[j] = _onto_c(acc[j], g, low, flush, spec, to)
        return
    x2, x3 = A[k0 + 2], A[k0 + 3]
    r2, r3 = Bm[k0 + 2, j0:j0 + n], Bm[k0 + 3, j0:j0 + n]
    for j in range(n):
        g0 = _tree_add(x0 * r0[j] + 0.0, x1 * r1[j] + 0.0, low, spec, to)
        g1 = _tree_add(x2 * r2[j] + 0.0, x3 * r3[j] + 0.0, low, spec, to)
        acc[j] = _onto_c(acc[j], _tree_add(g0, g1, low, spec, to), low, flush, spec, to)


@njit(inline="always", **JIT_OPTIONS)
def _tree_group(acc, A, Bm, k0, k1, j0, n, group, tree, buf, flush, tiny, spec, to, tame):
    """GroupStep._tree_step: products rounded (``tree`` rows (leaf, slot, other): a leaf puts
    product slot + k0 in ``buf[slot]``; else buf[slot] = round(buf[slot] + buf[other])), the
    group's sum added to C (flushed first) with one more rounding.  ``to``: as in
    ``_result`` (its bit 0: to nearest by the magic constant); ``tame``: ``_tree_tame`` for
    full groups of 2 or 4."""
    low = tiny if flush else 0.0
    if tame and k1 - k0 == group and (group == 2 or group == 4):
        if to & 1:
            _tree_tame(acc, A, Bm, k0, j0, n, group, low, flush, spec, 1)
        else:
            _tree_tame(acc, A, Bm, k0, j0, n, group, low, flush, spec, 0)
        return
    if to & 1:
        _tree_sums(acc, A, Bm, k0, j0, n, tree, buf, low, flush, spec, 1)
    else:
        _tree_sums(acc, A, Bm, k0, j0, n, tree, buf, low, flush, spec, 0)


@njit(inline="always", **JIT_OPTIONS)
def _tally_group(bsw, bpk, y, old, new, n, floor):
    """GroupStep's counted statistics of one group for one row: C before it (``old``; 0 where
    below ``floor``: a tree's flushed C) against ``y`` (the products' float64 sum, or a
    tree's group sum) and the result ``new`` (``_count``)."""
    for j in range(n):
        o = 0.0 if abs(old[j]) < floor else old[j]
        _count(bsw, bpk, j, y[j], o, new[j])


@njit(**JIT_OPTIONS)
def _fused_span(acc, A, EA, Bm, EB, i0, rows, s0, s1, group, j0, n, tops, up, s, ps, old, bsw,
                bpk, finite, sums, f, run, cut, align, emin, beyond, spec, rdown, to):
    """``_fused_group`` over the groups of products s0..s1-1 (a span between promotions) and
    the block's rows, with (``sums``) the statistics: one call per span, not per group and
    row (the calls' cost was most of a small group's time)."""
    _wide()
    for k0 in range(s0, s1, group):
        k1 = min(s1, k0 + group)
        for r in range(rows):
            if sums:
                old[:n] = acc[r, :n]
            _fused_group(acc[r], A[i0 + r], EA[i0 + r], Bm, EB, k0, k1, j0, n, tops, up, s, ps,
                         finite, sums, f, run, cut, align, emin, beyond, spec, rdown, to)
            if sums:
                _tally_group(bsw[r], bpk[r], ps, old, acc[r], n, 0.0)


@njit(**JIT_OPTIONS)
def _cdna3_span(acc, A, EA, Bm, EB, i0, rows, s0, s1, group, j0, n, t0, t1, v0, v1, ps, u0, u1,
                old, bsw, bpk, stats, f, cut, halves, sum_bits, c_bits, emin, spec, to, tame):
    """``_cdna3_group`` over a span's groups and the block's rows (``_fused_span``)."""
    _wide()
    for k0 in range(s0, s1, group):
        k1 = min(s1, k0 + group)
        for r in range(rows):
            if stats:
                old[:n] = acc[r, :n]
            _cdna3_group(acc[r], A[i0 + r], EA[i0 + r], Bm, EB, k0, k1, j0, n, t0, t1, v0, v1,
                         ps, u0, u1, f, cut, halves, sum_bits, c_bits, emin, spec, to,
                         tame and not stats)
            if stats:
                _tally_group(bsw[r], bpk[r], ps, old, acc[r], n, 0.0)


@njit(**JIT_OPTIONS)
def _tree_span(acc, A, Bm, i0, rows, s0, s1, group, j0, n, tree, tail, buf, old, bsw, bpk, stats,
               flush, tiny, spec, to, tame):
    """``_tree_group`` over a span's groups and the block's rows (``_fused_span``); ``tail``:
    the tree of a last, partial group."""
    _wide()
    for k0 in range(s0, s1, group):
        k1 = min(s1, k0 + group)
        for r in range(rows):
            if stats:
                old[:n] = acc[r, :n]
            _tree_group(acc[r], A[i0 + r], Bm, k0, k1, j0, n, group,
                        tree if k1 - k0 == group else tail, buf, flush, tiny, spec, to,
                        tame and not stats)
            if stats:
                _tally_group(bsw[r], bpk[r], buf[0], old, acc[r], n, tiny if flush else 0.0)


@njit(**JIT_OPTIONS)
def tensor_core(a3, b3, ea3, eb3, ia, ib, c, has_init, out, finite, tame, chunk, kind, group, f,
                run, cut, align, emin, beyond, spec, to, rdown, halves, sum_bits, c_bits, tree,
                tail, flush, tiny, f32, sw, pk, stats, first, last):
    """tensor_core.run for blocks of ROWS x TC_COLS outputs: groups of ``group`` products (a
    GroupStep of structure ``kind``), C (``c``) starting the sum or, with ``chunk``, the FP32
    outer sum the accumulator is promoted into every ``chunk`` products (a multiple of
    ``group``, as ``fpsim.Accumulator`` requires); ``tree`` / ``tail``:
    the FMA tree of a full and of the last group; ``finite``: no NaN or inf among the
    operands; ``tame``: besides, every product a value of the result format, none below its
    least normal (so none is rounded, flushed or beyond 2^128); ``stats``: GroupStep's
    counted statistics in ``sw`` and ``pk`` (C against the
    products' float64 sum; a tree's flushed C against its group's sum).  Blocks of rows
    first..last-1 as in ``sequential``."""
    _wide()
    M, K, N = a3.shape[1], a3.shape[2], b3.shape[2]
    nrb = (M + ROWS - 1) // ROWS
    span = chunk if chunk > 0 else K
    for task in range(first, last):
        bi, i0, rows = _task(task, nrb, M)
        A, Bm, Ob = a3[ia[bi]], b3[ib[bi]], out[bi]
        EA, EB = ea3[ia[bi]], eb3[ib[bi]]
        acc = np.empty((ROWS, TC_COLS))
        tot = np.empty((ROWS, TC_COLS))
        t0 = np.empty(TC_COLS, np.int64)
        t1 = np.empty(TC_COLS, np.int64)
        v0 = np.empty(TC_COLS)
        v1 = np.empty(TC_COLS)
        ps = np.empty(TC_COLS)
        u0 = np.empty(TC_COLS)
        u1 = np.empty(TC_COLS)
        buf = np.empty((max(group, 1), TC_COLS))
        old = np.empty(TC_COLS)
        bsw = np.zeros((ROWS, TC_COLS), np.int32)
        bpk = np.zeros((ROWS, TC_COLS))
        for j0 in range(0, N, TC_COLS):
            n = min(TC_COLS, N - j0)
            _start(acc, tot, bsw, bpk, c, has_init, bi, i0, j0, rows, n, 0.0, chunk)
            for s0 in range(0, K, span):
                if s0 > 0:
                    _promote(tot, acc, rows, n, 0.0, False, f32, bsw, bpk, stats)
                s1 = min(K, s0 + span)
                if kind == FUSED:                   # statistics need the products' sum
                    _fused_span(acc, A, EA, Bm, EB, i0, rows, s0, s1, group, j0, n, t0, v1, v0,
                                ps, old, bsw, bpk, finite, stats, f, run, cut, align, emin,
                                beyond, spec, rdown, to)
                elif kind == CDNA3:
                    _cdna3_span(acc, A, EA, Bm, EB, i0, rows, s0, s1, group, j0, n, t0, t1, v0,
                                v1, ps, u0, u1, old, bsw, bpk, stats, f, cut, halves, sum_bits,
                                c_bits, emin, spec, to, tame)
                else:
                    _tree_span(acc, A, Bm, i0, rows, s0, s1, group, j0, n, tree, tail, buf,
                               old, bsw, bpk, stats, flush, tiny, spec, to, tame)
            _block_out(tot, acc, bsw, bpk, Ob, sw, pk, bi, i0, j0, rows, n, 0.0, False, f32,
                       chunk, stats)


# ----------------------------------------------------------------------------------------------
# capture's statistics (fpsim.emulation.intercept.error_energy and operand_scan,
# fpsim.emulation.sites.operand_events)
# ----------------------------------------------------------------------------------------------
@njit(inline="always", **JIT_OPTIONS)
def _energy_term(a, b):
    """One result ``b`` against its reference ``a``: whether ``b`` is inf/NaN where ``a`` is
    finite, and (0 unless both are finite) ``a * a`` and ``(b - a)^2``."""
    fr, fy = abs(a) < np.inf, abs(b) < np.inf      # False for inf and NaN
    ok = fr & fy
    d = b - a
    return fr & (not fy), a * a if ok else 0.0, d * d if ok else 0.0


@njit(**JIT_OPTIONS)
def error_energy(y, r):
    """Results ``y`` (float32 or float64) against the reference ``r`` (float64), both flat: the
    count of ``y`` inf/NaN where ``r`` is finite, and over the elements finite in both the sums
    of ``r * r`` and ``(y - r)^2`` in float64, in one pass (eight running sums of each, element
    ``i`` into sum ``i % 8``, added in order at the end: the same on every machine).  Whole
    groups of eight first (a fixed trip count, which LLVM unrolls), then the tail."""
    _wide()
    sig = np.zeros(8)
    noi = np.zeros(8)
    bad = 0
    n = y.size
    full = n - n % 8
    for i0 in range(0, full, 8):
        for q in range(8):
            c, s, e = _energy_term(r[i0 + q], np.float64(y[i0 + q]))
            bad += c
            sig[q] += s
            noi[q] += e
    for q in range(n - full):
        c, s, e = _energy_term(r[full + q], np.float64(y[full + q]))
        bad += c
        sig[q] += s
        noi[q] += e
    s = 0.0
    e = 0.0
    for q in range(8):
        s += sig[q]
        e += noi[q]
    return bad, s, e


@njit(**JIT_OPTIONS)
def operand_scan(u, mag, inf):
    """A floating operand's bits ``u`` (flat signed integers of its width; ``mag``: the mask
    of the magnitude bits, ``inf``: the magnitude bits of inf) in one pass: the largest
    magnitude bits of a finite element (0 if none: a finite magnitude orders as its bits) and
    the count of non-zero elements (NaN and inf included, -0 not)."""
    _wide()
    top = 0
    nonzero = 0
    for i in range(u.size):
        m = u[i] & mag
        nonzero += m != 0
        top = max(top, m if m < inf else 0)
    return top, nonzero


@njit(**JIT_OPTIONS)
def nonfinite(u, mag, inf):
    """The count of inf and NaN among the bits ``u`` (``operand_scan``'s arguments)."""
    _wide()
    bad = 0
    for i in range(u.size):
        bad += (u[i] & mag) >= inf
    return bad


@njit(**JIT_OPTIONS)
def operand_events(u, v, mag, inf, limit):
    """``fpsim.emulation.sites.operand_events`` on the bits ``u`` of an operand and ``v`` of
    its quantization (flat, the same width; ``mag`` and ``inf`` as in ``operand_scan``;
    ``limit``: the magnitude bits of the least value of the width at or above the scalar
    limit) in one pass: the elements finite in ``u`` and inf/NaN in ``v`` (overflowed),
    finite in both with ``|u|`` at the limit or above (saturated), and non-zero finite in
    ``u`` but zero in ``v`` (flushed)."""
    _wide()
    over = 0
    saturated = 0
    flushed = 0
    for i in range(u.size):
        a = u[i] & mag
        b = v[i] & mag
        fx, fq = a < inf, b < inf
        over += fx & (not fq)
        saturated += fx & fq & (a >= limit)
        flushed += fx & (a != 0) & (b == 0)
    return over, saturated, flushed
