"""``fpsim.matmul`` and ``fpsim.dot``: matrix products with every rounding of the hardware.

The driver brings the operands to float lanes that hold every product exactly
(``fpsim.arith.lanes``) and walks the output in tiles: for each tile the loop runs over K in
Python while every step is vectorised over the tile's outputs, so memory stays a few times a
tile and no loop runs over M×N.
"""

from __future__ import annotations

import contextvars
import os
import warnings
from concurrent.futures import ThreadPoolExecutor

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import dispatch
from ..backend import is_torch, is_torch_generator
from ..convert import quantize
from ..formats import Format, get_format
from ..inputs import check_flag, check_input, check_seed
from ..rounding import F32, F64, STOCHASTIC
from . import accumulate, block_scaled, compiled, fused, given_bits, jit
from .tensor_core import (GroupStep, TensorCoreModel, canonical_nan, exponents,
                          run as run_tensor_core)
from .accumulate import Stats
from .accumulator import Accumulator
from .addend import addend
from .lanes import Lanes, Profile, guarded, holds, lane_max, profile
from .operands import Operands, batched, deliver, prepare
from .plan import FP32, Plan, make_plan

TILE = 1 << 15          # outputs per tile: the K loop's temporaries stay in L2
FUSED_TILE = 1 << 18    # compiled steps: fewer, larger calls (one fused pass, no temporaries)
TREE = 1 << 21          # products held at once by the pairwise tree and tensor-core groups


@dataclass
class MatmulStats:
    """Per-output statistics of an emulated product, arrays shaped like the result.

    ``overflow``: the result is inf or NaN (the sum overflowed, or inf/NaN came in).
    ``max_partial``: the largest magnitude any partial sum reached.
    ``swamped``: additions that left the accumulator unchanged although the addend was non-zero.
    ``underflow``: products rounded to zero by ``product`` although the exact product was not.
    """

    overflow: Any
    max_partial: Any
    swamped: Any
    underflow: Any


