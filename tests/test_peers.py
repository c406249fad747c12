"""Bit-exact agreement with ml_dtypes and with torch's own casts.

Codes are compared for every non-NaN input (NaN inputs: both sides must give a NaN code, whose
payload may differ); values as bit patterns.  Inputs: every float16 and bfloat16 bit pattern,
and over 10^6 float32 values that include each midpoint and boundary of the target format.
"""

import ml_dtypes
import numpy as np
import pytest

import fpsim
from probes import all_16bit, float32_probe

MLD = {
    "bf16": ml_dtypes.bfloat16, "fp16": np.float16,
    "fp8_e4m3fn": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2,
    "fp8_e4m3fnuz": ml_dtypes.float8_e4m3fnuz, "fp8_e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    "fp8_e4m3b11fnuz": ml_dtypes.float8_e4m3b11fnuz, "fp8_e4m3": ml_dtypes.float8_e4m3, "fp8_e3m4": ml_dtypes.float8_e3m4,
    "e8m0": ml_dtypes.float8_e8m0fnu, "fp6_e2m3": ml_dtypes.float6_e2m3fn,
    "fp6_e3m2": ml_dtypes.float6_e3m2fn, "fp4_e2m1": ml_dtypes.float4_e2m1fn,
}


def _uint(a):
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _ml_dtypes_mismatch_e8m0(x):
    """ml_dtypes 0.6 rounds float32 subnormals in (2^-127, 2^-126) up; see test_reference_modes."""
    ax = np.abs(x.astype(np.float32))
    return (ax > 2.0**-127) & (ax < 2.0**-126)


def _compare_with_ml_dtypes(name, x):
    fmt, md = fpsim.get_format(name), MLD[name]
    with np.errstate(all="ignore"):
        ref = x.astype(md)
    nan_in = np.isnan(x.astype(np.float32))
    keep = ~nan_in
    if name == "e8m0":
        keep &= ~_ml_dtypes_mismatch_e8m0(x)
    codes = fpsim.encode(x, fmt, on_nan="zero")
    ref_codes = _uint(ref).astype(codes.dtype)
    bad = np.flatnonzero(keep & (codes != ref_codes))
    assert bad.size == 0, (name, x[bad[:5]], codes[bad[:5]], ref_codes[bad[:5]])
    if fmt.has_nan:
        assert np.isnan(fpsim.decode(codes[nan_in], fmt)).all()
    q = fpsim.quantize(x, fmt)
    assert q.dtype == x.dtype
    with np.errstate(all="ignore"):
        ref_q = ref.astype(x.dtype)
    same = (_uint(q) == _uint(ref_q)) | (np.isnan(q.astype(np.float32)) & np.isnan(ref_q.astype(np.float32)))
    same |= nan_in & np.isnan(q.astype(np.float32))  # fpsim keeps NaN even where the format has none
    if name == "e8m0":
        same |= _ml_dtypes_mismatch_e8m0(x)
    assert same.all(), (name, x[~same][:5], q[~same][:5], ref_q[~same][:5])


@pytest.mark.parametrize("name", sorted(MLD))
@pytest.mark.parametrize("src", [np.float16, ml_dtypes.bfloat16])
def test_every_16bit_input_matches_ml_dtypes(name, src):
    _compare_with_ml_dtypes(name, all_16bit(src))


@pytest.mark.parametrize("name", sorted(MLD))
def test_float32_probe_matches_ml_dtypes(name):
    _compare_with_ml_dtypes(name, float32_probe(name, n_random=1_000_000, seed=len(name)))


@pytest.mark.parametrize("name", sorted(MLD))
def test_decode_every_code_matches_ml_dtypes(name):
    fmt, md = fpsim.get_format(name), MLD[name]
    codes = np.arange(fmt.num_codes, dtype=np.uint32)
    with np.errstate(invalid="ignore"):
        ref = codes.astype(np.uint8 if np.dtype(md).itemsize == 1 else np.uint16).view(md).astype(np.float64)
    got = fpsim.decode(codes, fmt)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(_uint(got[~nan]), _uint(ref[~nan]))  # bit for bit, -0 included


def test_decode_of_encode_is_quantize():
    x = float32_probe("fp16", n_random=200_000)
    for name in ["fp16", "bf16", "tf32", "e4m3", "e5m2", "fp8_e4m3fnuz", "e2m3", "e2m1", "e8m0",
                 "int8", "int4", "e3m4"]:
        q = fpsim.quantize(x, name)
        d = fpsim.decode(fpsim.encode(x, name, on_nan="zero"), name, dtype=np.float32)
        fin = ~np.isnan(x)
        assert np.array_equal(_uint(q[fin]), _uint(d[fin])), name


# ---------------------------------------------------------------------------------------------
torch = pytest.importorskip("torch")
TORCH = {"bf16": (torch.bfloat16, False), "fp16": (torch.float16, False),
         "fp8_e4m3fn": (torch.float8_e4m3fn, True), "fp8_e5m2": (torch.float8_e5m2, False),
         "fp8_e4m3fnuz": (torch.float8_e4m3fnuz, False),
         "fp8_e5m2fnuz": (torch.float8_e5m2fnuz, False)}  # torch saturates e4m3fn only


def _compare_with_torch(name, x):
    tdt, sat = TORCH[name]
    fmt = fpsim.get_format(name)
    t = torch.from_numpy(x)
    ref = t.to(tdt)
    ref_codes = ref.view(torch.uint8 if fmt.bits == 8 else torch.int16).numpy().view(
        np.uint8 if fmt.bits == 8 else np.uint16)
    codes = fpsim.encode(x, fmt, saturate=sat)
    keep = ~np.isnan(x)
    bad = np.flatnonzero(keep & (codes != ref_codes))
    assert bad.size == 0, (name, x[bad[:5]], codes[bad[:5]], ref_codes[bad[:5]])
    # the torch path of fpsim gives the same codes on tensors
    tcodes = fpsim.encode(t, fmt, saturate=sat, backend="torch")
    assert np.array_equal(tcodes.numpy().astype(codes.dtype), codes)


@pytest.mark.parametrize("name", sorted(TORCH))
def test_float32_probe_matches_torch_casts(name):
    _compare_with_torch(name, float32_probe(name, n_random=300_000, seed=7))


@pytest.mark.parametrize("name", ["bf16", "fp8_e4m3fn", "fp8_e5m2"])
def test_every_float16_input_matches_torch_casts(name):
    x = all_16bit(np.float16)
    tdt, sat = TORCH[name]
    ref = torch.from_numpy(x.astype(np.float32)).to(tdt)
    got = fpsim.quantize(torch.from_numpy(x), name, saturate=sat, backend="torch")
    assert got.dtype == torch.float16
    want = ref.to(torch.float16)
    same = (got.view(torch.int16) == want.view(torch.int16)) | (torch.isnan(got) & torch.isnan(want))
    assert bool(same.all())
