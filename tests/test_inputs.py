"""The input gate (fpsim/inputs.py) at every entry point: exotic but legal inputs give the exact
answer or a clear TypeError/ValueError, never a silently wrong one."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import fpsim
from fpsim import mx

BIG = ">" if np.little_endian else "<"          # the non-native byte order
X = 1 + 2.0**-8 + 2.0**-30                        # bf16: 1.0078125, not 1.0 through float32


def entry_points():
    """(name, call) for every public entry point taking data."""
    return [
        ("quantize", lambda x: fpsim.quantize(x, "bf16")),
        ("encode", lambda x: fpsim.encode(x, "bf16")),
        ("explain", lambda x: fpsim.explain(x.reshape(-1)[:1], "bf16")),
        ("mx.quantize", lambda x: mx.quantize(x, "mxfp8_e4m3")),
        ("scaled_quantize", lambda x: fpsim.scaled_quantize(x, "e4m3")),
        ("matmul a", lambda x: fpsim.matmul(x.reshape(1, -1), np.ones((x.size, 1)))),
        ("matmul b", lambda x: fpsim.matmul(np.ones((1, x.size)), x.reshape(-1, 1))),
    ]


# ----------------------------------------------------------------------------------------------
# byte order
# ----------------------------------------------------------------------------------------------
def test_non_native_floats_keep_their_values():
    x = np.array([0.1, 1e300, X], BIG + "f8")
    q = fpsim.quantize(x, "fp64")
    assert q.dtype == np.float64 and q.dtype.isnative
    assert np.array_equal(q, [0.1, 1e300, X])
    assert fpsim.quantize(np.array([X], BIG + "f8"), "bf16")[0] == 1.0078125
    assert fpsim.encode(np.array([X], BIG + "f8"), "bf16")[0] == fpsim.encode(X, "bf16")
    assert fpsim.explain(np.array([X], BIG + "f8")[0], "bf16").value == 1.0078125


def test_non_native_everywhere_equals_native():
    rng = np.random.default_rng(0)
    for dt in ("f2", "f4", "f8"):
        x = (rng.standard_normal(64) * 1e2).astype(dt)
        xb = x.astype(BIG + dt)
        a, b = mx.quantize(x, "mxfp8_e4m3"), mx.quantize(xb, "mxfp8_e4m3")
        assert np.array_equal(a.codes, b.codes) and np.array_equal(a.scales, b.scales)
        s, t = fpsim.scaled_quantize(x, "e4m3"), fpsim.scaled_quantize(xb, "e4m3")
        assert np.array_equal(s.codes, t.codes) and np.array_equal(s.scales, t.scales)
        m = fpsim.matmul(x.reshape(8, 8), x.reshape(8, 8), inputs="bf16")
        assert np.array_equal(m, fpsim.matmul(xb.reshape(8, 8), xb.reshape(8, 8), inputs="bf16"))
    codes = np.arange(256, dtype=np.uint16)
    assert np.array_equal(fpsim.decode(codes.astype(BIG + "u2"), "e4m3"),
                          fpsim.decode(codes, "e4m3"), equal_nan=True)


# ----------------------------------------------------------------------------------------------
# long double
# ----------------------------------------------------------------------------------------------
wide_long_double = pytest.mark.skipif(np.finfo(np.longdouble).nmant <= 52,
                                      reason="long double is float64 on this platform")


@wide_long_double
def test_long_double_exact_in_float64_is_converted():
    x = np.array([0.25, 1e300, -np.inf, np.nan], np.longdouble)
    assert np.array_equal(fpsim.quantize(x, "fp64"), [0.25, 1e300, -np.inf, np.nan],
                          equal_nan=True)
    assert fpsim.quantize(np.longdouble(1) / 4, "fp64") == 0.25


@wide_long_double
@pytest.mark.parametrize("name, call", entry_points())
def test_long_double_not_in_float64_is_refused(name, call):
    third = np.array([np.longdouble(1) / 3] * 32)
    with pytest.raises(ValueError, match="float64 cannot hold exactly"):
        call(third)
    huge = np.array([np.longdouble("1e4000")] * 32)
    with pytest.raises(ValueError, match="float64 cannot hold exactly"):
        call(huge)


@wide_long_double
def test_explain_never_calls_a_long_double_exact():
    with pytest.raises(ValueError, match="float64 cannot hold exactly"):
        fpsim.explain(np.longdouble(1) / 3, "fp64")
    with pytest.raises(ValueError, match="float64 cannot hold exactly"):
        fpsim.quantize(np.longdouble("1e4000"), "fp16", saturate=True)


def test_explain_refuses_integers_that_are_not_float64():
    with pytest.raises(ValueError, match="not a float64 exactly"):
        fpsim.explain(2**60 + 1, "fp64", rounding="rup")
    assert fpsim.explain(2**60, "fp64").value == 2.0**60


# ----------------------------------------------------------------------------------------------
# dates, strings, complex, masked
# ----------------------------------------------------------------------------------------------
REFUSED = {
    "datetime64": np.array(["2020-01-01"] * 32, "datetime64[D]"),
    "timedelta64": np.array([42] * 32, "timedelta64[s]"),
    "complex": np.ones(32, complex),
    "str": np.array(["1.5"] * 32),
    "object": np.array([1.5] * 32, object),
}


@pytest.mark.parametrize("kind", REFUSED)
@pytest.mark.parametrize("name, call", entry_points())
def test_non_numbers_are_refused(kind, name, call):
    with pytest.raises(TypeError, match="real numbers"):
        call(REFUSED[kind])


@pytest.mark.parametrize("name, call", entry_points())
def test_masked_arrays_are_refused(name, call):
    x = np.ma.masked_array(np.ones(32), mask=[True] + [False] * 31)
    with pytest.raises(TypeError, match="masked array.*filled"):
        call(x)


def test_decode_refuses_dates_and_masked_codes():
    with pytest.raises(TypeError):
        fpsim.decode(np.array([1], "timedelta64[s]"), "e4m3")
    with pytest.raises(TypeError, match="masked"):
        fpsim.decode(np.ma.masked_array([1, 2], mask=[1, 0]), "e4m3")


# ----------------------------------------------------------------------------------------------
# decode to an integer dtype
# ----------------------------------------------------------------------------------------------
def test_decode_integer_dtype_only_when_exact():
    codes = fpsim.encode(np.array([0.0, 1.0, -2.0, 448.0]), "e4m3")
    assert np.array_equal(fpsim.decode(codes, "e4m3", dtype=np.int32), [0, 1, -2, 448])
    assert fpsim.decode(codes, "e4m3", dtype=np.int32).dtype == np.int32
    for bad, dtype in ((np.nan, np.int32), (0.5, np.int64), (448.0, np.int8), (-1.0, np.uint8)):
        with pytest.raises(ValueError, match="do not fit dtype"):
            fpsim.decode(fpsim.encode(np.array([bad]), "e4m3"), "e4m3", dtype=dtype)
    with pytest.raises(ValueError, match="do not fit dtype float16"):
        fpsim.decode(fpsim.encode(np.float32([3e38]), "fp32"), "fp32", dtype=np.float16)
    specials = fpsim.encode(np.array([np.nan, -np.inf, 65504.0]), "fp16")
    assert same_nan(fpsim.decode(specials, "fp16", dtype=np.float16), [np.nan, -np.inf, 65504])
    with pytest.raises(TypeError, match="float dtype"):
        fpsim.decode(codes, "e4m3", dtype="datetime64[s]")


def same_nan(a, b) -> bool:
    return np.array_equal(np.asarray(a, np.float64), np.asarray(b, np.float64), equal_nan=True)


# ----------------------------------------------------------------------------------------------
# MXArray.unpack
# ----------------------------------------------------------------------------------------------
def test_unpack_checks_bytes_and_scale_codes():
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    a = mx.quantize(x, "mxfp8_e4m3")
    scales, elems = a.pack()
    back = mx.MXArray.unpack(scales, elems, "mxfp8_e4m3", (4, 64))
    assert np.array_equal(back.codes, a.codes)
    with pytest.raises(ValueError, match="element bytes given.*mxfp4"):
        mx.MXArray.unpack(scales, elems, "mxfp4", (4, 64))
    with pytest.raises(ValueError, match="element bytes"):
        mx.MXArray.unpack(scales, elems[:-1], "mxfp8_e4m3", (4, 64))
    with pytest.raises(ValueError, match=r"scale codes lie in \[0, 255\]"):
        mx.MXArray.unpack(scales.astype(np.int32) + 200, elems, "mxfp8_e4m3", (4, 64))
    with pytest.raises(TypeError, match="scale codes must be integers"):
        mx.MXArray.unpack(scales.astype(np.float32), elems, "mxfp8_e4m3", (4, 64))


# ----------------------------------------------------------------------------------------------
# warnings, seeds, docs
# ----------------------------------------------------------------------------------------------
def test_no_runtime_warning_escapes_a_documented_result():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.isinf(fpsim.quantize(np.float32([3.4e38]), "e9m6"))[0]
        assert fpsim.quantize(np.float32([3.0e38]), "e9m6", rounding="rtz")[0] < np.inf
        fpsim.quantize(np.float16([65504]), "fp32", rounding="rup")
        fpsim.decode(fpsim.encode(np.array([np.nan, np.inf]), "fp16"), "fp16", dtype=np.float16)
        # found by the fuzz test: float64 data beyond float32 in fp32 scales and NVFP4
        assert fpsim.scaled_quantize(np.array([1e42, 1.0]), "e4m3").scales == np.float32(
            np.finfo(np.float32).max)
        mx.quantize(np.full(16, 3.4028236e38), "nvfp4")


def test_negative_seed_names_the_argument():
    with pytest.raises(ValueError, match="seed=-1"):
        fpsim.quantize(np.ones(3), "bf16", rounding="stochastic", seed=-1)
    with pytest.raises(ValueError, match="seed=-1"):
        fpsim.matmul(np.ones((2, 2)), np.ones((2, 2)), accum="bf16", rounding="stochastic",
                     seed=-1)


def test_semantics_doc_mentions_torch_e8m0_rounding():
    text = (Path(__file__).parent.parent / "docs" / "semantics.md").read_text()
    assert "float8_e8m0fnu` cast, like ml_dtypes, rounds every input in (2^−127, 2^−126) up" \
        in text.replace("\n  ", " ")


def test_negative_seed_names_the_argument_in_block_formats():
    with pytest.raises(ValueError, match="seed=-1"):
        mx.quantize(np.ones(32), "mxfp4", rounding="stochastic", seed=-1)


def test_torch_decode_integer_dtype_only_when_exact():
    torch = pytest.importorskip("torch")
    codes = torch.tensor([0x38, 0x7F, 0x40], dtype=torch.uint8)       # 1.0, NaN, 2.0 in e4m3
    with pytest.raises(ValueError, match="do not fit dtype torch.int32"):
        fpsim.decode(codes, "e4m3", dtype=torch.int32)
    assert fpsim.decode(codes[[0, 2]], "e4m3", dtype=torch.int32).tolist() == [1, 2]
    assert fpsim.decode(codes, "e4m3").dtype == torch.float64
