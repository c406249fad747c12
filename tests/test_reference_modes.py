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


# --------------------------------------------------------------------------------------------
# float64 through float32: the compiled round-to-odd kernel and both NumPy routes
# --------------------------------------------------------------------------------------------
THROUGH_F32 = ["bf16", "fp16", "tf32", "e8m3"]
SATURATE = [False, True, "finite"]


def _routine_bits(xs, fmt, mode, saturate, want):
    """fpsim.rounding's own answer on the float64 bits (codes, or values as float64 bits)."""
    from fpsim import rounding as R
    from fpsim.backend import NumpyOps

    bits = xs.view(np.int64)
    return R.round_bits(NumpyOps(), bits & np.int64(2**63 - 1), bits < 0, R.F64, fmt, mode,
                        saturate=saturate, want=want)


def _grid(fmt):
    """Finite values of ``fmt``: all of them up to 16 bits, else float32 values rounded to it."""
    if fmt.bits <= 16:
        v = fpsim.values(fmt)
    else:
        f32 = np.random.default_rng(8).integers(0, 0x7F800000, 20_000, dtype=np.uint32)
        v = np.unique(fpsim.quantize(f32.view(np.float32).astype(np.float64), fmt))
        v = v[np.isfinite(v) & (v >= 0)]
        v = np.unique(np.concatenate([v, [fmt.max, fmt.min_normal, fmt.min_subnormal]]))
    return v[v >= 0]