def matmul(a: Any, b: Any, *, inputs: Any = None, accum: str | Format | Accumulator = "fp32",
           order: str | None = None, chunk: int | None = None, product: str | Format = "exact",
           rounding: str = "rne", output: str | Format | None = None,
           return_stats: bool | str = False, seed: Any = None, srbits: int | None = None,
           random_bits: Any = None, tensor_core: str | TensorCoreModel | None = None,
           backend: str = "auto", engine: str | None = None, c: Any = None) -> Any:
    """Matrix product ``a @ b`` (NumPy ``matmul`` semantics) with emulated arithmetic, plus
    ``c`` when given: D = A·B + C, as the matrix instructions compute it.

    ``inputs``: format (or pair of formats for a and b) the operands are first rounded to
    (nearest even, like ``fpsim.quantize``: overflow gives inf, or NaN in E4M3FN, without
    saturation; pre-scale or saturate operands yourself for torch's saturating FP8 cast); None
    takes them as given.  With ``order="tensor_core"`` operand exponents are clamped at the
    least normal exponent of ``inputs`` (or of the array's dtype when ``inputs`` is None), and
    TF32/XF32 presets then truncate the operands to TF32, as the hardware reads FP32 registers.
    ``product``: "exact" (as tensor cores and FMA form them), a format each product is rounded
    to with ``rounding`` before it is added, or "fp64" (a float64 multiply).
    ``accum``: accumulator format; every addition is rounded to it once with ``rounding``
    (all of fpsim's modes; stochastic rounding draws its probability from the exact sum).  "fp64" means float64's own additions.
    ``accum``, ``order``, ``chunk`` and ``tensor_core`` are shorthand for an
    ``fpsim.Accumulator``, which ``accum`` may also be (the three others then stay None):
    ``accum=Accumulator("fp16", "pairwise")`` is ``accum="fp16", order="pairwise"``.
    ``order``: "sequential" (left to right; None means it here), "pairwise" (a balanced tree), "chunked" (blocks of
    ``chunk`` terms, default 128, summed in ``accum``, each block then added to an FP32 outer
    accumulator rounded to nearest even: DeepSeek-V3's promotion), "fma" (sequential, product
    and sum rounded once: with exact products this is "sequential" by another name), or "tensor_core" with ``tensor_core=`` a preset name from
    ``TENSOR_CORES`` or a ``TensorCoreModel`` (``chunk`` then promotes to FP32 every ``chunk``).
    ``output``: format the result is finally rounded to (nearest even).
    ``c``: the addend, broadcast to the result's shape and first rounded (nearest even) to the
    accumulator's format (with ``order="tensor_core"``: the instruction's C register, FP32 or
    FP16; with ``chunk``: FP32).  It starts the running sum (the first instruction's C, or the
    FP32 outer sum with ``chunk``); ``order="pairwise"`` adds it to the tree's sum.
    ``seed``: seed or generator for stochastic rounding (NumPy Generator / torch Generator);
    ``srbits``: its number of random bits per rounding (None: every dropped bit, the exact
    probability; n: the rule of the stochastic mode, docs/stochastic.md, on the exact sum).
    ``random_bits``: the n-bit values themselves instead of ``seed`` (needs ``srbits``): an
    integer array of the result's shape plus one last axis with a value per rounding of each
    output (the K rounded products when ``product=`` rounds them, then the additions in the
    order's sequence: docs/stochastic.md); the result is then a pure function of (operands,
    random bits), the same on every backend.
    ``backend``: "numpy", "numba" (``fpsim.arith.jit``, needs numba: ``pip install
    fpsim[fast]``; one compiled loop on every core, many times faster than "numpy"; exact
    products, orders sequential/fma/chunked/pairwise, modes other than stochastic, signed
    accumulators with a zero, no ``return_stats``; else a ValueError says what it lacks; the
    first call of a session loads or compiles its kernels, seconds), "torch" (any device),
    "compiled" (torch.compile fuses each loop step into one kernel: several times faster once
    compiled, which takes seconds to a minute per configuration; no stochastic rounding), or
    "auto" (torch for GPU tensors or a torch.Generator seed; for NumPy operands "numba" when
    numba is installed and covers the options, else NumPy, whose tiles run on every core; CPU
    tensors are read as NumPy arrays without a copy, take the same choice and come back as
    tensors).  Every backend gives the same bits.  ``engine`` is its old name (a DeprecationWarning).

    Returns an array of float32 when the result's format fits it, else float64 (a torch tensor
    on the operands' device when either operand is one) and, with ``return_stats``, a
    ``MatmulStats``; ``return_stats="swamped"`` leaves its ``max_partial`` None, which the
    compiled engine's sequential sums then do not track (faster).  Exactly zero sums follow
    IEEE 754 §6.3: +0 (-0 when both addends are -0), except with ``rounding="rdown"``, where
    they are -0 (+0 when both addends are +0).  With ``order="tensor_core"`` zeros are +0 (any
    rounding) and NaN is NVIDIA's 0x7FFFFFFF, as MMA-Sim has them; the FMA-chain presets (FP64
    DMMA/MFMA, AMD FP32 MFMA) follow IEEE 754's fma instead (-0·x + -0 is -0; NumPy's NaN), and
    FP64 ones run on NumPy only.

    >>> import numpy as np, fpsim
    >>> ones = np.ones((1, 4096), np.float16)
    >>> y, stats = fpsim.matmul(ones, ones.T, accum="fp16", return_stats=True)
    >>> y.tolist(), stats.swamped.tolist()       # FP16 stalls at 2048: 2048 additions swamped
    ([[2048.0]], [[2048]])
    >>> fpsim.matmul(ones, ones.T, accum=fpsim.Accumulator("fp16", "pairwise")).tolist()
    [[4096.0]]
    """
    keyword = "backend"
    if engine is not None:
        warnings.warn("matmul(engine=...) is now matmul(backend=...)", DeprecationWarning,
                      stacklevel=2)
        backend, keyword = engine, "engine"
    plan = make_plan(inputs, accum, order, chunk, product, rounding, output, tensor_core, backend,
                     keyword, srbits)
    return_stats, peak = _stats_wanted(return_stats)
    use_torch = plan.backend in ("torch", "compiled") or (plan.backend == "auto" and (
        any(is_torch(x) and dispatch.device_kind(x) != "cpu" for x in (a, b)) or is_torch_generator(seed)))
    scaled = block_scaled.split(a, b, plan.model)
    if scaled is not None:
        if plan.inputs != (None, None):
            raise ValueError("MXArray operands are already quantized: leave inputs=None")
        a, b = scaled.a, scaled.b
    ops = prepare(check_input(a, "a"), check_input(b, "b"), use_torch)
    exps = None if scaled is None else prepare(scaled.ea, scaled.eb, use_torch)
    fa, fb = plan.inputs
    if fa is not None:
        ops.a = quantize(ops.a, fa)
    if fb is not None:
        ops.b = quantize(ops.b, fb)
    if plan.model is not None and plan.model.truncate is not None:   # TF32 reads 19 bits
        ops.a, ops.b = (_truncated(x, plan.model.truncate) for x in (ops.a, ops.b))
    init = None if c is None else addend(c, ops, plan.c_format, use_torch)
    bits = given_bits.check(random_bits, plan, seed, ops, c is not None)
    emins = tuple((f or g).emin if (f or g) else -1022 for f, g in zip(plan.inputs, ops.formats))
    pa, pb = profile(ops.a), profile(ops.b)
    prod = pa.times(pb)
    lanes = _lanes_for(plan, prod, pa.fits(F32) and pb.fits(F32), ops.a if use_torch else None)
    if _compiled_engine(plan, prod, use_torch, return_stats, keyword):
        a3, idx_a = batched(ops.a, ops.batch)
        b3, idx_b = batched(ops.b, ops.batch)
        exps3 = exps and (batched(exps.a, ops.batch)[0], batched(exps.b, ops.batch)[0])
        out, stats = jit.run(plan, prod, a3, b3, idx_a, idx_b, init, emins, exps3,
                             return_stats, peak, pa.fits(jit.FP16) and pb.fits(jit.FP16))
    else:
        with np.errstate(invalid="ignore", over="ignore"):      # inf - inf inside TwoSum
            out, stats = _run(plan, lanes, prod, ops, emins, seed, return_stats, init, exps,
                              bits)
    if plan.output is not None:
        out = quantize(out, plan.output)
    narrow = holds(F32, plan.result_format)
    out = Lanes(F32 if narrow else F64, out if use_torch else None).cast(out)
    if plan.model is not None and plan.model.canonical_nan:
        out = canonical_nan(out)
    result = deliver(out.reshape(ops.shape), ops.device)
    if not return_stats:
        return result
    # NumPy's isfinite where the result is still an array (a CPU tensor's is ten times slower)
    overflow = ~(out.isfinite() if is_torch(out) else np.isfinite(out))
    overflow, swamped, underflow, largest = (deliver(s.reshape(ops.shape), ops.device)
                                             for s in (overflow, *stats))
    return result, MatmulStats(overflow, largest if peak else None, swamped, underflow)


