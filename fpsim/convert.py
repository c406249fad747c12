"""Public conversions: quantize, encode, decode, values.

This module only prepares inputs (types, dtypes, chunks, exact integer conversion) and hands the
bits to the single rounding routine in ``fpsim.rounding``.  Where the dropped bits allow it
(float32 into FP8/FP6/FP4, bf16, fp16, tf32 and integers; float64 into FP8/FP6/FP4, E8M0 and
integers) the same routine is evaluated once on representative inputs and the result used as a
lookup table: rounding to such a format depends only on the input's high bits and on whether
any of its low bits is set (see ``_table_low_bits``).  With numba installed, arrays of at least
``JIT_SIZE`` elements run the table lookup, float64's rounding to odd into float32 and nearest
rounding into formats sharing float32's exponent field (bf16, tf32) in one compiled pass each
(``fpsim._cast_kernels``, tested bit for bit against the NumPy steps).
"""

from __future__ import annotations

import functools
import numbers
import struct
import sys
from bisect import bisect_right
from typing import Any, Callable

import numpy as np

from . import dispatch
from . import parallel
from . import rounding
from .backend import NumpyOps, check_backend, code_dtype, is_torch, on_nan_keyword, ops_for
from .dispatch import CONVERT_BACKENDS as BACKENDS
from .formats import FORMATS, Format, get_format
from .rounding import F32, F64, STOCHASTIC, Source, check_saturate, decode_bits, round_bits
from .stochastic import check_random_bits, check_srbits
from .inputs import check_flag, check_input, check_seed, exact_cast

CHUNK = 1 << 16  # elements per slice: temporaries stay in cache, memory stays near the output's
SMALL = 64       # arrays up to this size read a lookup table by binary search (_table_steps)
_NP = NumpyOps()
BF16 = FORMATS["bf16"]
_NATIVE_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
#: NumPy float32/float64 calls resolved once: the arguments as given -> (plan, code dtype,
#: whether NaN inputs must be looked for), or None where the general path runs
_FAST: dict[tuple, tuple[Callable, np.dtype, bool, Callable | None] | None] = {}
_FAST_ENTRIES = 4096


def _fast_plan(fmt: Any, rounding: Any, saturate: Any, subnormals: Any, backend: Any,
               on_nan: Any, dtype: np.dtype, want: str
               ) -> tuple[Callable, np.dtype, bool, Callable | None] | None:
    """The plan of a NumPy float32/float64 call with deterministic rounding, looked up by the
    arguments as given: a repeated call costs one tuple and one dict lookup, no resolving and
    no context managers.  None (stochastic rounding, other dtypes, torch backends, options the
    general path must check or reject) sends the call the general way."""
    key = (fmt, rounding, saturate, subnormals, backend, on_nan, dtype, want)
    try:
        return _FAST[key]                              # the repeated call: no further call
    except (KeyError, TypeError):
        return _memo(_FAST, key, _build_fast)


def _memo(cache: dict, key: tuple, build: Callable[..., Any]) -> Any:
    """``cache[key]``, made by ``build(*key)`` on the first call (the cache is emptied when
    full); None for unhashable arguments, which the general path checks and names."""
    try:
        return cache[key]
    except KeyError:
        pass
    except TypeError:
        return None
    if len(cache) >= _FAST_ENTRIES:
        cache.clear()
    entry = cache[key] = build(*key)
    return entry


def _build_fast(fmt: Any, rounding: Any, saturate: Any, subnormals: Any, backend: Any,
                on_nan: Any, dtype: np.dtype, want: str) -> tuple | None:
    """``_fast_plan``'s entry for these arguments."""
    entry = None
    if (dtype in _NATIVE_FLOATS and isinstance(fmt, (str, Format)) and isinstance(rounding, str)
            and backend in ("auto", "numpy") and on_nan in ("raise", "zero")):
        f, mode, _ = _options(fmt, rounding, backend)
        if mode not in STOCHASTIC:
            plan = numpy_plan(f, mode, check_saturate(saturate),
                               check_flag(subnormals, "subnormals"), want,
                               dtype == _NATIVE_FLOATS[1])
            entry = (parallel.elementwise(plan), code_dtype(f),
                     on_nan == "raise" and not f.has_nan, getattr(plan, "small", None))
    return entry


#: Python floats and NumPy float32/float64 scalars: (type, arguments as given) -> a function of
#: the scalar giving quantize's (or encode's) result, or None where the array path runs
_SCALAR: dict[tuple, Callable[[Any], Any] | None] = {}
_PACK, _UNPACK = struct.Struct("<d").pack, struct.Struct("<Q").unpack   # a double's bits
_SCALAR_TYPES = frozenset({float, np.float64, np.float32})


def _scalar_plan(key: tuple) -> Callable[[Any], Any] | None:
    """The scalar path of a call on a Python float or NumPy float32/float64 scalar: where the
    array plan is a lookup table, the table's steps (``_table_steps``) searched for the
    scalar's bits as a Python integer (under a microsecond instead of an array call's
    several); the same table, so the same bits.  None (no table, NaN checks, options the
    general path must resolve) sends the call the general way.  ``key``: ``(type, fmt,
    rounding, saturate, subnormals, backend, on_nan, want)`` as given; quantize and encode
    read ``_SCALAR[key]`` themselves first (a scalar call's time is mostly calls)."""
    return _memo(_SCALAR, key, _build_scalar)