def _hard_float64(fmt):
    """Inputs where rounding through float32 can go wrong: every (sampled) midpoint of the
    target and float64s 1-3 ulps and 2^-30 relative from it (float32 ties that are not float64
    ties: the double-rounding cases), values, each binade boundary 2^k and its neighbours,
    subnormal results and the ties below them, the overflow threshold, float32's range edges,
    float64 subnormals, +-0, +-inf and NaNs with payloads and both signs."""
    v = _grid(fmt)
    v = np.concatenate([v, [fmt.max + (fmt.max - v[v < fmt.max][-1])]])   # overflow midpoint
    mids = (v[1:] + v[:-1]) / 2
    if mids.size > 6000:
        mids = mids[np.random.default_rng(9).permutation(mids.size)[:6000]]
    two = 2.0 ** np.arange(fmt.emin - fmt.mbits - 3, fmt.emax + 3)
    base = np.concatenate([mids, v[:: max(1, v.size // 3000)], two])
    near = [base, base * (1 + 2.0**-30), base * (1 - 2.0**-30)]
    up = down = base
    for _ in range(3):
        up, down = np.nextafter(up, np.inf), np.nextafter(down, -np.inf)
        near += [up, down]
    f32max = float(np.finfo(np.float32).max)
    edges = [f32max, 2.0**128 - 2.0**103, 2.0**128, 1e39, 1e300, 2.0**-149, 2.0**-150,
             1.5 * 2.0**-149, 2.0**-151, 1e-50, 5e-324, 2.0**-1022, 0.0, np.inf]
    finite = np.concatenate(near + [np.array(edges)])
    nans = np.array([0x7FF8000000000000, 0x7FF0000000000001, 0x7FF4000000000000,
                     0x7FFFFFFFFFFFFFFF, 0x7FF0000020000000, 0x7FF8000000001234],
                    np.uint64).view(np.float64)
    xs = np.concatenate([finite, nans])
    return np.concatenate([xs, -xs])


def _all_routes(xs, fmt, mode, saturate, want, monkeypatch):
    """The three ways a float64 array reaches float32: small arrays (NumPy), long arrays with
    the compiled kernel (where numba is installed) and long arrays without it."""
    from fpsim import convert

    long = np.resize(xs, max(xs.size, 2 * convert.JIT_SIZE + 3))
    call = ((lambda a: fpsim.encode(a, fmt, rounding=mode, saturate=saturate, on_nan="zero"))
            if want == "code" else
            (lambda a: fpsim.quantize(a, fmt, rounding=mode, saturate=saturate)))
    out = {"small": (xs[:convert.JIT_SIZE - 1], call(xs[:convert.JIT_SIZE - 1])),
           "long": (long, call(long))}
    with monkeypatch.context() as m:
        m.setattr(convert, "jit_kernels", lambda: None)
        out["long numpy"] = (long, call(long))
    return out


@pytest.mark.parametrize("name", THROUGH_F32)
@pytest.mark.parametrize("saturate", SATURATE)
def test_float64_through_float32_every_route_is_the_routine(name, saturate, monkeypatch):
    """Every mode, every saturation, codes and values: each route gives fpsim.rounding's bits
    on the float64 input (rounded once, not through float32's nearest value)."""
    fmt = fpsim.get_format(name)
    xs = _hard_float64(fmt)
    for mode in MODES:
        for want in ("code", "value"):
            for route, (inp, got) in _all_routes(xs, fmt, mode, saturate, want,
                                                 monkeypatch).items():
                ref = _routine_bits(inp, fmt, mode, saturate, want)
                got = got.view(np.int64) if want == "value" else got.astype(np.int64)
                bad = np.flatnonzero(got != ref)
                assert bad.size == 0, (name, mode, saturate, want, route, inp[bad[:3]])


def test_bf16_double_rounding_cases_round_once():
    """1 + 2^-8 (a bf16 midpoint) plus a bit below float32's precision: float32's nearest
    value is the midpoint itself, and a second rounding would give the even neighbour."""
    tiny = 2.0**-30
    cases = {1 + 2.0**-8 + tiny: 1 + 2.0**-7, 1 + 2.0**-8 - tiny: 1.0,
             -(1 + 2.0**-8 + tiny): -(1 + 2.0**-7), 1 + 3 * 2.0**-8 - tiny: 1 + 2.0**-7,
             2.0**-126 * (1 + 2.0**-8 + tiny): 2.0**-126 * (1 + 2.0**-7),
             2.0**-134 * (1 + tiny): 2.0**-133, 2.0**-134 * (1 - tiny): 0.0}
    xs = np.array(list(cases), np.float64)
    want = np.array(list(cases.values()))
    for n in (1, 1 << 17):                            # NumPy's route; the kernel where present
        got = fpsim.quantize(np.resize(xs, xs.size * n), "bf16")[:xs.size]
        assert np.array_equal(got, want) and np.array_equal(np.signbit(got), np.signbit(want))


def test_float64_nan_inf_zero_codes_keep_their_sign():
    """NaN (any payload, quiet or signalling) becomes bf16's quiet NaN with the input's sign;
    +-inf and +-0 keep theirs; overflow goes to inf, or to max when saturating."""
    nan_bits = np.array([0x7FF8000000000000, 0x7FF0000000000001, 0x7FFFFFFFFFFFFFFF],
                        np.uint64)
    xs = np.concatenate([nan_bits.view(np.float64), (nan_bits | np.uint64(1 << 63))
                         .view(np.float64), [np.inf, -np.inf, 0.0, -0.0, 1e39, -1e39]])
    want = [0x7FC0] * 3 + [0xFFC0] * 3 + [0x7F80, 0xFF80, 0, 0x8000, 0x7F80, 0xFF80]
    for n in (1, 1 << 17):
        got = fpsim.encode(np.resize(xs, xs.size * n), "bf16")[:xs.size]
        assert [int(c) for c in got] == want
        sat = fpsim.encode(np.resize(xs, xs.size * n), "bf16", saturate=True)[:xs.size]
        assert [int(c) for c in sat[-2:]] == [0x7F7F, 0xFF7F]


def test_compiled_round_to_odd_is_numpy_bit_for_bit():
    """numba's kernel against convert._round_to_odd_float32 on every class of float64: random
    bit patterns, float32's range edges, subnormals, zeros, infinities, NaN payloads."""
    from fpsim import convert

    if convert.jit_kernels() is None:
        pytest.skip("numba is not installed")
    kernel = convert.jit_kernels().round_to_odd_float32
    rng = np.random.default_rng(10)
    xs = np.concatenate([rng.integers(0, 2**64, 200_000, dtype=np.uint64).view(np.float64),
                         _hard_float64(fpsim.get_format("bf16")),
                         _hard_float64(fpsim.get_format("fp16"))])
    got = np.empty(xs.size, np.uint32)
    kernel(xs, got)
    want = convert._round_to_odd_float32(xs, np.empty(xs.size, np.float32)).view(np.uint32)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("name", ["fp16", "bf16", "tf32", "e8m3", "fp8_e4m3fn", "fp8_e5m2fnuz",
                                  "fp4_e2m1", "e8m0", "int8", "uint8"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_compiled_casts_are_numpy_bit_for_bit(name, dtype, monkeypatch):
    """Long arrays (the compiled table lookup and round-to-odd where numba is installed)
    against the same arrays with NumPy's steps only: random bit patterns of the input dtype
    (every class: NaN payloads, subnormals, infinities) and the format's hard inputs, every
    mode and saturation, codes and values."""
    from fpsim import convert

    if convert.jit_kernels() is None:
        pytest.skip("numba is not installed")
    fmt = fpsim.get_format(name)
    utype = np.uint64 if dtype is np.float64 else np.uint32
    rng = np.random.default_rng(11)
    raw = rng.integers(0, np.iinfo(utype).max, 3 * convert.JIT_SIZE, dtype=utype, endpoint=True)
    with np.errstate(over="ignore", invalid="ignore"):
        hard = _hard_float64(fmt).astype(dtype)
    xs = np.concatenate([raw.view(dtype), hard])
    for mode in MODES:
        for saturate in SATURATE:
            kw = dict(rounding=mode, saturate=saturate)
            got = (fpsim.encode(xs, fmt, on_nan="zero", **kw), fpsim.quantize(xs, fmt, **kw))
            with monkeypatch.context() as m:
                m.setattr(convert, "jit_kernels", lambda: None)
                want = (fpsim.encode(xs, fmt, on_nan="zero", **kw),
                        fpsim.quantize(xs, fmt, **kw))
            assert np.array_equal(got[0], want[0]), (name, mode, saturate)
            assert np.array_equal(got[1].view(utype), want[1].view(utype)), (name, mode, saturate)