def _stats_wanted(value: Any) -> tuple[bool, bool]:
    """``matmul``'s ``return_stats`` as (statistics wanted, largest partial sums wanted)."""
    if isinstance(value, str):
        if value != "swamped":
            raise TypeError(f"return_stats={value!r}: pass True, False or 'swamped' (the "
                            "swamped additions without the largest partial sums)")
        return True, False
    wanted = check_flag(value, "return_stats")
    return wanted, wanted


def dot(a: Any, b: Any, **options: Any) -> Any:
    """Dot product of two vectors with emulated arithmetic; options as for [``matmul``][].

    Returns a 0-d array (or tensor), and statistics with ``return_stats=True``.

    >>> import numpy as np, fpsim
    >>> float(fpsim.dot(np.ones(4096), np.ones(4096), accum="bf16"))   # BF16 stalls at 256
    256.0
    """
    for x, which in ((a, "a"), (b, "b")):
        if len(getattr(x, "shape", np.shape(x))) != 1:
            raise ValueError(f"dot: operand {which} has shape {tuple(np.shape(x))}; dot takes "
                             "two vectors (use matmul for matrices)")
    return matmul(a, b, **options)


def _truncated(x: Any, fmt: str | Format) -> Any:
    """``x`` cut toward zero to ``fmt`` (a TF32/XF32 instruction's read of FP32 registers), or
    ``x`` itself when it holds values of ``fmt`` only (finite, within its precision and
    range, and ``fmt`` has subnormals: the cut changes nothing; a NumPy array, whose
    ``profile`` is one compiled pass)."""
    fmt = get_format(fmt)
    if (not is_torch(x) and fmt.subnormals and profile(x).fits(fmt)
            and bool(np.isfinite(x).all())):
        return x
    return quantize(x, fmt, rounding="rtz")


