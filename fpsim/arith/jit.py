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

* binary16 accumulators rounding to nearest even on binary16 operands, where numba compiles
  for a target with a binary16 fused multiply-add (``compiled.native_half``): each step is
  that one instruction (``_on_half``), IEEE 754's fusedMultiplyAdd in binary16.

No fastmath: every operation rounds as IEEE 754 says, and LLVM contracts nothing into an FMA;
where a product is exact and float64's sum is the one rounding the kernels fuse it themselves
(``_jit_kernels._madd``: the same bits).

numba is optional (``pip install fpsim[fast]``) and imported only when this engine runs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings

import numpy as np

from .. import parallel
from ..formats import Format, get_format
from ..rounding import F64
from . import compiled
from .lanes import Profile, guarded, lane_max, profile
from .plan import FP32, Plan
from .tc_models import RUN, TensorCoreModel

#: ``rounding=`` modes the kernels implement (stochastic rounding stays with NumPy/torch).
MODES = {"rne": 0, "rna": 1, "rtz": 2, "rup": 3, "rdown": 4, "rto": 5}
ORDERS = ("sequential", "fma", "chunked", "pairwise")
#: a tensor-core model's ``sum_rounding`` as the kernel's cut of aligned terms
CUTS = {"rtz": 0, "rdown": 1, "rne": 2}

FP16 = get_format("fp16")
_MAG = (1 << 63) - 1
_NAN = 0x7FF8 << 48
_INF = 0x7FF << 52


#: how much slower the NumPy engine is than this one: the range of numba / numpy over the rows
#: of benchmarks/results/matmul_bench.json (sequential, chunked and pairwise FP16 sums;
#: tests/test_jit_matmul.py checks it)
NUMPY_SLOWDOWN = "14–32×"
_warned: list[bool] = []


def warn_missing() -> None:
    """Say once per process that numba is missing, so that the NumPy engine runs instead.

    >>> import fpsim.arith.jit as jit
    >>> jit.NUMPY_SLOWDOWN
    '14–32×'
    """
    if not _warned:
        _warned.append(True)
        warnings.warn("numba is not installed, so fpsim.matmul (and fpsim.emulate's exact sums "
                      f"and tensor-core models) runs its NumPy engine, {NUMPY_SLOWDOWN} slower "
                      "than the compiled one: pip install \"fpsim[fast]\" (or numba)",
                      RuntimeWarning, stacklevel=4)


def reason(plan: Plan, prod: Profile) -> str | None:
    """Why the compiled engine cannot compute ``plan`` on products of profile ``prod``, or None
    when it can."""
    acc, model = plan.accum, plan.model
    if model is not None:
        fmt = model.accum_format
        if model.structure == "fma" and fmt.name == "fp64":
            return f"tensor_core={model.name!r} (FP64 fused multiply-adds)"
        if model.rounding not in MODES:
            return f"tensor_core={model.name!r} with rounding={model.rounding!r}"
        if not (fmt.signed and fmt.zero and not fmt.p3109) or not guarded(F64, fmt):
            return f"tensor_core={model.name!r} with accum={fmt.name!r}"
    elif plan.order not in ORDERS:
        return f"order={plan.order!r} (it runs {', '.join(ORDERS)}, tensor_core)"
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


def bounded(acc: Format, a3: np.ndarray, b3: np.ndarray, c: np.ndarray | None,
            steps: int) -> bool:
    """Whether every partial sum of ``a3 @ b3`` (finite) summed in ``acc``, rounding to
    nearest (from ``c`` when given; ``steps`` additions at most before a restart), stays at
    or below ``acc.max`` in magnitude, so that ``_jit_kernels._nearest_within`` rounds it.
    The products of one sum total at most S = min(max|a| * (b's largest column sum of |b|),
    (a's largest row sum of |a|) * max|b|); each rounding adds at most 2^-(m+1) of the sum and
    half a subnormal spacing, so after t additions a partial sum is at most
    (max|c| + S + t 2^(emin-m-1)) (1 + 2^-(m+1))^t, below exp(t 2^-(m+1)) times the first
    factor (a margin of 1.001 covers float64's own sums of the norms).

    >>> from fpsim import get_format
    >>> fp16 = get_format("fp16")
    >>> bounded(fp16, np.ones((1, 2, 3)), np.ones((1, 3, 2)), None, 3)
    True
    >>> bounded(fp16, np.full((1, 1, 2), 200.0), np.full((1, 2, 1), 200.0), None, 2)
    False
    """
    m = acc.mbits
    mag_a, mag_b = np.abs(a3), np.abs(b3)
    total = min(mag_a.max() * mag_b.sum(axis=1).max(), mag_a.sum(axis=2).max() * mag_b.max())
    start = float(np.abs(c).max()) if c is not None else 0.0
    grow = math.exp(steps * math.ldexp(1.0, -m - 1))
    bound = (start + total + steps * math.ldexp(1.0, acc.emin - m - 1)) * grow * 1.001
    return bool(bound <= acc.max)


