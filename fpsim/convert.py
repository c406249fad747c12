"""Public conversions: quantize, encode, decode, values.

This module only prepares inputs (types, dtypes, chunks, exact integer conversion) and hands the
bits to the single rounding routine in :mod:`fpsim.rounding`.  Where the dropped bits allow it
(float32 into FP8/FP6/FP4, bf16, fp16, tf32 and integers; float64 into FP8/FP6/FP4, E8M0 and
integers) the same routine is evaluated once on representative inputs and the result used as a
lookup table: rounding to such a format depends only on the input's high bits and on whether
any of its low bits is set (see ``_table_low_bits``).
"""

from __future__ import annotations

import functools
import numbers
from typing import Any

import numpy as np

from . import dispatch
from . import rounding
from .backend import NumpyOps, check_backend, code_dtype, is_torch, on_nan_keyword, ops_for
from .dispatch import CONVERT_BACKENDS as BACKENDS
from .formats import Format, get_format
from .rounding import F32, F64, Source, check_saturate, decode_bits, round_bits

CHUNK = 1 << 16  # elements per slice: temporaries stay in cache, memory stays near the output's
_NP = NumpyOps()


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
    at most 51 fraction bits equals rounding once (Boldo & Melquiond).  Only fp64-wide targets
    with such integers and a mode other than ties-to-even (numpy's own rounding) are refused.
    """
    if arr.dtype.kind == "b":
        return arr.astype(np.float64)
    if arr.dtype.itemsize < 8 or arr.size == 0:
        return arr.astype(np.float64)
    big = np.abs(arr.astype(np.float64)) > 2.0**53
    if not big.any():
        return arr.astype(np.float64)
    if fmt.mbits > 50 and not fmt.is_int:
        if rounding == "rne":
            return arr.astype(np.float64)
        raise ValueError(f"integers beyond 2^53 rounded to {fmt.name} with {rounding!r}: only "
                         "'rne' is supported there; convert to float64 yourself first")
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
               seed: Any, want: str, out_dtype: np.dtype) -> np.ndarray:
    src = _source_for(fmt, wide=x.dtype == np.float64)
    with np.errstate(invalid="ignore"):  # NaN payloads of narrow floats widen silently
        work = x.astype(np.float64 if src is F64 else np.float32, copy=False)
    flat = np.ascontiguousarray(work).reshape(-1)
    out = np.empty(flat.shape, dtype=out_dtype)
    itype, utype = (np.int64, np.uint64) if src is F64 else (np.int32, np.uint32)
    low = _table_low_bits(fmt, rounding, src)
    if low:
        table = _lookup_table(fmt, rounding, saturate, subnormals, want, low, src)
        high_mask = utype(((1 << src.width) - 1 >> (low - 1)) & ~1)
        low_mask = utype((1 << low) - 1)
    rng = _numpy_rng(seed) if rounding == "stochastic" else None
    for lo in range(0, flat.size, CHUNK):
        chunk = flat[lo:lo + CHUNK]
        if low:
            u = chunk.view(utype)
            idx = ((u >> utype(low - 1)) & high_mask) | ((u & low_mask) != 0)
            out[lo:lo + CHUNK] = table[idx]
            continue
        a, neg = _sign_split(chunk.view(itype))
        rand = _NP.random_bits(a.shape, src.width - 2, itype, rng) if rng else None
        res = round_bits(_NP, a, neg, src, fmt, rounding, saturate=saturate,
                           subnormals=subnormals, rand=rand, want=want)
        if want == "value":
            out[lo:lo + CHUNK] = res.view(work.dtype)
        else:
            out[lo:lo + CHUNK] = res
    return out.reshape(x.shape)


TABLE_BYTES = 1 << 23  # the largest lookup table (of values) kept per configuration: 8 MB


def _numpy_rng(seed: Any) -> np.random.Generator:
    if seed is None or isinstance(seed, (numbers.Integral, np.random.Generator,
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
    if rounding == "stochastic" or fmt.bits > 19:
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
               want: str) -> Any:
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
    rand = ops.random_bits(tuple(a.shape), src.width - 2, itype, seed, device=a.device) \
        if rounding == "stochastic" else None
    res = round_bits(ops, a, neg, src, fmt, rounding, saturate=saturate, subnormals=subnormals,
                       rand=rand, want=want)
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
             subnormals: bool = True, seed: Any = None, backend: str = "auto") -> Any:
    """Round every element of ``x`` to the nearest value of ``fmt`` under ``rounding``.

    Returns the same kind of object as ``x``: NumPy array of the same float dtype (integer arrays
    give float64), Python float for a Python number, torch tensor of the same dtype and device.
    The input's exact value is rounded once; float64 is never rounded through float32.  (When
    the format is finer than the input dtype, e.g. bfloat16 input to fp16, the result is cast
    back to the input dtype like any cast.)  Overflow gives inf (or NaN for formats with NaN and
    no inf) unless ``saturate`` or the rounding direction says the largest finite value; NaN
    stays NaN.  ``saturate="finite"`` also sends infinite inputs to +-max (P3109's SatFinite;
    ``True`` is its SatPropagate, ``False`` its SatNone).  ``backend`` picks the driver for
    torch tensors (see :func:`fpsim.dispatch.route`): ``"auto"``, ``"numpy"``, ``"torch"`` or
    ``"triton"``.
    """
    fmt, rounding, backend = _options(fmt, rounding, backend)
    saturate = check_saturate(saturate)
    if is_torch(x):
        route = dispatch.route(x, backend, fmt, seed)
        if route == "triton":
            return dispatch.quantize(x, fmt, rounding=rounding, saturate=saturate,
                                     subnormals=subnormals, seed=seed)
        if route == "torch":
            out = _run_torch(x, fmt, rounding, saturate, subnormals, seed, "value")
        else:
            import torch

            out = torch.from_numpy(quantize(_tensor_via_numpy(x), fmt, rounding=rounding,
                                            saturate=saturate, subnormals=subnormals, seed=seed))
        return out.to(x.dtype) if x.is_floating_point() else out
    arr, scalar = _as_array(x)
    work = _float_input(arr, fmt, rounding)
    out = _run_numpy(work, fmt, rounding, saturate, subnormals, seed, "value",
                     np.dtype(np.float64 if work.dtype == np.float64 else np.float32))
    if arr.dtype.kind not in "iub" and out.dtype != arr.dtype:
        with np.errstate(over="ignore"):  # beyond the input dtype's range: inf, as casts do
            out = out.astype(arr.dtype)
    if scalar:
        return float(out)
    if isinstance(x, np.generic):
        return out.reshape(())[()]  # a NumPy scalar in, a NumPy scalar of its dtype out
    return out if arr.ndim else out.reshape(())


def encode(x: Any, fmt: str | Format, *, rounding: str = "rne", saturate: bool | str = False,
           subnormals: bool = True, seed: Any = None, on_nan: str = "raise",
           backend: str = "auto", **deprecated: Any) -> Any:
    """The bit codes of ``quantize(x, fmt, ...)``, in the smallest unsigned dtype that holds them.

    Sub-byte codes sit in the low bits; integer formats use two's complement.  NaN inputs into a
    format without a NaN code raise ``ValueError`` unless ``on_nan="zero"`` (ml_dtypes'
    behaviour: NaN becomes a zero; the old keyword ``nan=`` still works with a warning).
    torch tensors give torch tensors on the same device, in :func:`fpsim.backend.code_dtype`'s
    torch dtype: uint8 for codes of up to 8 bits, else int32/int64 lanes.
    """
    on_nan = on_nan_keyword(on_nan, deprecated, "encode")
    fmt, rounding, backend = _options(fmt, rounding, backend)
    saturate = check_saturate(saturate)
    if is_torch(x):
        route = dispatch.route(x, backend, fmt, seed)
        if route == "triton":                         # checks NaN inside the kernel
            return dispatch.encode(x, fmt, rounding=rounding, saturate=saturate,
                                   subnormals=subnormals, seed=seed, on_nan=on_nan)
        _check_nan(x, fmt, on_nan)
        if route == "torch":
            res = _run_torch(x, fmt, rounding, saturate, subnormals, seed, "code")
        else:
            import torch

            res = torch.from_numpy(encode(_tensor_via_numpy(x), fmt, rounding=rounding,
                                          saturate=saturate, subnormals=subnormals, seed=seed,
                                          on_nan=on_nan).astype(np.int64, copy=False)
                                   .view(np.int64))
        return _torch_codes(res, fmt)
    arr, _ = _as_array(x)
    _check_nan(arr, fmt, on_nan)
    work = _float_input(arr, fmt, rounding)
    cdt = code_dtype(fmt)
    out = _run_numpy(work, fmt, rounding, saturate, subnormals, seed, "code", cdt)
    return out if arr.ndim else out.reshape(())


def _torch_codes(codes: Any, fmt: Format) -> Any:
    """Codes in :func:`fpsim.backend.code_dtype`'s torch dtype; int64 lanes hold the unsigned
    code (64-bit codes keep their two's complement bit pattern)."""
    out = codes.to(code_dtype(fmt, torch=True))
    return out & 0xFFFFFFFF if fmt.bits == 32 else out


def decode(codes: Any, fmt: str | Format, *, dtype: Any = np.float64) -> Any:
    """Values of the codes of ``fmt``: every code, NaN and inf included.

    The values are exact in float64; a narrower ``dtype`` holds them exactly when the format fits
    it (e.g. every FP8/FP6/FP4 code in float32).  torch tensors decode on their own device (to
    ``torch.float64`` unless ``dtype`` is a torch dtype).
    """
    fmt = get_format(fmt)
    if is_torch(codes):
        import torch

        if codes.is_floating_point() or codes.is_complex():
            raise TypeError(f"codes must be integers, got dtype {codes.dtype}")
        wide = codes.to(torch.int64)  # 64-bit codes arrive as int64 bit patterns: all valid
        if fmt.bits < 64 and wide.numel():
            _check_code_range(int(wide.min()), int(wide.max()), fmt)
        ops = ops_for(codes)
        out = ops.view(decode_bits(ops, wide, F64, fmt), torch.float64)
        return out.to(dtype if isinstance(dtype, torch.dtype) else torch.float64)
    arr, scalar = _as_array(codes)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"codes must be integers, got dtype {arr.dtype}")
    if arr.size:
        _check_code_range(int(arr.min()), int(arr.max()), fmt)
    bits = decode_bits(_NP, arr.astype(np.uint64).view(np.int64), F64, fmt)
    out = bits.view(np.float64).astype(dtype)
    return float(out) if scalar else out


def _check_code_range(lo: int, hi: int, fmt: Format) -> None:
    if lo < 0 or hi >= fmt.num_codes:
        raise ValueError(f"codes out of range for {fmt.name}: {fmt.bits}-bit codes lie in "
                         f"[0, {fmt.num_codes - 1}] (got {lo}..{hi})")


def values(fmt: str | Format) -> np.ndarray:
    """Every finite value of a format of at most 16 bits, sorted, each once (one zero)."""
    fmt = get_format(fmt)
    if fmt.bits > 16:
        raise ValueError(f"{fmt.name} has 2^{fmt.bits} codes; values() lists formats of at most "
                         "16 bits")
    v = decode(np.arange(fmt.num_codes, dtype=np.uint32), fmt)
    return np.unique(v[np.isfinite(v)])
