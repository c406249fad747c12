"""Derived properties of every named format against ../shared/formats.md and the peers' finfo."""

import math

import ml_dtypes
import numpy as np
import pytest

import fpsim
from fpsim import get_format

P = math.ldexp
# name: (e, m, bias, has inf, NaN convention, max, min normal, min subnormal) as in formats.md
TABLE = {
    "fp64": (11, 52, 1023, True, "ieee", (2 - P(1, -52)) * P(1, 1023), P(1, -1022), P(1, -1074)),
    "fp32": (8, 23, 127, True, "ieee", (2 - P(1, -23)) * P(1, 127), P(1, -126), P(1, -149)),
    "tf32": (8, 10, 127, True, "ieee", (2 - P(1, -10)) * P(1, 127), P(1, -126), P(1, -136)),
    "bf16": (8, 7, 127, True, "ieee", (2 - P(1, -7)) * P(1, 127), P(1, -126), P(1, -133)),
    "fp16": (5, 10, 15, True, "ieee", 65504.0, P(1, -14), P(1, -24)),
    "fp8_e4m3fn": (4, 3, 7, False, "fn", 448.0, P(1, -6), P(1, -9)),
    "fp8_e5m2": (5, 2, 15, True, "ieee", 57344.0, P(1, -14), P(1, -16)),
    "fp8_e4m3fnuz": (4, 3, 8, False, "fnuz", 240.0, P(1, -7), P(1, -10)),
    "fp8_e5m2fnuz": (5, 2, 16, False, "fnuz", 57344.0, P(1, -15), P(1, -17)),
    "fp8_e4m3": (4, 3, 7, True, "ieee", 240.0, P(1, -6), P(1, -9)),
    "fp8_e3m4": (3, 4, 3, True, "ieee", 15.5, P(1, -2), P(1, -6)),
    "e8m0": (8, 0, 127, False, "fn", P(1, 127), P(1, -127), P(1, -127)),
    "fp6_e2m3": (2, 3, 1, False, "none", 7.5, 1.0, 0.125),
    "fp6_e3m2": (3, 2, 3, False, "none", 28.0, 0.25, 0.0625),
    "fp4_e2m1": (2, 1, 1, False, "none", 6.0, 1.0, 0.5),
}
INTS = {"int8": (8, 127, -128), "int4": (4, 7, -8), "uint8": (8, 255, 0)}

MLD = {
    "bf16": ml_dtypes.bfloat16, "fp16": np.float16, "fp32": np.float32, "fp64": np.float64,
    "fp8_e4m3fn": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2,
    "fp8_e4m3fnuz": ml_dtypes.float8_e4m3fnuz, "fp8_e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    "fp8_e4m3b11fnuz": ml_dtypes.float8_e4m3b11fnuz, "fp8_e4m3": ml_dtypes.float8_e4m3, "fp8_e3m4": ml_dtypes.float8_e3m4,
    "e8m0": ml_dtypes.float8_e8m0fnu, "fp6_e2m3": ml_dtypes.float6_e2m3fn,
    "fp6_e3m2": ml_dtypes.float6_e3m2fn, "fp4_e2m1": ml_dtypes.float4_e2m1fn,
}


def test_registry_holds_every_named_format():
    assert set(TABLE) | set(INTS) <= set(fpsim.FORMATS)


@pytest.mark.parametrize("name", sorted(TABLE))
def test_float_properties_match_the_table(name):
    e, m, bias, inf, nan, mx, mn, sub = TABLE[name]
    f = get_format(name)
    assert (f.ebits, f.mbits, f.bias, f.inf, f.nan) == (e, m, bias, inf, nan)
    assert (f.max, f.min_normal, f.min_subnormal) == (mx, mn, sub)
    assert f.bits == e + m + (0 if name == "e8m0" else 1)
    assert f.eps == P(1, -m)
    assert f.num_codes == 2**f.bits
    assert f.emin == math.frexp(mn)[1] - 1 and f.emax == math.frexp(mx)[1] - 1
    assert f.dynamic_range == pytest.approx(math.log2(mx) - math.log2(sub), abs=1e-12)


