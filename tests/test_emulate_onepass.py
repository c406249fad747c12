"""fpsim.emulation.onepass: the compiled one-pass operand quantizer gives the general path's
bits (values and limits compared as integers), and the general path runs wherever it does
not apply."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("numba")

import fpsim  # noqa: E402
from fpsim import Recipe, get_format  # noqa: E402
from fpsim.emulation import onepass, sites  # noqa: E402

FORMATS = ["e4m3", "e5m2", "e3m2", "e2m3", "e2m1"]
MODES = ["rne", "rna", "rtz", "rup", "rdown", "rto"]


def general(monkeypatch, x, fmt, recipe, axis):
    """quantize_operand with the compiled pass switched off."""
    with monkeypatch.context() as m:
        m.setattr(onepass, "tensor_scaled", lambda *a: None)
        return sites.quantize_operand(x, fmt, recipe, axis)


def same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
    ints = {torch.float32: torch.int32, torch.float64: torch.int64}[a.dtype]
    assert torch.equal(a.view(ints), b.view(ints))


def hard_values(fmt, dtype):
    """Every class where a rounding breaks: ±0, the format's largest finite value (so the
    scale is 1), every value, every midpoint (ties) and the floats either side of it, its
    subnormals, float32 subnormals, random values."""
    f = get_format(fmt)
    codes = np.arange(f.num_codes)
    vals = fpsim.decode(codes, f)
    vals = np.unique(vals[np.isfinite(vals)])
    mids = (vals[1:] + vals[:-1]) / 2
    near = np.concatenate([np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf)])
    extra = [0.0, -0.0, f.max, -f.max, 1e-45, -1e-45, 1.2e-38, f.min_normal / 3]
    rng = np.random.default_rng(0)
    data = np.concatenate([vals, mids, near.astype(np.float32), extra,
                           rng.standard_normal(300) * f.max / 4])
    t = torch.from_numpy(data).to(dtype)
    return t[: t.numel() // 8 * 8].reshape(8, -1)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_same_bits_as_general_path(monkeypatch, fmt, mode, dtype):
    recipe = Recipe(fmt, scaling="tensor", rounding=mode, name="t")
    x = hard_values(fmt, dtype)
    for axis in (-1, -2):
        assert onepass.tensor_scaled(x, get_format(fmt), mode, axis) is not None
        q, lim = sites.quantize_operand(x, fmt, recipe, axis)
        q0, lim0 = general(monkeypatch, x, fmt, recipe, axis)
        same(q, q0)
        same(lim, lim0)


@pytest.mark.parametrize("scale", [1.0, 2.0**-140, 2.0**-126, 3.0e38, 7.1])
def test_scale_extremes(monkeypatch, scale):
    """Operands so small their scale clamps to 2^-126, so large it is near float32's max, a
    tie-making scale, all zeros and signed zeros."""
    recipe = Recipe("e4m3", scaling="tensor", name="t")
    x = (torch.randn(64, 48, dtype=torch.float64) * scale).to(torch.float32)
    x[0, :4] = torch.tensor([0.0, -0.0, 3.4028234663852886e38 if scale > 1e30 else 0.0, -0.0])
    for t in (x, torch.zeros(4, 4), -torch.zeros(4, 4)):
        q, lim = sites.quantize_operand(t, "e4m3", recipe, -1)
        q0, lim0 = general(monkeypatch, t, "e4m3", recipe, -1)
        same(q, q0)
        same(lim, lim0)


def test_strided_and_batched_operands(monkeypatch):
    recipe = Recipe("e5m2", scaling="tensor", name="t")
    x = torch.randn(3, 40, 24).transpose(0, 2)          # not contiguous
    for axis in (-1, -2, 0):
        q, lim = sites.quantize_operand(x, "e5m2", recipe, axis)
        q0, lim0 = general(monkeypatch, x, "e5m2", recipe, axis)
        same(q, q0)
        same(lim, lim0)


@pytest.mark.parametrize("case", ["nan", "inf", "float16", "int8", "stochastic", "grad",
                                  "empty"])
def test_fallback_where_not_applicable(monkeypatch, case):
    """Where the compiled pass does not apply it returns None and quantize_operand's general
    path gives the result."""
    fmt, mode, dtype = "e4m3", "rne", torch.float32
    x = torch.randn(16, 32)
    if case == "nan":
        x[3, 4] = math.nan
    elif case == "inf":
        x[0, 0] = -math.inf
    elif case == "float16":
        dtype = torch.float16
    elif case == "int8":
        fmt = "int8"
    elif case == "stochastic":
        mode = "stochastic"
    elif case == "grad":
        x.requires_grad_(True)
    elif case == "empty":
        x = torch.zeros(0, 32)
    x = x.to(dtype) if case != "grad" else x
    assert onepass.tensor_scaled(x, get_format(fmt), mode, -1) is None
    if mode in ("stochastic",):
        return
    recipe = Recipe(fmt, scaling="tensor", rounding=mode, name="t")
    with torch.no_grad():
        q, _ = sites.quantize_operand(x, fmt, recipe, -1)
        q0, _ = general(monkeypatch, x, fmt, recipe, -1)
    assert torch.equal(q.isnan(), q0.isnan())
    assert torch.equal(torch.nan_to_num(q), torch.nan_to_num(q0))


def test_emulated_model_same_output(monkeypatch):
    """A small MLP under per-tensor E4M3 operands: the same output bits with and without the
    compiled pass, for both sum kinds."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(48, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    x = torch.randn(5, 48)
    for sums in ("fp64", "host"):
        recipe = Recipe("e4m3", scaling="tensor", native_sums=sums, name="t")
        with torch.no_grad(), fpsim.emulate(recipe):
            y = model(x)
        with monkeypatch.context() as m, torch.no_grad():
            m.setattr(onepass, "tensor_scaled", lambda *a: None)
            with fpsim.emulate(recipe):
                y0 = model(x)
        assert torch.equal(y.view(torch.int32), y0.view(torch.int32))


