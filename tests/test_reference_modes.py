"""Every deterministic rounding mode against the Fraction reference, on many formats."""

from fractions import Fraction

import numpy as np
import pytest

import fpsim
from reference import random_doubles, round_ref, special_inputs

FORMATS = ["fp16", "bf16", "tf32", "fp8_e4m3fn", "fp8_e5m2", "fp8_e4m3fnuz", "fp8_e5m2fnuz",
           "fp8_e4m3", "fp8_e3m4", "fp6_e2m3", "fp6_e3m2", "fp4_e2m1", "e8m0", "int8", "int4",
           "uint8", "e3m3fn", "e6m9"]
MODES = ["rne", "rna", "rtz", "rup", "rdown", "rto"]


def _as_value(r):
    if r == "nan":
        return float("nan")
    if r in ("inf", "-inf"):
        return float(r)
    return r


def _inputs(fmt):
    lo = int(np.floor(np.log2(fmt.min_subnormal))) - 3
    hi = int(np.ceil(np.log2(fmt.max))) + 2
    xs = special_inputs(fmt) + random_doubles(600, lo, hi, seed=fmt.bits)
    # also exact grid points and midpoints of the format
    if fmt.bits <= 8:
        v = fpsim.values(fmt)
        mids = (v[1:] + v[:-1]) / 2
        xs += list(v) + list(mids) + list(np.nextafter(mids, np.inf)) + list(np.nextafter(mids, -np.inf))
    return np.array(xs, dtype=np.float64)


def _check(got, xs, fmt, mode, saturate, subnormals=True):
    for g, x in zip(got, xs):
        ref = _as_value(round_ref(float(x), fmt, mode, saturate, subnormals))
        if isinstance(ref, float) and ref != ref:
            assert g != g, (fmt.name, mode, x, g)
        elif isinstance(ref, float):
            assert g == ref, (fmt.name, mode, x, g, ref)
        else:
            assert g == g and Fraction(float(g)) == ref, (fmt.name, mode, x, g, ref)
            if ref == 0:                             # fnuz and integers have no -0
                keeps_sign = fmt.nan != "fnuz" and not fmt.is_int
                assert np.signbit(g) == (keeps_sign and np.signbit(x)), (fmt.name, mode, x, g)


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("saturate", [False, True])
def test_modes_against_fraction_reference(name, saturate):
    fmt = fpsim.get_format(name)
    xs = _inputs(fmt)
    for mode in MODES:
        got = fpsim.quantize(xs, fmt, rounding=mode, saturate=saturate)
        _check(got, xs, fmt, mode, saturate)


@pytest.mark.parametrize("name", ["bf16", "fp16", "fp8_e4m3fn", "fp8_e5m2", "fp4_e2m1", "int8", "tf32"])
@pytest.mark.parametrize("saturate", [False, True])
def test_float32_inputs_against_reference(name, saturate):
    """float32 inputs take the 32-bit lanes (and the lookup table for narrow formats)."""
    fmt = fpsim.get_format(name)
    with np.errstate(over="ignore"):
        xs = _inputs(fmt).astype(np.float32)
    for mode in MODES:
        got = fpsim.quantize(xs, fmt, rounding=mode, saturate=saturate)
        assert got.dtype == np.float32
        _check(got.astype(np.float64), xs.astype(np.float64), fmt, mode, saturate)


