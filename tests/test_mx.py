"""MX (OCP v1.0) and NVFP4 against slow references written from the spec and torchao's recipe.

The MX reference below loops over blocks with Fractions: it enumerates each element format's
values from its definition (no fpsim code), finds floor(log2(amax)) with math.frexp and rounds by
comparing exact distances.  fpsim must agree code for code.
"""

import bisect
import math
import zlib
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fpsim
import fpsim.mx as mx
from fpsim.packing import pack_codes
from reference import round_ref

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

MX_NAMES = ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4", "mxint8"]
SCALE_MODES = ["floor", "ceil", "ceil_amax", "even"]


# --------------------------------------------------------------------------------------------
# The reference, from the spec text
# --------------------------------------------------------------------------------------------
class Elem:
    """An MX element format from its definition: positive codes, their exact values."""

    def __init__(self, name):
        if name == "mxint8":                       # two's complement k, value k / 64, |k| <= 127
            self.bits, self.emax, self.mbits = 8, 0, 6
            self.pos = [(Fraction(k, 64), k) for k in range(128)]
            self.is_int = True
        else:
            e, m, bias, bits, emax = {
                "mxfp8_e4m3": (4, 3, 7, 8, 8), "mxfp8_e5m2": (5, 2, 15, 8, 15),
                "mxfp6_e2m3": (2, 3, 1, 6, 2), "mxfp6_e3m2": (3, 2, 3, 6, 4),
                "mxfp4": (2, 1, 1, 4, 2)}[name]
            self.bits, self.emax, self.mbits, self.is_int = bits, emax, m, False
            self.pos = []
            for code in range(1 << (bits - 1)):
                ef, mf = code >> m, code & ((1 << m) - 1)
                if name == "mxfp8_e4m3" and code == 0x7F:
                    continue                        # NaN
                if name == "mxfp8_e5m2" and ef == 31:
                    continue                        # inf / NaN
                if ef == 0:
                    v = Fraction(mf, 1 << m) * Fraction(2) ** (1 - bias)
                else:
                    v = (1 + Fraction(mf, 1 << m)) * Fraction(2) ** (ef - bias)
                self.pos.append((v, code))
        self.pos.sort()
        self.vals = [v for v, _ in self.pos]
        self.max = self.vals[-1]
        self.value_of = {c: v for v, c in self.pos}

    def round(self, v, mode, neg):
        """Code of the exact value ``v`` (sign ``neg``: -0.0 counts) rounded, saturating."""
        a = abs(v)
        i = bisect.bisect_right(self.vals, a) - 1         # vals[i] <= a
        if self.vals[i] == a:
            k = i
        elif a > self.max:
            k = len(self.vals) - 1
        else:
            lo, hi = i, i + 1
            dlo, dhi = a - self.vals[lo], self.vals[hi] - a
            odd = self.pos[lo][1] & 1
            k = {"rne": lo if dlo < dhi or (dlo == dhi and not odd) else hi,
                 "rna": lo if dlo < dhi else hi,
                 "rtz": lo,
                 "rup": lo if neg else hi,
                 "rdown": hi if neg else lo,
                 "rto": lo if odd else hi}[mode]
        code = self.pos[k][1]
        if self.is_int:
            return (-code) % 256 if neg else code
        return code | (1 << (self.bits - 1)) if neg else code

    def value(self, code):
        if self.is_int:
            return Fraction(code - 256 if code >= 128 else code, 64)
        mag = self.value_of[code & ((1 << (self.bits - 1)) - 1)]
        return -mag if code >> (self.bits - 1) else mag


ELEMS = {name: Elem(name) for name in MX_NAMES}


def ref_exponent(amax, elem, mode):
    """Shared exponent s from the exact amax, before E8M0's range is applied."""
    if amax == 0:
        amax = Fraction(2) ** -126                       # microxcaling's all-zero block
    e = math.frexp(amax)[1] - 1 if isinstance(amax, float) else math.frexp(float(amax))[1] - 1
    amax = Fraction(amax)
    pow_e = Fraction(2) ** e
    assert pow_e <= amax < 2 * pow_e
    if mode == "floor":
        return e - elem.emax
    if mode == "ceil_amax":
        return e + (amax != pow_e) - elem.emax
    if mode == "even":
        q = amax / pow_e * 2**elem.mbits                # round to mbits fraction bits, RNE
        r = round(q)                                     # Python's round is ties-to-even
        return e + (r == 2 ** (elem.mbits + 1)) - elem.emax
    k = e - elem.emax - 2                                # "ceil": least k, amax / 2^k <= max
    while amax / Fraction(2) ** k > elem.max:
        k += 1
    assert amax / Fraction(2) ** (k - 1) > elem.max
    return k