BLOCK_FORMATS = ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp4", "mxint8", "nvfp4"]


def block_input(dtype):
    """Blocks holding NaN, ±inf, ±0, float32 subnormals, the largest float32, an all-zero block,
    and a last axis (70) that ends in a short block."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 70, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(
        -40, 38, (3, 5, 1), generator=g)
    x = x.to(dtype)
    x[0, 0, :6] = torch.tensor([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-45])
    x[0, 1, :] = 0.0
    x[0, 2, 64:] = torch.tensor([3.4e38, -3.4e38, 1e-40, -1e-40, 2.0**-149, 0.5])
    return x


@pytest.mark.parametrize("fmt", BLOCK_FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_block_values_same_bits(fmt, dtype):
    x = block_input(dtype)
    arr = fpsim.mx.quantize(x, fmt, axis=-1)
    got = onepass.block_values(arr, dtype)
    assert got is not None
    same(got, arr.dequantize(dtype))


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "nvfp4"])
def test_block_operand_same_bits(monkeypatch, fmt):
    """quantize_operand with block scaling: the same values with and without the compiled pass,
    and the same limits (counted events need them)."""
    recipe = Recipe(fmt, scaling="block", name="t")
    x = block_input(torch.float32)
    for axis in (-1, -2):
        q, lim = sites.quantize_operand(x, fmt, recipe, axis)
        with monkeypatch.context() as m:
            m.setattr(onepass, "block_values", lambda *a: None)
            q0, lim0 = sites.quantize_operand(x, fmt, recipe, axis)
        same(q, q0)
        same(lim, lim0)
        q1, none = sites.quantize_operand(x, fmt, recipe, axis, with_limit=False)
        same(q1, q0)
        assert none is None


def test_block_values_fallback():
    """Blocks along another axis, float16 output, empty operands: None (mx.dequantize runs)."""
    x = torch.randn(64, 8)
    assert onepass.block_values(fpsim.mx.quantize(x, "mxfp8_e4m3", axis=0), torch.float32) is None
    arr = fpsim.mx.quantize(x, "mxfp8_e4m3", axis=-1)
    assert onepass.block_values(arr, torch.float16) is None
    empty = fpsim.mx.quantize(torch.zeros(0, 32), "mxfp8_e4m3", axis=-1)
    assert onepass.block_values(empty, torch.float32) is None
    npa = fpsim.mx.quantize(x.numpy(), "mxfp8_e4m3", axis=-1)
    assert onepass.block_values(npa, torch.float32) is None


def test_block_model_same_output(monkeypatch):
    """A small MLP under MXFP8 and NVFP4 blocks: the same output bits with and without the
    compiled pass."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 8))
    x = torch.randn(5, 64)
    for fmt in ("mxfp8_e4m3", "nvfp4"):
        recipe = Recipe(fmt, scaling="block", name="t")
        with torch.no_grad(), fpsim.emulate(recipe):
            y = model(x)
        with monkeypatch.context() as m, torch.no_grad():
            m.setattr(onepass, "block_values", lambda *a: None)
            m.setattr(onepass, "mx_values", lambda *a: None)
            with fpsim.emulate(recipe):
                y0 = model(x)
        assert torch.equal(y.view(torch.int32), y0.view(torch.int32))


MX_FLOATS = ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4"]


@pytest.mark.parametrize("fmt, mode", [(f, m) for f in MX_FLOATS
                                        for m in ("floor", "ceil", "even", "ceil_amax")]
                         + [("nvfp4", None)])