def _on_half(plan: Plan, init: np.ndarray | None) -> bool:
    """Whether ``plan``'s sums (on finite binary16 operands) run on the host's binary16 unit,
    ``_jit_kernels.sequential_half``: a binary16 accumulator rounding to nearest even,
    sequential without promotion, a start C (when given) of finite binary16 values, and a host
    whose binary16 fused multiply-add rounds once (``compiled.native_half``).  Each step is
    then IEEE 754's fusedMultiplyAdd in binary16, which is what the emulated step computes:
    the exact product added to the sum, rounded once."""
    return (plan.accum == FP16 and plan.rounding == "rne" and plan.order in ("sequential", "fma")
            and not plan.chunk and compiled.native_half()
            and (init is None or (bool(np.isfinite(init).all()) and profile(init).fits(FP16))))


def _codes(x: np.ndarray) -> np.ndarray:
    """The binary16 codes (uint16) of ``x``, float64 holding binary16 values (one compiled
    pass: NumPy's own conversion is a scalar loop)."""
    x = np.ascontiguousarray(x, np.float64)
    out = np.empty(x.shape, np.uint16)
    compiled.kernels().half_codes(x.reshape(-1), out.reshape(-1))
    return out


def _arg(x: np.ndarray, dtype: type) -> np.ndarray:
    """``x`` as a kernel argument: C-contiguous, of ``dtype`` and writeable (a copy where it is
    not), so that one compiled specialisation serves every caller (numba compiles a kernel
    again for each array type, read-only ones included: about a minute of CPU for the
    tensor-core one)."""
    return np.require(x, dtype, ["C", "W"])


