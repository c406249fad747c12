"""scaled_quantize against a per-group reference (NumPy float32 ops, ml_dtypes casts, Fractions)
and PyTorch's MinMax observers, plus the documented edge cases."""

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fpsim
from fpsim import scaled_quantize

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

CASTS = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2,
         "e2m3": ml_dtypes.float6_e2m3fn, "e3m2": ml_dtypes.float6_e3m2fn,
         "e2m1": ml_dtypes.float4_e2m1fn}
QMAX = {"e4m3": 448.0, "e5m2": 57344.0, "e2m3": 7.5, "e3m2": 28.0, "e2m1": 6.0, "int8": 127.0,
        "int4": 7.0}
BITS = {"int8": 8, "int4": 4}


def ref_group(g, fmt, symmetric=True, scale_dtype="fp32", margin=0):
    """(scale, zero point, codes, values) of one group of float32 values, straight from the doc."""
    g = np.asarray(g, np.float32)
    f32 = np.float32
    if np.isnan(g).any():
        return f32(np.nan), 0, np.zeros(g.size, np.uint8), np.full(g.size, np.nan, np.float32)
    fin = np.where(np.isinf(g), f32(0), g)                   # the scale of the finite values
    if symmetric:
        span, levels = np.abs(fin).max(initial=f32(0)), QMAX[fmt]
    else:
        lo, hi = min(fin.min(initial=f32(0)), f32(0)), max(fin.max(initial=f32(0)), f32(0))
        span, levels = f32(hi - lo), 2.0 ** BITS[fmt] - 1
    if span == 0:
        s = f32(1)
    elif scale_dtype == "fp32":
        s = f32(span / f32(levels))                           # one float32 division
        s = f32(min(max(float(s) * 2.0**margin, 2.0**-126), float(np.finfo(f32).max)))
    else:
        k = -200                                              # least k: span / 2^k <= levels
        while Fraction(float(span)) / Fraction(2) ** k > Fraction(levels):
            k += 1
        s = f32(2.0 ** min(max(k + margin, -127), 127))
    t = g / s                                                 # float32 division
    if fmt in CASTS:
        q = np.clip(t, -QMAX[fmt], QMAX[fmt])                 # +-inf: +-qmax, but E5M2's inf
        q = np.where(np.isinf(t) & (fmt == "e5m2"), t, q).astype(CASTS[fmt])
        return s, 0, q.view(np.uint8), q.astype(f32) * s
    zp = 0
    lo_c, hi_c = -QMAX[fmt], QMAX[fmt]
    if not symmetric:
        qmin, qmax = -(2 ** (BITS[fmt] - 1)), 2 ** (BITS[fmt] - 1) - 1
        zp = 0 if span == 0 else int(np.clip(qmin - np.rint(lo / s), qmin, qmax))
        lo_c, hi_c = qmin, qmax
    q = np.clip(np.rint(t) + zp, lo_c, hi_c).astype(np.int64)
    codes = (q % (2 ** BITS[fmt])).astype(np.uint8)
    return s, zp, codes, (q - zp).astype(f32) * s


def ref_scaled(x, fmt, granularity, axis=None, **kw):
    """Loop over the groups of the doc with :func:`ref_group`."""
    x = np.asarray(x, np.float32)
    if granularity == "tensor":
        groups = [np.s_[...]]
    elif granularity == "channel":
        groups = [tuple([slice(None)] * (axis % x.ndim) + [i]) for i in range(x.shape[axis])]
    else:
        n = granularity[1]
        ax = (-1 if axis is None else axis) % x.ndim
        groups = [idx + (slice(b, b + n),) for idx in np.ndindex(*x.shape[:ax])
                  for b in range(0, x.shape[ax], n)]
        assert ax == x.ndim - 1, "reference blocks run along the last axis"
    codes = np.zeros(x.shape, np.uint8)
    vals = np.zeros(x.shape, np.float32)
    scales, zps = [], []
    for sl in groups:
        s, zp, c, v = ref_group(x[sl].reshape(-1), fmt, **kw)
        codes[sl], vals[sl] = c.reshape(x[sl].shape), v.reshape(x[sl].shape)
        scales.append(s)
        zps.append(zp)
    return np.array(scales, np.float32), np.array(zps), codes, vals


