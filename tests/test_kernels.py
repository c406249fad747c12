"""Triton kernels against the NumPy reference: codes and values compared bit for bit.

On a machine without CUDA the kernels run in Triton's interpreter on CPU tensors (conftest sets
``TRITON_INTERPRET=1``); with CUDA the same tests run on the GPU and the CPU variants skip.
Inputs hit every edge on purpose: NaN, ±inf, ±0, source and target subnormals, every tie of
small formats, ±max and just beyond, plus random bit patterns.  Sizes stay small (a few
thousand elements a launch) because the interpreter is slow.
"""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

import fpsim

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
import fpsim_kernels as kernels  # noqa: E402  (needs torch and triton)
from fpsim import blocks  # noqa: E402
from fpsim import mx as fmx  # noqa: E402
from fpsim.packing import pack_codes, unpack_codes  # noqa: E402

pytestmark = pytest.mark.filterwarnings(    # NumPy inside the interpreter: inf/NaN on purpose
    "ignore::RuntimeWarning:triton.runtime.interpreter")
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(
        not INTERPRETED, reason="CPU tensors run kernels only in the Triton interpreter, which "
        "conftest enables only without CUDA")),
    pytest.param("cuda", marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="no CUDA device: GPU runs of the kernels skipped")),
]
MODES = ("rne", "rna", "rtz", "rup", "rdown", "rto")
UNSIGNED_E5M0 = fpsim.Format("ue5m0", 5, 0, bias=15, inf=False, nan="fn", subnormals=False,
                             signed=False, zero=False)
INT2 = fpsim.Format("int2", 0, 1, inf=False, nan="none")
FORMATS = [name for name, f in fpsim.FORMATS.items() if kernels.supports(f)] + [
    "e3m3", "e2m2", "e3m1", "e2m0fn", "e6m9fn", "e4m2fnuz", UNSIGNED_E5M0, INT2]


def _id(fmt) -> str:
    return fpsim.get_format(fmt).name


def _probe(fmt, n_random: int = 2000, seed: int = 0) -> np.ndarray:
    """Float32 inputs at every edge of ``fmt``: its values (all for small formats, else the
    extremes and a sample), midpoints, neighbours, overflow and underflow, specials, random."""
    fmt = fpsim.get_format(fmt)
    rng = np.random.default_rng(seed)
    top = fmt.num_codes >> int(fmt.signed)
    mags = np.arange(min(top, 256), dtype=np.uint64)
    if top > 1024:
        mags = np.concatenate([mags, rng.integers(256, top - 256, 256, dtype=np.uint64),
                               np.arange(top - 256, top, dtype=np.uint64)])
    elif top > 256:
        mags = np.arange(top, dtype=np.uint64)
    with np.errstate(all="ignore"):
        v = fpsim.decode(mags, fmt)
        v = np.unique(v[np.isfinite(v) & (v >= 0)])
        ulp_top = fmt.max - v[-2] if v.size > 1 else fmt.max
        edges = [fmt.max + ulp_top / 2, fmt.max + ulp_top, fmt.max * 2, fmt.min_subnormal / 2,
                 fmt.min_subnormal / 4, fmt.min_subnormal * 0.75, fmt.min_normal]
        grid = np.concatenate([v, (v[1:] + v[:-1]) / 2, edges]).astype(np.float32)
        grid = np.concatenate([grid, -grid])
        specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 3.4028235e38,
                             -3.4028235e38, 1e-45, -1e-45, 2.0**-126, 1.1754942e-38, 2.0**-140],
                            np.float32)
        parts = [grid, np.nextafter(grid, np.float32(np.inf)),
                 np.nextafter(grid, np.float32(-np.inf)), specials,
                 rng.integers(0, 2**32, n_random, dtype=np.uint64).astype(np.uint32)
                 .view(np.float32)]
    return np.concatenate(parts)


def _bits(a) -> np.ndarray:
    a = a.cpu() if isinstance(a, torch.Tensor) else a
    if isinstance(a, torch.Tensor):
        a = a.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[
            a.element_size()]).numpy()
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _same(got, want, what: str) -> None:
    got, want = _bits(got), _bits(want)
    bad = np.nonzero(got != want)[0]
    assert got.shape == want.shape and bad.size == 0, (
        f"{what}: {bad.size} mismatches, first at {bad[:5]}: got {got[bad[:5]]}, "
        f"want {want[bad[:5]]}")


