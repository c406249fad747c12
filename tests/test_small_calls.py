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
    convert.jit_kernels()                                       # the kernels loaded
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


TABLE_FORMATS = ("fp8_e4m3fn", "fp8_e5m2", "fp8_e4m3fnuz", "fp8_e5m2fnuz", "fp8_e4m3b11fnuz",
                 "fp8_e4m3", "fp8_e3m4", "e8m0", "fp6_e2m3", "fp6_e3m2", "fp4_e2m1", "int8",
                 "int4", "uint8", "e3m7", "p3109_k8p3")


def table_plans():
    """Every lookup-table plan of these formats: (name, plan, unsigned type of its inputs)."""
    for name in TABLE_FORMATS:
        f = fpsim.get_format(name)
        for mode, sat, sub, want, wide in [(m, s, b, w, d) for m in MODES for s in (False, True)
                                           for b in (True, False) for w in ("value", "code")
                                           for d in (False, True)]:
            try:
                plan = convert.numpy_plan(f, mode, sat, sub, want, wide)
            except ValueError:
                continue
            if getattr(plan, "steps", None) is not None:
                yield name, plan, np.uint64 if wide else np.uint32


def test_table_steps_are_the_table_at_every_step_and_between(monkeypatch):
    """The steps of a lookup table (arrays of at most SMALL elements, scalars) give the table's
    own entry (NumPy steps over a long array, the kernels hidden) for every input: at each
    step's start, one below and one above, the ends of the range and random bits; as bits."""
    monkeypatch.delitem(sys.modules, convert._KERNELS, raising=False)
    rng = np.random.default_rng(1)
    seen = 0
    for name, plan, utype in table_plans():
        starts, values = plan.steps()
        top = np.iinfo(utype).max
        u = np.concatenate([starts, starts - 1, starts + 1, np.array([0, 1, top - 1, top], utype),
                            rng.integers(0, top, 4096, dtype=utype, endpoint=True)])
        assert u.size > convert.SMALL
        want = np.empty(u.size, values.dtype)
        plan(u.view(np.float64 if utype is np.uint64 else np.float32), want)
        got = values[starts.searchsorted(u, "right")]
        assert same(got, want), (name, plan)
        seen += 1
    assert seen > 500, seen


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e2m1", "e3m4", "int8", "e8m0"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_small_arrays_give_the_long_arrays_bits(fmt, dtype, monkeypatch):
    """Arrays of at most SMALL elements (binary search) against the same values in one long
    array (NumPy steps, the compiled kernels hidden), every mode, saturating or not."""
    monkeypatch.delitem(sys.modules, convert._KERNELS, raising=False)
    with np.errstate(over="ignore"):
        x = probes().astype(dtype)
    assert x.size > convert.SMALL
    for mode in MODES:
        for sat in (False, True):
            kw = dict(rounding=mode, saturate=sat)
            whole = fpsim.quantize(x, fmt, **kw), fpsim.encode(x, fmt, on_nan="zero", **kw)
            for lo in range(0, x.size, convert.SMALL):
                part = x[lo:lo + convert.SMALL]
                assert same(fpsim.quantize(part, fmt, **kw), whole[0][lo:lo + part.size])
                assert same(fpsim.encode(part, fmt, on_nan="zero", **kw),
                            whole[1][lo:lo + part.size])


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e2m1", "fp8_e4m3fnuz", "int8"])
def test_python_floats_by_value_at_every_step(fmt):
    """A Python float is placed on its step by value (zeros and NaN by bits): every float64
    step start of the format's tables, one bit below and above, both signs, against the array
    path on the same values."""
    for mode in MODES:
        for sat in (False, True):
            plan = convert.numpy_plan(fpsim.get_format(fmt), mode, sat, True, "value", True)
            starts, _ = plan.steps()
            u = np.concatenate([starts, starts - 1, starts + 1])
            x = np.concatenate([u, u ^ np.uint64(1 << 63)]).view(np.float64)
            x = x[~np.isnan(x)]
            want = fpsim.quantize(x, fmt, rounding=mode, saturate=sat)
            got = np.array([fpsim.quantize(float(v), fmt, rounding=mode, saturate=sat)
                            for v in x])
            assert same(got, want), (fmt, mode, sat)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_small_arrays_keep_shape_strides_and_dtype(dtype):
    """The shortest path (at most SMALL elements): 2-D, strided and 0-d inputs give what the
    long array gives at the same positions, as new arrays of the input's shape and dtype."""
    with np.errstate(over="ignore"):
        x = probes().astype(dtype)[:128].reshape(8, 16)
    whole = fpsim.quantize(x, "e4m3"), fpsim.encode(x, "e4m3", on_nan="zero")
    for pick in (np.s_[:2], np.s_[:, ::4], np.s_[1:7:3, 2:12:2], np.s_[3, 5, ...]):
        part = x[pick]
        q, c = fpsim.quantize(part, "e4m3"), fpsim.encode(part, "e4m3", on_nan="zero")
        assert type(q) is np.ndarray and q.shape == part.shape and same(q, whole[0][pick])
        assert type(c) is np.ndarray and c.shape == part.shape and same(c, whole[1][pick])
        assert not np.shares_memory(q, x)
