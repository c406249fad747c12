"""Hypothesis properties of quantize: monotonic, idempotent, symmetric, bracketing, on-grid."""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import fpsim

NAMES = ["fp16", "bf16", "e4m3", "e5m2", "fp8_e4m3fnuz", "e3m4", "e2m3", "e3m2", "e2m1", "int8",
         "e8m0", "e5m4fn"]
DETERMINISTIC = ["rne", "rna", "rtz", "rup", "rdown", "rto"]
floats = st.floats(allow_nan=False, allow_infinity=True, width=64)
arrays = st.lists(floats, min_size=2, max_size=40)
SET = settings(max_examples=150, deadline=None)


@SET
@given(arrays, st.sampled_from(NAMES), st.sampled_from(DETERMINISTIC), st.booleans())
def test_monotonic(xs, name, mode, saturate):
    x = np.sort(np.array(xs))
    q = fpsim.quantize(x, name, rounding=mode, saturate=saturate)
    ordered = q[~np.isnan(q)]
    assert np.all(ordered[1:] >= ordered[:-1])


@SET
@given(arrays, st.sampled_from(NAMES), st.sampled_from(DETERMINISTIC + ["stochastic"]))
def test_idempotent(xs, name, mode):
    x = np.array(xs)
    q = fpsim.quantize(x, name, rounding=mode, seed=1)
    qq = fpsim.quantize(q, name, rounding=mode, seed=2)
    assert np.array_equal(q, qq, equal_nan=True)


@SET
@given(arrays, st.sampled_from([n for n in NAMES if n != "e8m0"]), st.sampled_from(["rne", "rna", "rtz", "rto"]))
def test_sign_symmetric(xs, name, mode):
    x = np.array(xs)
    fmt = fpsim.get_format(name)
    if fmt.is_int:  # two's complement is asymmetric at the bottom
        x = np.clip(x, -fmt.max, fmt.max)
    a = fpsim.quantize(x, name, rounding=mode)
    b = fpsim.quantize(-x, name, rounding=mode)
    assert np.array_equal(a, -b, equal_nan=True)


@SET
@given(arrays, st.sampled_from(NAMES))
def test_directed_modes_bracket_the_input(xs, name):
    x = np.array(xs)
    lo = fpsim.quantize(x, name, rounding="rdown", saturate=True)
    hi = fpsim.quantize(x, name, rounding="rup", saturate=True)
    fmt = fpsim.get_format(name)
    inside = (x >= fmt.min) & (x <= fmt.max)
    if not fmt.zero:
        inside &= x >= fmt.min_normal
    assert np.all(lo[inside] <= x[inside]) and np.all(x[inside] <= hi[inside])


@SET
@given(arrays, st.sampled_from(NAMES), st.sampled_from(DETERMINISTIC + ["stochastic"]),
       st.booleans())
def test_result_is_on_the_grid(xs, name, mode, saturate):
    x = np.array(xs)
    q = fpsim.quantize(x, name, rounding=mode, saturate=saturate, seed=0)
    grid = set(fpsim.values(name).tolist())
    for v in q:
        assert math.isnan(v) or math.isinf(v) or v in grid


@SET
@given(st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=40),
       st.sampled_from(NAMES), st.sampled_from(DETERMINISTIC))
def test_float32_and_float64_inputs_agree(xs, name, mode):
    x32 = np.array(xs, dtype=np.float32)
    a = fpsim.quantize(x32, name, rounding=mode).astype(np.float64)
    b = fpsim.quantize(x32.astype(np.float64), name, rounding=mode)
    assert np.array_equal(a, b, equal_nan=True)


@given(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=64),
       st.sampled_from(["bf16", "fp16", "tf32"]), st.sampled_from(DETERMINISTIC),
       st.sampled_from([False, True, "finite"]), st.booleans())
@SET
def test_float64_bit_patterns_through_float32_match_the_routine(bits, name, mode, saturate, jit):
    """Random float64 bit patterns (NaN payloads, subnormals, every binade) into the formats
    rounded through float32, long enough for the compiled kernel (``jit``) or not: codes and
    values are fpsim.rounding's on the float64 bits."""
    from fpsim import convert, rounding as R
    from fpsim.backend import NumpyOps

    raw = np.array(bits, np.uint64)
    xs = np.resize(raw, convert.JIT_SIZE if jit else raw.size).view(np.float64)
    fmt = fpsim.get_format(name)
    a, neg = xs.view(np.int64) & np.int64(2**63 - 1), xs.view(np.int64) < 0
    for want in ("code", "value"):
        ref = R.round_bits(NumpyOps(), a, neg, R.F64, fmt, mode, saturate=saturate, want=want)
        if want == "code":
            got = fpsim.encode(xs, fmt, rounding=mode, saturate=saturate, on_nan="zero")
            assert np.array_equal(got.astype(np.int64), ref)
        else:
            got = fpsim.quantize(xs, fmt, rounding=mode, saturate=saturate)
            assert np.array_equal(got.view(np.int64), ref)