def _same_codes(got, want: np.ndarray, what: str) -> None:
    """Codes compared as integers (the kernels' int32/int64 lanes hold fpsim's uint16/32)."""
    _same(got.cpu().numpy().astype(np.int64), want.astype(np.int64), what)


def _ref_codes(x: np.ndarray, fmt, **kw) -> np.ndarray:
    """fpsim's codes, packed as kernels.encode packs formats under 8 bits."""
    fmt = fpsim.get_format(fmt)
    codes = fpsim.encode(x, fmt, on_nan="zero", **kw)
    return pack_codes(codes, fmt.bits) if fmt.bits < 8 else codes


# --------------------------------------------------------------------------------------------
# Bit-exact against the reference
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS, ids=_id)
def test_float32_every_mode_matches_reference(fmt, device):
    x = _probe(fmt)
    xt = torch.from_numpy(x).to(device)
    variants = [dict(rounding=m) for m in MODES] + \
        [dict(rounding=m, saturate=True) for m in MODES] + \
        [dict(rounding=m, subnormals=False) for m in ("rne", "rdown")]
    for kw in variants:
        _same(kernels.quantize(xt, fmt, **kw), fpsim.quantize(x, fmt, **kw), f"quantize {kw}")
        _same_codes(kernels.encode(xt, fmt, on_nan="zero", **kw), _ref_codes(x, fmt, **kw),
                    f"encode {kw}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("fmt", FORMATS, ids=_id)
def test_16bit_inputs_match_reference(fmt, dtype, device):
    """16-bit floats in, same dtype out: rounded once to fmt, then to the dtype (RNE)."""
    np_dt = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[dtype]
    with np.errstate(all="ignore"):
        x = _probe(fmt, n_random=1000).astype(np_dt)
    x = np.concatenate([x, np.arange(0, 1 << 16, 16, dtype=np.uint16).view(np_dt)])
    xt = torch.from_numpy(x.view(np.int16)).view(getattr(torch, dtype)).to(device)
    for kw in (dict(rounding="rne"), dict(rounding="rup", saturate=True)):
        got = kernels.quantize(xt, fmt, **kw)
        assert got.dtype == xt.dtype
        _same(got, fpsim.quantize(x, fmt, **kw), f"quantize {kw}")
        _same_codes(kernels.encode(xt, fmt, on_nan="zero", **kw), _ref_codes(x, fmt, **kw),
                    f"encode {kw}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", FORMATS, ids=_id)
def test_decode_matches_reference(fmt, device):
    fmt = fpsim.get_format(fmt)
    rng = np.random.default_rng(1)
    codes = np.arange(min(fmt.num_codes, 1 << 16), dtype=np.uint64)
    if fmt.num_codes > codes.size:
        codes = np.concatenate([codes, rng.integers(0, fmt.num_codes, 4096, dtype=np.uint64),
                                np.arange(fmt.num_codes - 4096, fmt.num_codes, dtype=np.uint64)])
    tcodes = torch.from_numpy(codes.astype(np.int64)).to(device)
    if fmt.bits <= 8:
        tcodes = tcodes.to(torch.uint8)
    with np.errstate(all="ignore"):
        for dtype, np_dt in ((torch.float32, np.float32), (torch.float16, np.float16),
                             (torch.bfloat16, ml_dtypes.bfloat16)):
            want = fpsim.decode(codes, fmt).astype(np_dt)
            _same(kernels.decode(tcodes, fmt, dtype=dtype, packed=False), want, f"{dtype}")
    if fmt.bits < 8:
        for n in {codes.size, 1, 3, 5, 7} & set(range(codes.size + 1)):
            packed = torch.from_numpy(pack_codes(codes[:n], fmt.bits)).to(device)
            want = fpsim.decode(codes[:n], fmt, dtype=np.float32)
            _same(kernels.decode(packed, fmt, count=n), want, f"packed count={n}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["fp4_e2m1", "fp6_e3m2", "e3m3", "e2m2", "int4", "e2m0fn", INT2],
                         ids=_id)
def test_packing_matches_pack_codes_for_ragged_counts(fmt, device):
    x = _probe(fmt, n_random=100)
    x = x[~np.isnan(x)]                     # NaN stays NaN in quantize, encodes to 0 here
    for n in (1, 2, 3, 5, 7, 9, x.size):
        xt = torch.from_numpy(x[:n]).to(device)
        got = kernels.encode(xt, fmt, on_nan="zero")
        _same(got, pack_codes(fpsim.encode(x[:n], fmt, on_nan="zero"), fpsim.get_format(fmt).bits),
              f"n={n}")
        back = kernels.decode(got, fmt, count=n)
        _same(back, fpsim.quantize(x[:n], fmt), f"round trip n={n}")


# --------------------------------------------------------------------------------------------
# Stochastic rounding: properties, not bits (Philox cannot reproduce NumPy's generator)
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["fp8_e4m3fn", "fp4_e2m1", "bf16", "int8"], ids=_id)
def test_stochastic_lands_on_a_neighbour_and_is_reproducible(fmt, device):
    x = _probe(fmt)
    xt = torch.from_numpy(x).to(device)
    got = _bits(kernels.quantize(xt, fmt, rounding="stochastic", seed=7))
    down = _bits(fpsim.quantize(x, fmt, rounding="rdown"))
    up = _bits(fpsim.quantize(x, fmt, rounding="rup"))
    assert np.all((got == down) | (got == up))
    assert np.any(got != down) and np.any(got != up)
    _same(kernels.quantize(xt, fmt, rounding="stochastic", seed=7), got, "same seed")
    assert np.any(_bits(kernels.quantize(xt, fmt, rounding="stochastic", seed=8)) != got)
    codes = kernels.encode(xt, fmt, rounding="stochastic", seed=7, on_nan="zero", pack=False)
    real = ~np.isnan(x)                     # NaN stays NaN in quantize, encodes to 0 here
    _same(kernels.decode(codes, fmt, packed=False).cpu()[real], got[real],
          "encode draws the same bits as quantize")
    torch.manual_seed(3)
    a = kernels.quantize(xt, fmt, rounding="stochastic")
    torch.manual_seed(3)
    _same(kernels.quantize(xt, fmt, rounding="stochastic"), a, "torch.manual_seed")
    gen = torch.Generator().manual_seed(5)
    b = kernels.quantize(xt, fmt, rounding="stochastic", seed=gen)
    _same(kernels.quantize(xt, fmt, rounding="stochastic", seed=torch.Generator().manual_seed(5)),
          b, "torch.Generator")


