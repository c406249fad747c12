"""The public API on every kind of input: the exact answer, or TypeError/ValueError.

* A Hypothesis fuzz test draws formats, rounding modes, dtypes (byte orders, long double,
  dates, complex, strings), shapes and memory layouts, and checks ``quantize`` and ``encode``
  element by element against the Fraction reference of tests/reference.py, and the block,
  scaled and matmul entry points against the same call on a native, contiguous copy.
  Any other exception, or a RuntimeWarning, fails it.
* A property test over the matrix dtypes x byte orders x layouts compares every entry point
  with its result on the float64 copy of the same values.
* torch tensors of every dtype (int, bool, float16, bfloat16, float8, requires_grad, transposed
  and flipped views) on every backend give the codes of the float64 NumPy route; Python numbers
  and lists those of the NumPy array; NaN payloads and signalling NaNs the canonical NaN's code.
* A table of awkward arguments, each with the exception type and the words its message must
  hold (the problem and the fix); the command line answers bad input with exit status 2 and
  one line on stderr, no traceback.
"""

from __future__ import annotations

import decimal
import math
import re
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import round_ref

import fpsim
from fpsim import cli, get_format, mx

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
@pytest.mark.parametrize("dt, layout", list(matrix()))
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


# ----------------------------------------------------------------------------------------------
# torch tensors, Python numbers and NaN payloads: the codes of the float64 NumPy route
# ----------------------------------------------------------------------------------------------
torch = pytest.importorskip("torch")
SPECIALS = [0.0, -0.0, math.inf, -math.inf, math.nan, 1.1, -2.5, 1000.0, 3e-5, -2.0**-140,
            2.0**-149, 448.0, 464.0, -1e30, 65504.0, 1 + 2.0**-8]
INTS = [0, 1, -1, 3, 127, -128, 100, 7]
TORCH_DTYPES = ["int8", "int32", "int64", "uint8", "bool", "float16", "bfloat16", "float32",
                "float64", "float8_e4m3fn", "float8_e5m2"]


def _torch_input(name: str, layout: str, grad: bool):
    """A 4x4 tensor of ``name`` in ``layout``, and its exact values as a float64 array."""
    dt = getattr(torch, name)
    base = torch.tensor(SPECIALS if dt.is_floating_point else INTS * 2, dtype=torch.float64)
    x = (base.abs() if name in ("uint8", "bool") else base).reshape(4, 4).to(dt)
    if layout == "T":
        x = x.t()
    elif layout == "flip":
        x = x.flip(0)                         # torch has no negative strides: a flipped copy
    if grad and dt.is_floating_point:
        x = x.clone().requires_grad_(True)
    return x, x.detach().to(torch.float64).numpy()


@pytest.mark.parametrize("name", TORCH_DTYPES)
@pytest.mark.parametrize("backend", ["auto", "torch", "numpy"])
def test_torch_inputs_give_the_codes_of_float64(name, backend):
    for layout, grad in (("C", False), ("T", True), ("flip", False)):
        x, f64 = _torch_input(name, layout, grad)
        for fmt in ("e4m3", "bf16", "int8", "e5m2"):
            want = fpsim.encode(f64, fmt, on_nan="zero")
            got = fpsim.encode(x, fmt, on_nan="zero", backend=backend)
            assert np.array_equal(got.numpy(), want), (name, layout, fmt)
            q = fpsim.quantize(x, fmt, backend=backend)
            assert q.dtype == (x.dtype if x.dtype.is_floating_point else torch.float64)
            exact = fpsim.quantize(f64, fmt)
            with np.errstate(over="ignore"):
                cast = torch.from_numpy(exact).to(q.dtype).to(torch.float64).numpy()
            qv = q.detach().to(torch.float64).numpy()
            assert same(qv, cast) and np.array_equal(np.signbit(qv), np.signbit(cast))


def test_torch_complex_tensors_are_refused():
    for call in (lambda z: fpsim.quantize(z, "e4m3"), lambda z: fpsim.encode(z, "e4m3"),
                 lambda z: fpsim.matmul(z, z), lambda z: mx.quantize(z, "mxfp4"),
                 lambda z: fpsim.scaled_quantize(z, "e4m3")):
        with pytest.raises(TypeError, match="complex"):
            call(torch.ones(2, 2, dtype=torch.complex64))


