"""The public functions' contract: types in and out, options, errors, and exactness of inputs."""

import math

import ml_dtypes
import numpy as np
import pytest

import fpsim


def test_types_and_dtypes_are_preserved():
    assert isinstance(fpsim.quantize(0.1, "bf16"), float)
    assert fpsim.quantize(0.1, "bf16") == 0.10009765625
    for dt in (np.float16, np.float32, np.float64, ml_dtypes.bfloat16):
        x = np.array([[0.1, 2.5], [-3.0, 1e4]], dtype=dt)
        q = fpsim.quantize(x, "e4m3")
        assert q.dtype == x.dtype and q.shape == x.shape
    assert fpsim.quantize(np.float32(3.3), "e2m1").dtype == np.float32
    assert fpsim.quantize([1, 2, 3], "e2m1").dtype == np.float64  # integers become float64
    assert fpsim.encode(np.zeros((2, 0)), "e4m3").shape == (2, 0)
    assert fpsim.quantize(np.array(2.2, np.float32), "e2m1").shape == ()
    assert fpsim.encode(np.array(1.0), "fp16").dtype == np.uint16


def test_code_dtypes_are_the_smallest_that_hold_them():
    x = np.ones(3)
    assert fpsim.encode(x, "e2m1").dtype == np.uint8
    assert fpsim.encode(x, "bf16").dtype == np.uint16
    assert fpsim.encode(x, "tf32").dtype == np.uint32
    assert fpsim.encode(x, "fp32").dtype == np.uint32
    assert fpsim.encode(x, "fp64").dtype == np.uint64
    assert fpsim.encode(x, "fp64")[0] == np.float64(1.0).view(np.uint64)
    assert fpsim.encode(np.array([-1.0, -8.0, 7.0]), "int4").tolist() == [0xF, 0x8, 0x7]


def test_float64_is_rounded_once_not_through_float32():
    x = 1 + 2.0**-8 + 2.0**-30  # above the bf16 tie; float32 would drop 2^-30 and make a tie
    assert fpsim.quantize(np.float64(x), "bf16") == 1 + 2.0**-7
    assert float(np.float32(x)) == 1 + 2.0**-8  # (the double rounding this avoids)


def test_big_integers_are_rounded_once():
    x = 2**60 + 2**36 + 1  # just above a fp32 tie; float64 would make it an exact tie
    assert fpsim.quantize(np.array([x], dtype=np.int64), "fp32")[0] == 2.0**60 + 2.0**37
    assert fpsim.quantize(np.array([-x], dtype=np.int64), "fp32")[0] == -(2.0**60 + 2.0**37)
    assert fpsim.quantize(np.array([x], dtype=np.int64), "bf16", rounding="rtz")[0] == 2.0**60
    assert fpsim.quantize(x, "fp32") == 2.0**60 + 2.0**37  # Python int too
    assert fpsim.quantize(np.array([x], dtype=np.uint64), "fp32")[0] == 2.0**60 + 2.0**37
    with pytest.raises(ValueError, match="2\\^53"):
        fpsim.quantize(np.array([x], np.int64), "fp64", rounding="rtz")


def test_non_numeric_input_is_a_type_error():
    for bad in ("1.0", ["a", "b"], [object()], 1 + 2j):
        with pytest.raises(TypeError):
            fpsim.quantize(bad, "fp16")
    with pytest.raises(TypeError):
        fpsim.decode(np.array([1.5]), "fp16")


def test_unknown_rounding_lists_the_modes():
    with pytest.raises(ValueError) as info:
        fpsim.quantize(1.0, "fp16", rounding="nearest")
    assert all(m in str(info.value) for m in fpsim.MODES)


def test_nan_into_format_without_nan():
    x = np.array([1.0, np.nan, -np.nan, 2.0])
    with pytest.raises(ValueError, match="2 NaN"):
        fpsim.encode(x, "e2m1")
    assert fpsim.encode(x, "e2m1", on_nan="zero").tolist() == [2, 0, 8, 4]
    with pytest.warns(DeprecationWarning, match="on_nan="):          # the old keyword still works
        assert fpsim.encode(x, "e2m1", nan="zero").tolist() == [2, 0, 8, 4]
    assert np.isnan(fpsim.quantize(x, "e2m1")[1])  # quantize returns floats: NaN stays NaN
    assert fpsim.encode(x, "e4m3")[1] == 0x7F