def data(seed, shape=(6, 40)):
    rng = np.random.default_rng(seed)
    x = rng.standard_t(3, shape) * np.exp(rng.uniform(-4, 4, (shape[0],) + (1,) * (len(shape) - 1)))
    return x.astype(np.float32)


CASES = [(f, True) for f in QMAX] + [("int8", False), ("int4", False)]


@pytest.mark.parametrize("fmt, symmetric", CASES)
@pytest.mark.parametrize("granularity", ["tensor", "channel", ("block", 16)])
@pytest.mark.parametrize("scale_dtype", ["fp32", "e8m0"])
def test_matches_the_reference(fmt, symmetric, granularity, scale_dtype):
    x = data(1)
    x[2, :] = 0                                          # an all-zero channel
    x[4, 3] = np.inf                                     # scales from the finite values
    axis = 0 if granularity == "channel" else None
    r = scaled_quantize(x, fmt, granularity=granularity, axis=axis, scale_dtype=scale_dtype,
                        symmetric=symmetric)
    s, zp, codes, vals = ref_scaled(x, fmt, granularity, axis, symmetric=symmetric,
                                    scale_dtype=scale_dtype)
    assert r.scales.dtype == np.float32
    assert np.array_equal(r.scales.reshape(-1), s, equal_nan=True)
    assert np.array_equal(r.codes, codes)
    assert np.array_equal(r.values, vals, equal_nan=True)
    if symmetric:
        assert r.zero_points is None
    else:
        assert np.array_equal(r.zero_points.reshape(-1), zp)


@pytest.mark.parametrize("margin", [-2, 1, 3])
@pytest.mark.parametrize("scale_dtype", ["fp32", "e8m0"])
def test_margin_multiplies_the_scale_by_powers_of_two(margin, scale_dtype):
    x = data(2)
    base = scaled_quantize(x, "e4m3", granularity="channel", scale_dtype=scale_dtype)
    r = scaled_quantize(x, "e4m3", granularity="channel", scale_dtype=scale_dtype, margin=margin)
    assert np.array_equal(r.scales, base.scales * np.float32(2.0**margin))
    s, _, codes, vals = ref_scaled(x, "e4m3", "channel", 0, scale_dtype=scale_dtype,
                                   margin=margin)
    assert np.array_equal(r.codes, codes) and np.array_equal(r.values, vals)


def test_asymmetric_matches_pytorch_observers():
    x = data(3)
    x[1] += 5                                            # a channel with a positive range only
    tx = torch.from_numpy(x)
    obs = torch.ao.quantization.MinMaxObserver(dtype=torch.qint8, qscheme=torch.per_tensor_affine)
    obs(tx)
    scale, zp = obs.calculate_qparams()
    r = scaled_quantize(x, "int8", symmetric=False)
    assert float(r.scales) == float(scale) and int(r.zero_points) == int(zp)
    obs = torch.ao.quantization.PerChannelMinMaxObserver(
        ch_axis=0, dtype=torch.qint8, qscheme=torch.per_channel_affine)
    obs(tx)
    scale, zp = obs.calculate_qparams()
    r = scaled_quantize(x, "int8", granularity="channel", axis=0, symmetric=False)
    assert np.array_equal(r.scales.reshape(-1), scale.numpy())
    assert np.array_equal(r.zero_points.reshape(-1), zp.numpy())