def ref_mx(x, name, mode="floor", rounding="rne", block=32):
    """(scale codes, element codes) of a 1-D array, block by block."""
    elem = ELEMS[name]
    scales, codes = [], []
    xs = list(x) + [0.0] * (-len(x) % block)
    for b in range(0, len(xs), block):
        vals = xs[b:b + block]
        if any(math.isnan(v) or math.isinf(v) for v in vals):
            scales.append(0xFF)
            codes += [0] * block
            continue
        s = ref_exponent(max(abs(v) for v in vals), elem, mode)
        if s > 127:
            scales.append(0xFF)
            codes += [0] * block
            continue
        s = max(s, -127)
        scales.append(s + 127)
        codes += [elem.round(Fraction(v) / Fraction(2) ** s, rounding, math.copysign(1, v) < 0)
                  for v in vals]
    return np.array(scales, np.uint8), np.array(codes[:len(x)], np.uint8)


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------
def specials(name):
    """Blocks (of 32) that probe the rules: boundaries, ties, zeros, NaN, inf, subnormals."""
    elem = ELEMS[name]
    rng = np.random.default_rng(7)
    top = float(elem.max)
    rows = [np.zeros(32),
            rng.standard_normal(32) * 2.0**-140,           # float32-subnormal amax
            np.r_[1e-40, np.zeros(31)],
            np.r_[np.nan, rng.standard_normal(31)],
            np.r_[rng.standard_normal(31), np.inf],
            np.r_[-np.inf, np.zeros(31)],
            np.r_[8.0, rng.standard_normal(31)],            # amax a power of two
            np.r_[top * 4, rng.standard_normal(31)],        # amax = max_elem * 2^k ("ceil" edge)
            np.r_[np.nextafter(np.float32(top * 4), np.float32(np.inf)), np.ones(31)],
            np.r_[-np.float32(2 - 2.0 ** -(elem.mbits + 1)) * 16, rng.standard_normal(31)],
            np.r_[np.float32(2 - 2.0 ** -(elem.mbits + 1)) * 16 * (1 - 2.0**-23), np.ones(31)],
            np.r_[3.4e38, -3.4e38, rng.standard_normal(30) * 1e38],
            np.r_[2.0**-126, rng.standard_normal(31) * 2.0**-127],
            np.r_[3e38, 1e-45, -1e-45, 1e-30, -1e-30, rng.standard_normal(27)],  # x / X underflows
            -np.abs(rng.standard_normal(32)) * 2.0**-20,
            np.r_[-0.0, 0.0, -0.0, rng.standard_normal(28) * 1e-30, 0.0]]
    # ties: exact midpoints between neighbouring elements, amax pinning the scale to 2^0 (floor)
    mids = [(a + b) / 2 for a, b in zip(elem.vals, elem.vals[1:])]
    picks = [float(m) for m in mids[:: max(1, len(mids) // 31)][:31]]
    rows.append(np.r_[float(2**elem.emax), picks, [0.0] * (31 - len(picks))] * 2.0**-3)
    rows.append(-rows[-1])
    assert all(len(r) == 32 for r in rows)
    return np.concatenate(rows).astype(np.float32)


def datasets(name):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    outliers = rng.standard_normal(320)
    outliers[rng.integers(0, 320, 6)] *= 1e4
    return {"normal": rng.standard_normal(320).astype(np.float32),
            "heavy": rng.standard_t(2, 320).astype(np.float32),
            "outliers": outliers.astype(np.float32),
            "tiny": (rng.standard_normal(320) * 2.0**-130).astype(np.float32),
            "specials": specials(name)}


# --------------------------------------------------------------------------------------------
# MX against the reference
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", MX_NAMES)
@pytest.mark.parametrize("mode", SCALE_MODES)
def test_codes_match_the_spec_reference(name, mode):
    for label, x in datasets(name).items():
        got = mx.quantize(x, name, scale_rounding=mode)
        ref_s, ref_c = ref_mx(x.tolist(), name, mode)
        assert np.array_equal(got.scales, ref_s), (label, np.nonzero(got.scales != ref_s))
        bad = np.nonzero(got.codes != ref_c)[0]
        assert bad.size == 0, (label, bad[:5], x[bad[:5]], got.codes[bad[:5]], ref_c[bad[:5]])


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(MX_NAMES), st.sampled_from(SCALE_MODES),
       st.sampled_from(["rne", "rtz", "rup"]), st.sampled_from([np.float32, np.float64]),
       st.lists(st.floats(width=64), min_size=1, max_size=40))
def test_any_floats_match_the_reference(name, mode, rounding, dtype, values):
    """Arbitrary values: NaN, ±inf, subnormals, float64 beyond float32's range."""
    with np.errstate(over="ignore"):
        x = np.array(values, dtype)
    got = mx.quantize(x, name, scale_rounding=mode, rounding=rounding, block_size=8)
    ref_s, ref_c = ref_mx(x.tolist(), name, mode, rounding, block=8)
    assert np.array_equal(got.scales, ref_s) and np.array_equal(got.codes, ref_c)


@pytest.mark.parametrize("name", MX_NAMES)
@pytest.mark.parametrize("rounding", ["rna", "rtz", "rup", "rdown", "rto"])
def test_element_rounding_modes_match_the_reference(name, rounding):
    x = np.concatenate([datasets(name)["normal"], specials(name)])
    got = mx.quantize(x, name, rounding=rounding)
    ref_s, ref_c = ref_mx(x.tolist(), name, "floor", rounding)
    assert np.array_equal(got.scales, ref_s)
    assert np.array_equal(got.codes, ref_c)


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "mxfp4", "mxint8"])
def test_float64_input_beyond_float32_range(name):
    x = np.array([1e300, 3.0, 2.0**130, -5.0, 1e-300, 2.0**-1070, 7.0, 2.0**-200] * 8)
    got = mx.quantize(x, name, block_size=8)
    ref_s, ref_c = ref_mx(x.tolist(), name, block=8)
    assert np.array_equal(got.scales, ref_s) and np.array_equal(got.codes, ref_c)
    assert got.scales[0] == 0xFF                      # 2^996: s > 127 is NaN


