"""The input gate: every public entry point passes its data through :func:`check_input`.

Data arrives in more shapes than float32/float64 arrays: other byte orders, long double,
dates, masked arrays.  Each is either converted without changing a single value or refused with
an error that names the problem and the fix; nothing is rounded on the way in.

* Non-native byte order (``'>f8'`` on a little-endian machine, or ``'<f4'`` on a big-endian
  one): converted to the native order, values unchanged.
* ``np.longdouble`` wider than float64 (x87 80-bit, IEEE quad): converted to float64 when every
  value (inf and NaN included) is a float64 exactly, else ``ValueError`` (fpsim rounds from
  float64 at most; round with ``.astype(np.float64)`` yourself if that double rounding is
  acceptable).
* ``datetime64`` / ``timedelta64``, strings, bytes, objects, complex numbers: ``TypeError``.
* Masked arrays: ``TypeError`` (the mask would be lost); pass ``x.filled(value)`` or
  ``x.compressed()``.

torch tensors and Python numbers pass unchanged (torch has one byte order and no long double;
complex tensors are refused).
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from .backend import is_torch

_REFUSED_KINDS = {"M": "dates (datetime64)", "m": "durations (timedelta64)", "O": "objects",
                  "S": "bytes", "U": "strings", "c": "complex numbers"}


def check_input(x: Any, name: str = "x") -> Any:
    """``x`` with exactly its values, as a native-endian array (or unchanged): see module doc.

    Python numbers and tensors come back as given, NumPy scalars as NumPy scalars, anything
    else as a NumPy array.  ``name`` is the argument's name in error messages.
    """
    if is_torch(x):
        if x.is_complex():
            raise TypeError(f"{name}: expected real numbers, got a complex tensor ({x.dtype})")
        return x
    if isinstance(x, (str, bytes)) or isinstance(x, complex):
        raise TypeError(f"{name}: expected real numbers, got {type(x).__name__}: {x!r:.40}")
    if isinstance(x, numbers.Number) and not isinstance(x, np.generic):
        return x
    if isinstance(x, np.ma.MaskedArray):
        raise TypeError(f"{name} is a masked array; fpsim would lose its mask: pass "
                        f"{name}.filled(value) or {name}.compressed()")
    arr = np.asarray(x)
    kind = arr.dtype.kind
    if kind in _REFUSED_KINDS:
        raise TypeError(f"{name}: expected real numbers, got {_REFUSED_KINDS[kind]} (dtype "
                        f"{arr.dtype}); pass real numbers: a float or integer array")
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if kind == "f" and arr.dtype.itemsize > 8:
        arr = _long_double(arr, name)
    return arr.reshape(())[()] if isinstance(x, np.generic) else arr


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


def check_seed(seed: Any, name: str = "seed") -> Any:
    """``seed`` unchanged unless it is a negative integer (refused, naming the argument)."""
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool) and seed < 0:
        raise ValueError(f"{name}={seed}: a seed is a non-negative integer (or a Generator)")
    return seed