@pytest.mark.parametrize("name", sorted(INTS))
def test_integer_properties(name):
    bits, hi, lo = INTS[name]
    f = get_format(name)
    assert (f.bits, f.max, f.min, f.is_int) == (bits, hi, lo, True)
    assert fpsim.encode(np.array([lo - 5.0, hi + 5.0]), f).tolist() == \
        [(lo) % 2**bits, hi]


@pytest.mark.parametrize("name", sorted(MLD))
def test_against_ml_dtypes_finfo(name):
    f, fi = get_format(name), ml_dtypes.finfo(MLD[name])
    assert f.max == float(fi.max)
    assert f.min_normal == float(fi.smallest_normal)
    assert f.min_subnormal == float(fi.smallest_subnormal)
    assert f.eps == float(fi.eps)
    assert f.bits == fi.bits


def test_against_torch_finfo():
    torch = pytest.importorskip("torch")
    pairs = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
             "fp8_e4m3fn": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2,
             "fp8_e4m3fnuz": torch.float8_e4m3fnuz, "fp8_e5m2fnuz": torch.float8_e5m2fnuz,
             "e8m0": torch.float8_e8m0fnu}
    for name, dt in pairs.items():
        f, fi = get_format(name), torch.finfo(dt)
        assert (f.max, f.min_normal, f.bits) == (fi.max, fi.smallest_normal, fi.bits), name
        if name != "fp8_e5m2fnuz":  # torch 2.13 reports eps 0.125 there; 2 mantissa bits give 0.25
            assert f.eps == fi.eps, name


def test_codes_of_specials():
    f = get_format("e4m3")
    assert (f.max_code, f.nan_code, f.inf_code) == (0x7E, 0x7F, None)
    f = get_format("e5m2")
    assert (f.max_code, f.nan_code, f.inf_code) == (0x7B, 0x7E, 0x7C)
    assert get_format("fp8_e4m3fnuz").nan_code == 0x80
    assert get_format("e8m0").nan_code == 0xFF and get_format("e8m0").max_code == 0xFE
    assert get_format("e2m1").nan_code is None


def test_spec_strings_and_aliases():
    assert get_format("e5m10") == get_format("fp16")
    assert get_format("e8m7") == get_format("bf16")
    assert get_format("e8m23") == get_format("fp32")
    assert get_format("e4m3fn") == get_format("fp8_e4m3fn") == get_format("E4M3")
    assert get_format("e5m2fnuz") == get_format("fp8_e5m2fnuz")
    assert get_format("float8_e8m0fnu") is fpsim.FORMATS["e8m0"]
    g = get_format("e3m3fn")
    assert (g.inf, g.nan, g.max) == (False, "fn", 28.0)  # 1.110b x 2^4
    assert get_format(fpsim.FORMATS["fp16"]) is fpsim.FORMATS["fp16"]


@pytest.mark.parametrize("bad, words", [
    ("e0m3", "exponent bit"),
    ("e12m60", "64 bits"),
    ("e1m4", "ebits >= 2"),
    ("e12m3", "exceeds float64"),
])
def test_impossible_specs_say_why(bad, words):
    with pytest.raises(ValueError, match=words):
        get_format(bad)


def test_nonsense_bias_is_refused():
    with pytest.raises(ValueError, match="float64"):
        fpsim.Format("huge", 8, 3, bias=-2000)
    with pytest.raises(ValueError, match="nan="):
        fpsim.Format("x", 4, 3, nan="weird")


def test_unknown_name_lists_known_names_and_closest():
    with pytest.raises(ValueError) as info:
        get_format("fp8_e4m3fx")
    msg = str(info.value)
    assert "Did you mean 'fp8_e4m3fn'" in msg and "Also close: fp8_e4m3, fp8_e4m3fnuz" in msg
    assert "`fpsim formats` lists them" in msg and "e8m0" not in msg    # not all ~60 names
    with pytest.raises(TypeError):
        get_format(3)


def test_core_import_needs_only_numpy():
    import subprocess
    import sys

    code = ("import sys, fpsim, fpsim.mx, fpsim.scaling, fpsim.arith, fpsim.packing; "
            "print(sorted(m for m in ('torch', 'triton', 'matplotlib', 'ml_dtypes', 'fpsim_kernels') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