@pytest.mark.parametrize("rounding", ["rne", "rna", "rtz"])
def test_mx_values_same_bits(fmt, mode, rounding):
    """The compiled block quantize-and-dequantize against mx.quantize then dequantize, on blocks
    with NaN, ±inf, ±0, subnormals, the largest floats, all zeros, a short last block, ties
    (every element code's value and midpoint next to the element format's largest value: a
    scale of 2^0 in MX)."""
    elem = fpsim.mx.get_block_format(fmt).elem
    vals = fpsim.decode(np.arange(elem.num_codes), elem)
    vals = np.unique(vals[np.isfinite(vals)])
    ties = np.concatenate([vals, (vals[1:] + vals[:-1]) / 2])
    ties = np.concatenate([ties, np.zeros(-ties.size % 31)]).reshape(-1, 31)
    ties = np.concatenate([np.full((ties.shape[0], 1), elem.max), ties], axis=1)  # scale 2^0
    for x in (block_input(torch.float32), torch.from_numpy(ties).float()):
        arr = fpsim.mx.quantize(x, fmt, axis=-1, scale_rounding=mode, rounding=rounding)
        got = onepass.mx_values(x, fmt, mode, rounding)
        same(got, arr.dequantize(torch.float32))


@pytest.mark.parametrize("case", ["mxint8", "float64", "rup", "stochastic", "empty", "grad"])
def test_mx_values_fallback(monkeypatch, case):
    """Where the compiled MX pass does not apply: None, and quantize_operand's general path
    (mx.quantize, then dequantize) gives the values."""
    fmt, rounding, x = "mxfp8_e4m3", "rne", block_input(torch.float32)
    if case == "mxint8":
        fmt = case
    elif case == "float64":
        x = x.double()
    elif case in ("rup", "stochastic"):
        rounding = case
    elif case == "empty":
        x = torch.zeros(0, 64)
    elif case == "grad":
        x = torch.randn(4, 64, requires_grad=True)
    assert onepass.mx_values(x, fmt, None, rounding) is None
    if case in ("stochastic", "grad"):
        return
    recipe = Recipe(fmt, scaling="block", rounding=rounding, name="t")
    q, lim = sites.quantize_operand(x, fmt, recipe, -1, with_limit=False)
    with monkeypatch.context() as m:
        m.setattr(onepass, "block_values", lambda *a: None)
        q0, _ = sites.quantize_operand(x, fmt, recipe, -1)
    same(q, q0)
    assert lim is None


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "nvfp4"])
def test_block_operand_any_axis(monkeypatch, fmt):
    """Right operands (blocks along axis -2, as attention's K^T and V) take the compiled pass
    on the moved tensor: the general path's values and strides."""
    recipe = Recipe(fmt, scaling="block", name="t")
    x = block_input(torch.float32).transpose(-1, -2)
    for axis in (-2, -1, 0):
        q, _ = sites.quantize_operand(x, fmt, recipe, axis, with_limit=False)
        with monkeypatch.context() as m:
            m.setattr(onepass, "mx_values", lambda *a: None)
            m.setattr(onepass, "block_values", lambda *a: None)
            q0, _ = sites.quantize_operand(x, fmt, recipe, axis)
        same(q, q0)


def test_compiled_paths_are_taken(monkeypatch):
    """Under an operand-only recipe the activations never reach the general quantizers."""
    def refuse(*a, **k):
        raise AssertionError("general path taken")
    x = torch.randn(8, 64)
    with monkeypatch.context() as m:
        m.setattr(sites.mx, "quantize", refuse)
        for fmt in ("mxfp8_e4m3", "nvfp4"):
            sites.quantize_operand(x, fmt, Recipe(fmt, scaling="block", name="t"), -1,
                                   with_limit=False)
    with monkeypatch.context() as m:
        m.setattr(sites, "scaled_quantize", refuse)
        sites.quantize_operand(x, "e4m3", Recipe("e4m3", scaling="tensor", name="t"), -1)


def test_no_numba_takes_the_general_path(monkeypatch):
    """Without numba's kernels (``convert.jit_kernels()`` None) both compiled passes decline."""
    onepass._table.cache_clear()
    try:
        monkeypatch.setattr(fpsim.convert, "jit_kernels", lambda: None)
        x = torch.randn(8, 64)
        assert onepass.tensor_scaled(x, get_format("e4m3"), "rne", -1) is None
        assert onepass.mx_values(x, "mxfp8_e4m3", None, "rne") is None
        assert onepass.block_values(fpsim.mx.quantize(x, "mxfp8_e4m3"), torch.float32) is None
    finally:
        onepass._table.cache_clear()