def test_scale_edge_cases_by_name():
    """The documented choices, spelled out."""
    zero = mx.quantize(np.zeros(32, np.float32), "mxfp8_e4m3")
    assert zero.scales.tolist() == [0] and not zero.codes.any()
    assert mx.quantize(np.zeros(32, np.float32), "mxint8").scales.tolist() == [1]
    nan = mx.quantize(np.r_[np.nan, np.ones(31)].astype(np.float32), "mxfp4")
    assert nan.scales.tolist() == [255] and not nan.codes.any()
    assert np.isnan(nan.dequantize()).all()
    inf = mx.quantize(np.r_[np.ones(31), -np.inf].astype(np.float32), "mxfp6_e2m3")
    assert inf.scales.tolist() == [255] and np.isnan(inf.dequantize()).all()
    sub = mx.quantize(np.r_[1e-45, np.zeros(31)].astype(np.float32), "mxfp8_e5m2")
    assert sub.scales.tolist() == [0]                 # clamped to 2^-127
    sat = mx.quantize(np.r_[480.0, np.zeros(31)].astype(np.float32), "mxfp8_e4m3")
    assert sat.scales.tolist() == [127] and sat.codes[0] == 0x7E   # saturates to 448, not NaN
    assert mx.quantize(np.r_[480.0, np.zeros(31)], "mxfp8_e4m3", scale_rounding="rceil") \
        .scales.tolist() == [128]                     # alias of "ceil": 480/2 <= 448
    neg = mx.quantize(np.r_[-1.0, -1.99, np.zeros(30)].astype(np.float32), "mxint8",
                      rounding="rdown")
    assert neg.codes[:2].tolist() == [0xC0, 0x81]     # -64 and -127 (never -128)