@pytest.mark.parametrize("device", DEVICES)
def test_stochastic_is_unbiased(device):
    """The mean of many roundings of x is x: |mean - x| under 5 standard errors, for points at
    1/8, 1/2 and 7/8 of an ulp, in a normal binade, the subnormal range and a carry."""
    fmt = fpsim.get_format("fp8_e4m3fn")
    lows = np.array([1.0, 2.0**-8, 1.875, 2.0**-9 * 0], np.float64)
    ulps = np.array([0.125, 2.0**-9, 0.125, 2.0**-9], np.float64)
    fracs = np.array([0.125, 0.5, 0.875])
    x = (lows[:, None] + fracs[None, :] * ulps[:, None]).reshape(-1)
    n = 4096
    xt = torch.from_numpy(np.repeat(x.astype(np.float32), n)).to(device)
    q = kernels.quantize(xt, fmt, rounding="stochastic", seed=11).cpu().double().numpy()
    mean = q.reshape(-1, n).mean(axis=1)
    p = np.tile(fracs, lows.size)
    sem = np.repeat(ulps, fracs.size) * np.sqrt(p * (1 - p) / n)
    assert np.all(np.abs(mean - x) < 5 * sem), (mean - x) / sem


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", fpsim.rounding.STOCHASTIC)
@pytest.mark.parametrize("fmt", ["fp8_e4m3fn", "fp4_e2m1", "bf16", "p3109_k8p1se"], ids=_id)
def test_given_random_bits_give_fpsims_bits(fmt, mode, device):
    """The random bits as an input tensor: quantize and packed encode give fpsim's NumPy results
    bit for bit, for every stochastic variant and n = 1, 13, 28; with a seed instead, the top n
    bits of each Philox draw land on a neighbour."""
    x = _probe(fmt, n_random=500)
    xt = torch.from_numpy(x).to(device)
    rng = np.random.default_rng(5)
    for n in (1, 13, 28):
        r = rng.integers(0, 2**n, x.shape)
        kw = dict(rounding=mode, srbits=n)
        want = fpsim.quantize(x, fmt, random_bits=r, **kw)
        rt = torch.from_numpy(r).to(device)
        _same(kernels.quantize(xt, fmt, random_bits=rt, **kw), want, f"quantize n={n}")
        codes = fpsim.encode(x, fmt, random_bits=r, on_nan="zero", **kw)
        packed = kernels.encode(xt, fmt, random_bits=rt, on_nan="zero", **kw)
        _same(packed, pack_codes(codes, fpsim.get_format(fmt).bits) if
              fpsim.get_format(fmt).bits < 8 else codes, f"encode n={n}")
    got = _bits(kernels.quantize(xt, fmt, rounding=mode, srbits=3, seed=2))
    down, up = (_bits(fpsim.quantize(x, fmt, rounding=m)) for m in ("rdown", "rup"))
    assert np.all((got == down) | (got == up))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4", "nvfp4"])
