"""Small calls: Python floats and NumPy scalars take quantize's and encode's scalar path (the
lookup table's index computed on the scalar's bits), small arrays the compiled table lookup once
the kernels are loaded; both give the array path's bits, NaN and signed zeros included."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import fpsim
from fpsim import convert

FORMATS = ("e4m3", "e5m2", "fp8_e4m3fn", "fp8_e4m3fnuz", "e2m1", "fp16")   # fp16: no table
MODES = ("rne", "rna", "rtz", "rup", "rdown", "rto")


def probes() -> np.ndarray:
    """float64 values at and between the edges of the small formats, specials, random bits."""
    rng = np.random.default_rng(0)
    grid = np.concatenate([fpsim.values("e4m3"), fpsim.values("e2m1"), fpsim.values("e5m2")])
    mids = (grid[1:] + grid[:-1]) / 2
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e300, 5e-324, 2.0**-9 * 1.5]
    rand = rng.integers(0, 2**64, 64, dtype=np.uint64).view(np.float64)
    x = np.concatenate([grid, mids, np.nextafter(mids, np.inf)])
    x = np.concatenate([rng.choice(x, 90, replace=False), special, rand[:16]])
    return np.concatenate([x, -x])


def same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("kind", [float, np.float32, np.float64])
@pytest.mark.parametrize("fmt", FORMATS)
def test_scalars_give_the_array_paths_bits(fmt, kind):
    with np.errstate(over="ignore"):
        xs = probes().astype(np.float32 if kind is np.float32 else np.float64)
    for mode in MODES:
        for sat in (False, True):
            kw = dict(rounding=mode, saturate=sat)
            want = fpsim.quantize(xs, fmt, **kw)
            codes = fpsim.encode(xs, fmt, on_nan="zero", **kw)
            for i, v in enumerate(xs):
                x = float(v) if kind is float else kind(v)
                got = fpsim.quantize(x, fmt, **kw)
                assert type(got) is kind
                assert same(np.array(got, want.dtype), want[i]), (fmt, mode, sat, v)
                c = fpsim.encode(x, fmt, on_nan="zero", **kw)
                assert isinstance(c, np.ndarray) and c.shape == () and same(c, codes[i])
    if fmt.startswith(("e4m3", "e5m2", "fp8")):          # tables from float32 and float64
        assert any(plan is not None for key, plan in convert._SCALAR.items()
                   if key[:2] == (kind, fmt))


def test_scalar_path_leaves_checks_to_the_general_path():
    """encode's NaN check into a format without NaN, unhashable and bad options."""
    with pytest.raises(ValueError, match="NaN"):
        fpsim.encode(float("nan"), "e2m1")
    with pytest.raises(ValueError):
        fpsim.quantize(0.5, "e4m3", rounding="nearest-ish")
    with pytest.raises(ValueError):
        fpsim.quantize(np.float32(0.5), "no_such_format")
    assert fpsim.quantize(0.1, "e4m3") == fpsim.quantize(0.1, "e4m3", seed=[1])  # unhashable


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e2m1", "bf16"])
def test_small_arrays_through_the_kernels_give_the_numpy_steps_bits(fmt, monkeypatch):
    pytest.importorskip("numba")
    convert._jit()                                       # the kernels loaded
    for dtype in (np.float32, np.float64):
        with np.errstate(over="ignore"):
            x = probes().astype(dtype)
        for mode in ("rne", "rtz", "rup"):
            fast = fpsim.quantize(x, fmt, rounding=mode), fpsim.encode(x, fmt, rounding=mode,
                                                                        on_nan="zero")
            with monkeypatch.context() as m:
                m.delitem(sys.modules, convert._KERNELS)
                slow = fpsim.quantize(x, fmt, rounding=mode), fpsim.encode(
                    x, fmt, rounding=mode, on_nan="zero")
            assert same(fast[0], slow[0]) and same(fast[1], slow[1])