def test_unsigned_formats_without_nan_take_negatives_to_zero():
    u = fpsim.Format("ue3m3", 3, 3, inf=False, nan="none", signed=False)
    x = np.array([-1.0, -0.0, 0.3, -np.inf], np.float32)
    assert fpsim.encode(x, u).tolist() == [0, 0, int(fpsim.encode(0.3, u)), 0]
    assert fpsim.quantize(x, u).tolist()[:2] == [0.0, 0.0]
    z = fpsim.Format("ue3m0", 3, 0, inf=False, nan="none", signed=False, subnormals=False,
                     zero=False)
    assert fpsim.encode(np.array([0.0, -2.0]), z).tolist() == [0, 0]
    assert fpsim.quantize(np.array([0.0]), z).tolist() == [z.min_normal]


def test_decode_rejects_codes_out_of_range():
    with pytest.raises(ValueError, match="out of range"):
        fpsim.decode(np.array([16]), "e2m1")


def test_overflow_rules_per_mode():
    big = np.array([1e6, -1e6])
    def q(fmt, mode, sat=False):
        return fpsim.quantize(big, fmt, rounding=mode, saturate=sat).tolist()
    inf = math.inf
    assert q("fp16", "rne") == [inf, -inf]
    assert q("fp16", "rna") == [inf, -inf]
    assert q("fp16", "rtz") == [65504, -65504]
    assert q("fp16", "rup") == [inf, -65504]
    assert q("fp16", "rdown") == [65504, -inf]
    assert q("fp16", "rne", True) == [65504, -65504]
    r = q("e4m3", "rne")
    assert math.isnan(r[0]) and math.isnan(r[1])
    assert q("e4m3", "rne", True) == [448, -448]
    assert q("e2m1", "rne") == [6, -6]
    assert q("int8", "rne") == [127, -128]
    # inf input stays inf whatever the mode, in formats that have it
    assert fpsim.quantize(np.array([np.inf]), "fp16", rounding="rtz")[0] == inf
    assert fpsim.quantize(np.array([np.inf]), "e4m3", saturate=True)[0] == 448


def test_subnormals_flag_flushes_results_below_min_normal():
    f = fpsim.get_format("fp16")
    x = np.array([f.min_subnormal, -f.min_normal / 2, f.min_normal * (1 - 2**-12), f.min_normal])
    q = fpsim.quantize(x, f, subnormals=False)
    assert q.tolist() == [0.0, 0.0, f.min_normal, f.min_normal]  # rounds up to min normal: kept
    assert np.signbit(q[1])
    c = fpsim.encode(np.array([-2.0**-9]), "fp8_e4m3fnuz", subnormals=False)
    assert c[0] == 0  # +0: fnuz has no negative zero


def test_tf32_nvidia_behaviours():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(100_000).astype(np.float32)
    x[:4] = [1 + 2**-11, 1 + 3 * 2**-11, -(1 + 2**-11), 1 + 2**-11 + 2**-23]  # ties and one above
    bits = x.view(np.uint32)
    rtz = (bits & ~np.uint32(0x1FFF)).view(np.float32)           # tensor cores read 10 bits
    rna = ((bits + np.uint32(0x1000)) & ~np.uint32(0x1FFF)).view(np.float32)  # cvt.rna.tf32.f32
    assert np.array_equal(fpsim.quantize(x, "tf32", rounding="rtz"), rtz)
    assert np.array_equal(fpsim.quantize(x, "tf32", rounding="rna"), rna)
    assert fpsim.quantize(x[:2], "tf32").tolist() == [1.0, 1 + 2**-9]  # rne: ties to even


def test_stochastic_rounding_is_unbiased_and_reproducible():
    x = np.full(200_000, 1 + 0.3 * 2**-7)  # 30% of the way from 1 to the next bf16
    q = fpsim.quantize(x, "bf16", rounding="stochastic", seed=123)
    assert set(np.unique(q)) == {1.0, 1 + 2**-7}
    p = (q > 1).mean()
    assert abs(p - 0.3) < 5 * math.sqrt(0.3 * 0.7 / x.size)
    assert np.array_equal(q, fpsim.quantize(x, "bf16", rounding="stochastic", seed=123))
    assert not np.array_equal(q, fpsim.quantize(x, "bf16", rounding="stochastic", seed=124))
    # float32 inputs, a subnormal target, and tiny probabilities
    y = np.full(400_000, 0.1 * 2.0**-9, np.float32)  # 0.1 of e4m3's smallest subnormal
    r = fpsim.quantize(y, "e4m3", rounding="stochastic", seed=5).astype(np.float64)
    assert abs(r.mean() - float(y[0])) < 5 * 2.0**-9 * math.sqrt(0.09 / y.size)