def _build_scalar(kind: type, fmt: Any, rounding: Any, saturate: Any, subnormals: Any,
                  backend: Any, on_nan: Any, want: str) -> Callable[[Any], Any] | None:
    """``_scalar_plan``'s entry for these arguments."""
    dtype = np.dtype(np.float64 if kind is float else kind)
    fast = _fast_plan(fmt, rounding, saturate, subnormals, backend, on_nan, dtype, want)
    entry = None
    if fast is not None and not fast[2]:               # no NaN to look for (encode's raise)
        f, mode, _ = _options(fmt, rounding, backend)
        steps = getattr(numpy_plan(f, mode, check_saturate(saturate),
                                    check_flag(subnormals, "subnormals"), want,
                                    dtype == _NATIVE_FLOATS[1]), "steps", None)
        if steps is not None:
            starts, values = steps()
            bounds = starts.tolist()
            # encode gives a 0-d array, quantize a Python float or the NumPy scalar's type;
            # the bits: float32's through NumPy's view (which keeps a NaN's payload), a Python
            # float's or np.float64's (a float subclass) through struct
            read = values.tolist() if kind is float and want == "value" else values
            wrap = np.asarray if want == "code" else None
            if kind is np.float32:
                def entry(x: Any) -> Any:
                    v = read[bisect_right(bounds, int(x.view(np.uint32)))]
                    return v if wrap is None else wrap(v)
            elif kind is float:
                pos, neg, npos = _value_bounds(starts)

                def entry(x: Any) -> Any:            # nonzero numbers by value, no bits
                    if x > 0.0:
                        v = read[bisect_right(pos, x)]
                    elif x < 0.0:
                        v = read[npos + bisect_right(neg, -x)]
                    else:                              # zeros (their sign) and NaN: bits
                        u = _UNPACK(_PACK(x))[0]
                        v = read[bisect_right(bounds, u)]
                    return v if wrap is None else wrap(v)
            else:
                def entry(x: Any) -> Any:
                    v = read[bisect_right(bounds, _UNPACK(_PACK(x))[0])]
                    return v if wrap is None else wrap(v)
    return entry


def _source_for(fmt: Format, wide: bool) -> Source:
    """float32 lanes when they hold the format exactly, else float64 lanes."""
    if not wide and F32.holds(fmt):
        return F32
    if F64.holds(fmt):
        return F64
    raise ValueError(f"format {fmt.name!r} cannot be rounded exactly through float64 "
                     f"(emin {fmt.emin}, emax {fmt.emax}, {fmt.mbits} mantissa bits)")


def _options(fmt: Any, mode: str, backend: str = "auto") -> tuple[Format, str, str]:
    """The resolved format, rounding mode and backend (names as every resolver reads them)."""
    mode = rounding.check_mode(mode)
    return get_format(fmt), mode, check_backend(backend, BACKENDS)


# --------------------------------------------------------------------------------------------
# Input preparation
# --------------------------------------------------------------------------------------------
def _as_array(x: Any) -> tuple[np.ndarray, bool]:
    """NumPy view of ``x`` and whether it was a Python scalar."""
    scalar = isinstance(x, numbers.Number) and not isinstance(x, np.ndarray)
    if isinstance(x, (str, bytes)) or (scalar and isinstance(x, complex)):
        raise TypeError(f"expected numbers, got {type(x).__name__}: {x!r:.40}")
    arr = np.asarray(x)
    if arr.dtype.kind in "OSUc" or arr.dtype.kind == "V" and arr.dtype.itemsize > 2:
        raise TypeError(f"expected real numbers, got an array of dtype {arr.dtype}")
    return arr, scalar and not isinstance(x, np.generic)


def _float_input(arr: np.ndarray, fmt: Format, rounding: str) -> np.ndarray:
    """A float32/float64 array holding the input's exact values."""
    kind = arr.dtype.kind
    if kind in "iub":
        return _int_to_float64(arr, fmt, rounding)
    if arr.dtype in (np.float32, np.float64):
        return arr
    return arr.astype(np.float32)  # float16 and ml_dtypes' 16-bit and narrower floats: exact


def _int_to_float64(arr: np.ndarray, fmt: Format, rounding: str) -> np.ndarray:
    """Integers as float64 without a second rounding.

    Beyond 2^53 the value is rounded to odd: rounding to odd at 53 bits and then to a format of
    at most 50 fraction bits equals rounding once (Boldo & Melquiond: two bits to spare).  Such
    integers into wider formats are refused, except ties-to-even into formats of float64's 52
    fraction bits, which is NumPy's own conversion (into 51 bits it would round twice: 2^60 +
    2^8 + 1 would become the tie 2^60 + 2^8 and then 2^60).
    """
    if arr.dtype.kind == "b":
        return arr.astype(np.float64)
    if arr.dtype.itemsize < 8 or arr.size == 0:
        return arr.astype(np.float64)
    # on the integers: 2^53 + 1 converts to 2^53, which a test on the floats would let through
    big = arr > 2**53 if arr.dtype.kind == "u" else (arr > 2**53) | (arr < -(2**53))
    if not big.any():
        return arr.astype(np.float64)
    if fmt.mbits > 50 and not fmt.is_int:
        if rounding == "rne" and fmt.mbits >= F64.mbits:
            return arr.astype(np.float64)
        raise ValueError(f"integers beyond 2^53 rounded to {fmt.name} with {rounding!r}: fpsim "
                         "rounds them exactly into formats of at most 50 fraction bits, or with "
                         "'rne' into 52; convert to float64 yourself first")
    f = arr.astype(np.float64)
    mag = np.abs(arr.astype(np.int64)).astype(np.uint64) if arr.dtype.kind == "i" else arr
    fmag = np.abs(f)
    back = np.minimum(fmag, 2.0**64 - 2048).astype(np.uint64)
    inexact = (back != mag) & big
    odd = (fmag.view(np.int64) & 1) == 1
    toward = np.where((fmag >= 2.0**64) | (back > mag), 0.0, np.inf)  # 2^64 is above any input
    fixed = np.where(inexact & ~odd, np.nextafter(fmag, toward), fmag)
    return np.copysign(fixed, f)