def test_mx_given_random_bits_give_fpsims_bytes(fmt, device):
    x = _mx_input((8, 96), seed=6)
    r = np.random.default_rng(6).integers(0, 2**6, x.shape)
    for mode in fpsim.rounding.STOCHASTIC:
        want = fmx.quantize(x, fmt, rounding=mode, srbits=6, random_bits=r).pack()
        got = kernels.mx_quantize(torch.from_numpy(x).to(device), fmt, rounding=mode, srbits=6,
                                  random_bits=torch.from_numpy(r).to(device))
        _same(got.scales, want[0], f"{mode} scales")
        _same(got.elements, want[1], f"{mode} elements")


# --------------------------------------------------------------------------------------------
# Contract
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_nan_into_a_format_without_nan(device):
    x = torch.tensor([1.0, float("nan"), -float("nan"), 2.0], device=device)
    with pytest.raises(ValueError, match="2 NaN input"):
        kernels.encode(x, "fp4_e2m1")
    with pytest.raises(ValueError, match="nan='zero'"):
        kernels.encode(x, "int8", pack=False)
    _same(kernels.encode(x, "fp4_e2m1", on_nan="zero", pack=False),
          fpsim.encode(x.cpu().numpy(), "fp4_e2m1", on_nan="zero"), "nan='zero'")
    _same(kernels.encode(x, "fp8_e4m3fn"), fpsim.encode(x.cpu().numpy(), "fp8_e4m3fn"), "e4m3")


@pytest.mark.parametrize("device", DEVICES)
def test_shapes_dtypes_and_errors(device):
    x = torch.linspace(-3, 3, 24, device=device).reshape(2, 3, 4)
    assert kernels.quantize(x, "e4m3").shape == x.shape
    assert kernels.encode(x, "e4m3").dtype == torch.uint8
    assert kernels.encode(x, "bf16").dtype == torch.int32
    assert kernels.encode(x, "fp32").dtype == torch.int64
    assert kernels.encode(x, "fp4_e2m1").shape == (12,)
    assert kernels.encode(x, "fp6_e2m3").shape == (18,)
    assert kernels.encode(x, "fp4_e2m1", pack=False).shape == x.shape
    xt = x.transpose(0, 2)                                                # non-contiguous
    _same(kernels.quantize(xt, "e4m3"), fpsim.quantize(xt.cpu().numpy(), "e4m3"), "transposed")
    assert kernels.quantize(x[:, :0], "e4m3").numel() == 0
    with pytest.raises(NotImplementedError, match="float64"):
        kernels.quantize(x, "e8m0")
    with pytest.raises(NotImplementedError):
        kernels.encode(x, "fp64")
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        kernels.quantize(x.double(), "e4m3")
    with pytest.raises(ValueError, match="unknown rounding"):
        kernels.quantize(x, "e4m3", rounding="nearest")
    with pytest.raises(ValueError, match="count"):
        kernels.decode(kernels.encode(x, "fp4_e2m1"), "fp4_e2m1", count=25)


