"""A compiled (Numba) engine for exact emulated matmul: the NumPy engine's bits in one pass.

The NumPy engine (``fpsim.arith.driver``) walks K in Python with ~20 array passes per step;
here one compiled loop runs all of K for a block of outputs held in L1, the blocks shared
among one Python thread per core.  The arithmetic is the NumPy engine's, scalar by scalar:

* the running sum is a float64 holding an exact accumulator value; a product of two operands
  is exact in float64 (``Profile.fits``);
* ``s = acc + p`` in float64.  Where ``fpsim.arith.fused``'s proof holds (FP16-like
  accumulators, nearest modes) rounding ``s`` once is exact; elsewhere TwoSum gives its error
  and ``s`` is made round-to-odd, which one more rounding to at most 51 bits keeps exact
  (``fpsim.arith.accumulate``);
* float64 to the accumulator: round to nearest even by the magic constant ``(s + C) - C``,
  ``C = 1.5 * 2^(k + 52 - m)`` from ``s``'s binade ``k`` clamped to the format's exponents (so
  subnormals and overflow come out right), or every mode by ``fpsim.rounding.round_bits``'
  integer algorithm, ported line by line to scalars;
* NaN: x86 returns the first operand's NaN when both are NaN, and LLVM may swap the operands
  of a commutative add, so where NaN or inf operands let two NaNs meet the first operand's is
  selected explicitly (NumPy's own loops are not consistent there: strided and contiguous
  ones differ); payloads are made quantize's once at the end.

No fastmath: every operation rounds as IEEE 754 says, and nothing is contracted into an FMA.
numba is optional (``pip install fpsim[fast]``) and imported only when this engine runs.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from .. import parallel
from ..formats import Format
from ..rounding import F64
from .lanes import Profile, guarded, lane_max
from .plan import FP32, Plan

#: ``rounding=`` modes the kernels implement (stochastic rounding stays with NumPy/torch).
MODES = {"rne": 0, "rna": 1, "rtz": 2, "rup": 3, "rdown": 4, "rto": 5}
ORDERS = ("sequential", "fma", "chunked", "pairwise")

_MAG = (1 << 63) - 1
_NAN = 0x7FF8 << 48
_INF = 0x7FF << 52


@functools.cache
def available() -> bool:
    """Whether numba can be imported (the ``fast`` extra)."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def reason(plan: Plan, prod: Profile) -> str | None:
    """Why the compiled engine cannot compute ``plan`` on products of profile ``prod``, or None
    when it can."""
    acc = plan.accum
    if plan.model is not None or plan.order not in ORDERS:
        return f"order={plan.order!r} (it runs {', '.join(ORDERS)})"
    if plan.product is not None or plan.native_product:
        return "rounded products (it runs product='exact')"
    if plan.rounding not in MODES:
        return f"rounding={plan.rounding!r} (it runs {', '.join(MODES)})"
    if plan.plain:
        return "accum='fp64' (float64's own sums)"
    if not (acc.signed and acc.zero and not acc.p3109) or not guarded(F64, acc):
        return (f"accumulator {acc.name!r} (it runs signed formats with a zero, not P3109, "
                "two bits narrower than float64)")
    if not prod.fits(F64) or 2 * max(acc.max, prod.bound) >= lane_max(F64):
        return "products or sums beyond float64's exact range"
    return None


def applies(plan: Plan, prod: Profile) -> bool:
    """Whether the compiled engine computes ``plan`` (see ``reason``)."""
    return reason(plan, prod) is None


def _fast(plan: Plan, grid: bool) -> bool:
    """One float64 sum rounded once is exact (fused.py's proof) when ``grid`` holds and the
    accumulator's values lie on a grid coarser than float64's half ulp at its top."""
    acc = plan.accum
    return (plan.rounding in ("rne", "rna") and grid
            and acc.emin - acc.mbits >= acc.emax - 52)