PY_CASES = [1.1, -0.0, 3, True, -(2**63), 2**64 - 1, 2**53 + 1, 2**70, -(2**70) * 3,
            2**64 + 2**12, math.inf, [1.1, 2, True], [[1, 2], [3, 4]], [], [2**63, 1]]


@pytest.mark.parametrize("x", PY_CASES, ids=[repr(c)[:24] for c in PY_CASES])
def test_python_numbers_and_lists_give_the_codes_of_the_exact_array(x):
    # the independent route: NumPy holds the value exactly (ints beyond 64 bits: as the
    # float64 that holds them, checked here with int())
    arr = np.asarray(float(x) if isinstance(x, int) and not -(2**63) <= x < 2**64 else x)
    if isinstance(x, int) and arr.dtype.kind == "f":
        assert int(arr) == x
    for fmt in ("e4m3", "bf16", "fp32", "int8", "p3109_k8p4"):
        assert np.array_equal(fpsim.encode(x, fmt, on_nan="zero"),
                              fpsim.encode(arr, fmt, on_nan="zero"))
        q = fpsim.quantize(x, fmt)
        assert type(q) is (float if not isinstance(x, list) else np.ndarray)
        assert same(q, fpsim.quantize(arr, fmt))


BIG_INTS = [2**53 - 1, 2**53, 2**53 + 1, -(2**53 + 1), 2**53 + 3, 2**54 + 1, 2**60 + 2**8 + 1,
            2**63 - 1, -(2**63)]


@pytest.mark.parametrize("name", ["fp64", "e8m52", "e11m51", "e11m50", "e11m30", "fp32",
                                  "bf16", "int8"])
def test_integers_beyond_2_53_round_once_or_are_refused(name):
    # exact below 2^53; beyond it, into formats of at most 50 fraction bits, rounded once
    # (round to odd first); into 51 or 52 a ValueError, except 'rne' into 52 (NumPy's cast)
    fmt = get_format(name)
    for v, mode in ((v, m) for v in BIG_INTS for m in MODES):
        refused = abs(v) > 2**53 and fmt.mbits > 50 and not (mode == "rne" and fmt.mbits >= 52)
        want = ref_value(v, fmt, mode, False)
        for x in [np.array([v]), torch.tensor([v])] + ([np.array([v], np.uint64)] if v > 0
                                                       else []):
            if refused:
                with pytest.raises(ValueError, match="beyond 2\\^53.*convert to float64"):
                    fpsim.quantize(x, fmt, rounding=mode)
                continue
            got = float(fpsim.quantize(x, fmt, rounding=mode)[0])
            assert same(got, want), (name, v, mode, type(x), got, want)


NAN_FORMATS = [n for n in FORMATS if get_format(n).has_nan]