# --------------------------------------------------------------------------------------------
# Dequantization and the error bound
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", MX_NAMES)
def test_dequantize_is_element_times_scale_exactly(name):
    elem = ELEMS[name]
    x = datasets(name)["specials"]
    q = mx.quantize(x, name)
    d64, d32 = q.dequantize(np.float64), q.dequantize()
    assert d64.dtype == np.float64 and d32.dtype == np.float32
    for i, (c, s) in enumerate(zip(q.codes, np.repeat(q.scales, 32))):
        if s == 255:
            assert math.isnan(d64[i]) and math.isnan(d32[i])
            continue
        exact = elem.value(int(c)) * Fraction(2) ** (int(s) - 127)
        assert Fraction(float(d64[i])) == exact
        assert float(d32[i]) == float(np.float32(float(exact)))
        f32_max = Fraction(float(np.finfo(np.float32).max))
        assert Fraction(float(d32[i])) == exact or abs(exact) > f32_max


def ulp(a, elem):
    """Spacing of the element format around the magnitude ``a`` (below the next power of two)."""
    if elem.is_int:
        return Fraction(1, 64)
    emin = 1 - {"mxfp8_e4m3": 7, "mxfp8_e5m2": 15, "mxfp6_e2m3": 1, "mxfp6_e3m2": 3,
                "mxfp4": 1}[[k for k, v in ELEMS.items() if v is elem][0]]
    e = math.frexp(float(a))[1] - 1 if a else emin
    return Fraction(2) ** (max(e, emin) - elem.mbits)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(MX_NAMES), st.sampled_from(["floor", "ceil"]),
       st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=1,
                max_size=64),
       st.integers(-60, 60))
def test_error_is_at_most_half_an_element_ulp(name, mode, values, shift):
    """|x - dequant| <= ulp(x / X) / 2 * X, except where |x / X| > max (then it saturates)."""
    elem = ELEMS[name]
    with np.errstate(over="ignore"):
        x = (np.array(values, np.float64) * 2.0**shift).astype(np.float32)
    q = mx.quantize(x, name, scale_rounding=mode)
    d = q.dequantize(np.float64)
    scales = np.repeat(q.scales.astype(int), 32)[:x.size]
    for xi, di, s in zip(x.tolist(), d.tolist(), scales):
        if s == 255:
            assert not np.isfinite(x).all() and math.isnan(di)
            continue
        X = Fraction(2) ** (int(s) - 127)
        a = abs(Fraction(xi)) / X
        if a > elem.max:
            assert mode == "floor", "ceil never saturates"
            assert Fraction(di) == math.copysign(1, xi) * elem.max * X
        else:
            assert abs(Fraction(di) - Fraction(xi)) <= ulp(a, elem) / 2 * X


@pytest.mark.parametrize("name", MX_NAMES)
def test_ceil_is_the_least_scale_that_never_saturates(name):
    elem = ELEMS[name]
    x = np.concatenate([v for v in datasets(name).values()]).astype(np.float32)
    x = x[np.isfinite(x)][:320]
    q = mx.quantize(x, name, scale_rounding="ceil")
    for b, s in enumerate(q.scales.astype(int) - 127):
        amax = max(abs(Fraction(float(v))) for v in x[32 * b:32 * b + 32])
        assert amax / Fraction(2) ** s <= elem.max
        assert s == -127 or amax / Fraction(2) ** (s - 1) > elem.max


# --------------------------------------------------------------------------------------------
# Shapes, axes, padding, packing
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", MX_NAMES + ["nvfp4"])
@pytest.mark.parametrize("shape, axis", [((3, 70), -1), ((70, 3), 0), ((2, 5, 40), 1),
                                         ((64,), 0)])
