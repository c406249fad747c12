"""fpsim.as_dtype / fpsim.codes_of against ml_dtypes' and torch's own dtypes and casts, over
every code (decoding) and every float16 and bfloat16 value (encoding), bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

import fpsim
from fpsim.bridge import DTYPES, dtype_for, format_of

ml_dtypes = pytest.importorskip("ml_dtypes")

NUMPY_FORMATS = [k for k, (n, _) in DTYPES.items() if n and fpsim.get_format(k).bits <= 16]
TORCH_FORMATS = [k for k, (_, t) in DTYPES.items() if t and t.startswith("float8")]


def every_code(fmt) -> np.ndarray:
    return np.arange(fmt.num_codes, dtype=np.uint32).astype(
        np.uint8 if fmt.bits <= 8 else np.uint16)


def inputs() -> np.ndarray:
    """Every float16 and every bfloat16 value as float32 (NaN, inf, subnormals, ties)."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    b = (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)
    return np.concatenate([h, b])


def same_codes(got: np.ndarray, want: np.ndarray, nan: np.ndarray) -> None:
    """Codes equal everywhere; for NaN inputs both NaN (the NaN payload is each library's)."""
    ok = (got == want) | nan
    assert ok.all(), (np.flatnonzero(~ok)[:5], got[~ok][:5], want[~ok][:5])


@pytest.mark.parametrize("name", NUMPY_FORMATS)
def test_every_code_decodes_as_the_numpy_dtype_reads_it(name):
    fmt = fpsim.get_format(name)
    codes = every_code(fmt)
    viewed = codes.view(dtype_for(fmt))
    with np.errstate(invalid="ignore"):
        want = viewed.astype(np.float64)
    got = fpsim.decode(codes, fmt).astype(np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    same = np.isnan(got) | (got == want) & (np.signbit(got) == np.signbit(want))
    assert same.all(), name
    back, f = fpsim.codes_of(viewed)
    assert f == fmt and np.shares_memory(back, viewed)
    np.testing.assert_array_equal(back, codes)


@pytest.mark.parametrize("name", [n for n in NUMPY_FORMATS if not fpsim.get_format(n).is_int])
def test_as_dtype_matches_the_ml_dtypes_cast_of_every_fp16_and_bf16_value(name):
    # (integer dtypes' casts truncate and wrap, as C does: no rounding to compare with)
    fmt = fpsim.get_format(name)
    dtype = dtype_for(fmt)
    x = inputs()
    got = fpsim.as_dtype(x, fmt, on_nan="zero")
    assert got.dtype == dtype
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(dtype)
    codes_dtype = np.uint8 if dtype.itemsize == 1 else np.uint16
    same_codes(got.view(codes_dtype), want.view(codes_dtype), np.isnan(x))
    codes, f = fpsim.codes_of(got)
    assert np.shares_memory(codes, got) and f == fmt


def test_wide_numpy_formats_view_their_codes():
    x = np.array([0.1, -3.0, np.inf], np.float64)
    assert fpsim.as_dtype(x, "fp64").view(np.uint64).tolist() == x.view(np.uint64).tolist()
    assert fpsim.as_dtype(x, "fp32").tolist() == x.astype(np.float32).tolist()
    assert fpsim.codes_of(x)[0].dtype == np.uint64 and format_of(x.dtype).name == "fp64"


# -- torch -----------------------------------------------------------------------------------
torch = pytest.importorskip("torch")
#: the fpsim options that reproduce torch's own cast (see fpsim.bridge's module doc)
TORCH_CAST = {"fp8_e4m3fn": {"saturate": True}}


@pytest.mark.parametrize("name", TORCH_FORMATS)
def test_every_code_decodes_as_torch_reads_it(name):
    fmt = fpsim.get_format(name)
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    t = codes.view(dtype_for(fmt, "torch"))
    want = t.to(torch.float64).numpy()
    got = fpsim.decode(codes.numpy(), fmt)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert ((got == want) | np.isnan(got)).all()
    back, f = fpsim.codes_of(t)
    assert f == fmt and back.data_ptr() == t.data_ptr() and back.dtype == torch.uint8


@pytest.mark.parametrize("name", TORCH_FORMATS)
def test_as_dtype_matches_torchs_cast_of_every_fp16_and_bf16_value(name):
    fmt = fpsim.get_format(name)
    x = torch.from_numpy(inputs())
    got = fpsim.as_dtype(x, fmt, **TORCH_CAST.get(name, {}))
    assert got.dtype == dtype_for(fmt, "torch")
    want = x.to(got.dtype)
    skip = np.isnan(x.numpy())
    if name == "e8m0":      # torch's own rules: |x|, 0 -> 2^-127, float32 subnormals up
        skip |= ~(x.numpy() >= 2.0**-126)
        assert skip.sum() < 0.55 * len(skip)
    same_codes(got.view(torch.uint8).numpy(), want.view(torch.uint8).numpy(), skip)


def test_torchs_e8m0_cast_differs_from_ml_dtypes_where_the_module_doc_says():
    x = torch.tensor([0.0, -4.0, 2.0**-127 * 1.04])
    assert x.to(torch.float8_e8m0fnu).view(torch.uint8).tolist() == [0, 129, 1]
    assert fpsim.as_dtype(x, "e8m0").view(torch.uint8).tolist() == [255, 255, 0]
    assert x.numpy().astype(ml_dtypes.float8_e8m0fnu).view(np.uint8).tolist() == [255, 255, 0]


def test_wide_torch_formats_round_trip_their_bits():
    x = torch.tensor([0.1, -3.0, 65504.0, float("-inf")], dtype=torch.float32)
    for name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16),
                        ("fp32", torch.float32)):
        got = fpsim.as_dtype(x, name)
        assert got.dtype == dtype and torch.equal(got, x.to(dtype))
        codes, f = fpsim.codes_of(got)
        assert f.name == name and (codes >= 0).all()
        assert torch.equal(torch.from_numpy(np.asarray(fpsim.decode(codes, f))).to(dtype), got)


def test_float4_e2m1fn_x2_packs_pairs_first_in_the_low_nibble():
    x = np.linspace(-6, 6, 64, dtype=np.float32).reshape(4, 16)
    t = fpsim.as_dtype(torch.from_numpy(x), "fp4_e2m1")
    assert t.dtype == torch.float4_e2m1fn_x2 and tuple(t.shape) == (4, 8)
    elements = x.astype(ml_dtypes.float4_e2m1fn).view(np.uint8)      # ml_dtypes' own cast
    np.testing.assert_array_equal(t.view(torch.uint8).numpy().reshape(-1),
                                  fpsim.packing.pack_codes(elements.reshape(-1), 4))
    np.testing.assert_array_equal(t.view(torch.uint8).numpy()[0, 0],
                                  elements[0, 0] | elements[0, 1] << 4)
    codes, f = fpsim.codes_of(t)
    assert f.name == "fp4_e2m1" and codes.shape == (4, 16)
    np.testing.assert_array_equal(codes.numpy(), elements)
    with pytest.raises(ValueError, match="odd"):
        fpsim.as_dtype(torch.ones(3), "fp4_e2m1")


def test_formats_without_a_dtype_say_so():
    with pytest.raises(ValueError, match="no torch dtype.*numpy"):
        dtype_for("e3m4", "torch")
    with pytest.raises(ValueError, match="no numpy dtype"):
        fpsim.as_dtype(np.ones(2, np.float32), "tf32")
    with pytest.raises(ValueError, match="holds no fpsim format"):
        fpsim.codes_of(np.ones(2, np.int32))