def _compiled_engine(plan: Plan, prod: Profile, use_torch: bool, want_stats: bool,
                     keyword: str) -> bool:
    """Whether the Numba engine (``fpsim.arith.jit``) runs this product: always with
    backend="numba" (or a ValueError saying why it cannot), with "auto" for operands read as
    NumPy arrays (NumPy operands, and CPU tensors as zero-copy views: ``not use_torch``) when
    numba is installed and the plan is one it covers."""
    why = jit.reason(plan, prod)
    if why is None and want_stats and plan.order == "pairwise":
        why = "return_stats=True with order='pairwise'"
    if plan.backend == "numba":
        if why is not None:
            raise ValueError(f"{keyword}='numba' does not run {why}: use {keyword}='numpy' "
                             f"(or 'auto', which picks the engine)")
        return True
    if plan.backend != "auto" or why is not None or use_torch:
        return False
    if not compiled.available():
        jit.warn_missing()
        return False
    return True


def _lanes_for(plan: Plan, prod: Profile, operands_fit_f32: bool, like: Any) -> Lanes:
    """The narrowest lanes that hold the operands and their exact products, with guard bits
    below the accumulator."""
    fma = plan.model is not None and plan.model.structure == "fma"
    if not plan.native_product and not prod.fits(F64) and not (
            fma and plan.model.accum_format.name == "fp64"):    # FP64 fma forms them itself
        raise ValueError(
            f"products of these operands are not exact in float64 (they need {prod.sig} "
            f"significant bits, exponents 2^{prod.low}..2^{prod.high}): quantize the operands "
            "first (inputs='fp32' or narrower), or round each product as a float64 multiply "
            "does (product='fp64')")
    if plan.model is not None and not fma and prod.low < plan.model.frac_bits - 1022:
        raise ValueError(f"products as small as 2^{prod.low} are beyond the tensor-core model's "
                         "alignment in float64; scale the operands up")
    compiled = plan.backend == "compiled"
    if fused.applies(plan, prod, like is None):
        return Lanes(F64)                   # float64's own sums: one rounding (fused.py)
    extra = 2 if plan.srbits is None else plan.srbits + 2   # round to odd: 2 bits, + n random
    if plan.srbits is not None and not guarded(F64, plan.accum, extra):
        raise ValueError(f"srbits={plan.srbits} with accum {plan.accum.name!r}: the exact sum "
                         f"would need {plan.accum.mbits + extra} significant bits, float64 lanes "
                         f"hold 52; use srbits <= {F64.mbits - plan.accum.mbits - 2}")
    if plan.model is None and not plan.plain and operands_fit_f32 and prod.fits(F32) \
            and guarded(F32, plan.accum, extra) \
            and (plan.product is None or holds(F32, plan.product)):
        return Lanes(F32, like, compiled)
    return Lanes(F64, like, compiled)


