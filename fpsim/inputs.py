"""The input gate: every public entry point passes its data through ``check_input``.

Data arrives in more shapes than float32/float64 arrays: other byte orders, long double,
dates, masked arrays.  Each is either converted without changing a single value or refused with
an error that names the problem and the fix; nothing is rounded on the way in.

* Non-native byte order (``'>f8'`` on a little-endian machine, or ``'<f4'`` on a big-endian
  one): converted to the native order, values unchanged.
* ``np.longdouble`` wider than float64 (x87 80-bit, IEEE quad): converted to float64 when every
  value (inf and NaN included) is a float64 exactly, else ``ValueError`` (fpsim rounds from
  float64 at most; round with ``.astype(np.float64)`` yourself if that double rounding is
  acceptable).
* ``datetime64`` / ``timedelta64``, strings, bytes, objects, complex numbers, raw bytes and
  records (NumPy ``void``: what a ``.npy`` file saved from an ml_dtypes array holds; view it
  as the ml_dtypes type again): ``TypeError``.
* Python integers beyond 64 bits: converted to float64 when it holds them exactly, else
  ``ValueError``; other Python numbers (``Fraction``, ``Decimal``): ``TypeError``.
* Masked arrays: ``TypeError`` (the mask would be lost); pass ``x.filled(value)`` or
  ``x.compressed()``.

torch tensors and Python ints and floats pass unchanged (torch has one byte order and no long
double; complex tensors are refused).  The keyword checks every entry point shares live here
too: ``check_flag`` (yes/no arguments) and ``check_seed``.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from .backend import is_torch

_REFUSED_KINDS = {"M": "dates (datetime64)", "m": "durations (timedelta64)", "O": "objects",
                  "S": "bytes", "U": "strings", "c": "complex numbers"}
_INT64 = (-(2**63), 2**64)                       # NumPy holds integers in [lo, hi) exactly


def check_input(x: Any, name: str = "x") -> Any:
    """``x`` with exactly its values, as a native-endian array (or unchanged): see module doc.

    Python ints and floats and tensors come back as given (an int beyond 64 bits as the float64
    that holds it), NumPy scalars as NumPy scalars, anything else as a NumPy array.  ``name``
    is the argument's name in error messages.
    """
    if is_torch(x):
        if x.is_complex():
            raise TypeError(f"{name}: expected real numbers, got a complex tensor ({x.dtype})")
        return x
    if isinstance(x, (str, bytes)) or isinstance(x, complex):
        raise TypeError(f"{name}: expected real numbers, got {type(x).__name__}: {x!r:.40}")
    if isinstance(x, numbers.Number) and not isinstance(x, np.generic):
        return _python_number(x, name)
    if isinstance(x, np.ma.MaskedArray):
        raise TypeError(f"{name} is a masked array; fpsim would lose its mask: pass "
                        f"{name}.filled(value) or {name}.compressed()")
    arr = np.asarray(x)
    kind = arr.dtype.kind
    if kind in _REFUSED_KINDS:
        raise TypeError(f"{name}: expected real numbers, got {_REFUSED_KINDS[kind]} (dtype "
                        f"{arr.dtype}{_example(arr)}); pass real numbers: a float or integer "
                        "array")
    if arr.dtype.type is np.void:
        raise TypeError(f"{name}: expected real numbers, got raw bytes or records (dtype "
                        f"{arr.dtype}); a .npy file saved from an ml_dtypes array holds raw "
                        f"bytes: view them as its type again, e.g. {name}.view(ml_dtypes.bfloat16)")
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if kind == "f" and arr.dtype.itemsize > 8:
        arr = _long_double(arr, name)
    return arr.reshape(())[()] if isinstance(x, np.generic) else arr


def _python_number(x: numbers.Number, name: str) -> int | float:
    """A Python int or float unchanged (an int beyond 64 bits as the float64 that holds it
    exactly); other numbers refused: NumPy would make an object array of them."""
    if isinstance(x, int) and not _INT64[0] <= x < _INT64[1]:
        f = float(x) if abs(x) < 2**1024 else None
        if f is None or int(f) != x:
            raise ValueError(f"{name}: an integer of {abs(x).bit_length()} bits, which neither "
                             "NumPy's 64-bit integers nor float64 hold exactly; pass "
                             f"float({name}) if rounding it to float64 first is acceptable")
        return f
    if isinstance(x, (int, float)):
        return x
    raise TypeError(f"{name}: {type(x).__name__} {x!r:.40} is not supported: pass a float, an "
                    f"int or an array (float({name}) rounds it to float64)")


def _example(arr: np.ndarray) -> str:
    """For an object array, its first element that is not a number NumPy can hold."""
    if arr.dtype.kind != "O":
        return ""
    for v in arr.flat:
        if not (isinstance(v, (float, np.floating)) or (isinstance(v, (int, np.integer))
                                                         and _INT64[0] <= v < _INT64[1])):
            if isinstance(v, int):
                return f", e.g. an integer of {abs(v).bit_length()} bits"
            return f", e.g. {type(v).__name__} {v!r:.40}"
    return ""


def _long_double(arr: np.ndarray, name: str) -> np.ndarray:
    """float64 holding exactly the values of a long double array, or ValueError."""
    with np.errstate(over="ignore", under="ignore"):
        f = arr.astype(np.float64)
    same = (f.astype(arr.dtype) == arr) | (np.isnan(f) & np.isnan(arr))
    if not same.all():
        bad = arr[~same].reshape(-1)[0]
        raise ValueError(f"{name} holds {arr.dtype} values that float64 cannot hold exactly "
                         f"(e.g. {bad!r}); fpsim rounds exact float64 values at most: round "
                         f"them yourself with {name}.astype(np.float64) if double rounding "
                         "is acceptable")
    return f


def exact_cast(values: np.ndarray, dtype: Any, what: str = "decoded values") -> np.ndarray:
    """float64 ``values`` as ``dtype``, refused (ValueError) unless it holds every one exactly
    (NaN as NaN; integer and bool dtypes hold neither NaN nor inf)."""
    if is_torch(values):
        if dtype.is_complex:
            raise TypeError(f"dtype={dtype}: {what} are real numbers; choose a float dtype")
        out = values.to(dtype)
        back, floating = out.to(values.dtype), dtype.is_floating_point
    else:
        dt = np.dtype(dtype)
        if dt.kind not in "iubf" and not (dt.kind == "V" and dt.itemsize <= 2):
            raise TypeError(f"dtype={dt}: {what} are real numbers; choose a float dtype")
        with np.errstate(invalid="ignore", over="ignore"):
            out = values.astype(dt)
            back = out.astype(np.float64)
        floating, dtype = dt.kind not in "iub", dt
    ok = back == values
    if floating:
        ok = ok | ((values != values) & (back != back))                # NaN stays NaN
    else:
        ok = ok & (values.isfinite() if is_torch(values) else np.isfinite(values))
    if not bool(ok.all()):
        bad = float(values[~ok].reshape(-1)[0])
        raise ValueError(f"{what} do not fit dtype {dtype} exactly (e.g. {bad!r}); use a wider "
                         "dtype such as float64")
    return out


def check_flag(value: Any, name: str) -> bool:
    """A yes/no argument as a bool: True/False, NumPy bools, 0 and 1; anything else (a string
    such as ``"no"``, which is truthy, or None) is refused with a TypeError naming ``name``."""
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, numbers.Integral)
                                               and value in (0, 1)):
        return bool(value)
    raise TypeError(f"{name}={value!r}: pass True or False")


def check_seed(seed: Any, name: str = "seed") -> Any:
    """``seed`` unchanged unless it is a negative integer (refused, naming the argument)."""
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool) and seed < 0:
        raise ValueError(f"{name}={seed}: a seed is a non-negative integer (or a Generator)")
    return seed