@pytest.mark.parametrize("x, fmt, scale, zero_point", [
    ([-0.5, 254.5, 3.0], "int8", 1.0, -128),      # min / scale = -0.5, a tie: to even, 0
    ([-2.5, 252.5], "int8", 1.0, -126),           # -2.5 to -2 (away from zero would give -125)
    ([-4.5, 250.5, 1.0], "int8", 1.0, -124),
    ([-1.5, 253.5], "int8", 1.0, -126),           # -1.5 to -2: both rules agree here
    ([-0.5, 14.5], "int4", 1.0, -8),
    ([-2.5, 12.5], "int4", 1.0, -6),
])
def test_zero_point_ties_round_to_even_as_pytorch(x, fmt, scale, zero_point):
    """Ties of min / scale, checked against torch's MinMaxObserver (quant_min..quant_max of the
    format) and the codes against torch's own per-tensor quantization where it has the dtype."""
    x = np.float32(x)
    qmin = -(2 ** (BITS[fmt] - 1))
    obs = torch.ao.quantization.MinMaxObserver(dtype=torch.qint8, quant_min=qmin,
                                               quant_max=-qmin - 1,
                                               qscheme=torch.per_tensor_affine)
    obs(torch.from_numpy(x))
    t_scale, t_zp = obs.calculate_qparams()
    assert (float(t_scale), int(t_zp)) == (scale, zero_point)
    r = scaled_quantize(x, fmt, symmetric=False)
    assert (float(r.scales), int(r.zero_points)) == (scale, zero_point)
    if fmt == "int8":
        q = torch.quantize_per_tensor(torch.from_numpy(x), scale, zero_point, torch.qint8)
        assert r.codes.tolist() == (q.int_repr().numpy().astype(np.uint8)).tolist()
        assert r.values.tolist() == q.dequantize().numpy().tolist()


@pytest.mark.parametrize("fmt, inf_value", [("e4m3", 448.0), ("e5m2", np.inf), ("e2m1", 6.0),
                                             ("int8", 127.0)])
def test_one_inf_leaves_the_other_values_of_a_tensor(fmt, inf_value):
    """A per-tensor scale comes from the finite values; +-inf saturates (E5M2: stays inf)."""
    x = np.float32([1.0, np.inf, -0.5, -np.inf, 2.0])
    r = scaled_quantize(x, fmt)
    plain = scaled_quantize(np.float32([1.0, 0.0, -0.5, 0.0, 2.0]), fmt)
    assert r.scales == plain.scales == np.float32(2.0 / QMAX[fmt])
    assert np.array_equal(r.codes[[0, 2, 4]], plain.codes[[0, 2, 4]])
    assert r.values[[0, 2, 4]].tolist() == plain.values[[0, 2, 4]].tolist()
    edge = np.float32(inf_value) * r.scales if np.isfinite(inf_value) else np.float32(np.inf)
    assert r.values[1] == edge and r.values[3] == -edge


def test_edge_cases():
    z = scaled_quantize(np.zeros((3, 4), np.float32), "e4m3")
    assert float(z.scales) == 1.0 and not z.codes.any() and not z.values.any()
    za = scaled_quantize(np.zeros(8, np.float32), "int8", symmetric=False)
    assert float(za.scales) == 1.0 and int(za.zero_points) == 0 and not za.codes.any()
    x = np.ones((3, 4), np.float32)
    x[1, 2] = np.nan
    x[2, 0] = -np.inf
    r = scaled_quantize(x, "int4", granularity="channel", axis=0)
    assert r.scales[0, 0] == r.scales[2, 0] == np.float32(1 / 7) and np.isnan(r.scales[1])
    assert np.isnan(r.values[1]).all() and not r.codes[1].any()          # NaN: a NaN channel
    assert r.codes[0].tolist() == [7] * 4 and r.values[0].tolist() == [1.0] * 4  # 7 · fp32(1/7)
    assert r.codes[2].tolist() == [9, 7, 7, 7] and r.values[2].tolist() == [-1.0] + [1.0] * 3
    t = scaled_quantize(np.float32([1e-44, -3e-45]), "e2m1")          # tiny amax: scale clamped
    assert float(t.scales) == 2.0**-126 and t.codes.tolist() == [0, 8]   # +0, -0
    big = scaled_quantize(np.float32([3e38, -1.0]), "e2m1", margin=5)   # scale capped at max
    assert float(big.scales) == np.finfo(np.float32).max
    wide = scaled_quantize(np.float32([3e38, -3e38]), "int8", symmetric=False)
    f32max = float(np.finfo(np.float32).max)         # span overflows float32: the largest scale
    assert float(wide.scales) == f32max and int(wide.zero_points) == -127   # -128 - rint(-0.88)
    assert wide.codes.tolist() == [130, 128] and wide.values.tolist() == [f32max, -f32max]
    a = np.float32(1.0030015)                        # a / fp32(a / 127) = 127.00001 in float32
    sym = scaled_quantize(np.float32([-a, 0.5]), "int8", rounding="rdown")
    assert sym.codes.tolist()[0] == 0x81                                # -127, not -128
    assert scaled_quantize(np.float32([a, 0.5]), "int8", rounding="rup").codes[0] == 0x7F