def _spec(fmt: Format, rounding: str) -> tuple:
    """The format and mode as the kernels' scalars: (magic-constant fields, integer fields)."""
    m = fmt.mbits
    overflows = fmt.inf or fmt.has_nan
    over_bits = _INF if fmt.inf else (_NAN if fmt.has_nan else F64.float_bits(fmt.max))
    return ((fmt.emin + 1023) << 52, (fmt.emax + 1023) << 52, ((52 - m) << 52) + (1 << 51),
            float(fmt.max), over_bits, int(fmt.nan == "fnuz"),
            m, fmt.bias, fmt.max_code, fmt.max_biased_exp, MODES[rounding],
            _INF if fmt.inf else _NAN, int(overflows), int(fmt.subnormals),
            math.ldexp(1.0, fmt.emin - m))


def run(plan: Plan, prod: Profile, a3: np.ndarray, b3: np.ndarray, idx_a: np.ndarray,
        idx_b: np.ndarray, init: np.ndarray | None) -> np.ndarray:
    """The sums of ``a3[idx_a] @ b3[idx_b]`` (float64 (batch, M, K) and (batch, K, N)), starting
    from ``init`` (batch, M, N) when given, as float64 (batch, M, N)."""
    kern = _kernels()
    a3 = np.ascontiguousarray(a3, dtype=np.float64)
    b3 = np.ascontiguousarray(b3, dtype=np.float64)
    ia, ib = (np.ascontiguousarray(i, dtype=np.int64) for i in (idx_a, idx_b))
    B, (M, K, N) = len(ia), (a3.shape[1], a3.shape[2], b3.shape[2])
    out = np.empty((B, M, N))
    has_init = init is not None
    c = (np.ascontiguousarray(init, dtype=np.float64) if has_init else np.zeros((1, 1, 1)))
    if B * M * N == 0:
        return out
    if K == 0:
        out[...] = c if has_init else 0.0
        return out
    acc, mode = plan.accum, plan.rounding
    spec = _spec(acc, mode)
    magic = mode == "rne" and acc.subnormals
    identity = 0.0 if mode == "rdown" else -0.0
    finite = bool(np.isfinite(a3).all() and np.isfinite(b3).all())
    acc_prod = _fast(plan, prod.sig <= 51 - acc.mbits)
    if plan.order == "pairwise":
        # two products, multiples of 2^low below 2^(high+1): their float64 sum is exact when
        # it spans at most 53 bits (then any mode rounds it once), else fused.py's bound
        exact_pairs = prod.high + 2 - prod.low <= 53
        prod_prod = exact_pairs or _fast(plan, prod.low >= acc.emax - 52)
        args = (a3, b3, ia, ib, c, has_init, out, identity, finite, prod_prod, acc_prod,
                mode == "rdown", magic, spec)
        kernel = kern.pairwise
    else:
        args = (a3, b3, ia, ib, c, has_init, out, plan.chunk or 0, identity, finite, acc_prod,
                mode == "rdown", magic, spec, _spec(FP32, "rne"))
        kernel = kern.sequential
    # blocks of rows over the cores (the kernels release the GIL): fpsim's thread pool, not
    # numba's OpenMP layer, whose spinning threads starve other OpenMP pools such as torch's
    parallel.run(lambda lo, hi: kernel(*args, lo, hi), B * -(-M // kern.ROWS), grain=1)
    return finish(out, FP32 if plan.chunk else acc)


def finish(out: np.ndarray, fmt: Format) -> np.ndarray:
    """NaNs as quantize makes them (0x7FF8... with their sign; FNUZ: unsigned) and FNUZ's
    zeros unsigned, once at the end instead of in every step."""
    bits = out.view(np.int64)
    nan = np.isnan(out)
    if nan.any():
        bits[nan] = (bits[nan] & np.int64(-(1 << 63))) | _NAN
    if fmt.nan == "fnuz":
        bits[nan | (out == 0)] &= _MAG
    return out


@functools.cache
def _kernels() -> Any:
    """Compile (or load from numba's disk cache) the kernels on first use."""
    if not available():
        raise ImportError("backend='numba' needs numba: pip install 'fpsim[fast]' (or numba)")
    from . import _jit_kernels

    return _jit_kernels