# --------------------------------------------------------------------------------------------
# The GPU code path, compiled ahead of time for sm_90 (no GPU needed)
# --------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_kernels_compile_for_sm90_with_wide_accesses_and_no_ftz():
    """The interpreter never runs Triton's code generator: compile every kernel variant for a
    Hopper GPU with the bundled ptxas, in a process without TRITON_INTERPRET."""
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    done = subprocess.run([sys.executable, "-m", "fpsim_kernels.ptx", "--json"], env=env,
                          capture_output=True, text=True, timeout=600,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["variant"]: r for r in json.loads(done.stdout)}
    assert all(not r["ftz"] and not r["approx_div"] and r["local_bytes"] == 0
               for r in rows.values()), rows
    for name, r in rows.items():
        if name.startswith(("quantize", "encode fp32->e4m3")):
            assert r["widest_load_bits"] == 128 and r["widest_store_bits"] == 128, r


# --------------------------------------------------------------------------------------------
# MX and NVFP4 block kernels against fpsim.mx
# --------------------------------------------------------------------------------------------
MX_NAMES = list(fmx.MX_FORMATS)


def _mx_input(shape: tuple[int, int], seed: int = 0) -> np.ndarray:
    """Blocks at every edge: a random binade per row (float32 subnormal to near max), a NaN,
    an inf, an all-zero and a subnormal-only block, exact element ties, signed zeros."""
    rng = np.random.default_rng(seed)
    rows, cols = shape
    with np.errstate(over="ignore"):
        x = (rng.standard_normal(shape) * np.exp2(rng.integers(-150, 128, (rows, 1))))
        x = x.astype(np.float32)
    x[0, 1], x[1, 3], x[2, :] = np.nan, -np.inf, 0.0
    x[3, :] = rng.integers(-(2**20), 2**20, cols).astype(np.float32) * np.float32(2.0**-149)
    x[4, :] = np.float32(1.25) * rng.choice([-1, 1], cols)          # element ties
    x[5, :] = rng.choice([0.0, -0.0, 3.4028235e38, -3.0e38, 1.5, 448.0, 480.0], cols)
    return x


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", MX_NAMES)
def test_mx_quantize_matches_fpsim_pack(fmt, device):
    spec = fmx.get_mx_format(fmt)
    scale_modes = fmx.SCALE_ROUNDINGS if spec.is_mx else (None,)
    cases = [(_mx_input((12, 64)), -1), (_mx_input((72, 7), seed=1), 0)]   # regular, ragged
    for x, axis in cases:
        xt = torch.from_numpy(x).to(device)
        for sr in scale_modes:
            for mode in MODES:
                with np.errstate(all="ignore"):
                    ref = fmx.quantize(x, fmt, axis=axis, scale_rounding=sr, rounding=mode)
                want_scales, want_elems = ref.pack()
                got = kernels.mx_quantize(xt, fmt, axis=axis, scale_rounding=sr, rounding=mode)
                what = f"axis={axis} scale={sr} {mode}"
                _same(got.scales, want_scales, f"scales {what}")
                _same(got.elements, want_elems, f"elements {what}")
                assert got.tensor_scale == ref.tensor_scale
    unpacked = kernels.mx_quantize(xt, fmt, axis=axis, pack=False).elements
    _same(unpacked, blocks.to_rows(fmx.quantize(x, fmt, axis=axis).codes, ref.layout).reshape(-1),
          "pack=False")
    if not spec.is_mx:
        got = kernels.mx_quantize(xt, fmt, axis=axis, tensor_scale=0.375)
        want = fmx.quantize(x, fmt, axis=axis, tensor_scale=0.375).pack()
        _same(got.elements, want[1], "given tensor_scale")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4", "nvfp4"])
def test_mx_16bit_inputs_match_fpsim(fmt, device):
    x = _mx_input((8, 64), seed=2)
    for np_dt, t_dt in ((np.float16, torch.float16), (ml_dtypes.bfloat16, torch.bfloat16)):
        with np.errstate(all="ignore"):
            x16 = x.astype(np_dt)
            want = fmx.quantize(x16.astype(np.float32), fmt).pack()
        got = kernels.mx_quantize(torch.from_numpy(x16.view(np.int16)).view(t_dt).to(device), fmt)
        _same(got.scales, want[0], f"{t_dt} scales")
        _same(got.elements, want[1], f"{t_dt} elements")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", MX_NAMES)