# --------------------------------------------------------------------------------------------
# The NumPy driver
# --------------------------------------------------------------------------------------------
def _sign_split(bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    neg = bits < 0
    return bits & np.iinfo(bits.dtype).max, neg


def _run_numpy(x: np.ndarray, fmt: Format, rounding: str, saturate: bool, subnormals: bool,
               seed: Any, want: str, out_dtype: np.dtype, srbits: int | None = None,
               rbits: np.ndarray | None = None) -> np.ndarray:
    flat = np.ascontiguousarray(x).reshape(-1)
    out = np.empty(flat.shape, dtype=out_dtype)
    if rounding in STOCHASTIC:
        rng = _numpy_rng(seed) if rbits is None else None
        _routine(flat, out, fmt, rounding, saturate, subnormals, want, rng, srbits,
                 None if rbits is None else rbits.reshape(-1))
    else:
        parallel.elementwise(numpy_plan(fmt, rounding, saturate, subnormals, want,
                                         flat.dtype == np.float64))(flat, out)
    return out.reshape(x.shape)


def _routine(flat: np.ndarray, out: np.ndarray, fmt: Format, rounding: str, saturate: bool,
             subnormals: bool, want: str, rng: np.random.Generator | None = None,
             srbits: int | None = None, rbits: np.ndarray | None = None) -> None:
    """The rounding routine itself, chunk by chunk (stochastic rounding: the caller's bits
    ``rbits``, else fresh bits from ``rng`` for every chunk: ``srbits`` of them per element, or
    all the lanes hold)."""
    src = _source_for(fmt, wide=flat.dtype == np.float64)
    work = flat.astype(np.float64 if src is F64 else np.float32, copy=False)
    itype = np.int64 if src is F64 else np.int32
    nbits = src.width - 2 if srbits is None else srbits
    for lo in range(0, work.size, CHUNK):
        a, neg = _sign_split(work[lo:lo + CHUNK].view(itype))
        rand = None
        if rbits is not None:
            rand = rbits[lo:lo + CHUNK].astype(itype)
        elif rng:
            rand = _NP.random_bits(a.shape, nbits, itype, rng)
        res = round_bits(_NP, a, neg, src, fmt, rounding, saturate=saturate,
                         subnormals=subnormals, rand=rand, srbits=srbits, want=want)
        out[lo:lo + CHUNK] = res.view(work.dtype) if want == "value" else res


@functools.lru_cache(maxsize=256)
def numpy_plan(fmt: Format, rounding: str, saturate: bool, subnormals: bool, want: str,
                wide: bool) -> Callable[[np.ndarray, np.ndarray], None]:
    """How a flat float32 (or, ``wide``, float64) array is rounded into ``out``, decided once per
    configuration: a lookup table, a delegated cast (bit-identical, see ``_delegate``), a float64
    input first rounded to odd in float32 (``_via_float32``), or the routine itself; with numba,
    long arrays into formats that share float32's exponent field in one pass (``_field_plan``)."""
    plan = _numpy_steps(fmt, rounding, saturate, subnormals, want, wide)
    if rounding in ("rne", "rna") and not saturate and subnormals and _float32_field(fmt):
        return _field_plan(plan, fmt, rounding, want)
    return plan


def _float32_field(fmt: Format) -> bool:
    """Whether ``fmt`` is float32 with at most 21 fraction bits (bf16, tf32, any e8mM): the same
    sign, exponent field and bias, IEEE inf and NaN (float32's quiet NaN as its NaN code),
    subnormals, the code laid out as float32's top bits."""
    return (fmt.signed and not fmt.is_int and not fmt.p3109 and fmt.ebits == 8
            and fmt.bias == 127 and fmt.nan == "ieee" and fmt.inf and fmt.zero
            and fmt.subnormals and fmt.mbits <= 21 and fmt.bits == 9 + fmt.mbits
            and fmt.nan_code << (F32.mbits - fmt.mbits) == 0x7FC00000)


def _field_plan(plan: Callable, fmt: Format, rounding: str, want: str) -> Callable:
    """Nearest rounding into a ``_float32_field`` format, codes or values, from float32 or
    float64 (rounded to odd into float32 on the way, see ``_through_float32``), in one compiled
    pass over arrays of at least ``JIT_SIZE`` elements (``fpsim._cast_kernels``); ``plan``
    (the NumPy steps) below that or without numba.  Tests compare the two bit for bit."""
    args = (np.uint32(F32.mbits - fmt.mbits), rounding == "rna", np.uint32(fmt.nan_code),
            want == "code")

    def run(flat: np.ndarray, out: np.ndarray) -> None:
        jit = jit_kernels() if flat.size >= JIT_SIZE else None
        if jit is None:
            plan(flat, out)
        else:
            jit.nearest_float32_field(flat, out, *args)
    return run


def _numpy_steps(fmt: Format, rounding: str, saturate: bool, subnormals: bool, want: str,
                 wide: bool) -> Callable[[np.ndarray, np.ndarray], None]:
    """``numpy_plan`` without the compiled one-pass plan."""
    src = _source_for(fmt, wide)
    if not wide and src is F64:
        return _convert_first(numpy_plan(fmt, rounding, saturate, subnormals, want, True),
                              np.float64, want)
    cast = None if wide else _delegate(fmt, rounding, saturate, subnormals, want)
    if cast is not None:
        return cast
    low = _table_low_bits(fmt, rounding, src)
    if wide and not low and _via_float32(fmt):
        near = rounding in ("rne", "rna") and not saturate and fmt.zero and not fmt.is_int
        cast = _delegate(fmt, rounding, saturate, subnormals, want)
        return _through_float32(cast or numpy_plan(fmt, rounding, saturate, subnormals, want,
                                                    False),
                                want, _midpoint_test(fmt) if near else None,
                                direct=cast is not None)
    if low:
        return _table_plan(_lookup_table(fmt, rounding, saturate, subnormals, want, low, src),
                           low, src)
    return functools.partial(_routine, fmt=fmt, rounding=rounding, saturate=saturate,
                             subnormals=subnormals, want=want)


def _table_plan(table: np.ndarray, low: int, src: Source) -> Callable:
    """Index = the input's high bits and one sticky bit for its ``low`` low bits; one gather.
    ``(u & below) + below`` (``below`` = the ``low - 1`` bits under the top low bit) carries
    into the top low bit exactly when a bit below it is set: OR-ing that into ``u`` and
    shifting by ``low - 1`` leaves high * 2 + sticky of all ``low`` bits.  In-place steps with
    0-d operands, NumPy's cheapest form for chunks; arrays of at most ``SMALL`` elements
    read the same table as steps (``_table_steps``): one binary search and one gather."""
    utype = np.uint64 if src is F64 else np.uint32
    shift = np.array(low - 1, utype)
    below = np.array((1 << (low - 1)) - 1, utype)
    args = (shift[()], below[()])                      # the compiled kernel's (scalars)
    built: list = []                                   # (starts, values), built on first use

    def steps() -> tuple[np.ndarray, np.ndarray]:
        if not built:
            built.append(_table_steps(table, low, utype))
        return built[0]

    def index(u: np.ndarray, idx: np.ndarray | None) -> np.ndarray:
        idx = np.bitwise_and(u, below, out=idx)         # None: a new array
        idx += below
        idx |= u
        idx >>= shift
        return idx

    def lookup(flat: np.ndarray, out: np.ndarray) -> None:
        u = flat.view(utype)
        if u.size <= SMALL:                            # two NumPy calls, kernels or not
            starts, values = steps()
            values.take(starts.searchsorted(u, "right"), out=out, mode="wrap")
            return
        # mid-size arrays too once the kernels are loaded: one compiled call instead of five
        # NumPy calls, each of which costs more than the whole job on a few elements
        jit = jit_kernels() if u.size >= JIT_SIZE else sys.modules.get(_KERNELS)
        if jit is not None:
            jit.table_lookup(u, table, *args, out)
            return
        if u.size <= CHUNK:
            table.take(index(u, None), out=out, mode="wrap")  # "raise" buffers out
            return
        idx = np.empty(CHUNK, utype)
        for lo in range(0, u.size, CHUNK):
            part = u[lo:lo + CHUNK]
            table.take(index(part, idx[:part.size]), out=out[lo:lo + part.size], mode="wrap")
    def small(x: np.ndarray) -> np.ndarray:
        """A new array of the table's values for an array of at most ``SMALL`` elements,
        any shape and strides (quantize's and encode's shortest path)."""
        starts, values = steps()
        return values[starts.searchsorted(x.view(utype), "right")]

    lookup.steps, lookup.small = steps, small                   # _scalar_plan's, the calls'
    lookup.index = (table, low - 1, (1 << (low - 1)) - 1)      # the compiled passes' (onepass)
    return lookup


def _value_bounds(starts: np.ndarray) -> tuple[list[float], list[float], int]:
    """Float64 steps (``_table_steps``) by value: ``(pos, neg, npos)`` where a number
    ``x > 0`` is on step ``bisect_right(pos, x)`` and ``x < 0`` on ``npos + bisect_right(neg,
    -x)`` (the bits order positive numbers by value, negative ones by magnitude after every
    positive bit pattern).  Starts among the NaN patterns are left out: no number reaches them,
    and NaN takes the bits path."""
    sign = np.uint64(1 << 63)
    inf = np.float64(np.inf).view(np.uint64)
    pos = starts[starts <= inf]
    neg = starts[(starts >= sign) & (starts - sign <= inf)] - sign
    return (pos.view(np.float64).tolist(), neg.view(np.float64).tolist(),
            int(np.count_nonzero(starts < sign)))


def _table_steps(table: np.ndarray, low: int, utype: type) -> tuple[np.ndarray, np.ndarray]:
    """``_table_plan``'s table as a step function of the input's bits ``u``: the value is
    ``values[starts.searchsorted(u, "right")]``.  Index ``2h`` holds the one input
    ``h << low`` and ``2h + 1`` the inputs strictly between it and ``(h + 1) << low``, so the
    indices run in the inputs' order and each step starts where the table's entry changes
    (entries compared as bits: NaN equals itself)."""
    bits = table.view(f"u{table.itemsize}")
    change = np.flatnonzero(bits[1:] != bits[:-1]) + 1
    starts = ((change >> 1).astype(utype) << utype(low)) | (change & 1).astype(utype)
    return starts, np.concatenate([table[:1], table[change]])


def _delegate(fmt: Format, rounding: str, saturate: bool, subnormals: bool,
              want: str) -> Callable | None:
    """ml_dtypes' float32 -> bfloat16 cast where it is fpsim's own rounding bit for bit
    (nearest even, overflow to inf, subnormals kept, NaN to the sign-keeping quiet NaN): several
    times faster (SIMD).  Tests compare the two on every float32 class exhaustively."""
    if (fmt != BF16 or rounding != "rne" or saturate or not subnormals):
        return None
    try:
        import ml_dtypes
    except ImportError:
        return None
    bf16 = ml_dtypes.bfloat16

    def cast(flat: np.ndarray, out: np.ndarray) -> None:
        with np.errstate(invalid="ignore"):   # signalling NaNs raise the FPU flag: quiet here
            if want != "value":
                np.copyto(out.view(bf16), flat, casting="unsafe")
                return
            buf = np.empty(min(flat.size, CHUNK), bf16)
            for lo in range(0, flat.size, CHUNK):
                part = buf[:min(CHUNK, flat.size - lo)]
                np.copyto(part, flat[lo:lo + CHUNK], casting="unsafe")
                np.copyto(out[lo:lo + part.size], part, casting="unsafe")
    return cast


def _convert_first(plan: Callable, dtype: Any, want: str) -> Callable:
    """A plan for ``dtype`` input run on another float dtype, converted exactly chunk by chunk
    (float32 into float64 lanes: the format needs them)."""
    def run(flat: np.ndarray, out: np.ndarray) -> None:
        for lo in range(0, flat.size, CHUNK):
            with np.errstate(invalid="ignore"):       # signalling NaNs widen quietly
                part = flat[lo:lo + CHUNK].astype(dtype)
            if want == "value":
                res = np.empty(part.size, dtype)
                plan(part, res)
                with np.errstate(over="ignore"):      # beyond the input dtype: inf, as casts do
                    out[lo:lo + part.size] = res
            else:
                plan(part, out[lo:lo + part.size])
    return run


def _through_float32(plan32: Callable, want: str,
                     midpoints: Callable[..., np.ndarray] | None = None,
                     direct: bool = False) -> Callable:
    """float64 input to a format that float32 holds with two bits to spare: round to odd into
    float32 first (exact, cheap), then the float32 plan.  Rounding to odd at 24 bits and then
    to at most 22 bits in any deterministic mode equals rounding once (Boldo & Melquiond): the
    odd result lies strictly inside the same interval between the target's values and midpoints
    as the input (every one of them is even in float32).

    With ``midpoints`` (nearest modes without saturation) NumPy's nearest cast comes first and
    only the elements it put on a target midpoint (``midpoints`` of their float32 bits) are
    rounded to odd: the nearest cast never crosses a midpoint, a value or the overflow
    threshold (all lie on float32's grid), so elsewhere the target rounding sees the same side
    of every one of them as the input; beyond float32's range it gives inf, as the target does.
    ``direct``: ``plan32`` is a cast that writes values into the float64 output itself (no
    float32 result and second copy).  With numba, arrays of at least ``JIT_SIZE`` elements are
    rounded to odd in one compiled pass instead (``fpsim._cast_kernels``, the same bits)."""
    def run(flat: np.ndarray, out: np.ndarray) -> None:
        m = min(flat.size, CHUNK)
        buf = np.empty(m, np.float32)
        res = np.empty(m, np.float32) if want == "value" and not direct else None
        jit = jit_kernels() if flat.size >= JIT_SIZE else None
        kernel = jit.round_to_odd_float32 if jit is not None else None
        # scratch for the midpoint test, allocated once per call: fresh temporaries in every
        # chunk cost page faults (glibc returns them to the system), in worker threads above all
        if midpoints is not None and kernel is None:
            scratch = (np.empty(m, np.uint32), np.empty(m, bool), np.empty(m, bool))
        for lo in range(0, flat.size, CHUNK):
            part = flat[lo:lo + CHUNK]
            n = part.size
            if kernel is not None:
                f = buf[:n]
                kernel(part, f.view(np.uint32))
            elif midpoints is None:
                f = _round_to_odd_float32(part, buf[:n])
            else:
                f = _nearest_float32(part, buf[:n], midpoints,
                                     scratch if n == m else [a[:n] for a in scratch])
            if res is None:
                plan32(f, out[lo:lo + n])
            else:
                plan32(f, res[:n])
                out[lo:lo + n] = res[:n]
    return run


def _nearest_float32(x: np.ndarray, f: np.ndarray, midpoints: Callable[..., np.ndarray],
                     scratch: Any) -> np.ndarray:
    """``x`` (float64) cast to nearest into float32 ``f``, then rounded to odd wherever the cast
    landed on a target midpoint (see ``_through_float32``); ``scratch``: the test's buffers."""
    with np.errstate(over="ignore", invalid="ignore"):
        np.copyto(f, x, casting="unsafe")
    hit = np.flatnonzero(midpoints(f.view(np.uint32), *scratch))
    if hit.size:
        xs, fs = x[hit], f[hit]
        if (fs != xs).any():          # exact casts are ties the target rounding breaks itself
            f[hit] = _round_to_odd_float32(xs, fs)
    return f


@functools.lru_cache(maxsize=64)
def _midpoint_test(fmt: Format) -> Callable[..., np.ndarray]:
    """Which float32 bit patterns may be midpoints between two values of ``fmt``: those whose
    ``23 - mbits`` dropped bits are exactly one half, and every magnitude below the target's
    least normal when its subnormal grid is not float32's with the same bits dropped."""
    drop = F32.mbits - fmt.mbits
    low = np.array((1 << drop) - 1, np.uint32)
    half = np.array(1 << (drop - 1), np.uint32)
    floor = np.array((fmt.emin + F32.bias) << F32.mbits, np.uint32)
    mag = np.array(0x7FFFFFFF, np.uint32)
    other_subnormals = fmt.emin > F32.emin

    def test(u: np.ndarray, tmp: np.ndarray, hit: np.ndarray, low_mag: np.ndarray) -> np.ndarray:
        np.equal(np.bitwise_and(u, low, out=tmp), half, out=hit)
        if other_subnormals:
            np.less(np.bitwise_and(u, mag, out=tmp), floor, out=low_mag)
            np.logical_or(hit, low_mag, out=hit)
        return hit
    return test


def _via_float32(fmt: Format) -> bool:
    """Whether float32 holds ``fmt`` with two bits to spare at every magnitude: at most 21
    fraction bits and a least spacing of at least 2^-147 (four float32 subnormal steps)."""
    least = fmt.emin - (fmt.mbits if fmt.subnormals else 0)
    return F32.holds(fmt) and fmt.mbits <= 21 and (fmt.is_int or least >= -147)


#: Fewest elements a compiled kernel takes: below, the gain is a few microseconds, and numba's
#: first use costs about 0.5 s once per process (import, cache load; compiling when uncached).
JIT_SIZE = 1 << 16
_KERNELS = f"{__package__}._cast_kernels"      # loaded: small arrays take the kernels too


@functools.cache
def jit_kernels() -> Any:
    """``fpsim._cast_kernels`` (numba's one-pass twins of NumPy steps here), or None without
    numba."""
    try:
        from . import _cast_kernels
    except ImportError:
        return None
    return _cast_kernels


def _round_to_odd_float32(x: np.ndarray, f: np.ndarray) -> np.ndarray:
    """``x`` (float64) rounded to odd into float32 ``f``: NumPy's nearest-even cast, then one ulp
    towards ``x`` wherever that cast was inexact and landed on an even significand (beyond the
    range that moves inf back to the largest float32, below it 0 up to the least subnormal)."""
    with np.errstate(over="ignore", invalid="ignore"):
        np.copyto(f, x, casting="unsafe")
    back = f.astype(np.float64)
    u = f.view(np.uint32)
    fix = (back != x) & ((u & 1) == 0) & (x == x)
    if fix.any():
        away = np.abs(back) > np.abs(x)
        u -= (fix & away).view(np.uint8).astype(np.uint32)
        u += (fix & ~away).view(np.uint8).astype(np.uint32)
    return f


TABLE_BYTES = 1 << 23  # the largest lookup table (of values) kept per configuration: 8 MB


def _numpy_rng(seed: Any) -> np.random.Generator:
    if seed is None or isinstance(check_seed(seed), (numbers.Integral, np.random.Generator,
                                         np.random.SeedSequence)):
        return np.random.default_rng(seed)
    raise TypeError(f"seed for NumPy input must be an int, a numpy Generator or None, not "
                    f"{type(seed).__name__} (a torch.Generator works with torch tensors)")


def _table_low_bits(fmt: Format, rounding: str, src: Source) -> int:
    """How many low source bits a lookup table may fold into one sticky bit (0: no table).

    Rounding drops at least ``least_shift`` bits, so bits below the half-ulp bit only matter
    through "any of them set": a table indexed by the high ``width - low`` bits and that sticky
    bit is exact when ``low < least_shift``.  The largest such ``low`` is taken, and a table only
    when it has at most TABLE_BYTES of values: float32 into fp16/tf32 (2^21 entries), bf16,
    FP8/FP6/FP4 and integers (2^17-2^18); float64 into FP8/FP6/FP4, E8M0 and integers.
    """
    if rounding in STOCHASTIC or fmt.bits > 19:
        return 0
    least_shift = src.mbits - fmt.mbits + (1 if fmt.is_int else 0)
    low = min(src.width - 16, least_shift - 1)
    entries = 2 ** (src.width - low + 1)
    return low if entries * src.width // 8 <= TABLE_BYTES else 0


@functools.lru_cache(maxsize=16)
def _lookup_table(fmt: Format, rounding: str, saturate: bool, subnormals: bool, want: str,
                  low: int, src: Source) -> np.ndarray:
    """The rounding routine evaluated once per (high bits, sticky): index = high * 2 + sticky."""
    utype, itype = (np.uint64, np.int64) if src is F64 else (np.uint32, np.int32)
    hi = np.arange(1 << (src.width - low), dtype=utype) << utype(low)
    reps = np.stack([hi, hi | utype(1)], axis=1).reshape(-1).view(itype)
    a, neg = _sign_split(reps)
    res = round_bits(_NP, a, neg, src, fmt, rounding, saturate=saturate,
                       subnormals=subnormals, want=want)
    if want == "value":
        return res.view(np.float64 if src is F64 else np.float32)
    return res.astype(code_dtype(fmt))


def _check_nan(arr: Any, fmt: Format, on_nan: str) -> None:
    if on_nan not in ("raise", "zero"):
        raise ValueError(f"on_nan={on_nan!r}: choose 'raise' or 'zero'")
    if on_nan == "raise" and not fmt.has_nan:
        count = int((arr != arr).sum())
        if count:
            raise ValueError(f"{count} NaN input(s) cannot be encoded: {fmt.name} has no NaN code. "
                             "Pass on_nan='zero' to map them to zero as ml_dtypes does.")


# --------------------------------------------------------------------------------------------
# The torch driver (same algorithm, whole tensor at once)
# --------------------------------------------------------------------------------------------
def _run_torch(x: Any, fmt: Format, rounding: str, saturate: bool, subnormals: bool, seed: Any,
               want: str, srbits: int | None = None, rbits: Any = None) -> Any:
    import torch

    ops = ops_for(x)
    if x.is_complex():
        raise TypeError(f"expected a real tensor, got dtype {x.dtype}")
    if not x.is_floating_point():
        work = torch.from_numpy(_int_to_float64(x.cpu().numpy(), fmt, rounding)).to(x.device)
    else:
        work = x
    src = _source_for(fmt, wide=work.dtype == torch.float64)
    fdt, itype = (torch.float64, torch.int64) if src is F64 else (torch.float32, torch.int32)
    work = work.to(fdt).contiguous()
    bits = work.view(itype)
    neg = bits < 0
    a = bits & torch.iinfo(itype).max
    rand = None
    if rbits is not None:
        rand = rbits.to(itype)
    elif rounding in STOCHASTIC:
        rand = ops.random_bits(tuple(a.shape), src.width - 2 if srbits is None else srbits,
                               itype, seed, device=a.device)
    res = round_bits(ops, a, neg, src, fmt, rounding, saturate=saturate, subnormals=subnormals,
                     rand=rand, srbits=srbits, want=want)
    if want == "value":
        return res.view(fdt)
    return res


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------
def _tensor_via_numpy(x: Any) -> np.ndarray:
    import torch

    x = x.detach()
    if x.dtype in (torch.float32, torch.float64) or not x.is_floating_point():
        return x.numpy()
    return x.float().numpy()  # float16/bfloat16: exact in float32


def quantize(x: Any, fmt: str | Format, *, rounding: str = "rne", saturate: bool | str = False,
             subnormals: bool = True, seed: Any = None, srbits: int | None = None,
             random_bits: Any = None, backend: str = "auto") -> Any:
    """Round every element of ``x`` to the nearest value of ``fmt`` under ``rounding``.

    Returns the same kind of object as ``x``: NumPy array of the same float dtype (integer arrays
    give float64), Python float for a Python number, torch tensor of the same dtype and device.
    The input's exact value is rounded once; float64 is never rounded through float32.  (When
    the format is finer than the input dtype, e.g. bfloat16 input to fp16, the result is cast
    back to the input dtype like any cast.)  Overflow gives inf (or NaN for formats with NaN and
    no inf) unless ``saturate`` or the rounding direction says the largest finite value; NaN
    stays NaN.  ``saturate="finite"`` also sends infinite inputs to +-max (P3109's SatFinite;
    ``True`` is its SatPropagate, ``False`` its SatNone).  ``backend`` picks the driver for
    torch tensors (see ``fpsim.dispatch.route``): ``"auto"``, ``"numpy"``, ``"torch"`` or
    ``"triton"``.  Stochastic modes (docs/stochastic.md): ``srbits`` random bits per element
    (None: every dropped bit, exact probabilities), drawn from ``seed`` or given as
    ``random_bits`` (integers of ``x``'s shape in [0, 2^srbits)): the same random bits give the
    same result on every backend.

    >>> import numpy as np, fpsim
    >>> q = fpsim.quantize(np.float32(0.1), "bf16")
    >>> float(q), type(q).__name__                               # the type is kept
    (0.10009765625, 'float32')
    >>> fpsim.quantize([300.0, 1e-3], "e4m3", saturate=True).tolist()
    [288.0, 0.001953125]
    """
    if type(x) is np.ndarray and srbits is None and random_bits is None:
        fast = _fast_plan(fmt, rounding, saturate, subnormals, backend, "raise", x.dtype, "value")
        if fast:
            if fast[3] is not None and x.ndim and x.size <= SMALL:
                return fast[3](x)
            out = np.empty(x.shape, x.dtype)
            fast[0](x.ravel(), out.reshape(-1))
            return out
    elif type(x) in _SCALAR_TYPES:
        key = (type(x), fmt, rounding, saturate, subnormals, backend, "raise", "value")
        try:
            one = _SCALAR[key]                         # a repeated call: no further call
        except (KeyError, TypeError):
            one = _scalar_plan(key)
        if one:
            return one(x)
    fmt, rounding, backend = _options(fmt, rounding, backend)
    saturate, subnormals = check_saturate(saturate), check_flag(subnormals, "subnormals")
    srbits = check_srbits(srbits, rounding)
    x = check_input(x)
    rbits = check_random_bits(random_bits, x, rounding, srbits, seed)
    sr = {"srbits": srbits, "random_bits": rbits}
    if is_torch(x):
        route = dispatch.route(x, backend, fmt, seed)
        if route == "triton":
            return dispatch.quantize(x, fmt, rounding=rounding, saturate=saturate,
                                     subnormals=subnormals, seed=seed, **sr)
        if route == "torch":
            out = _run_torch(x, fmt, rounding, saturate, subnormals, seed, "value", srbits, rbits)
        else:
            import torch

            out = torch.from_numpy(quantize(
                _tensor_via_numpy(x), fmt, rounding=rounding, saturate=saturate,
                subnormals=subnormals, seed=seed, srbits=srbits,
                random_bits=None if rbits is None else rbits.cpu().numpy()))
        return out.to(x.dtype) if x.is_floating_point() else out
    arr, scalar = _as_array(x)
    work = _float_input(arr, fmt, rounding)
    wide = work.dtype == np.float64 or not F32.holds(fmt)   # float64 lanes: float64 values
    out = _run_numpy(work, fmt, rounding, saturate, subnormals, seed, "value",
                     np.dtype(np.float64 if wide else np.float32), srbits, rbits)
    if arr.dtype.kind not in "iub" and out.dtype != arr.dtype:
        with np.errstate(over="ignore"):  # beyond the input dtype's range: inf, as casts do
            out = out.astype(arr.dtype)
    if scalar:
        return float(out)
    if isinstance(x, np.generic):
        return out.reshape(())[()]  # a NumPy scalar in, a NumPy scalar of its dtype out
    return out if arr.ndim else out.reshape(())


def encode(x: Any, fmt: str | Format, *, rounding: str = "rne", saturate: bool | str = False,
           subnormals: bool = True, seed: Any = None, srbits: int | None = None,
           random_bits: Any = None, on_nan: str = "raise", backend: str = "auto",
           **deprecated: Any) -> Any:
    """The bit codes of ``quantize(x, fmt, ...)``, in the smallest unsigned dtype that holds them.

    Sub-byte codes sit in the low bits; integer formats use two's complement.  NaN inputs into a
    format without a NaN code raise ``ValueError`` unless ``on_nan="zero"`` (ml_dtypes'
    behaviour: NaN becomes a zero; the old keyword ``nan=`` still works with a warning).
    torch tensors give torch tensors on the same device, in ``fpsim.backend.code_dtype``'s
    torch dtype: uint8 for codes of up to 8 bits, else int32/int64 lanes.  ``srbits`` and
    ``random_bits``: as [``quantize``][].

    >>> import fpsim
    >>> fpsim.encode([448.0, 500.0, -0.0], "e4m3").tolist()    # 500 overflows to NaN (0x7F)
    [126, 127, 128]
    >>> fpsim.encode([1.0], "bf16").dtype
    dtype('uint16')
    """
    if type(x) is np.ndarray and not deprecated and srbits is None and random_bits is None:
        fast = _fast_plan(fmt, rounding, saturate, subnormals, backend, on_nan, x.dtype, "code")
        if fast and (not fast[2] or not np.isnan(x).any()):
            if fast[3] is not None and x.ndim and x.size <= SMALL:
                return fast[3](x)
            out = np.empty(x.shape, fast[1])
            fast[0](x.ravel(), out.reshape(-1))
            return out
    elif type(x) in _SCALAR_TYPES and not deprecated:
        key = (type(x), fmt, rounding, saturate, subnormals, backend, on_nan, "code")
        try:
            one = _SCALAR[key]                         # a repeated call: no further call
        except (KeyError, TypeError):
            one = _scalar_plan(key)
        if one:
            return one(x)
    on_nan = on_nan_keyword(on_nan, deprecated, "encode")
    fmt, rounding, backend = _options(fmt, rounding, backend)
    saturate, subnormals = check_saturate(saturate), check_flag(subnormals, "subnormals")
    srbits = check_srbits(srbits, rounding)
    x = check_input(x)
    rbits = check_random_bits(random_bits, x, rounding, srbits, seed)
    if is_torch(x):
        route = dispatch.route(x, backend, fmt, seed)
        if route == "triton":                         # checks NaN inside the kernel
            return dispatch.encode(x, fmt, rounding=rounding, saturate=saturate,
                                   subnormals=subnormals, seed=seed, on_nan=on_nan,
                                   srbits=srbits, random_bits=rbits)
        _check_nan(x, fmt, on_nan)
        if route == "torch":
            res = _run_torch(x, fmt, rounding, saturate, subnormals, seed, "code", srbits, rbits)
        else:
            import torch

            res = torch.from_numpy(encode(
                _tensor_via_numpy(x), fmt, rounding=rounding, saturate=saturate,
                subnormals=subnormals, seed=seed, srbits=srbits,
                random_bits=None if rbits is None else rbits.cpu().numpy(),
                on_nan=on_nan).astype(np.int64, copy=False).view(np.int64))
        return _torch_codes(res, fmt)
    arr, _ = _as_array(x)
    _check_nan(arr, fmt, on_nan)
    work = _float_input(arr, fmt, rounding)
    cdt = code_dtype(fmt)
    out = _run_numpy(work, fmt, rounding, saturate, subnormals, seed, "code", cdt, srbits, rbits)
    return out if arr.ndim else out.reshape(())


def _torch_codes(codes: Any, fmt: Format) -> Any:
    """Codes in ``fpsim.backend.code_dtype``'s torch dtype; int64 lanes hold the unsigned
    code (64-bit codes keep their two's complement bit pattern)."""
    out = codes.to(code_dtype(fmt, torch=True))
    return out & 0xFFFFFFFF if fmt.bits == 32 else out


def decode(codes: Any, fmt: str | Format, *, dtype: Any = np.float64) -> Any:
    """Values of the codes of ``fmt``: every code, NaN and inf included.

    The values are exact in float64; a narrower ``dtype`` (float, or integer for integer
    values) is refused with ValueError unless it holds every decoded value exactly (every
    FP8/FP6/FP4 code fits float32).  torch tensors decode on their own device (to
    ``torch.float64`` unless ``dtype`` is a torch dtype; another NumPy dtype is refused).

    >>> import numpy as np, fpsim
    >>> fpsim.decode([0x7E, 0x7F, 0x80], "e4m3").tolist()         # max, NaN, -0
    [448.0, nan, -0.0]
    >>> fpsim.decode(np.uint8([1, 7]), "e2m1", dtype=np.float32).tolist()
    [0.5, 6.0]
    """
    fmt = get_format(fmt)
    if isinstance(codes, int) and not isinstance(codes, bool):   # before 2^64 becomes a float
        _check_code_range(codes, codes, fmt)
    codes = check_input(codes, "codes")
    if is_torch(codes):
        import torch

        if codes.is_floating_point() or codes.is_complex() or codes.dtype == torch.bool:
            raise TypeError(f"codes must be integers, got dtype {codes.dtype}")
        if not isinstance(dtype, torch.dtype) and np.dtype(dtype) != np.float64:
            raise TypeError(f"dtype={np.dtype(dtype)}: the codes are a torch tensor; pass a "
                            "torch dtype (e.g. torch.float32)")
        wide = codes.to(torch.int64)  # 64-bit codes arrive as int64 bit patterns: all valid
        if fmt.bits < 64 and wide.numel():
            _check_code_range(int(wide.min()), int(wide.max()), fmt)
        if fmt.bits <= _TABLE_BITS:
            out = _torch_decode_table(fmt, codes.device)[wide]
        else:
            ops = ops_for(codes)
            out = ops.view(decode_bits(ops, wide, F64, fmt), torch.float64)
        want = dtype if isinstance(dtype, torch.dtype) else torch.float64
        return out if want == torch.float64 else exact_cast(out, want)
    arr, scalar = _as_array(codes)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"codes must be integers, got dtype {arr.dtype}")
    if arr.size:
        _check_code_range(int(arr.min()), int(arr.max()), fmt)
    if fmt.bits <= _TABLE_BITS:
        out = decode_table(fmt).take(arr)
    else:
        out = decode_bits(_NP, arr.astype(np.uint64).view(np.int64), F64, fmt).view(np.float64)
    if np.dtype(dtype) != np.float64:
        out = exact_cast(out, dtype)
    return float(out) if scalar else out