def _nans(dtype) -> np.ndarray:
    """Quiet and signalling NaNs of both signs with assorted payloads."""
    if dtype == np.float64:
        bits = [0x7FF8000000000000, 0x7FF0000000000001, 0x7FFFFFFFFFFFFFFF, 0x7FF8DEADBEEF0001]
        u = np.array(bits + [b | 1 << 63 for b in bits], np.uint64)
    else:
        bits = [0x7FC00000, 0x7F800001, 0x7FFFFFFF, 0x7FC0BEEF]
        u = np.array(bits + [b | 1 << 31 for b in bits], np.uint32)
    return u.view(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_nan_payloads_do_not_change_the_code(dtype):
    nans = _nans(dtype)
    neg = np.signbit(nans)
    for name in NAN_FORMATS:
        want = np.where(neg, fpsim.encode(np.array([-np.nan], dtype), name),
                        fpsim.encode(np.array([np.nan], dtype), name))
        with np.errstate(invalid="ignore"):
            assert np.array_equal(fpsim.encode(nans, name), want), name
            got = fpsim.encode(torch.from_numpy(nans), name).numpy()   # int64 lanes for fp64
            assert np.array_equal(got.astype(np.uint64), want.astype(np.uint64)), name
        assert np.isnan(fpsim.quantize(nans, name)).all()
    for name in ("e2m1", "int8"):
        with pytest.raises(ValueError, match="no NaN code.*on_nan='zero'"):
            fpsim.encode(nans, name)
        assert (fpsim.decode(fpsim.encode(nans, name, on_nan="zero"), name) == 0).all()


# ----------------------------------------------------------------------------------------------
# Awkward arguments: the exception and the words of its message
# ----------------------------------------------------------------------------------------------
X = np.linspace(-3, 3, 64, dtype=np.float32).reshape(2, 32)
_A = mx.quantize(X, "mxfp4")
SCALES, PACKED = _A.pack()
q, enc = fpsim.quantize, fpsim.encode
REFUSALS = [
    # data that is not real numbers, or not exactly representable as given
    ("complex scalar", lambda: q(1 + 2j, "e4m3"), TypeError, "real numbers.*complex"),
    ("complex array", lambda: enc(np.ones(2, "c8"), "e4m3"), TypeError, "complex"),
    ("string", lambda: q("1.5", "e4m3"), TypeError, "real numbers.*str"),
    ("None", lambda: q(None, "e4m3"), TypeError, "objects"),
    ("list with None", lambda: q([1.0, None], "e4m3"), TypeError, "objects.*NoneType"),
    ("Fraction", lambda: q(Fraction(1, 3), "bf16"), TypeError, r"Fraction.*float\(x\)"),
    ("Decimal", lambda: q(decimal.Decimal("0.1"), "bf16"), TypeError, r"Decimal.*float\(x\)"),
    ("int beyond 64 bits, inexact", lambda: q(2**70 + 1, "bf16"), ValueError,
     r"71 bits.*float\(x\)"),
    ("list of ints beyond 64 bits", lambda: q([2**64 + 1, 1], "bf16"), TypeError,
     "objects.*integer of 65 bits"),
    ("raw bytes (.npy of ml_dtypes)", lambda: q(np.zeros(2, "V2"), "e4m3"), TypeError,
     r"raw bytes.*view\(ml_dtypes"),
    ("records", lambda: q(np.zeros(2, [("a", "f4")]), "e4m3"), TypeError, "records"),
    ("masked array", lambda: q(np.ma.masked_array([1.0], [True]), "e4m3"), TypeError,
     "mask.*filled"),
    ("matmul int 2^53 + 1", lambda: fpsim.matmul(np.array([[2**53 + 1]]), np.ones((1, 1))),
     ValueError, "beyond 2\\^53"),
    ("matmul uint64 2^53 + 1", lambda: fpsim.matmul(np.ones((1, 1)), np.array(
        [[2**53 + 1]], np.uint64)), ValueError, "operand b.*beyond 2\\^53"),
    ("matmul int -(2^53 + 1)", lambda: fpsim.matmul(torch.tensor([[-(2**53) - 1]]),
                                                    torch.ones(1, 1)), ValueError, "2\\^53"),
    ("matmul complex c", lambda: fpsim.matmul(X, X.T, c=np.ones(1, "c16")), TypeError,
     "c: .*complex"),
    ("explain of a 2-D array", lambda: fpsim.explain(np.ones((2, 2)), "e4m3"), ValueError,
     r"one number or a 1-D sequence.*shape \(2, 2\)"),
    ("explain of an empty array", lambda: fpsim.explain([], "e4m3"), ValueError, "one number"),
    ("explain of int64 2^53 + 1 (0-d)", lambda: fpsim.explain(np.array(2**53 + 1), "fp64"),
     ValueError, "not a float64 exactly"),
    ("explain of a torch int 2^53 + 1", lambda: fpsim.explain(torch.tensor([2**53 + 1]), "bf16"),
     ValueError, "not a float64 exactly"),
    # keyword values
    ("rounding='foo'", lambda: q(1.0, "e4m3", rounding="foo"), ValueError,
     "unknown rounding mode 'foo'.*rne"),
    ("rounding='nearest'", lambda: q(1.0, "e4m3", rounding="nearest"), ValueError,
     "Did you mean 'rne'"),
    ("saturate='maybe'", lambda: q(X, "e4m3", saturate="maybe"), ValueError,
     "saturate='maybe'.*'finite'"),
    ("subnormals='no' (array)", lambda: q(X, "e4m3", subnormals="no"), TypeError,
     "subnormals='no': pass True or False"),
    ("subnormals='no' (float64)", lambda: enc(X.astype(np.float64), "bf16", subnormals="no"),
     TypeError, "subnormals='no'"),
    ("subnormals=None (scalar)", lambda: q(1e-3, "e4m3", subnormals=None), TypeError,
     "subnormals=None"),
    ("subnormals='no' (torch)", lambda: q(torch.ones(2), "e4m3", subnormals="no"), TypeError,
     "subnormals"),
    ("backend='foo'", lambda: q(X, "e4m3", backend="foo"), ValueError, "unknown backend"),
    ("on_nan='drop'", lambda: enc(X, "e2m1", on_nan="drop"), ValueError, "on_nan='drop'"),
    ("seed=-1", lambda: q(X, "e4m3", rounding="stochastic", seed=-1), ValueError,
     "non-negative"),
    ("seed=1.5", lambda: q(X, "e4m3", rounding="stochastic", seed=1.5), TypeError, "seed"),
    ("decode float codes", lambda: fpsim.decode(np.array([1.0]), "e4m3"), TypeError,
     "integers"),
    ("decode bool codes", lambda: fpsim.decode(np.array([True]), "e4m3"), TypeError, "integers"),
    ("decode torch bool codes", lambda: fpsim.decode(torch.tensor([True]), "e4m3"), TypeError,
     "integers, got dtype torch.bool"),
    ("decode code 256", lambda: fpsim.decode(256, "e4m3"), ValueError, r"\[0, 255\]"),
    ("decode code 2^64", lambda: fpsim.decode(2**64, "fp64"), ValueError, "out of range"),
    ("decode torch codes to a NumPy dtype", lambda: fpsim.decode(torch.tensor([56]), "e4m3",
                                                                 dtype=np.float32),
     TypeError, "torch dtype"),
    ("decode to a dtype that rounds", lambda: fpsim.decode(np.array([0x37]), "e4m3",
                                                           dtype=np.int8), ValueError,
     "exactly.*wider"),
    # shapes and sizes
    ("matmul shapes", lambda: fpsim.matmul(X, X), ValueError, "32 columns but b has 2 rows"),
    ("matmul scalars", lambda: fpsim.matmul(1.0, X), ValueError, "at least one dimension"),
    ("matmul batch", lambda: fpsim.matmul(np.ones((2, 1, 2)), np.ones((3, 2, 1))), ValueError,
     "batch dimensions"),
    ("dot of matrices", lambda: fpsim.dot(X, X), ValueError, "two vectors"),
    ("tensor_core='hopper_fp9'", lambda: fpsim.matmul(X, X.T, order="tensor_core",
                                                      tensor_core="hopper_fp9"), ValueError,
     "unknown tensor_core 'hopper_fp9'. Did you mean 'hopper_fp8'"),
    ("chunk=0", lambda: fpsim.matmul(X, X.T, order="chunked", chunk=0), ValueError,
     "positive integer"),
    ("return_stats='yes'", lambda: fpsim.matmul(X, X.T, return_stats="yes"), TypeError,
     "return_stats='yes'"),
    ("axis out of range", lambda: mx.quantize(X, "mxfp4", axis=2), ValueError, "out of range"),
    ("axis=True", lambda: mx.quantize(X, "mxfp4", axis=True), TypeError, "integer, not bool"),
    ("axis=1.0", lambda: mx.quantize(X, "mxfp4", axis=1.0), TypeError, "integer"),
    ("block_size=0", lambda: mx.quantize(X, "mxfp4", block_size=0), ValueError, "positive"),
    ("block_size=-4", lambda: mx.quantize(X, "mxfp4", block_size=-4), ValueError, "positive"),
    ("block_size not dividing, pad=False", lambda: mx.quantize(X, "mxfp4", block_size=5,
                                                               pad=False), ValueError,
     "not a multiple of block_size 5.*pad=True"),
    ("pad='no'", lambda: mx.quantize(X, "mxfp4", block_size=5, pad="no"), TypeError,
     "pad='no'"),
    ("tensor_scale='1'", lambda: mx.quantize(X, "nvfp4", tensor_scale="1"), TypeError,
     "tensor_scale='1'"),
    ("tensor_scale=0", lambda: mx.quantize(X, "nvfp4", tensor_scale=0.0), ValueError,
     "positive"),
    ("scale_rounding='foo'", lambda: mx.quantize(X, "mxfp4", scale_rounding="foo"), ValueError,
     "unknown scale_rounding"),
    ("mx int data", lambda: mx.quantize(X.astype(int), "mxfp4"), TypeError, "astype"),
    ("unpack with another shape", lambda: mx.BlockArray.unpack(SCALES, PACKED, "mxfp4", (2, 31)),
     ValueError, "padding.*another shape"),
    ("unpack negative shape", lambda: mx.BlockArray.unpack(SCALES, PACKED, "mxfp4", (-2, -32)),
     ValueError, "non-negative"),
    ("unpack float shape", lambda: mx.BlockArray.unpack(SCALES, PACKED, "mxfp4", (2.5, 32)),
     TypeError, "tuple of integers"),
    ("unpack another format", lambda: mx.BlockArray.unpack(SCALES, PACKED, "mxfp8_e4m3", (2, 32)),
     ValueError, "packs into 64"),
    ("symmetric='no'", lambda: fpsim.scaled_quantize(X, "int8", symmetric="no"), TypeError,
     "symmetric='no'"),
    ("granularity='foo'", lambda: fpsim.scaled_quantize(X, "e4m3", granularity="foo"),
     ValueError, "'tensor', 'channel'"),
    ("scaled channel axis 5", lambda: fpsim.scaled_quantize(X, "e4m3", granularity="channel",
                                                            axis=5), ValueError, "out of range"),
    # recipes and emulate: checked when built, not when a model first runs
    ("Recipe flush='no'", lambda: fpsim.Recipe("e4m3", flush="no"), TypeError,
     "flush='no'"),
    ("Recipe full_subnormals='no'", lambda: fpsim.Recipe("e4m3", full_subnormals="no"),
     TypeError, "full_subnormals='no'"),
    ("Recipe saturate='no'", lambda: fpsim.Recipe("e4m3", saturate="no"), ValueError,
     "saturate='no'"),
    ("Recipe rounding='foo'", lambda: fpsim.Recipe("e4m3", rounding="foo"), ValueError,
     "unknown rounding mode"),
    ("Recipe accum='fp8'", lambda: fpsim.Recipe("e4m3", accum="fp8"), ValueError,
     "unknown format 'fp8'. Did you mean 'e4m3'"),
    ("emulate capture='no'", lambda: fpsim.emulate(fpsim.Recipe("e4m3"), capture="no"),
     TypeError, "capture='no'"),
    # formats built by hand
    ("Format(subnormals='no')", lambda: fpsim.Format("x", 4, 3, subnormals="no"), TypeError,
     "Format 'x': subnormals='no': pass True or False"),
    ("Format(inf='no')", lambda: fpsim.Format("x", 4, 3, inf="no"), TypeError, "inf='no'"),
    ("Format(ebits=4.5)", lambda: fpsim.Format("x", 4.5, 3), TypeError,
     "ebits=4.5: pass an integer"),
    ("Format(bias=7.5)", lambda: fpsim.Format("x", 4, 3, bias=7.5), TypeError, "bias=7.5"),
    ("Format(ebits=True)", lambda: fpsim.Format("x", True, 3), TypeError, "ebits=True"),
    # format names: unknown, near misses, other registries
    ("format None", lambda: q(1.0, None), TypeError, "format must be a name"),
    ("fp8", lambda: get_format("fp8"), ValueError, "Did you mean 'e4m3'"),
    ("fp6", lambda: get_format("fp6"), ValueError, "Did you mean 'e2m3'"),
    ("k8p4", lambda: get_format("k8p4"), ValueError, "Did you mean 'p3109_k8p4'"),
    ("k8p4uf", lambda: get_format("K8P4UF"), ValueError, "Did you mean 'p3109_k8p4uf'"),
    ("k8p9 (no such P3109 format)", lambda: get_format("k8p9"), ValueError,
     r"unknown format 'k8p9'\. Known"),
    ("e04m03 (leading zeros)", lambda: get_format("e04m03"), ValueError, "Did you mean 'e4m3'"),
    ("e\u0664m3 (Arabic-Indic digit)", lambda: get_format("e\u0664m3"), ValueError,
     "unknown format"),
    ("p3109_k08p4", lambda: get_format("p3109_k08p4"), ValueError, "unknown format"),
    ("e4m3x", lambda: get_format("e4m3x"), ValueError, "Did you mean 'e4m3'.*Known names"),
    ("e0m3", lambda: get_format("e0m3"), ValueError, "exponent bit.*int8"),
    ("e20m3", lambda: get_format("e20m3"), ValueError, "exceeds float64"),
    ("e4m60", lambda: get_format("e4m60"), ValueError, "wider than 64 bits"),
    ("empty name", lambda: get_format(" "), ValueError, "unknown format.*Known names"),
    ("block format as element format", lambda: q(X, "mxfp4"), ValueError,
     "block format.*fpsim.mx.quantize"),
    ("element format as block format", lambda: mx.quantize(X, "e4m3"), ValueError,
     "names a format, not a block format"),
    ("matmul accum='fp8'", lambda: fpsim.matmul(X, X.T, accum="fp8"), ValueError,
     "accum: unknown format 'fp8'. Did you mean 'e4m3'"),
]

if np.finfo(np.longdouble).nmant > 52:                 # x87 or quad long double
    REFUSALS.append(("long double beyond float64", lambda: q(
        np.ones(2, np.longdouble) + np.longdouble(2) ** -60, "e4m3"), ValueError,
        "exactly.*astype"))


@pytest.mark.parametrize("call, exc, words", [pytest.param(*r[1:], id=r[0]) for r in REFUSALS])
def test_awkward_arguments_raise_a_clear_error(call, exc, words):
    with pytest.raises(exc, match=words):
        call()


ACCEPTED = [
    # the same answer as the plain spelling
    ("names", lambda: [get_format(n) for n in (" e4m3", "E4M3", "e4m3\n", "FP8-E4M3FN",
                                               "float8_e4m3fn", "bfloat16", "binary8p4")],
     lambda: [get_format(n) for n in ("e4m3",) * 5 + ("bf16", "p3109_k8p4se")]),
    ("ml_dtypes' FP6/FP4 names without the prefix: OCP, no NaN (max 7.5, 28, 6)",
     lambda: [(get_format(n).max, get_format(n).nan) for n in ("e2m3fn", "e3m2fn", "e2m1fn")],
     lambda: [(float(ml_dtypes.finfo(t).max), "none") for t in (
         ml_dtypes.float6_e2m3fn, ml_dtypes.float6_e3m2fn, ml_dtypes.float4_e2m1fn)]),
    ("Recipe accum 'FP32', 'float32', a Format: torch's native FP32 sum as 'fp32'",
     lambda: [fpsim.Recipe("e4m3", accum=a) for a in ("FP32", "float32",
                                                             get_format("fp32"))],
     lambda: [fpsim.Recipe("e4m3")] * 3),
    ("Format of NumPy integers and bools", lambda: [
        fpsim.Format("x", np.int64(4), np.int8(3), bias=np.int32(7), subnormals=np.True_),
        q(X, fpsim.Format("x", np.int64(4), np.int64(3))).tolist()],
     lambda: [fpsim.Format("x", 4, 3), q(X, fpsim.Format("x", 4, 3)).tolist()]),
    ("tensor_core ' HOPPER-FP8 '", lambda: fpsim.matmul(X, X.T, order="tensor_core",
                                                        tensor_core=" HOPPER-FP8 ").tolist(),
     lambda: fpsim.matmul(X, X.T, order="tensor_core", tensor_core="hopper_fp8").tolist()),
    ("flags 0/1/np.bool_", lambda: [q(X * 1e-3, "e4m3", subnormals=f).tolist()
                                    for f in (0, 1, np.False_, np.True_)],
     lambda: [q(X * 1e-3, "e4m3", subnormals=f).tolist() for f in (False, True) * 2]),
    ("int beyond 64 bits, exact", lambda: (q(2**70, "bf16"), q(-(2**64) * 5, "bf16"),
                                           enc(2**100, "fp32").item()),
     lambda: (2.0**70, -(2.0**64) * 5, enc(2.0**100, "fp32").item())),
    ("explain of a one-element tensor that wants grad",
     lambda: fpsim.explain(torch.tensor([1.1], requires_grad=True), "e4m3").code,
     lambda: fpsim.explain(float(np.float32(1.1)), "e4m3").code),
    ("explain of an int beyond 64 bits", lambda: fpsim.explain(2**70, "bf16").code,
     lambda: fpsim.explain(2.0**70, "bf16").code),
    ("matmul c: big-endian, long double, beyond 64 bits",
     lambda: [fpsim.matmul(X, X.T, c=c, accum="fp64").tolist() for c in
              (np.ones((2, 1), ">f8"), np.ones((2, 1), np.longdouble), 2**70)],
     lambda: [fpsim.matmul(X, X.T, c=c, accum="fp64").tolist() for c in
              (np.ones((2, 1)), np.ones((2, 1)), 2.0**70)]),
    ("unpack from lists, an int shape", lambda: [
        mx.BlockArray.unpack(list(SCALES), list(PACKED), "mxfp4", (2, 32)).codes.tolist(),
        mx.BlockArray.unpack(SCALES, PACKED, "mxfp4", 64).codes.tolist()],
     lambda: [_A.codes.tolist(), _A.codes.reshape(-1).tolist()]),
    ("unpack of a padded shape", lambda: mx.BlockArray.unpack(
        *mx.quantize(X[:, :31], "mxfp4").pack(), "mxfp4", (2, 31)).codes.tolist(),
     lambda: mx.quantize(X[:, :31], "mxfp4").codes.tolist()),
]


@pytest.mark.filterwarnings("error")                  # e.g. torch's on float() of a grad tensor
@pytest.mark.parametrize("call, want", [pytest.param(*r[1:], id=r[0]) for r in ACCEPTED])
def test_awkward_but_valid_arguments_give_the_plain_answer(call, want):
    assert call() == want()


# ----------------------------------------------------------------------------------------------
# The command line: exit status 2, one line on stderr, no traceback
# ----------------------------------------------------------------------------------------------
def _npy(tmp_path, name: str, arr: np.ndarray) -> str:
    path = tmp_path / name
    np.save(path, arr)
    return str(path)


CLI_REFUSALS = [
    (["explain", "0x1p2000"], "beyond float64's range"),
    (["explain", "1e400", "-r", "rtz"], "beyond float64's range.*inf"),
    (["explain", "1e-400", "-r", "rup"], "beyond float64's range.*0.0"),
    (["explain", "0x1p-2000"], "beyond float64's range"),
    (["explain", "abc"], "not a number"),
    (["explain", "1.5", "-f", "fp8"], "Did you mean 'e4m3'"),
    (["explain", "1.5", "-f", ""], "unknown format"),
    (["explain", "1.5", "-r", "foo"], "invalid choice: 'foo'"),
    (["values", "k8p4"], "Did you mean 'p3109_k8p4'"),
    (["values", "fp32"], "at most 8 bits"),
    (["bogus"], "invalid choice"),
    (["quantize", "IN", "OUT"], "required: --format"),
    (["quantize", "IN", "OUT", "-f", "e4m4x"], "Did you mean 'e4m3'"),
    (["quantize", "{bf16}", "OUT", "-f", "e4m3"], r"raw bytes.*view\(ml_dtypes"),
    (["quantize", "{complex}", "OUT", "-f", "e4m3"], "complex"),
    (["quantize", "{missing}", "OUT", "-f", "e4m3"], "cannot read"),
    (["quantize", "{text}", "OUT", "-f", "e4m3"], "not a .npy file"),
    (["quantize", "IN", "OUT", "-f", "e4m3", "--seed", "x"], "invalid int value"),
    (["quantize", "IN", "OUT", "-f", "e4m3", "-r", "stochastic", "--seed", "-1"],
     "non-negative"),
    (["tensor-cores", "nope"], "unknown tensor_core"),
]


@pytest.mark.parametrize("argv, words", CLI_REFUSALS, ids=[" ".join(a) for a, _ in CLI_REFUSALS])
def test_cli_refuses_bad_input_in_one_line(argv, words, tmp_path, capsys):
    files = {"IN": _npy(tmp_path, "in.npy", X), "OUT": str(tmp_path / "out.npy"),
             "{bf16}": _npy(tmp_path, "bf16.npy", X.astype(ml_dtypes.bfloat16)),
             "{complex}": _npy(tmp_path, "c.npy", X.astype(np.complex64)),
             "{missing}": str(tmp_path / "missing.npy"), "{text}": str(tmp_path / "t.npy")}
    (tmp_path / "t.npy").write_text("hello")
    try:
        status = cli.main([files.get(a, a) for a in argv])
    except SystemExit as exc:                          # argparse's own errors
        status = exc.code
    _, err = capsys.readouterr()
    assert status == 2
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("fpsim") and re.search(words, err), err