def test_axis_and_padding(name, shape, axis):
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    q = mx.quantize(x, name, axis=axis)
    bs = q.block_size
    assert q.codes.shape == x.shape and q.codes.dtype == np.uint8 and q.scales.dtype == np.uint8
    nb = -(-shape[axis] // bs)
    assert q.scales.shape == tuple(nb if d == axis % len(shape) else n for d, n in enumerate(shape))
    # the same as quantizing each line along the axis on its own
    moved = np.moveaxis(x, axis, -1).reshape(-1, shape[axis])
    for i, line in enumerate(moved):
        one = mx.quantize(line, name, tensor_scale=q.tensor_scale)
        assert np.array_equal(np.moveaxis(q.codes, axis, -1).reshape(-1, shape[axis])[i], one.codes)
        assert np.array_equal(np.moveaxis(q.scales, axis, -1).reshape(-1, nb)[i], one.scales)
    assert q.dequantize().shape == x.shape
    if shape[axis] % bs:
        with pytest.raises(ValueError, match="pad=True"):
            mx.quantize(x, name, axis=axis, pad=False)


@pytest.mark.parametrize("name", MX_NAMES + ["nvfp4"])
@pytest.mark.parametrize("shape, axis", [((3, 70), -1), ((70, 5), 0), ((2, 4, 64), 2)])
def test_pack_layout_and_round_trip(name, shape, axis):
    x = np.random.default_rng(4).standard_t(3, shape).astype(np.float32)
    q = mx.quantize(x, name, axis=axis)
    scales, packed = q.pack()
    bs, bits = q.block_size, q.fmt.elem.bits
    # layout, built independently: axis last, zero-padded to whole blocks, C order, LE bit stream
    moved = np.moveaxis(q.codes, axis, -1)
    padded = np.zeros(moved.shape[:-1] + (-(-moved.shape[-1] // bs) * bs,), np.uint8)
    padded[..., :moved.shape[-1]] = moved
    stream = sum(int(c) << (bits * i) for i, c in enumerate(padded.reshape(-1)))
    assert bytes(packed) == stream.to_bytes(padded.size * bits // 8, "little")
    assert np.array_equal(scales, np.moveaxis(q.scales, axis, -1).reshape(-1))
    back = mx.MXArray.unpack(scales, packed, name, shape, axis=axis, tensor_scale=q.tensor_scale)
    assert np.array_equal(back.codes, q.codes) and np.array_equal(back.scales, q.scales)
    assert np.array_equal(back.dequantize(), q.dequantize())


def test_fp6_blocks_fill_whole_bytes():
    q = mx.quantize(np.ones((2, 64), np.float32), "mxfp6_e3m2")
    scales, packed = q.pack()
    assert scales.shape == (4,) and packed.shape == (96,)      # 24 bytes per block
    assert np.array_equal(packed[:24], pack_codes(q.codes[0, :32], 6))


@pytest.mark.parametrize("name, bits", [("mxfp4", 4.25), ("mxfp6_e2m3", 6.25),
                                        ("mxfp8_e5m2", 8.25), ("mxint8", 8.25), ("nvfp4", 4.5)])
def test_bits_per_element(name, bits):
    assert mx.quantize(np.ones(64, np.float32), name).bits_per_element == bits


# --------------------------------------------------------------------------------------------
# torch
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", MX_NAMES + ["nvfp4"])
def test_torch_is_bit_identical(name):
    x = np.concatenate([datasets("mxfp4")["heavy"], specials("mxfp4")])
    x = x[:x.size // 48 * 48].reshape(-1, 48)                # pads along axis 1
    kinds = [("floor", "rne"), ("ceil", "rtz"), ("even", "rup")] if name != "nvfp4" else \
        [(None, "rne"), (None, "rdown")]
    for mode, rounding in kinds:
        for axis in (0, 1):
            a = mx.quantize(x, name, axis=axis, scale_rounding=mode, rounding=rounding)
            t = mx.quantize(torch.from_numpy(x), name, axis=axis, scale_rounding=mode,
                            rounding=rounding)
            assert isinstance(t.codes, torch.Tensor) and t.codes.dtype == torch.uint8
            assert np.array_equal(t.codes.numpy(), a.codes)
            assert np.array_equal(t.scales.numpy(), a.scales)
            assert t.tensor_scale == a.tensor_scale
            for dt, tdt in ((np.float32, torch.float32), (np.float64, torch.float64)):
                td = t.dequantize(tdt)
                assert td.dtype == tdt
                assert np.array_equal(td.numpy(), a.dequantize(dt), equal_nan=True)
            ts, tp = t.pack()
            ns, npk = a.pack()
            assert np.array_equal(ts.numpy(), ns) and np.array_equal(tp.numpy(), npk)


@pytest.mark.parametrize("rounding", ["rup", "rdown", "rto", "rne"])
def test_float64_underflow_of_x_over_scale(rounding):
    """x / X below float64's subnormals still rounds by its sign in directed modes."""
    x = np.r_[2.0**120, 1e-320, -1e-320, 5e-324, -5e-324, 1.0, np.zeros(26)]
    ref_s, ref_c = ref_mx(x.tolist(), "mxfp8_e4m3", rounding=rounding)
    for arr in (x, torch.from_numpy(x)):
        got = mx.quantize(arr, "mxfp8_e4m3", rounding=rounding)
        assert np.array_equal(np.asarray(got.codes), ref_c)
        assert np.array_equal(np.asarray(got.scales), ref_s)


def test_torch_float64_and_bfloat16_inputs():
    x = np.random.default_rng(5).standard_normal(96) * 1e3
    for name in ("mxfp8_e4m3", "mxint8"):
        t = mx.quantize(torch.from_numpy(x), name)
        assert np.array_equal(t.codes.numpy(), mx.quantize(x, name).codes)
    xb = torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16)
    nb = xb.float().numpy().astype(ml_dtypes.bfloat16)
    assert np.array_equal(mx.quantize(xb, "mxfp4").codes.numpy(), mx.quantize(nb, "mxfp4").codes)


# --------------------------------------------------------------------------------------------
# Stochastic rounding
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["mxfp4", "mxint8", "mxfp6_e3m2"])
def test_stochastic_rounds_to_a_neighbour_and_is_seeded(name):
    x = datasets(name)["normal"]
    down = mx.quantize(x, name, rounding="rdown").dequantize(np.float64)
    up = mx.quantize(x, name, rounding="rup").dequantize(np.float64)
    a = mx.quantize(x, name, rounding="stochastic", seed=1)
    assert np.array_equal(a.codes, mx.quantize(x, name, rounding="stochastic", seed=1).codes)
    assert not np.array_equal(a.codes, mx.quantize(x, name, rounding="stochastic", seed=2).codes)
    d = a.dequantize(np.float64)
    assert np.all((d == down) | (d == up))
    t = mx.quantize(torch.from_numpy(x), name, rounding="stochastic", seed=3).dequantize(
        torch.float64).numpy()
    assert np.all((t == down) | (t == up))


def test_stochastic_is_unbiased():
    x = np.full(32 * 400, 0.3, np.float32)
    x[::32] = 4.0                                      # scale 2^0 for mxfp4: 0.3 between 0 and 0.5
    d = mx.quantize(x, "mxfp4", rounding="stochastic", seed=0).dequantize(np.float64)
    rest = np.delete(d, np.s_[::32])
    assert set(np.unique(rest)) == {0.0, 0.5}
    assert abs(rest.mean() - 0.3) < 0.01              # ~12400 draws: sd of the mean ~0.0022


# --------------------------------------------------------------------------------------------
# NVFP4 against torchao's recipe (torch ops, torch's E4M3 cast, ml_dtypes' E2M1 cast)
# --------------------------------------------------------------------------------------------
def torchao_nvfp4(x, per_tensor_scale):
    """torchao nvfp4_quantize, two-level (or single-level with per_tensor_scale None)."""
    data = torch.from_numpy(x.astype(np.float32)).reshape(-1, 16)
    amax = data.abs().amax(dim=-1)
    block = amax / 6.0
    if per_tensor_scale is None:
        s8 = block.clamp(2.0**-6, 448.0).to(torch.float8_e4m3fn)
        total = s8.to(torch.float32)
    else:
        pts = torch.tensor(per_tensor_scale, dtype=torch.float32)
        s8 = (block / pts).clamp(2.0**-6, 448.0).to(torch.float8_e4m3fn)
        total = pts * s8.to(torch.float32)
    scaled = (data / total.unsqueeze(-1)).clamp(-6.0, 6.0)
    e2m1 = scaled.numpy().astype(ml_dtypes.float4_e2m1fn).view(np.uint8)
    return s8.view(torch.uint8).numpy(), e2m1.reshape(-1)


@pytest.mark.parametrize("label", ["normal", "heavy", "outliers", "zeros_row", "scales_clamped"])
def test_nvfp4_matches_torchao(label):
    rng = np.random.default_rng(11)
    x = {"normal": rng.standard_normal(1024), "heavy": rng.standard_t(1.5, 1024),
         "outliers": np.r_[rng.standard_normal(1008), 1e5 * rng.standard_normal(16)],
         "zeros_row": np.r_[np.zeros(64), rng.standard_normal(960)],
         "scales_clamped": np.r_[rng.standard_normal(512) * 1e-6, rng.standard_normal(512) * 1e4],
         }[label].astype(np.float32)
    q = mx.quantize(x, "nvfp4")
    pts = float(np.float32(np.abs(x).max()) / np.float32(448 * 6))
    assert q.tensor_scale == pts
    s_ref, c_ref = torchao_nvfp4(x, pts)
    assert np.array_equal(q.scales, s_ref)
    assert np.array_equal(q.codes, c_ref)
    # dequantize: torchao multiplies the E2M1 value by fp32(tensor_scale * block scale)
    e2m1 = c_ref.view(ml_dtypes.float4_e2m1fn).astype(np.float32).reshape(-1, 16)
    total = np.float32(pts) * s_ref.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert np.array_equal(q.dequantize(), (e2m1 * total[:, None]).reshape(-1))
    block = s_ref.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    exact = e2m1.astype(np.float64) * block[:, None] * pts
    assert np.array_equal(q.dequantize(np.float64), exact.reshape(-1))


def test_nvfp4_single_level_is_tensor_scale_one():
    x = np.random.default_rng(12).standard_normal(512).astype(np.float32) * 30
    q = mx.quantize(x, "nvfp4", tensor_scale=1.0)
    s_ref, c_ref = torchao_nvfp4(x, None)
    assert np.array_equal(q.scales, s_ref) and np.array_equal(q.codes, c_ref)


def test_nvfp4_edge_cases():
    zero = mx.quantize(np.zeros(32, np.float32), "nvfp4")
    assert zero.tensor_scale == 2.0**-126
    assert zero.scales.tolist() == [0x08, 0x08] and not zero.codes.any()   # 2^-6, zeros
    assert not zero.dequantize().any()
    x = np.r_[np.ones(16), [np.inf] + [1.0] * 15, [np.nan] * 16, np.full(16, 3.0)]
    q = mx.quantize(x.astype(np.float32), "nvfp4")
    assert q.tensor_scale == float(np.float32(3.0) / np.float32(2688))    # inf/NaN ignored
    assert q.scales[1:3].tolist() == [0x7F, 0x7F] and not q.codes[16:48].any()
    d = q.dequantize()
    assert np.isnan(d[16:48]).all() and np.isfinite(d[:16]).all() and np.isfinite(d[48:]).all()
    tiny = mx.quantize(np.full(16, 1e-38, np.float32), "nvfp4")
    assert tiny.tensor_scale == 2.0**-126                                  # clamped, not 0
    x, ts = Fraction(float(np.float32(1e-38))), Fraction(2) ** -126       # from the definitions:
    s = round_ref(x / ts / 6, fpsim.get_format("fp8_e4m3fn"))            # 0.8507/6 -> 9·2^-6
    e = round_ref(x / (ts * s), fpsim.get_format("fp4_e2m1"))            # 6.05 -> 6
    assert (s, e) == (Fraction(9, 64), 6) and tiny.scales.tolist() == [0x21]
    assert tiny.codes.tolist() == [7] * 16                               # E2M1 6.0
    assert [Fraction(float(v)) for v in tiny.dequantize()] == [e * s * ts] * 16   # 0.84375·2^-126


# --------------------------------------------------------------------------------------------
# Registry and errors
# --------------------------------------------------------------------------------------------
def test_registry():
    assert set(mx.MX_FORMATS) == set(MX_NAMES) | {"nvfp4"}
    assert mx.get_mx_format("MXFP4") is mx.MX_FORMATS["mxfp4"]
    assert mx.get_mx_format("mxfp8-e4m3").emax == 8
    assert mx.MX_FORMATS["mxint8"].max == 127 / 64
    assert fpsim.mx is mx


@pytest.mark.parametrize("call, match", [
    (lambda: mx.quantize(np.ones(32), "mxfp5"), r"Did you mean 'mxfp[48]'.*mxfp8_e4m3"),
    (lambda: mx.quantize(np.ones(32), 3), "name or an MXFormat"),
    (lambda: mx.quantize(np.ones(30), "mxfp4", pad=False), "not a multiple of block_size 32"),
    (lambda: mx.quantize(np.ones(32), "mxfp4", axis=1), "axis 1 is out of range"),
    (lambda: mx.quantize(np.ones(32), "mxfp4", block_size=0), "positive integer"),
    (lambda: mx.quantize(np.ones(32), "mxfp4", scale_rounding="round"), "floor, ceil"),
    (lambda: mx.quantize(np.ones(32), "nvfp4", scale_rounding="floor"), "E4M3"),
    (lambda: mx.quantize(np.ones(32), "mxfp4", rounding="nearest"), "rounding mode"),
    (lambda: mx.quantize(np.ones(32, np.int32), "mxfp4"), r"floating-point.*astype"),
    (lambda: mx.quantize(torch.ones(32, dtype=torch.int64), "mxfp4"), r"\.float\(\)"),
    (lambda: mx.quantize(np.float32(1.0), "mxfp4"), "at least one dimension"),
    (lambda: mx.quantize(np.ones(32), "mxfp4", tensor_scale=2.0), "nvfp4"),
    (lambda: mx.quantize(np.ones(32), "nvfp4", tensor_scale=0.0), "finite positive"),
    (lambda: mx.quantize(np.ones(32), "mxfp4").dequantize(np.float16), "float32 or float64"),
    (lambda: mx.MXArray.unpack(np.zeros(3, np.uint8), np.zeros(16, np.uint8), "mxfp4", (32,)),
     "3 scale bytes given.*1 blocks"),
    (lambda: mx.MXArray.unpack(np.zeros(2, np.uint8), np.zeros(16, np.uint8), "nvfp4", (32,)),
     "tensor_scale"),
])
def test_bad_input_is_named(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_triton_backend_gives_the_numpy_result(monkeypatch):
    """``backend="triton"`` runs kernels.mx_quantize (interpreted on CPU) behind fpsim.mx."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    import fpsim_kernels as kernels

    calls = []
    real = kernels.mx_quantize
    monkeypatch.setattr(kernels, "mx_quantize", lambda *a, **k: calls.append(1) or real(*a, **k))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 70, generator=g) * torch.exp2(torch.randint(-8, 8, (3, 70), generator=g).float())
    x[0, :32] = 0.0
    x[1, 5] = float("inf")
    for name in ("mxfp8_e4m3", "mxfp4", "mxfp6_e3m2", "nvfp4"):
        got = fpsim.mx.quantize(x, name, backend="triton")
        ref = fpsim.mx.quantize(x.numpy(), name)
        assert np.array_equal(got.scales.numpy(), ref.scales), name
        assert np.array_equal(got.codes.numpy(), ref.codes), name
        assert got.tensor_scale == ref.tensor_scale
        for a, b in zip(got.pack(), ref.pack()):
            assert np.array_equal(a.numpy(), b), name
    assert len(calls) == 4
    fpsim.mx.quantize(x, "mxfp4")  # a CPU tensor under "auto" stays off the kernel
    assert len(calls) == 4


def test_rounded_up_scale_beyond_e8m0_is_nan_even_from_float32():
    """The module doc's rule: a shared exponent above 127 gives the NaN scale."""
    x = np.full((1, 32), 3.4e38, np.float32)
    assert mx.quantize(x, "mxint8").scales[0, 0] == 127 + 127     # floor: 2^127, elements saturate
    up = mx.quantize(x, "mxint8", scale_rounding="ceil")
    assert up.scales[0, 0] == 0xFF and np.isnan(up.dequantize()).all()


def test_nvfp4_tensor_scale_is_checked_as_float32():
    for bad in (1e-50, 1e39):                # 0 and inf once rounded to float32
        with pytest.raises(ValueError, match="normal range"):
            mx.quantize(np.ones(16, np.float32), "nvfp4", tensor_scale=bad)