def test_e8m0_scales_are_the_least_powers_of_two_without_saturation():
    x = data(4, (8, 64))
    r = scaled_quantize(x, "e2m1", granularity=("block", 32), scale_dtype="e8m0")
    amax = np.abs(x).reshape(8, 2, 32).max(axis=2)
    mant, _ = np.frexp(r.scales)
    assert (mant == 0.5).all()                                          # powers of two
    assert (amax / r.scales <= 6).all() and (amax / (r.scales / 2) > 6).all()


def test_float64_input_stays_float64():
    x = data(5).astype(np.float64) * np.pi
    r = scaled_quantize(x, "e4m3", granularity="channel")
    assert r.values.dtype == np.float64 and r.scales.dtype == np.float32
    s = np.float32(np.abs(x).max(axis=1) / 448.0)
    assert np.array_equal(r.scales.reshape(-1), s)
    t = x / r.scales.astype(np.float64)
    expected = np.clip(t, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    assert np.array_equal(r.codes, expected.view(np.uint8))


@pytest.mark.parametrize("fmt, symmetric", [("e4m3", True), ("e2m1", True), ("int8", False),
                                            ("int4", True)])
@pytest.mark.parametrize("granularity, axis", [("tensor", None), ("channel", 1),
                                               (("block", 8), 0)])
def test_torch_is_bit_identical(fmt, symmetric, granularity, axis):
    x = data(6, (4, 24, 3))
    x[0, 0, 0] = np.nan
    for scale_dtype in ("fp32", "e8m0"):
        kw = dict(granularity=granularity, axis=axis, symmetric=symmetric, scale_dtype=scale_dtype)
        a = scaled_quantize(x, fmt, **kw)
        t = scaled_quantize(torch.from_numpy(x), fmt, **kw)
        assert isinstance(t.values, torch.Tensor)
        assert np.array_equal(t.values.numpy(), a.values, equal_nan=True)
        assert np.array_equal(t.codes.numpy(), a.codes)
        assert np.array_equal(t.scales.numpy(), a.scales, equal_nan=True)
        if not symmetric:
            assert np.array_equal(t.zero_points.numpy(), a.zero_points)


def test_granularities_compare_on_the_same_data():
    """Finer groups never lose accuracy on data with per-row magnitudes (the point of it)."""
    x = data(7, (16, 128))
    err = {g: float(np.abs(scaled_quantize(x, "int8", granularity=g, axis=a).values - x).mean())
           for g, a in [("tensor", None), ("channel", 0), (("block", 32), -1)]}
    assert err[("block", 32)] <= err["channel"] < err["tensor"]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, width=32), min_size=1, max_size=40),
       st.sampled_from(["e4m3", "e2m1", "int8", "int4"]))