def test_stochastic_rounding_of_exact_values_is_exact():
    v = fpsim.values("e4m3")
    assert np.array_equal(fpsim.quantize(v, "e4m3", rounding="stochastic", seed=0), v)


def test_values_lists_every_finite_value_once():
    v = fpsim.values("e2m1")
    assert v.tolist() == [-6, -4, -3, -2, -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert len(fpsim.values("e4m3")) == 253  # 256 codes - 2 NaN - one of ±0
    assert len(fpsim.values("fp16")) == 65536 - 2 * 1024 - 1  # no inf/NaN exponent, one zero
    with pytest.raises(ValueError, match="16 bits"):
        fpsim.values("fp32")


def test_explain_layout():
    e = fpsim.explain(0.1, "bf16")
    assert str(e) == "0 | 01111011 | 1001101  = +1.1001101b × 2^-4 = 0.10009765625  (error +9.77e-05)"
    assert (e.kind, e.unbiased_exponent, e.value) == ("normal", -4, 0.10009765625)
    assert fpsim.explain(2.0**-9, "e4m3").kind == "subnormal"
    assert fpsim.explain(1e9, "e4m3").kind == "nan"
    assert fpsim.explain(1e9, "fp16").kind == "inf"
    assert fpsim.explain(-0.0, "fp16").fields == ("1", "00000", "0000000000")
    assert fpsim.explain(1e-3, "e4m3").error == pytest.approx(0.001953125 - 1e-3, rel=1e-15)


torch = pytest.importorskip("torch")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["bf16", "fp16", "e4m3", "e5m2", "e2m1", "int8", "e8m0", "tf32"])
def test_torch_path_is_bit_identical_to_numpy(dtype, name):
    g = torch.Generator().manual_seed(0)
    t = (torch.randn(4096, generator=g) * torch.exp2(torch.randint(-20, 20, (4096,), generator=g))).to(dtype)
    t[:6] = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e30]).to(dtype)
    for mode in ("rne", "rtz", "rup", "rdown", "rna", "rto"):
        q = fpsim.quantize(t, name, rounding=mode, backend="torch")  # torch ops, not numpy
        assert q.dtype == dtype and q.device == t.device
        # numpy has no bfloat16: round the float32 copy, then cast the result as torch does
        ref = fpsim.quantize(t.float().numpy() if dtype == torch.bfloat16 else t.numpy(), name,
                             rounding=mode)
        ref = torch.from_numpy(ref).to(dtype)
        same = (q == ref) | (torch.isnan(q) & torch.isnan(ref))
        assert bool(same.all()) and torch.equal(torch.signbit(q), torch.signbit(ref)), mode
    c = fpsim.encode(t, name, on_nan="zero", backend="torch")
    ref = fpsim.encode(t.float().numpy(), name, on_nan="zero")
    assert torch.equal(c, fpsim.encode(t, name, on_nan="zero"))  # the default (numpy) driver too
    assert np.array_equal(c.numpy().astype(np.int64), ref.astype(np.int64))


def test_torch_stochastic_is_reproducible_and_unbiased():
    x = torch.full((200_000,), 1 + 0.25 * 2**-7)
    a = fpsim.quantize(x, "bf16", rounding="stochastic", seed=3, backend="torch")
    b = fpsim.quantize(x, "bf16", rounding="stochastic", seed=3, backend="torch")
    assert torch.equal(a, b)
    p = (a > 1).double().mean().item()
    assert abs(p - 0.25) < 5 * math.sqrt(0.25 * 0.75 / x.numel())


def test_wide_codes_are_the_same_on_every_torch_driver():
    x = torch.tensor([-1.0, 2.5, float("inf")])
    for name in ("fp32", "tf32", "fp64"):
        want = fpsim.encode(x.numpy().astype(np.float64), name).astype(np.uint64)
        for backend in ("torch", "numpy"):
            got = fpsim.encode(x, name, backend=backend).numpy().astype(np.int64).view(np.uint64)
            assert np.array_equal(got, want), (name, backend)