def run(plan: Plan, prod: Profile, a3: np.ndarray, b3: np.ndarray, idx_a: np.ndarray,
        idx_b: np.ndarray, init: np.ndarray | None, emins: tuple[int, int] = (-1022, -1022),
        exps: tuple[np.ndarray, np.ndarray] | None = None,
        want_stats: bool = False, peak: bool = True, halves: bool = False
        ) -> tuple[np.ndarray, tuple]:
    """The sums of ``a3[idx_a] @ b3[idx_b]`` (float64 (batch, M, K) and (batch, K, N)), starting
    from ``init`` (batch, M, N) when given, as float64 (batch, M, N), and with ``want_stats``
    the NumPy engine's statistics (swamped additions, underflowed products: none, they are
    exact, and the largest partial sums, left undefined by sequential sums without ``peak``;
    else ()).  A tensor-core model reads the operands' exponents clamped at ``emins``
    (tensor_core.exponents), or ``exps`` when given (block scales: integers shaped like ``a3``
    and ``b3``).  ``halves``: both operands hold binary16 values only (``sequential_half``
    may then run, ``_on_half``)."""
    kern = compiled.kernels()
    a3, b3 = _arg(a3, np.float64), _arg(b3, np.float64)
    ia, ib = _arg(idx_a, np.int64), _arg(idx_b, np.int64)
    B, (M, K, N) = len(ia), (a3.shape[1], a3.shape[2], b3.shape[2])
    out = np.empty((B, M, N))
    has_init = init is not None
    c = _arg(init, np.float64) if has_init else np.zeros((1, 1, 1))
    shape = (B, M, N) if want_stats else (1, 1, 1)
    sw, pk = np.empty(shape, np.int64), np.empty(shape)     # the kernels write every output's
    stats = (sw, np.zeros(shape, np.int64), pk) if want_stats else ()
    if B * M * N == 0:
        return out, stats
    if K == 0:
        out[...] = c if has_init else 0.0
        sw[...], pk[...] = 0, 0.0
        return out, stats
    model = plan.model
    if model is not None and model.structure != "fma":
        if exps is None:
            exps = kern.exponents(a3, emins[0]), kern.exponents(b3, emins[1])
        args = _tensor_core_args(model, plan.chunk, prod, a3, b3, exps, ia, ib, c, has_init,
                                 out)
        args += (sw, pk, want_stats)
        kern_tc = kern.tensor_core
        parallel.run(lambda lo, hi: kern_tc(*args, lo, hi), B * -(-M // kern.ROWS), grain=1)
        return finish(out, plan.sum_format), stats
    if model is not None:               # FP32 fma chains: sequential sums starting from +0
        plan = dataclasses.replace(plan, accum=model.accum_format, rounding=model.rounding,
                                   order="sequential")
    acc, mode = plan.accum, plan.rounding
    spec = _spec(acc, mode)
    magic = mode == "rne" and acc.subnormals
    identity = 0.0 if mode == "rdown" or model is not None else -0.0
    finite = bool(np.isfinite(a3).all() and np.isfinite(b3).all())
    if halves and finite and _on_half(plan, init):
        start = np.uint16(0x8000 if math.copysign(1.0, identity) < 0 else 0)
        args = (*(_codes(x) for x in (a3, b3)), ia, ib,
                _codes(c) if has_init else np.zeros((1, 1, 1), np.uint16), has_init, out,
                start, sw, pk, want_stats, peak)
        kernel = kern.sequential_half
        parallel.run(lambda lo, hi: kernel(*args, lo, hi), B * -(-M // kern.ROWS), grain=1)
        return finish(out, plan.sum_format), stats
    acc_prod = _fast(plan, prod.sig <= 51 - acc.mbits)
    pairs = plan.order == "pairwise"          # C joins a pairwise tree's sum at the end
    within = finite and magic and bounded(acc, a3, b3, c if has_init and not pairs else None,
                                           plan.chunk or K)
    if pairs:
        # two products, multiples of 2^low below 2^(high+1): their float64 sum is exact when
        # it spans at most 53 bits (then any mode rounds it once), else fused.py's bound
        exact_pairs = prod.high + 2 - prod.low <= 53
        prod_prod = exact_pairs or _fast(plan, prod.low >= acc.emax - 52)
        args = (a3, b3, ia, ib, c, has_init, out, identity, finite, prod_prod, acc_prod,
                mode == "rdown", magic, within, spec)
        kernel = kern.pairwise
    else:
        args = (a3, b3, ia, ib, c, has_init, out, plan.chunk or 0, identity, finite, acc_prod,
                mode == "rdown", magic, within, spec, _spec(FP32, "rne"), sw, pk, want_stats,
                peak)
        kernel = kern.sequential
    # blocks of rows over the cores (the kernels release the GIL): fpsim's thread pool, not
    # numba's OpenMP layer, whose spinning threads starve other OpenMP pools such as torch's
    parallel.run(lambda lo, hi: kernel(*args, lo, hi), B * -(-M // kern.ROWS), grain=1)
    return finish(out, plan.sum_format), stats


def _tree(n: int) -> np.ndarray:
    """GroupStep._tree_step's pairwise tree of ``n`` products as rows (leaf, slot, other), in
    the order they run: a leaf rounds product ``slot`` into buffer row ``slot``; else row
    ``slot`` (a left subtree's) += row ``other`` (its right neighbour's), rounded."""
    rows: list[tuple[int, int, int]] = []

    def walk(lo: int, hi: int) -> int:
        if hi - lo == 1:
            rows.append((1, lo, 0))
        else:
            mid = lo + (hi - lo) // 2
            rows.append((0, walk(lo, mid), walk(mid, hi)))
        return lo

    walk(0, n)
    return np.array(rows, np.int64).reshape(-1, 3)


def _to(fmt: Format, rounding: str) -> int:
    """How the tensor-core kernel rounds to the result ``fmt`` (``_jit_kernels._result``): 1 to
    nearest even by the magic constant, 2 by clearing bits (toward zero), 0 the general way."""
    if not fmt.subnormals:
        return 0
    return {"rne": 1, "rtz": 2}.get(rounding, 0)


@functools.lru_cache(maxsize=256)
def _model_constants(model: TensorCoreModel, tail: int) -> tuple:
    """The scalars and FMA trees of ``_jit_kernels.tensor_core`` that depend on ``model`` alone
    (and ``tail``, the products of a last, partial group), in the kernel's order from ``kind``
    to ``f32``: worked out once per model, not on every call."""
    kern = compiled.kernels()
    fmt = model.accum_format
    kind = {"fma_tree": kern.TREE}.get(model.structure,
                                      kern.FUSED if model.sum_bits is None else kern.CDNA3)
    tree = _tree(model.group) if kind == kern.TREE else np.zeros((0, 3), np.int64)
    last = _tree(tail) if kind == kern.TREE and tail else tree
    return (kind, model.group, model.frac_bits, RUN if model.scaled == "runs" else 1,
            CUTS[model.sum_rounding], model.align_accumulator, fmt.emin,
            math.ldexp(1.0, fmt.emax + 1), _spec(fmt, model.rounding),
            _to(fmt, model.rounding), model.rounding == "rdown", model.halves,
            model.sum_bits or 0, model.c_bits or 0, tree, last, model.flush_subnormals,
            math.ldexp(1.0, fmt.emin), _spec(FP32, "rne"))


def _tensor_core_args(model: TensorCoreModel, chunk: int | None, prod: Profile, a3: np.ndarray,
                      b3: np.ndarray, exps: tuple[np.ndarray, np.ndarray], ia: np.ndarray,
                      ib: np.ndarray, c: np.ndarray, has_init: bool, out: np.ndarray) -> tuple:
    """The arguments of ``_jit_kernels.tensor_core`` for ``model`` on products of profile
    ``prod`` (less the row blocks)."""
    ea3, eb3 = (_arg(e, np.int64) for e in exps)
    if model.flush_subnormals:           # CDNA2: subnormal operands are +0
        a3, b3 = compiled.kernels().flushed(a3, ea3), compiled.kernels().flushed(b3, eb3)
    finite = bool(np.isfinite(a3).all() and np.isfinite(b3).all())
    fmt = model.accum_format
    tame = finite and prod.fits(fmt) and (prod.empty or prod.low >= fmt.emin)
    return (a3, b3, ea3, eb3, ia, ib, c, has_init, out, finite, tame, chunk or 0,
            *_model_constants(model, a3.shape[2] % model.group))


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
