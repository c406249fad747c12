"""One rule for every name argument, one error shape, and the renamed keywords and classes."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fpsim
from fpsim import mx
from fpsim.rounding import check_mode
from fpsim.scaling import scaled_quantize

A = np.array([1.0, -2.5, 3.0])


@pytest.mark.parametrize("call, plain", [
    (lambda name: fpsim.get_format(name).name, "fp16"),
    (lambda name: mx.get_block_format(name).name, "mxfp4"),
    (check_mode, "rne"),
    (lambda name: mx.quantize(np.ones(32), "mxfp8_e4m3", scale_rounding=name).scales[0], "ceil"),
    (lambda name: fpsim.quantize(A, "e4m3", backend=name)[1], "numpy"),
    (lambda name: mx.quantize(np.ones(32), "mxfp4", backend=name).codes[0], "torch"),
    (lambda name: fpsim.matmul(A[None], A[:, None], backend=name)[0, 0], "numpy"),
])
@pytest.mark.parametrize("spelling", ["{}", " {} ", "{U}", "\t{U}\n"])
def test_white_space_and_case_are_ignored_everywhere(call, plain, spelling):
    """The same rule for formats, block formats, modes, scale rules and backends."""
    assert call(spelling.format(plain, U=plain.upper())) == call(plain)


def test_rounding_modes_are_checked_and_used_after_normalising():
    assert fpsim.quantize(2.5, "int8", rounding=" RTZ ") == 2.0
    assert fpsim.encode(np.array([1.3]), "fp4_e2m1", rounding="Rup")[0] == \
        fpsim.encode(np.array([1.3]), "fp4_e2m1", rounding="rup")[0]


@pytest.mark.parametrize("bad, kind", [("fp8_e4m3fx", "format"), ("rnee", "rounding mode"),
                                       ("mxfp5", "block format"), ("flor", "scale_rounding")])
def test_a_close_name_is_suggested(bad, kind):
    calls = {"format": fpsim.get_format, "rounding mode": check_mode,
             "block format": mx.get_block_format,
             "scale_rounding": lambda s: mx.quantize(np.ones(32), "mxfp4", scale_rounding=s)}
    with pytest.raises(ValueError, match=f"unknown {kind} '{bad}'. Did you mean") as info:
        calls[kind](bad)
    assert "Known names:" in str(info.value)


@pytest.mark.parametrize("call", [fpsim.get_format, check_mode, mx.get_block_format])
@pytest.mark.parametrize("bad", ["", "   ", "zzzzzz", "q"])
def test_no_suggestion_when_nothing_is_close(call, bad):
    with pytest.raises(ValueError) as info:
        call(bad)
    msg = str(info.value)
    assert "Did you mean" not in msg and "Known names:" in msg
    assert "uint8'?" not in msg


def test_nearest_points_to_rne_not_rtz():
    for name in ("nearest", "Nearest", "nearest_even"):
        with pytest.raises(ValueError, match="Did you mean 'rne'") as info:
            fpsim.quantize(1.0, "fp16", rounding=name)
        assert "'rtz'?" not in str(info.value)


@pytest.mark.parametrize("name", ["MXFP8", "mxfp8_e4m3", "nvfp4", " MXINT8 "])
def test_format_resolver_points_to_the_block_api(name):
    with pytest.raises(ValueError, match="block format.*fpsim.mx.quantize"):
        fpsim.get_format(name)
    with pytest.raises(ValueError, match="block format"):
        fpsim.quantize(1.0, name)


@pytest.mark.parametrize("name", ["e4m3", "fp16", "bf16", "e3m2fn"])
def test_block_resolver_points_to_the_element_api(name):
    with pytest.raises(ValueError, match="names a format.*fpsim.quantize"):
        mx.get_block_format(name)


def test_backend_errors_name_the_values_that_apply():
    with pytest.raises(ValueError, match="unknown backend 'gpu'.*auto, numpy, torch, triton"):
        fpsim.quantize(A, "e4m3", backend="gpu")
    with pytest.raises(ValueError, match="unknown backend.*auto, torch, triton"):
        mx.quantize(np.ones(32), "mxfp4", backend="numpi")
    with pytest.raises(ValueError, match="unknown backend.*auto, numpy, numba, torch, compiled"):
        fpsim.matmul(A[None], A[:, None], backend="triton")


def test_e4m3_is_the_ocp_alias_and_e4m3_ieee_the_grammar():
    assert fpsim.get_format("e4m3") == fpsim.get_format("fp8_e4m3fn")
    assert fpsim.get_format("e4m3").max == 448
    ieee = fpsim.get_format("e4m3_ieee")
    assert (ieee.max, ieee.inf, ieee.nan) == (240, True, "ieee")
    assert ieee == fpsim.get_format("E4M3-IEEE")
    assert np.array_equal(fpsim.encode(np.array([1.0, 300.0, np.inf]), ieee),
                          fpsim.encode(np.array([1.0, 300.0, np.inf]), "fp8_e4m3"))
    assert fpsim.get_format("e5m10_ieee").max == fpsim.get_format("fp16").max


def test_encode_on_nan_and_its_old_name():
    x = np.array([np.nan, 1.0])
    new = fpsim.encode(x, "fp4_e2m1", on_nan="zero")
    with pytest.warns(DeprecationWarning, match="on_nan"):
        old = fpsim.encode(x, "fp4_e2m1", nan="zero")
    assert np.array_equal(new, old)
    with pytest.raises(ValueError, match="on_nan='raise'|on_nan='zero'"):
        fpsim.encode(x, "fp4_e2m1")
    with pytest.raises(TypeError, match="unexpected keyword argument 'nann'"):
        fpsim.encode(x, "fp4_e2m1", nann="zero")


def test_matmul_engine_still_works_and_warns():
    a, b = np.ones((2, 3), np.float32), np.ones((3, 2), np.float32)
    with pytest.warns(DeprecationWarning, match="backend"):
        old = fpsim.matmul(a, b, engine="numpy", accum="bf16")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = fpsim.matmul(a, b, backend="numpy", accum="bf16")
    assert np.array_equal(old, new)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="unknown engine"):
        fpsim.matmul(a, b, engine="gpu")


def test_block_containers_have_neutral_names_and_keep_the_old_ones():
    assert mx.MXArray is mx.BlockArray and mx.MXFormat is mx.BlockFormat
    assert mx.MX_FORMATS is mx.BLOCK_FORMATS and mx.get_mx_format is mx.get_block_format
    q = mx.quantize(np.linspace(-1, 1, 64), "nvfp4")
    assert isinstance(q, mx.BlockArray) and isinstance(q.fmt, mx.MXFormat)


def test_scaled_quantize_takes_the_same_names():
    x = np.linspace(-3, 3, 16)
    a = scaled_quantize(x, " INT8 ", rounding=" RNE ")
    b = scaled_quantize(x, "int8")
    assert np.array_equal(a.codes, b.codes)