def test_torch_decode_checks_its_codes():
    with pytest.raises(ValueError, match="out of range"):
        fpsim.decode(torch.tensor([300, -1]), "e4m3")
    with pytest.raises(TypeError, match="integers"):
        fpsim.decode(torch.tensor([1.5]), "e4m3")
    codes = fpsim.encode(torch.tensor([-2.0]), "fp64", backend="torch")  # int64 bit pattern
    assert fpsim.decode(codes, "fp64").item() == -2.0


def test_backend_switch_is_checked():
    x = torch.ones(3)
    with pytest.raises(ValueError, match="backend"):
        fpsim.quantize(x, "fp16", backend="cuda")
    gen = torch.Generator().manual_seed(0)
    a = fpsim.quantize(torch.full((1000,), 1.3), "e2m1", rounding="stochastic", seed=gen)
    assert set(a.unique().tolist()) <= {1.0, 1.5}


@pytest.mark.parametrize("name", ["fp16", "bf16", "e4m3", "fp8_e4m3fnuz", "e2m1", "int8", "e8m0"])
def test_torch_decode_of_every_code_matches_numpy(name):
    n = fpsim.get_format(name).num_codes
    got = fpsim.decode(torch.arange(n), name)
    assert got.dtype == torch.float64
    want = fpsim.decode(np.arange(n), name)
    assert np.array_equal(got.numpy().view(np.uint64)[~np.isnan(want)],
                          want.view(np.uint64)[~np.isnan(want)])
    assert np.array_equal(np.isnan(got.numpy()), np.isnan(want))


@pytest.mark.parametrize("name, wide", [
    ("bf16", False), ("fp16", False), ("tf32", False), ("e4m3", False), ("e3m4", False),
    ("int8", False), ("int4", False), ("e2m1", False), ("fp8_e4m3fnuz", False), ("e6m9fn", False),
    ("e4m3", True), ("e5m2", True), ("e2m1", True), ("int8", True), ("e8m0", True),
    ("fp8_e5m2fnuz", True)])
