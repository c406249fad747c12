"""The public API on every kind of input: the exact answer, or TypeError/ValueError.

* A Hypothesis fuzz test draws formats, rounding modes, dtypes (byte orders, long double,
  dates, complex, strings), shapes and memory layouts, and checks ``quantize`` and ``encode``
  element by element against the Fraction reference of tests/reference.py, and the block,
  scaled and matmul entry points against the same call on a native, contiguous copy.
  Any other exception, or a RuntimeWarning, fails it.
* A property test over the matrix dtypes x byte orders x layouts compares every entry point
  with its result on the float64 copy of the same values.
"""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import round_ref

import fpsim
from fpsim import get_format, mx

OTHER = ">" if np.little_endian else "<"
MODES = ["rne", "rna", "rtz", "rup", "rdown", "rto"]
FORMATS = list(fpsim.FORMATS) + ["e9m6", "e5m10", "e3m2", "e11m4", "e6m9"]
NUMERIC = ["f2", "f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "u8", "?"]
DTYPES = ([np.dtype(d) for d in NUMERIC] + [np.dtype(d).newbyteorder(OTHER) for d in NUMERIC
                                             if np.dtype(d).itemsize > 1]
          + [np.dtype(np.longdouble), np.dtype(ml_dtypes.bfloat16),
             np.dtype(ml_dtypes.float8_e4m3fn)])
REFUSED = [np.dtype(d) for d in ("datetime64[s]", "timedelta64[ms]", "c8", "O", "U4", "S2")]
LAYOUTS = ["C", "F", "T", "step", "rev"]
floats = st.floats(width=64, allow_nan=True, allow_infinity=True)


def as_dtype(values: np.ndarray, dt: np.dtype) -> np.ndarray:
    """``values`` (float64) in dtype ``dt``: integers clipped to its range, floats cast."""
    with np.errstate(all="ignore"):
        if dt.kind in "iu":
            info = np.iinfo(dt)
            v = np.nan_to_num(values, nan=0.0, posinf=info.max, neginf=info.min)
            return np.clip(np.trunc(v), info.min, float(info.max) // 2).astype(np.int64).astype(dt)
        if dt.kind == "b":
            return (values > 0).astype(dt)
        if dt.kind in "MmOUS":
            return np.round(np.nan_to_num(values) % 1000).astype(np.int64).astype(dt)
        if dt.kind == "c":
            return values.astype(dt)
        return values.astype(dt)


def laid_out(x: np.ndarray, layout: str) -> np.ndarray:
    """The same 2-D data in another memory layout (same shape, except for ``T``/``step``)."""
    if layout == "F":
        return np.asfortranarray(x)
    if layout == "T":
        return np.ascontiguousarray(x.T).T
    if layout == "step":
        wide = np.repeat(x, 2, axis=1)
        return wide[:, ::2]
    if layout == "rev":
        return np.ascontiguousarray(x[::-1])[::-1]
    return x


def exact(e) -> float | int | Fraction:
    """One element's exact value for the reference."""
    if isinstance(e, (bool, np.bool_)):
        return int(e)
    if isinstance(e, (np.integer, int)):
        return int(e)
    if isinstance(e, np.longdouble) and np.isfinite(e):
        return Fraction(*e.as_integer_ratio())
    return float(e)


def ref_value(e, fmt, mode: str, saturate: bool) -> float:
    r = round_ref(exact(e), fmt, mode, saturate)
    return {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}.get(r, None) \
        if isinstance(r, str) else float(r)


def same(a, b) -> bool:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a.shape == b.shape and bool(np.all((a == b) | (np.isnan(a) & np.isnan(b))))


@st.composite
def inputs(draw):
    dt = draw(st.sampled_from(DTYPES + REFUSED))
    shape = draw(st.tuples(st.integers(0, 4), st.integers(1, 5)))
    vals = np.array(draw(st.lists(floats, min_size=shape[0] * shape[1],
                                  max_size=shape[0] * shape[1])), np.float64).reshape(shape)
    x = as_dtype(vals, dt)
    if dt == np.longdouble and x.size and draw(st.booleans()):
        x = x + x * np.longdouble(2.0**-60)                 # beyond float64's precision
    return laid_out(x, draw(st.sampled_from(LAYOUTS)))


@pytest.mark.filterwarnings("error::RuntimeWarning")
@settings(max_examples=400, deadline=None)
@given(x=inputs(), name=st.sampled_from(FORMATS), mode=st.sampled_from(MODES),
       saturate=st.booleans())
def test_fuzz_quantize_and_encode_are_exact_or_refuse(x, name, mode, saturate):
    fmt = get_format(name)
    try:
        q = fpsim.quantize(x, fmt, rounding=mode, saturate=saturate)
    except (TypeError, ValueError):
        assert x.dtype.kind in "MmOUSc" or x.dtype == np.longdouble or not fpsim.rounding.F64.holds(
            fmt) or x.dtype.itemsize == 8, (x.dtype, name)
        return
    assert q.shape == x.shape
    want = np.array([ref_value(e, fmt, mode, saturate) for e in x.reshape(-1)], np.float64)
    cast = want if x.dtype.kind in "iub" else _cast(want, q.dtype)
    assert same(q.reshape(-1), cast), (x, name, mode, q, want)
    try:
        codes = fpsim.encode(x, fmt, rounding=mode, saturate=saturate)
    except ValueError as exc:
        assert "NaN" in str(exc) and not fmt.has_nan
        return
    assert same(fpsim.decode(codes, fmt).reshape(-1), want)


def _cast(v: np.ndarray, dt: np.dtype) -> np.ndarray:
    with np.errstate(over="ignore"):
        return v.astype(dt)


@pytest.mark.filterwarnings("error::RuntimeWarning")
@settings(max_examples=150, deadline=None)
@given(x=inputs(), which=st.sampled_from(["mx", "nvfp4", "scaled", "matmul", "explain"]),
       mode=st.sampled_from(MODES))
def test_fuzz_other_entry_points_ignore_layout_and_byte_order(x, which, mode):
    calls = {
        "mx": lambda v: mx.quantize(v, "mxfp8_e4m3", rounding=mode, block_size=4).codes,
        "nvfp4": lambda v: mx.quantize(v, "nvfp4", rounding=mode, block_size=4).codes,
        "scaled": lambda v: fpsim.scaled_quantize(v, "e4m3", rounding=mode).codes,
        "matmul": lambda v: fpsim.matmul(v, np.ones((v.shape[-1], 2), np.float32),
                                         accum="bf16", rounding=mode, product="fp64"),
        "explain": lambda v: fpsim.explain(v.reshape(-1)[-1] if v.size else v, "bf16",
                                           rounding=mode).code,
    }
    try:
        got = calls[which](x)
    except (TypeError, ValueError):
        return
    native = np.ascontiguousarray(x).astype(x.dtype.newbyteorder("="))
    if native.dtype == np.longdouble:
        native = native.astype(np.float64)                # the gate accepted it: exact
    assert same(got, calls[which](native))


# ----------------------------------------------------------------------------------------------
# The matrix: dtypes x byte orders x layouts, every entry point against float64
# ----------------------------------------------------------------------------------------------
MATRIX_DTYPES = ["f2", "f4", "f8", "i1", "i4", "i8", "u2", "longdouble", "bfloat16"]


def matrix():
    for name in MATRIX_DTYPES:
        base = np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(
            np.longdouble if name == "longdouble" else name)
        orders = [base]
        if base.itemsize > 1 and base.kind != "V" and name != "longdouble":
            orders.append(base.newbyteorder(OTHER))
        for dt in orders:
            for layout in LAYOUTS:
                yield pytest.param(dt, layout, id=f"{dt.str}-{layout}")


def sample(dt: np.dtype) -> np.ndarray:
    """Quarters in [-15, 15] (integers for ints), which every dtype holds; 8-byte and wider
    floats also get values float32 would change (1 + 2^-8 + 2^-30 rounds to bf16 differently)."""
    rng = np.random.default_rng(7)
    v = rng.integers(-60, 61, (4, 8)) / 4
    if dt.kind in "iu":
        v = np.abs(np.round(v)) if dt.kind == "u" else np.round(v)
    elif dt.itemsize >= 8:
        v[1, 2:5] = [1 + 2.0**-8 + 2.0**-30, 0.1, -(2.0**-140)]
    return v.astype(dt)


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("dt, layout", matrix())
def test_every_entry_point_equals_float64(dt, layout):
    x = laid_out(sample(dt), layout)
    f64 = np.ascontiguousarray(x.astype(np.float64))
    assert x.dtype == dt
    for fmt in ("e4m3", "bf16", "int8"):
        assert same(fpsim.quantize(x, fmt), fpsim.quantize(f64, fmt))
        assert np.array_equal(fpsim.encode(x, fmt), fpsim.encode(f64, fmt))
    assert fpsim.explain(x[1, 2], "e4m3").code == fpsim.explain(f64[1, 2], "e4m3").code
    ones = np.ones((x.shape[-1], 3), np.float32)
    for opts in ({}, {"accum": "bf16", "rounding": "rdown"}, {"order": "pairwise"}):
        assert same(fpsim.matmul(x, ones, **opts), fpsim.matmul(f64, ones, **opts))
        assert same(fpsim.matmul(ones.T, x.T, **opts), fpsim.matmul(ones.T, f64.T, **opts))
    if dt.kind in "iu":
        codes = np.abs(x)                                      # integer arrays as codes
        assert same(fpsim.decode(codes, "e4m3"),
                    fpsim.decode(np.ascontiguousarray(codes.astype(np.int64)), "e4m3"))
        with pytest.raises(TypeError, match="floating-point"):
            mx.quantize(x, "mxfp4")
        return
    a, b = mx.quantize(x, "mxfp8_e4m3", block_size=4), mx.quantize(f64, "mxfp8_e4m3",
                                                                    block_size=4)
    assert np.array_equal(a.codes, b.codes) and np.array_equal(a.scales, b.scales)
    n, m = mx.quantize(x, "nvfp4", block_size=4), mx.quantize(f64, "nvfp4", block_size=4)
    assert np.array_equal(n.codes, m.codes) and n.tensor_scale == m.tensor_scale
    # scaled_quantize divides in the data's float type (documented): same dtype, native order
    nat = np.ascontiguousarray(x).astype(x.dtype.newbyteorder("="))
    s, t = fpsim.scaled_quantize(x, "e4m3"), fpsim.scaled_quantize(nat, "e4m3")
    assert np.array_equal(s.codes, t.codes) and np.array_equal(s.scales, t.scales)