def test_values_stay_within_half_a_step(values, fmt):
    """Symmetric: every value lies in [-amax, amax], so no saturation; the error is at most half
    the format's spacing at x / scale, times the scale, plus float32 slack: the rounded scale
    can put amax / scale a hair above the largest value, and value = code * scale is rounded."""
    x = np.array(values, np.float32)
    r = scaled_quantize(x, fmt)
    s = float(r.scales)
    grid = fpsim.values(fmt) if fmt in CASTS else np.arange(-QMAX[fmt], QMAX[fmt] + 1)
    for xi, vi in zip(x.tolist(), r.values.tolist()):
        t = xi / s
        i = np.searchsorted(grid, t)
        gap = grid[min(i, len(grid) - 1)] - grid[max(i - 1, 0)]
        assert abs(vi - xi) <= (gap / 2) * s + abs(xi) * 2.0**-22 + 2.0**-149


@pytest.mark.parametrize("rounding", ["stochastic", "rup", "rtz"])
def test_rounding_modes_reach_the_elements(rounding):
    x = data(8)
    down = scaled_quantize(x, "int8", rounding="rdown").values
    up = scaled_quantize(x, "int8", rounding="rup").values
    r = scaled_quantize(x, "int8", rounding=rounding, seed=0).values
    assert np.all((r == down) | (r == up))
    assert not np.array_equal(down, up)


@pytest.mark.parametrize("call, match", [
    (lambda: scaled_quantize(np.ones(4), "e4m3", granularity="row"), "'tensor', 'channel'"),
    (lambda: scaled_quantize(np.ones(4), "e4m3", axis=0), "leave axis None"),
    (lambda: scaled_quantize(np.ones(4), "e4m3", granularity=("block", 0)), "positive integer"),
    (lambda: scaled_quantize(np.ones(4), "e4m3", granularity="channel", axis=2), "out of range"),
    (lambda: scaled_quantize(np.ones(4), "e4m3", symmetric=False), "integer formats"),
    (lambda: scaled_quantize(np.ones(4), "uint8"), "unsigned"),
    (lambda: scaled_quantize(np.ones(4), "e8m0"), "unsigned"),
    (lambda: scaled_quantize(np.ones(4), "fp32"), "at most 16 bits"),
    (lambda: scaled_quantize(np.ones(4), "e4m3", scale_dtype="bf16"), "'fp32' or 'e8m0'"),
    (lambda: scaled_quantize(np.ones(4), "e4m3", margin=0.5), "whole number"),
    (lambda: scaled_quantize(np.ones(4), "e4m3", rounding="up"), "rounding mode"),
    (lambda: scaled_quantize(np.ones(4, np.int8), "e4m3"), "floating-point"),
    (lambda: scaled_quantize(np.ones(4), "e4m4x"), "unknown format"),
])
def test_bad_input_is_named(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_formats_wider_than_float32_scale_in_float64():
    """Quotients by a 2^-126 scale overflow float32; such formats work in float64."""
    x = np.array([1e5, 2.0, -3.0], np.float32)
    for name in ("e9m2", "e11m0"):
        r = fpsim.scaled_quantize(x, name)
        assert r.values.dtype == np.float64
        assert np.all(np.isfinite(r.values))
        assert np.array_equal(r.values, fpsim.quantize(x.astype(np.float64) / r.scales.astype(np.float64), name) * r.scales.astype(np.float64))


@pytest.mark.parametrize("shape,axis", [((0, 4), 0), ((4, 0), 1), ((4, 0), 0), ((0, 3, 2), 0)])
@pytest.mark.parametrize("torch_input", [False, True])
def test_channel_scaling_of_empty_tensors(shape, axis, torch_input):
    """Empty tensors, zero channels included, give empty values and codes and one scale per
    channel (there used to be a reshape error when the channel axis had length 0)."""
    x = np.zeros(shape, np.float32)
    if torch_input:
        torch = pytest.importorskip("torch")
        x = torch.from_numpy(x)
    for symmetric, fmt in ((True, "e4m3"), (False, "int8")):
        out = scaled_quantize(x, fmt, granularity="channel", axis=axis, symmetric=symmetric)
        assert tuple(out.values.shape) == shape and tuple(out.codes.shape) == shape
        assert tuple(out.scales.shape) == tuple(s if d == axis else 1
                                                for d, s in enumerate(shape))