@pytest.mark.parametrize("name", ["fp16", "bf16", "fp8_e4m3fn", "fp8_e5m2", "fp8_e4m3fnuz",
                                  "fp6_e2m3", "fp4_e2m1", "e6m9"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_subnormals_false_flushes_after_rounding(name, dtype):
    """``subnormals=False``: round as usual, then results below the least normal become
    (signed) zero; checked for every mode against the reference, float64 and float32 lanes."""
    fmt = fpsim.get_format(name)
    with np.errstate(over="ignore"):
        xs = _inputs(fmt).astype(dtype)
    xs = xs[np.isfinite(xs)]
    for mode in MODES:
        got = fpsim.quantize(xs, fmt, rounding=mode, subnormals=False).astype(np.float64)
        _check(got, xs.astype(np.float64), fmt, mode, False, subnormals=False)
        assert np.all(np.isnan(got) | (got == 0) | (np.abs(got) >= fmt.min_normal))


def test_e8m0_rounds_float32_subnormals_to_nearest():
    """ml_dtypes 0.6 sends (2^-127, 2^-126) up to 2^-126; the nearest is 2^-127 below 1.5·2^-127."""
    xs = np.array([1.03 * 2.0**-127, 1.4 * 2.0**-127, 1.5 * 2.0**-127, 1.6 * 2.0**-127,
                   2.0**-128, 2.0**-140], np.float32)
    got = fpsim.quantize(xs, "e8m0").astype(np.float64)
    want = [2.0**-127, 2.0**-127, 2.0**-126, 2.0**-126, 2.0**-127, 2.0**-127]
    assert list(got) == want


@pytest.mark.parametrize("name", ["bf16", "fp16", "tf32", "int8", "int4", "e6m9", "e5m12fn"])
@pytest.mark.parametrize("saturate", [False, True])
def test_float64_inputs_through_float32_round_once(name, saturate):
    """float64 inputs to formats that float32 holds with bits to spare are rounded to odd into
    float32 first: every tie of the target broken only by bits below float32's precision, values
    beyond float32's range and below its least subnormal must still round once, as the
    reference says."""
    fmt = fpsim.get_format(name)
    v = fpsim.values(fmt) if fmt.bits <= 16 else np.unique(
        fpsim.quantize(np.array(random_doubles(3000, -30, 30, seed=5)), fmt))
    v = v[np.isfinite(v)]
    mids = (v[1:] + v[:-1]) / 2
    rng = np.random.default_rng(4)
    mids = mids[rng.permutation(mids.size)[:800]]
    near = np.concatenate([mids, v[:800]])
    tiny = np.abs(near) * 2.0**-40 + 2.0**-1074                 # far below float32's resolution
    xs = np.concatenate([near + tiny, near - tiny, mids,
                         [1e39, -1e39, 1e300, -1e300, 3.4028235677973366e38, 2.0**128,
                          1e-50, -1e-50, 2.0**-150, 2.0**-149 * 1.5, 5e-324, -0.0, 0.0,
                          np.inf, -np.inf, np.nan]])
    for mode in MODES:
        got = fpsim.quantize(xs, fmt, rounding=mode, saturate=saturate)
        _check(got, xs, fmt, mode, saturate)


@pytest.mark.parametrize("name", ["bf16", "fp16", "tf32", "e6m9", "e5m12fn"])
@pytest.mark.parametrize("mode", ["rne", "rna"])
def test_float64_nearest_route_equals_the_routine(name, mode):
    """float64 into formats rounded through NumPy's nearest float32 cast (only casts landing on
    a target midpoint are redone): every midpoint of the target (bf16, fp16: all of them) and
    float64 neighbours 1-3 ulps and 2^-30 relative to each side (the cast lands on the
    midpoint), below the least normal, and random bit patterns, against the routine on float64
    bits, codes and values."""
    from fpsim import rounding as R
    from fpsim.backend import NumpyOps

    fmt = fpsim.get_format(name)
    if fmt.bits <= 16:
        v = fpsim.values(fmt)
    else:
        v = np.unique(fpsim.quantize(np.array(random_doubles(40_000, -40, 40, seed=6)), fmt))
        v = v[np.isfinite(v)]
    v = np.concatenate([v, [fmt.max + (fmt.max - v[v < fmt.max][-1])]])   # overflow midpoint
    mids = np.concatenate([(v[1:] + v[:-1]) / 2, v])
    steps = [np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf)]
    for k in range(2):
        steps += [np.nextafter(steps[-2], np.inf), np.nextafter(steps[-1], -np.inf)]
    xs = np.concatenate([mids, *steps, mids * (1 + 2.0**-30), mids * (1 - 2.0**-30),
                         np.array(random_doubles(100_000, -160, 140, seed=7))])
    xs = np.concatenate([xs, -xs, [np.inf, -np.inf, np.nan, 5e-324, 1e300]])
    bits = xs.view(np.int64)
    a, neg = bits & np.int64(2**63 - 1), bits < 0
    for want in ("code", "value"):
        ref = R.round_bits(NumpyOps(), a, neg, R.F64, fmt, mode, want=want)
        if want == "code":
            got = fpsim.encode(xs, fmt, rounding=mode, on_nan="zero")
            assert np.array_equal(got, ref.astype(got.dtype))
        else:
            got = fpsim.quantize(xs, fmt, rounding=mode)
            assert np.array_equal(got.view(np.int64), ref)