def test_lookup_tables_equal_the_rounding_routine(name, wide):
    """The fast path (a table of the routine's results) against the routine itself, for
    float32 and float64 inputs."""
    from fpsim import rounding as R
    from fpsim.backend import NumpyOps
    from fpsim.convert import _table_low_bits

    fmt = fpsim.get_format(name)
    src, ut, it = (R.F64, np.uint64, np.int64) if wide else (R.F32, np.uint32, np.int32)
    assert _table_low_bits(fmt, "rne", src) > 0  # these formats do take the table
    rng = np.random.default_rng(9)
    bits = rng.integers(0, 2**63, 300_000, dtype=np.int64).astype(np.uint64)
    bits = (bits << np.uint64(1)) | (bits >> np.uint64(62))   # all 64 bits random
    bits = bits.astype(ut)                                      # (float32: the low 32)
    bits[1::4] &= ~ut(2 ** (src.width // 2) - 1)                # low bits clear: ties, exact
    bits[2::4] >>= ut(src.width // 2 - 4)                       # tiny values and subnormals
    x = bits.view(np.float64 if wide else np.float32)
    a, neg = (bits & ut(2 ** (src.width - 1) - 1)).view(it), bits >= ut(2 ** (src.width - 1))
    for mode in ("rne", "rna", "rtz", "rup", "rdown", "rto"):
        for sat in (False, True):
            want = R.round_bits(NumpyOps(), a, neg, src, fmt, mode, saturate=sat, want="code")
            got = fpsim.encode(x, fmt, rounding=mode, saturate=sat, on_nan="zero")
            assert np.array_equal(got, want.astype(got.dtype)), (mode, sat)
            want_v = R.round_bits(NumpyOps(), a, neg, src, fmt, mode, saturate=sat, want="value")
            got_v = fpsim.quantize(x, fmt, rounding=mode, saturate=sat)
            assert np.array_equal(got_v.view(it), want_v.astype(it)), (mode, sat)


def test_64_bit_formats_decode_and_round_trip():
    x = np.array([1.5, -2.0, np.inf, -0.0, 5e-324, -1.7976931348623157e308])
    for name in ("fp64", "e11m52"):
        codes = fpsim.encode(x, name)
        assert codes.dtype == np.uint64 and codes[1] == np.float64(-2.0).view(np.uint64)
        assert np.array_equal(fpsim.decode(codes, name).view(np.uint64), x.view(np.uint64))
    assert str(fpsim.explain(-0.1, "fp64")).startswith("1 | 01111111011 | ")


def test_integers_at_the_top_of_uint64_round_down_when_asked():
    top = np.array([2**64 - 1], np.uint64)
    assert fpsim.quantize(top, "fp32", rounding="rtz")[0] == 2.0**64 - 2.0**40
    assert fpsim.quantize(top, "fp32", rounding="rdown")[0] == 2.0**64 - 2.0**40
    assert fpsim.quantize(top, "fp32", rounding="rup")[0] == 2.0**64
    assert fpsim.quantize(top, "fp32")[0] == 2.0**64


def test_options_are_checked_whatever_the_input():
    with pytest.raises(ValueError, match="backend"):
        fpsim.quantize([1.0], "e4m3", backend="bogus")
    with pytest.raises(ValueError, match="on_nan="):
        fpsim.encode([1.0], "e4m3", on_nan="ignore")  # e4m3 has a NaN code: still a bad option
    with pytest.raises(ValueError, match="Did you mean 'rne'"):
        fpsim.quantize([1.0], "e4m3", rounding="rnee")
    with pytest.raises(TypeError, match="seed"):
        fpsim.quantize(np.ones(3), "e4m3", rounding="stochastic", seed=object())


def test_resolved_once_calls_equal_the_general_path():
    """NumPy float arrays take plans cached by their arguments (fpsim.convert._fast_plan); lists
    take the general path.  Same bits for names and Format objects, any case of the mode,
    saturate="finite", 0-d, strided and Fortran-ordered arrays, and NaN into formats without
    one (a ValueError on both paths)."""
    rng = np.random.default_rng(5)
    base = (rng.standard_normal((6, 5)) * 2.0 ** rng.integers(-20, 20, (6, 5)))
    base[0, :4] = [np.inf, -np.inf, 0.0, -0.0]
    for dt in (np.float32, np.float64):
        x = base.astype(dt)
        for arr in (x, x[::2, 1::2], np.asfortranarray(x), x[2, 3].reshape(())):
            for fmt in ("e4m3", fpsim.get_format("e2m1"), "bf16", "fp16"):
                for kw in ({}, {"rounding": "RTZ"}, {"saturate": "finite"}, {"saturate": True}):
                    q = fpsim.quantize(arr, fmt, **kw)
                    assert q.dtype == arr.dtype and q.shape == arr.shape
                    ref = np.array(fpsim.quantize(arr.tolist(), fmt, **kw), dtype=arr.dtype)
                    assert np.array_equal(q.reshape(-1).view(np.uint8),
                                          ref.reshape(-1).view(np.uint8)), (fmt, kw)
                    c = fpsim.encode(arr, fmt, **kw)
                    assert np.array_equal(c, fpsim.encode(arr.tolist(), fmt, **kw)), (fmt, kw)
        with pytest.raises(ValueError, match="NaN"):
            fpsim.encode(np.array([1.0, np.nan], dt), "e2m1")
        assert fpsim.encode(np.array([1.0, np.nan], dt), "e2m1", on_nan="zero")[1] == 0


@pytest.mark.slow
def test_bf16_delegated_cast_equals_the_table_on_every_float32():
    """float32 -> bf16 is ml_dtypes' cast (convert._delegate); the lookup table is the rounding
    routine's (test_lookup_tables_equal_the_rounding_routine).  Every one of the 2^32 float32
    bit patterns, in chunks, codes and values (about a minute)."""
    from fpsim import convert as C
    from fpsim.rounding import F32

    fmt = fpsim.get_format("bf16")
    low = C._table_low_bits(fmt, "rne", F32)
    plans = {want: (C.numpy_plan(fmt, "rne", False, True, want, False),
                    C._table_plan(C._lookup_table(fmt, "rne", False, True, want, low, F32),
                                  low, F32)) for want in ("code", "value")}
    step = 1 << 24
    for lo in range(0, 1 << 32, step):
        x = np.arange(lo, lo + step, dtype=np.uint32).view(np.float32)
        for want, (fast, table) in plans.items():
            dt = np.uint16 if want == "code" else np.float32
            got, ref = np.empty(step, dt), np.empty(step, dt)
            fast(x, got)
            table(x, ref)
            assert np.array_equal(got.view(np.uint16 if want == "code" else np.uint32),
                                  ref.view(np.uint16 if want == "code" else np.uint32)), hex(lo)