#: Formats of at most this many bits decode through a table of every code's value.
_TABLE_BITS = 16


@functools.lru_cache(maxsize=64)
def decode_table(fmt: Format) -> np.ndarray:
    """float64 value of every code of ``fmt`` (at most 2^16), computed once by ``decode_bits``:
    decoding is then one gather, on NumPy or torch.

    >>> decode_table(get_format("e2m1"))[:8].tolist()
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    """
    codes = np.arange(fmt.num_codes, dtype=np.int64)
    table = decode_bits(_NP, codes, F64, fmt).view(np.float64)
    table.flags.writeable = False
    return table


@functools.lru_cache(maxsize=64)
def _torch_decode_table(fmt: Format, device: Any) -> Any:
    """``decode_table`` as a float64 tensor on ``device``."""
    import torch

    return torch.tensor(decode_table(fmt), dtype=torch.float64, device=device)


def _check_code_range(lo: int, hi: int, fmt: Format) -> None:
    if lo < 0 or hi >= fmt.num_codes:
        raise ValueError(f"codes out of range for {fmt.name}: {fmt.bits}-bit codes lie in "
                         f"[0, {fmt.num_codes - 1}] (got {lo}..{hi})")


def values(fmt: str | Format) -> np.ndarray:
    """Every finite value of a format of at most 16 bits, sorted, each once (one zero).

    >>> import fpsim
    >>> fpsim.values("e2m1").tolist()
    [-6.0, -4.0, -3.0, -2.0, -1.5, -1.0, -0.5, -0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    """
    fmt = get_format(fmt)
    if fmt.bits > 16:
        raise ValueError(f"{fmt.name} has 2^{fmt.bits} codes; values() lists formats of at most "
                         "16 bits")
    v = decode(np.arange(fmt.num_codes, dtype=np.uint32), fmt)
    return np.unique(v[np.isfinite(v)])