def test_mx_dequantize_matches_fpsim_on_every_byte(fmt, device):
    """Random scale and element bytes (NaN scales and NaN element codes included)."""
    spec = fmx.get_mx_format(fmt)
    rng = np.random.default_rng(3)
    shape, axis = (40, 3), 0                                         # ragged along axis 0
    lay = blocks.layout(shape, axis, spec.block_size, pad=True)
    scales = rng.integers(0, 256, lay.rows, dtype=np.uint8)
    scales[:2] = (0xFF, 0x7F) if spec.is_mx else (0x7F, 0xFF)
    codes = rng.integers(0, spec.elem.num_codes, lay.rows * lay.block_size, dtype=np.uint8)
    codes.reshape(lay.outer + (lay.padded,))[..., lay.length:] = 0   # padding, as pack writes
    elems = pack_codes(codes, spec.elem.bits)
    ts = None if spec.is_mx else 0.0078125
    with np.errstate(all="ignore"):
        want = fmx.MXArray.unpack(scales, elems, fmt, shape, axis=axis,
                                  tensor_scale=ts).dequantize()
    got = kernels.mx_dequantize(torch.from_numpy(scales).to(device),
                                torch.from_numpy(elems).to(device), fmt, shape, axis=axis,
                                tensor_scale=ts)
    _same(got, want, "dequantize")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4", "nvfp4"])
def test_mx_stochastic_rounds_to_a_neighbour(fmt, device):
    x = _mx_input((16, 64), seed=4)
    x[:2] = 1.0                                                     # no NaN/inf blocks here
    xt = torch.from_numpy(x).to(device)
    got = kernels.mx_quantize(xt, fmt, rounding="stochastic", seed=9)
    lo, hi = (fmx.quantize(x, fmt, rounding=m).pack() for m in ("rdown", "rup"))
    _same(got.scales, lo[0], "scales do not depend on the element rounding")
    bits = fmx.get_mx_format(fmt).elem.bits
    codes = [unpack_codes(b, bits, x.size) for b in (got.elements, lo[1], hi[1])]
    codes[0] = codes[0].cpu().numpy()
    assert np.all((codes[0] == codes[1]) | (codes[0] == codes[2]))
    assert np.any(codes[0] != codes[1]) and np.any(codes[0] != codes[2])
    _same(kernels.mx_quantize(xt, fmt, rounding="stochastic", seed=9).elements, got.elements,
          "same seed")


@pytest.mark.parametrize("device", DEVICES)
def test_mx_errors(device):
    x = torch.ones(4, 48, device=device)
    with pytest.raises(NotImplementedError, match="power of two"):
        kernels.mx_quantize(x, "mxfp8_e4m3", block_size=24)
    with pytest.raises(TypeError):
        kernels.mx_quantize(x.double(), "mxfp8_e4m3")
    with pytest.raises(ValueError, match="scale_rounding"):
        kernels.mx_quantize(x, "nvfp4", scale_rounding="floor")
    with pytest.raises(ValueError, match="tensor_scale"):
        kernels.mx_dequantize(torch.zeros(12, dtype=torch.uint8, device=device),
                              torch.zeros(96, dtype=torch.uint8, device=device), "nvfp4", (4, 48))


@pytest.mark.parametrize("device", DEVICES)
def test_mx_dequantize_refuses_bytes_of_another_layout(device):
    """As ``MXArray.unpack``: the exact byte count, and zero padding codes (bytes packed from
    (2, 32) read as (2, 31) would silently drop a column)."""
    x = np.linspace(-2, 2, 64, dtype=np.float32).reshape(2, 32)
    scales, elems = (torch.from_numpy(np.asarray(b)).to(device)
                     for b in fmx.quantize(x, "mxfp8_e4m3").pack())
    ok = kernels.mx_dequantize(scales, elems, "mxfp8_e4m3", (2, 32))
    assert torch.equal(ok.cpu(), torch.from_numpy(fmx.quantize(x, "mxfp8_e4m3").dequantize()))
    with pytest.raises(ValueError, match="padding of shape"):
        kernels.mx_dequantize(scales, elems, "mxfp8_e4m3", (2, 31))
    with pytest.raises(ValueError, match="65 element bytes given"):
        kernels.mx_dequantize(scales, torch.cat([elems, elems[:1]]), "mxfp8_e4m3", (2, 32))
    with pytest.raises(ValueError, match="3 scale bytes given"):
        kernels.mx_dequantize(torch.cat([scales, scales[:1]]), elems, "mxfp8_e4m3", (2, 32))