def _run(plan: Plan, lanes: Lanes, prod: Profile, ops: Operands, emins: tuple, seed: Any,
         want_stats: bool, init: Any = None, exps: Operands | None = None,
         bits: Any = None) -> tuple[Any, Stats]:
    """Walk the (batch, M, N) output in tiles, starting from the addend ``init`` (batch, M, N)
    when given; ``exps``: the operands' exponents of block-scaled instructions, else they are
    read from the operands; ``bits``: the caller's random bits (batch, M, N, R), which replace
    the generator.  Returns float64 results and statistics."""
    a3, idx_a = batched(lanes.cast(ops.a), ops.batch)
    b3, idx_b = batched(lanes.cast(ops.b), ops.batch)
    if exps is not None:
        ea3, eb3 = (batched(lanes.cast(x), ops.batch)[0] for x in (exps.a, exps.b))
    B, (M, K, N) = len(idx_a), ops.mkn
    like = ops.a if lanes.torch else None
    wide = Lanes(F64, like, lanes.compiled)
    out = Lanes(F32 if holds(F32, plan.sum_format) else F64, like).zeros((B, M, N))
    stats = accumulate.new_stats(wide, (B, M, N), want_stats)
    if B * M * N == 0:
        return out, stats
    if K == 0:
        if init is not None:
            out[...] = init
        return out, stats
    modes = (plan.rounding, plan.model.rounding if plan.model is not None else None)
    drawn = bits is None and any(m in STOCHASTIC for m in modes)
    rng = _rng(lanes, seed) if drawn else None     # given bits: nothing drawn, tiles in parallel
    products = 0 if bits is None else given_bits.count(plan, K, init is not None)[0]
    steps, outer, group_step = _steps(plan, lanes, wide, prod, rng)

    group = plan.model.group if plan.model else 1
    budget = TREE // K if plan.order == "pairwise" else TREE // group
    budget = max(1, min(budget, FUSED_TILE if lanes.compiled else TILE))
    tn = min(N, budget)
    tm = min(M, max(1, budget // tn))
    bt = min(B, max(1, budget // (tm * tn)))

    def tile(b0: int, i0: int, j0: int) -> None:
        ia, ib = idx_a[b0:b0 + bt], idx_b[b0:b0 + bt]
        A = _slab(lanes, a3, ia, slice(i0, i0 + tm), rows=True)
        Bs = _slab(lanes, b3, ib, slice(j0, j0 + tn), rows=False)
        if exps is not None:
            EA = _slab(lanes, ea3, ia, slice(i0, i0 + tm), rows=True)
            EB = _slab(lanes, eb3, ib, slice(j0, j0 + tn), rows=False)
        else:
            EA = exponents(lanes, A, emins[0]) if plan.model else None
            EB = exponents(lanes, Bs, emins[1]) if plan.model else None
        shape = (A.shape[1], A.shape[2], Bs.shape[3])
        st = accumulate.new_stats(wide, shape, want_stats)
        where = (slice(b0, b0 + bt), slice(i0, i0 + tm), slice(j0, j0 + tn))
        c0 = None if init is None else wide.cast(init[where])
        inner = None if c0 is None or plan.chunk else lanes.cast(c0)
        tb = None if bits is None else given_bits.TileBits(lanes, bits[where], products)

        def operands(k0: int, k1: int) -> tuple[Any, Any]:
            return A[k0:k1], Bs[k0:k1]

        def promote(total: Any, block: Any, st: Stats) -> tuple[Any, Stats]:
            """Add a block's sum into the FP32 outer accumulator (as 1 * block)."""
            if total is None:
                total = wide.full(shape, -0.0) if c0 is None else c0
            return outer.seq(total, wide.cast(block), wide.full(shape, 1.0), st)

        if plan.model is not None:
            res, st = run_tensor_core(operands, lambda k0, k1: (EA[k0:k1], EB[k0:k1]), K,
                                      shape, group_step, st, plan.chunk, promote, inner)
        elif plan.order == "pairwise":
            res, st = accumulate.pairwise(operands, K, steps, st, shape, inner, tb)
        else:
            res, st = accumulate.sequential(operands, K, steps, st, shape, plan.chunk, promote,
                                            inner, tb)
        out[where] = res
        for total, part in zip(stats, st):
            total[where] = part

    tiles = [(b0, i0, j0) for b0 in range(0, B, bt) for i0 in range(0, M, tm)
             for j0 in range(0, N, tn)]
    workers = min(len(tiles), os.cpu_count() or 1)
    if workers > 1 and rng is None and not lanes.torch:
        # tiles are independent and NumPy releases the GIL inside its loops: one per core
        # (stochastic rounding stays in one thread so that a seed gives one answer)
        # (each worker runs in a copy of this context: NumPy's errstate above is a context
        # variable, which new threads would not see)
        with ThreadPoolExecutor(workers) as pool:
            for done in [pool.submit(contextvars.copy_context().run, tile, *t) for t in tiles]:
                done.result()
    else:
        for t in tiles:
            tile(*t)
    return out, stats


_COMPILED: dict[tuple, tuple] = {}


def _steps(plan: Plan, lanes: Lanes, wide: Lanes, prod: Profile, rng: Any) -> tuple:
    """Loop bodies for this plan: the inner accumulator's, the FP32 promotion's and the tensor
    core's.  Compiled ones are kept per configuration, so torch.compile reuses its kernels."""
    accum = plan.accum
    big = 2 * max(accum.max, prod.bound if plan.product is None else plan.product.max)
    may_overflow = big >= lane_max(lanes.src)
    key = (plan.accum, plan.rounding, plan.srbits, plan.product, plan.model, may_overflow,
           lanes.src, str(lanes.device))
    if lanes.compiled and key in _COMPILED:
        return _COMPILED[key]
    if lanes.src is F64 and fused.applies(plan, prod, not lanes.torch):
        add = fused.OneRounding(accum, plan.rounding, lanes)
    else:
        add = accumulate.Adder(accum, plan.rounding, lanes, rng, plain=plan.plain,
                               may_overflow=may_overflow, srbits=plan.srbits)
    steps = accumulate.Steps(add, plan.product, plan.rounding, rng, lanes.compiled)
    fp32 = accumulate.Adder(FP32, "rne", wide, None, plain=False, may_overflow=False)
    outer = accumulate.Steps(fp32, None, "rne", None, lanes.compiled)
    group = GroupStep(plan.model, steps, lanes.compiled) if plan.model else None
    if lanes.compiled:
        _COMPILED[key] = steps, outer, group
    return steps, outer, group


def _rng(lanes: Lanes, seed: Any) -> Any:
    check_seed(seed)
    if not lanes.torch:
        return np.random.default_rng(seed)
    if isinstance(seed, lanes.xp.Generator):
        return seed
    gen = lanes.xp.Generator(device=lanes.device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(int(seed))
    return gen


def _slab(lanes: Lanes, x3: Any, idx: np.ndarray, part: slice, rows: bool) -> Any:
    """One tile's operand, K first: (K, bt, tm, 1) for a (made contiguous, so that a step reads
    one block), (K, bt, 1, tn) for b (a view when the tile has one batch entry)."""
    if len(idx) == 1:
        s = x3[int(idx[0]):int(idx[0]) + 1]
    else:
        s = x3[lanes.xp.from_numpy(np.array(idx)).to(x3.device) if lanes.torch else idx]
    s = s[:, part, :] if rows else s[:, :, part]
    if lanes.torch:
        s = s.permute(2, 0, 1).contiguous() if rows else s.permute(1, 0, 2)
    else:
        s = np.ascontiguousarray(s.transpose(2, 0, 1)) if rows else s.transpose(1, 0, 2)
    return s[..., None] if rows else s[:, :, None, :]