# --------------------------------------------------------------------------------------------
# fpsim.quantize / fpsim.encode hand tensors to the kernels
# --------------------------------------------------------------------------------------------
def test_cuda_tensors_route_to_the_kernels_where_they_apply():
    from types import SimpleNamespace

    from fpsim.dispatch import route as _torch_backend

    def tensor(dev: str = "cuda", dtype=torch.float32):
        return SimpleNamespace(device=SimpleNamespace(type=dev), dtype=dtype)

    e4m3 = fpsim.get_format("e4m3")
    assert _torch_backend(tensor(), "auto", e4m3) == "triton"
    assert _torch_backend(tensor(dtype=torch.bfloat16), "auto", e4m3, seed=3) == "triton"
    assert _torch_backend(tensor(), "auto", e4m3, seed=torch.Generator()) == "triton"
    assert _torch_backend(tensor(), "auto", fpsim.get_format("e8m0")) == "torch"  # float64 path
    assert _torch_backend(tensor(dtype=torch.float64), "auto", e4m3) == "torch"
    assert _torch_backend(tensor(), "auto", e4m3, seed=np.random.default_rng(0)) == "torch"
    assert _torch_backend(tensor(), "torch", e4m3) == "torch"                     # the switch
    assert _torch_backend(tensor("cpu"), "auto", e4m3) == "numpy"


@pytest.mark.parametrize("device", DEVICES)
def test_fpsim_entry_points_run_the_kernels(device):
    x = _probe("fp8_e4m3fn", n_random=500)
    xt = torch.from_numpy(x).to(device)
    backend = "auto" if device == "cuda" else "triton"
    _same(fpsim.quantize(xt, "e4m3", backend=backend), fpsim.quantize(x, "e4m3"), "quantize")
    _same(fpsim.quantize(xt, "e4m3", saturate=True, rounding="rup", backend=backend),
          fpsim.quantize(x, "e4m3", saturate=True, rounding="rup"), "quantize rup")
    for fmt in ("e4m3", "fp4_e2m1", "bf16"):
        got = fpsim.encode(xt, fmt, on_nan="zero", backend=backend)
        assert got.shape == xt.shape and got.device == xt.device
        _same_codes(got, fpsim.encode(x, fmt, on_nan="zero"), f"encode {fmt}")
    with pytest.raises(ValueError, match="NaN input"):
        fpsim.encode(xt, "fp4_e2m1", backend=backend)
    q = fpsim.quantize(xt, "e4m3", rounding="stochastic", seed=1, backend=backend)
    _same(fpsim.quantize(xt, "e4m3", rounding="stochastic", seed=1, backend=backend), q, "seed")


@pytest.mark.skipif(not INTERPRETED, reason="the dry run uses the Triton interpreter on CPU")
def test_benchmark_script_dry_run(tmp_path):
    """benchmarks/kernels_bench.py needs a GPU to measure; its dry run checks every row."""
    import json
    import runpy

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "benchmarks", "kernels_bench.py")
    runpy.run_path(path, run_name="kernels_bench")["main"](
        ["--dry-run", "--out-dir", str(tmp_path)])
    rows = json.loads((tmp_path / "kernels_dry_run.json").read_text())["rows"]
    assert len(rows) >= 20 and not [r for r in rows if "error" in r]
    assert {"copy", "torch", "kernels", "mx", "fusion", "shape"} == {r["group"] for r in rows}
    eager = next(r for r in rows if "eager" in r["row"])
    kernel = next(r for r in rows if r["row"] == "fake-quant e4m3: Triton kernel")
    assert eager["bytes_moved"] > 10 * kernel["bytes_moved"]    # what fusion saves
    assert (tmp_path / "kernels_dry_run.md").read_text().startswith("# Triton cast kernels")
