"""The compiled (Numba) matmul engine gives the NumPy engine's bits, NaN and signed zeros
included, for every order, mode and accumulator it covers; what it does not cover falls back.
"""

from __future__ import annotations

import json
import math
import warnings
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("numba", reason="the compiled engine needs numba (pip install fpsim[fast])")

import fpsim  # noqa: E402
from fpsim import Format, get_format  # noqa: E402
from fpsim.arith import TENSOR_CORES, compiled, jit  # noqa: E402

ORDERS = ("sequential", "fma", "chunked", "pairwise")
MODES = ("rne", "rna", "rtz", "rup", "rdown", "rto")
ACCUMS = ("fp16", "bf16", "fp32", "tf32", "fp8_e4m3fn", "fp8_e5m2", "fp8_e4m3fnuz",
          "fp8_e4m3", "fp6_e3m2")


def codes(x: np.ndarray) -> np.ndarray:
    """The bit patterns of a float32/float64 result (NaN payloads and signs included)."""
    x = np.asarray(x)
    return x.view(np.uint32 if x.dtype == np.float32 else np.uint64)


def assert_same(a, b, nan_sign: bool = True, **kw) -> np.ndarray:
    """backend="numba" and backend="numpy" give the same codes; returns the result.

    ``nan_sign=False`` where two NaNs of opposite signs can meet in a sum: IEEE 754 leaves the
    sign of such a NaN open, and NumPy's own loops pick either (its strided and contiguous
    loops differ, so the NumPy engine's answer depends on the tile's shape)."""
    got = fpsim.matmul(a, b, backend="numba", **kw)
    want = fpsim.matmul(a, b, backend="numpy", **kw)
    same_codes(got, want, nan_sign)
    return got


def same_codes(got: np.ndarray, want: np.ndarray, nan_sign: bool = True) -> None:
    """The same dtype, shape and codes (with ``nan_sign=False``: NaNs of either sign alike)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    cg, cw = codes(got), codes(want)
    if not nan_sign:
        top = cg.dtype.type(1 << (8 * cg.itemsize - 1))
        both = np.isnan(got) & np.isnan(want)
        cg, cw = np.where(both, cg & ~top, cg), np.where(both, cw & ~top, cw)
    bad = cg != cw
    assert not bad.any(), (f"{int(bad.sum())} of {bad.size} differ, e.g. "
                           f"{got[bad][:4]} vs {want[bad][:4]}")


@pytest.fixture(params=["binary16 unit", "float64 kernels"])
def unit(request, monkeypatch):
    """Run a test on the kernels this host takes for binary16 sums (its binary16 unit where
    ``compiled.native_half`` says so) and on the float64 kernels every other host runs."""
    if request.param == "float64 kernels":
        monkeypatch.setattr(compiled, "native_half", lambda: False)
    return request.param


def operands(fmt: str, shape: tuple, rng: np.random.Generator, spread: int = 6) -> np.ndarray:
    """Values of ``fmt`` over ``2*spread`` binades, as float64."""
    x = rng.standard_normal(shape) * 2.0 ** rng.integers(-spread, spread, shape)
    return fpsim.quantize(x, fmt)


# ----------------------------------------------------------------------------------------------
# random operands: every order, accumulator and mode
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("accum", ACCUMS)
@pytest.mark.usefixtures("unit")
def test_random_operands_every_mode(order, accum):
    rng = np.random.default_rng(sum(map(ord, order + accum)))
    inputs = "fp16" if get_format(accum).mbits >= 7 else "fp8_e4m3fn"
    a = operands(inputs, (7, 37), rng)
    b = operands(inputs, (37, 9), rng)
    for mode in MODES:
        assert_same(a, b, accum=accum, order=order, rounding=mode,
                    chunk=8 if order == "chunked" else None)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("order", ["sequential", "pairwise", "chunked"])
@pytest.mark.usefixtures("unit")
def test_narrow_dtypes_as_operands(dtype, order):
    """fp16/bf16/fp8 arrays go in as they are (ml_dtypes for the narrow ones)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    dt = np.dtype(getattr(ml_dtypes, dtype, None) or dtype)
    rng = np.random.default_rng(5)
    a = rng.standard_normal((16, 100)).astype(dt)
    b = (rng.standard_normal((100, 12)) * 0.1).astype(dt)
    for accum in ("fp16", "bf16", "fp32"):
        assert_same(a, b, accum=accum, order=order)


def test_kernels_ask_llvm_for_the_widest_vectors():
    """``_wide`` puts the attribute in the kernel's IR (llvmlite might stop taking it: the
    kernels would compile, only slower), and every compiled kernel with a loop calls it."""
    import inspect

    from numba import njit

    kern = compiled.kernels()

    @njit(cache=False)
    def doubled(x):  # noqa: ANN001, ANN202
        kern._wide()
        for i in range(x.size):
            x[i] = x[i] * 2.0

    x = np.arange(4.0)
    doubled(x)
    assert np.array_equal(x, [0.0, 2.0, 4.0, 6.0])
    ir = "".join(doubled.inspect_llvm().values())
    assert kern.WIDE in ir
    loops = [name for name, f in vars(kern).items()
             if hasattr(f, "py_func") and not f.targetoptions.get("inline") == "always"
             and " for " in inspect.getsource(f.py_func)]
    assert len(loops) >= 10
    missing = [n for n in loops if "_wide()" not in inspect.getsource(vars(kern)[n].py_func)]
    assert not missing, missing


@pytest.mark.usefixtures("unit")
def test_benchmark_shape_fp16():
    """The benchmark's case, fp16 operands and accumulator, at a GPT-2 width."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((20, 768)).astype(np.float16)
    b = (rng.standard_normal((768, 96)) * 0.02).astype(np.float16)
    for order in ("sequential", "chunked", "pairwise"):
        assert_same(a, b, accum="fp16", order=order)


# ----------------------------------------------------------------------------------------------
# rounding itself: K = 1 products x * 1 are the accumulator's rounding of x
# ----------------------------------------------------------------------------------------------
def finite_values(fmt: Format) -> np.ndarray:
    """Every finite value of ``fmt``; for formats beyond 16 bits a random sample over all of
    their binades (subnormals included) with the two largest values."""
    if fmt.bits <= 16:
        return fpsim.values(fmt)
    u = np.random.default_rng(0).integers(0, 2**31, 20000).astype(np.uint32).view(np.float32)
    u = fpsim.quantize(u[np.isfinite(u)].astype(np.float64), fmt, rounding="rtz")
    top = [fmt.max - 2.0 ** (fmt.emax - fmt.mbits), fmt.max, 0.0]
    return np.unique(np.concatenate([u[np.isfinite(u)], top]))


def boundaries(fmt: Format) -> np.ndarray:
    """Float64 values at and next to (one 51-bit ulp) every rounding boundary of ``fmt``
    (midpoints, values, the overflow threshold), both signs, with zeros, infinities, NaNs and
    float64 subnormals of both signs."""
    v = finite_values(fmt)
    v = v[v >= 0]
    top = np.concatenate([v, [fmt.max + (fmt.max - v[-2])]])
    pts = np.concatenate([v, (top[1:] + top[:-1]) / 2, [2 * fmt.max, 1e300]])
    lanes = Format("lanes", 11, 50)                  # x * 1.0 must be exact in float64
    up = fpsim.quantize(np.nextafter(pts, np.inf), lanes, rounding="rup")
    down = fpsim.quantize(np.nextafter(pts, -np.inf), lanes, rounding="rdown")
    x = np.concatenate([pts, up, down, [np.inf, np.nan, 2.0**-1070, 1e-310]])
    return np.concatenate([x, -x])


NOSUB = Format("e5m10_nosub", 5, 10, subnormals=False)


@pytest.mark.parametrize("accum", ACCUMS + ("fp8_e5m2fnuz", "fp4_e2m1", NOSUB))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("specials", [False, True])
def test_rounding_at_every_boundary_equals_quantize(accum, mode, specials):
    """A 1-term sum is the accumulator's rounding of the product: numba against NumPy and
    against fpsim.quantize, on each boundary of the format and next to it.  ``specials``: with
    inf and NaN operands (the kernels' path for NaNs that may meet: every mode's integer
    rounding), else finite ones (nearest even by the magic constant)."""
    fmt = get_format(accum)
    x = boundaries(fmt)
    if not specials:
        x = x[np.isfinite(x)]
    if fmt.mbits >= 10:                                  # keep the NumPy engine's time short
        x = x[np.random.default_rng(0).permutation(len(x))[:4000]]
    a, b = x[:, None], np.ones((1, 1))
    got = assert_same(a, b, accum=accum, rounding=mode)
    want = fpsim.quantize(x, fmt, rounding=mode)
    got = got[:, 0].astype(np.float64)
    nan = np.isnan(want)          # (rdown's -((-0) - y) flips a NaN's sign: both engines do)
    assert np.array_equal(nan, np.isnan(got))
    assert np.array_equal(codes(got[~nan]), codes(want[~nan]))


def test_accumulator_without_subnormals():
    """An accumulator that flushes subnormal results to zero (the integer rounding path)."""
    fmt = Format("e5m10_nosub", 5, 10, subnormals=False)
    rng = np.random.default_rng(2)
    a = operands("fp16", (6, 40), rng, spread=12)
    b = operands("fp16", (40, 7), rng, spread=12)
    for mode in ("rne", "rtz", "rdown"):
        assert_same(a, b, accum=fmt, rounding=mode)


# ----------------------------------------------------------------------------------------------
# adversarial sums
# ----------------------------------------------------------------------------------------------
def boundary_sums(fmt: Format, sig: int) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (x, y): x a value of ``fmt``, y of ``sig`` significant bits bringing x + y onto,
    or 1-2 units of y's last bit from, the midpoints next to x (above max: the overflow
    threshold)."""
    v = finite_values(fmt)
    v = np.unique(np.concatenate([v, -v]))

    def spacing(z: np.ndarray) -> np.ndarray:
        e = np.floor(np.log2(np.where(z == 0, 1.0, np.abs(z))))
        return 2.0 ** (np.maximum(e, fmt.emin) - fmt.mbits)

    lanes = Format("lanes", 11, sig - 1)
    xs, ys = [], []
    for mu in (v + spacing(np.nextafter(v, np.inf)) / 2, v - spacing(np.nextafter(v, -np.inf)) / 2):
        y = fpsim.quantize(mu - v, lanes)
        for k in (-2, -1, 0, 1, 2):
            xs.append(v)
            ys.append(y + k * np.where(y == 0, 2.0**-60, np.abs(y) * 2.0**(1 - sig)))
    return np.concatenate(xs), fpsim.quantize(np.concatenate(ys), lanes)


@pytest.mark.parametrize("accum, sig", [("fp16", 21), ("fp16", 40), ("fp16", 42), ("fp16", 43),
                                        ("fp16", 44), ("bf16", 24),
                                        ("fp8_e4m3fn", 30), ("fp32", 40)])
@pytest.mark.parametrize("order", ["sequential", "pairwise"])
def test_sums_landing_on_every_midpoint(accum, sig, order):
    """x + 1 * y with float64's sum on (or next to) each midpoint: the one-rounding path
    (sig <= 51 - mbits for FP16), the round-to-odd path beyond it and for wide formats."""
    fmt = get_format(accum)
    x, y = boundary_sums(fmt, sig)
    keep = np.random.default_rng(1).permutation(len(x))[:3000]
    a = np.stack([x[keep], y[keep]], axis=1)
    b = np.ones((2, 1))
    for mode in ("rne", "rna", "rup", "rdown"):
        assert_same(a, b, accum=accum, order=order, rounding=mode)


@pytest.mark.usefixtures("unit")
def test_subnormal_partial_sums_overflow_and_cancellation():
    """Partial sums through the subnormal range, sums overflowing (inf; NaN in E4M3FN) and
    later terms that would cancel them back."""
    rng = np.random.default_rng(4)
    tiny = fpsim.quantize(rng.standard_normal((8, 64)) * 2.0**-14, "fp16")
    ones = np.where(rng.random((64, 5)) < 0.5, 1.0, -1.0) * 2.0**-10
    big = np.full((3, 64), 240.0)
    big[1, 32:] = -240.0
    big[2, ::2] = -big[2, ::2]
    for accum in ("fp16", "bf16", "fp8_e4m3fn", "fp8_e5m2", "fp8_e4m3"):
        for order in ("sequential", "pairwise", "chunked"):
            for mode in ("rne", "rtz", "rup", "rdown"):
                assert_same(tiny, ones, accum=accum, order=order, rounding=mode)
                assert_same(big, np.abs(ones) * 2.0**10, accum=accum, order=order,
                            rounding=mode, nan_sign=order != "pairwise")


@pytest.mark.parametrize("accum", ["fp16", "bf16", "fp8_e5m2", "fp8_e4m3", "fp32"])
@pytest.mark.usefixtures("unit")
def test_sums_near_the_largest_value_round_as_without_the_bound(accum):
    """Where ``jit.bounded`` bounds every partial sum by the format's largest value, the
    kernels round without clamp and overflow test (``_nearest_within``): sums of same-signed
    products swept across that bound (both sides taken), a start C beyond it and sums of
    either sign; the NumPy engine's bits, and its largest partial sum under the bound
    whenever the bound holds."""
    fmt = get_format(accum)
    rng = np.random.default_rng(7)
    K = 48
    a0 = np.abs(fpsim.quantize(rng.standard_normal((8, K)), "fp8_e4m3")) + 0.5
    b0 = np.abs(fpsim.quantize(rng.standard_normal((K, 6)), "fp8_e4m3")) + 0.5
    top = fmt.max / (np.abs(a0).sum(axis=1).max() * np.abs(b0).max())
    seen = set()
    for shift in range(-12, 4):                 # the bound's margin: up to 2^9 in FP8
        scale = 2.0 ** (math.floor(math.log2(top)) + shift)
        a = fpsim.quantize(a0 * scale, "fp32").astype(np.float64)
        for b in (b0, b0 * np.where(rng.random(b0.shape) < 0.5, -1, 1)):
            for order, chunk in (("sequential", None), ("pairwise", None), ("chunked", 16)):
                within = jit.bounded(fmt, a[None], b[None], None, chunk or K)
                seen.add(within)
                kw = dict(accum=accum, order=order, chunk=chunk)
                assert_same(a, b, **kw)
                if within and order != "pairwise":
                    stats = fpsim.matmul(a, b, backend="numpy", return_stats=True, **kw)[1]
                    assert np.nanmax(stats.max_partial) <= fmt.max
    assert seen == {True, False}
    c = np.full((8, 6), fmt.max)
    small = next(x for shift in range(-2, -20, -1)
                 if jit.bounded(fmt, (x := a0 * 2.0 ** (math.floor(math.log2(top)) + shift))[None],
                                 b0[None], None, K))
    assert not jit.bounded(fmt, small[None], b0[None], c[None], K)
    for order, chunk in (("sequential", None), ("pairwise", None), ("chunked", 16)):
        assert_same(small, b0, c=c, accum=accum, order=order, chunk=chunk)


@pytest.mark.parametrize("accum", ["fp8_e5m2", "fp16"])
def test_pairwise_tree_shape_for_every_k(accum):
    """K = 1..70 on sums whose value depends on the order of the additions (large and small
    terms, truncation): the stack-built tree is the level-by-level one for every K."""
    rng = np.random.default_rng(11)
    for k in range(1, 71):
        a = operands("fp8_e5m2", (4, k), rng, spread=8)
        b = operands("fp8_e5m2", (k, 3), rng, spread=8)
        for mode in ("rtz", "rne"):
            assert_same(a, b, accum=accum, order="pairwise", rounding=mode)


def test_pairwise_sum_of_two_products_spanning_55_bits():
    """x + y with x = u * w of 53 bits just below 2 and y = 2^-53 (products spanning 55 bits,
    2^-53..2^1): float64's sum is a tie that rounds up, the exact sum lies 3/8 of a spacing
    of a 51-bit accumulator above a value; rounded once it stays there (ties away too)."""
    u, w = (2.0**27 - 1) * 2.0**-26, (2.0**26 - 1) * 2.0**-26
    a, b = np.array([[u, 2.0**-27]]), np.array([[w], [2.0**-26]])
    acc = Format("e8m50", 8, 50)
    exact = Fraction(u) * Fraction(w) + Fraction(2) ** -53
    for mode in ("rna", "rne"):
        got = assert_same(a, b, accum=acc, order="pairwise", rounding=mode)
        assert Fraction(float(got[0, 0])) == exact - Fraction(3, 8) * Fraction(2) ** -50
        assert float(got[0, 0]) != fpsim.quantize(u * w + 2.0**-53, acc, rounding="rna")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("order", ORDERS)
def test_signed_zeros(mode, order):
    """Every sign combination of zero products and cancelling sums: +0 by IEEE 754 §6.3, -0
    when both addends are -0, the opposite under rdown."""
    z = np.array([0.0, -0.0, 1.0, -1.0])
    rows = np.array(np.meshgrid(z, z, z, indexing="ij")).reshape(3, -1).T      # (64, 3)
    cols = np.array([[1.0, -1.0, 0.0, -0.0]] * 3)
    out = assert_same(rows, cols, accum="fp16", order=order, rounding=mode)
    assert (out == 0).any() and np.signbit(out[out == 0]).any()


@pytest.mark.parametrize("order", ORDERS)
def test_nan_and_inf_inputs_of_both_signs(order):
    """NaN and inf operands of either sign, NaN times NaN, inf * 0, inf - inf: the NumPy
    engine's NaN signs (the first operand's NaN wins on x86)."""
    rng = np.random.default_rng(6)
    a = operands("fp16", (12, 10), rng)
    b = operands("fp16", (10, 11), rng)
    specials = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0]
    for i in range(12):
        a[i, rng.integers(10, size=2)] = rng.choice(specials, 2)
    for j in range(0, 11, 2):
        b[rng.integers(10, size=2), j] = rng.choice(specials, 2)
    for accum in ("fp16", "bf16", "fp8_e4m3fn", "fp8_e4m3fnuz"):
        for mode in ("rne", "rdown", "rup"):
            assert_same(a, b, accum=accum, order=order, rounding=mode, nan_sign=False)
    a, b = (np.where(np.isnan(x), 1.0, x) for x in (a, b))            # NaN only from inf * 0
    assert_same(a, b, accum="fp16", order=order)


# ----------------------------------------------------------------------------------------------
# shapes, addends and a property
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sa, sb", [((5, 1), (1, 4)), ((5, 0), (0, 4)), ((1, 9), (9, 3)),
                                    ((4, 9), (9, 1)), ((9,), (9, 3)), ((4, 9), (9,)),
                                    ((9,), (9,)), ((3, 4, 9), (9, 5)), ((2, 1, 4, 9),
                                    (3, 9, 5)), ((0, 9), (9, 3)), ((20, 300), (300, 70)),
                                    ((11, 7), (7, 2100))])      # ragged row and column blocks
@pytest.mark.parametrize("order", ["sequential", "chunked", "pairwise"])
def test_shapes(sa, sb, order):
    rng = np.random.default_rng(7)
    a, b = operands("bf16", sa, rng), operands("bf16", sb, rng)
    assert_same(a, b, accum="bf16", order=order, chunk=4 if order == "chunked" else None)


def test_non_contiguous_operands_and_addend():
    rng = np.random.default_rng(8)
    a = operands("fp16", (30, 20), rng)[::2, ::-1]
    b = np.asfortranarray(operands("fp16", (20, 12), rng))[:, 1::2]
    c = operands("fp16", (6,), rng)
    for order in ("sequential", "chunked", "pairwise"):
        for mode in ("rne", "rdown"):
            assert_same(a, b, accum="fp16", order=order, rounding=mode, c=c)
            assert_same(a, b, accum="fp16", order=order, rounding=mode, c=0.0)


@settings(max_examples=40, deadline=None)
@given(m=st.integers(0, 5), k=st.integers(0, 12), n=st.integers(1, 5),
       order=st.sampled_from(ORDERS), mode=st.sampled_from(MODES),
       accum=st.sampled_from(("fp16", "bf16", "fp8_e4m3fn", "fp8_e5m2")), data=st.data())
def test_property_random_shapes_and_values(m, k, n, order, mode, accum, data):
    vals = fpsim.values("fp8_e5m2")
    pool = np.concatenate([vals, [np.nan, np.inf, -np.inf, -0.0]])
    pick = st.integers(0, len(pool) - 1)
    ia = data.draw(st.lists(pick, min_size=m * k, max_size=m * k))
    ib = data.draw(st.lists(pick, min_size=k * n, max_size=k * n))
    a, b = pool[ia].reshape(m, k), pool[ib].reshape(k, n)
    assert_same(a, b, accum=accum, order=order, rounding=mode, nan_sign=False,
                chunk=3 if order == "chunked" else None)


# ----------------------------------------------------------------------------------------------
# choosing the engine
# ----------------------------------------------------------------------------------------------
def test_auto_picks_numba_for_numpy_operands_and_cpu_tensors_and_falls_back(monkeypatch):
    calls = []
    run = jit.run
    monkeypatch.setattr(jit, "run", lambda *x: calls.append(1) or run(*x))
    a, b = np.ones((3, 4), np.float16), np.ones((4, 2), np.float16)
    fpsim.matmul(a, b, accum="fp16")
    assert calls == [1]
    fpsim.matmul(a, b, accum="fp16", order="pairwise", return_stats=True)
    fpsim.matmul(a, b, accum="fp16", rounding="stochastic", seed=0)
    fpsim.matmul(a, b, accum="fp16", product="bf16")
    fpsim.matmul(a, b, accum="fp64")
    fpsim.matmul(a, b, order="tensor_core", tensor_core="hopper_fp64")
    fpsim.matmul(a, b, accum="fp16", backend="numpy")
    torch = pytest.importorskip("torch")
    out = fpsim.matmul(torch.ones(3, 4), torch.ones(4, 2), accum="fp16")  # zero-copy views
    assert calls == [1, 1] and isinstance(out, torch.Tensor)
    from fpsim import dispatch

    monkeypatch.setattr(dispatch, "device_kind", lambda x: "cuda")   # the torch engine's path
    fpsim.matmul(torch.ones(3, 4), torch.ones(4, 2), accum="fp16")
    assert calls == [1, 1]


@pytest.mark.parametrize("kw, match", [
    (dict(rounding="stochastic"), "stochastic"), (dict(return_stats=True, order="pairwise"), "return_stats"),
    (dict(product="bf16"), "rounded products"), (dict(accum="fp64"), "fp64"),
    (dict(accum="e8m0"), "accumulator"),
    (dict(order="tensor_core", tensor_core="cdna3_fp64", accum="fp32"),
     "FP64 fused multiply-adds")])
def test_explicit_numba_names_what_it_lacks(kw, match):
    a, b = np.ones((3, 4)), np.ones((4, 2))
    with pytest.raises(ValueError, match=match):
        fpsim.matmul(a, b, backend="numba", **{"accum": "fp16", **kw})


def test_torch_tensors_with_explicit_numba_come_back_as_tensors():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    a, b = operands("bf16", (5, 30), rng), operands("bf16", (30, 4), rng)
    got = fpsim.matmul(torch.from_numpy(a), torch.from_numpy(b), accum="bf16", backend="numba")
    want = fpsim.matmul(a, b, accum="bf16", backend="numpy")
    assert isinstance(got, torch.Tensor) and np.array_equal(codes(got.numpy()), codes(want))


def test_kernels_compile_without_fma_contraction():
    """The kernels' numba options keep a * b + c two roundings: on these operands an FMA
    would give -2^-60 instead of 0."""
    from numba import njit

    from fpsim.arith._jit_kernels import JIT_OPTIONS

    @njit(**{**JIT_OPTIONS, "cache": False})
    def mul_add(x, y, z):
        out = np.empty_like(x)
        for i in range(len(x)):
            out[i] = x[i] * y[i] + z[i]
        return out

    v = (1 + 2.0**-30, 1 - 2.0**-30, -1.0)
    assert Fraction(v[0]) * Fraction(v[1]) + Fraction(v[2]) == -Fraction(2) ** -60
    x, y, z = (np.full(64, t) for t in v)
    assert np.all(mul_add(x, y, z) == 0.0)


def test_without_numba_auto_takes_numpy(monkeypatch):
    """numba is optional: when it cannot be imported, "auto" runs the NumPy engine, and says
    so once: how much slower, what to install."""
    calls = []
    monkeypatch.setattr(compiled, "available", lambda: False)
    monkeypatch.setattr(jit, "run", lambda *x: calls.append(1))
    monkeypatch.setattr(jit, "_warned", [])
    a, b = np.ones((3, 4), np.float16), np.ones((4, 2), np.float16)
    with pytest.warns(RuntimeWarning, match=r"NumPy engine, 14–32× slower .*fpsim\[fast\]"):
        out = fpsim.matmul(a, b, accum="fp16")
    assert calls == [] and np.all(out == 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fpsim.matmul(a, b, accum="fp16")                        # once per process
        fpsim.matmul(a, b, accum="fp16", backend="numpy")       # asked for: no warning


def test_numpy_slowdown_quotes_the_benchmark():
    rows = json.loads((Path(__file__).parents[1] / "benchmarks" / "results" /
                       "matmul_bench.json").read_text())["against_naive_loop"]
    ratios = [r["numba_mac_per_s"] / r["numpy_mac_per_s"] for r in rows]
    assert jit.NUMPY_SLOWDOWN == f"{math.floor(min(ratios))}–{math.ceil(max(ratios))}×"


# ----------------------------------------------------------------------------------------------
# tensor-core models
# ----------------------------------------------------------------------------------------------
def _tc_inputs(model) -> list[str]:
    """The operand formats a preset takes (FP32 ones for the TF32/XF32 truncation)."""
    name = model.name
    for key, fmts in (("fp8", ["e4m3", "e5m2"]), ("bf16", ["bf16"]), ("fp16", ["fp16"]),
                      ("f32", ["fp32"]), ("fp32", ["fp32"])):
        if key in name:
            return fmts
    return ["fp16"]


def _tc_edges(fmt: str) -> np.ndarray:
    """Values where the models' rules show: signed zeros, inf, NaN, the least subnormal and
    normal, the largest finite, and neighbours of 1 that alignment cuts or ties."""
    f = get_format(fmt)
    tiny, least = 2.0 ** f.emin, 2.0 ** (f.emin - f.mbits)
    ulp = 2.0 ** -f.mbits
    v = [0.0, 1.0, 1 + ulp, 1 - ulp / 2, 1.5, 3 * ulp, tiny, least, 3 * least, f.max, 2.0 ** 20]
    v += [np.inf, np.nan] if f.inf else [np.nan]
    v = np.array(v)
    return fpsim.quantize(np.concatenate([v, -v]), fmt)


#: one preset of each structure runs in the fast suite, the others with the slow tests
TC_FAST = ("hopper_fp8", "volta_fp16_f16", "ampere_tf32", "cdna3_fp8", "cdna3_xf32",
           "cdna2_bf16", "cdna1_fp32")
TC_MODELS = [m if m.name in TC_FAST else pytest.param(m, marks=pytest.mark.slow)
             for m in fpsim.arith.TENSOR_CORES.values()
             if m.scaled is None and m.accum_format.name != "fp64"] + [
    fpsim.arith.TensorCoreModel(8, 20, "fp16", "rtz", align_accumulator=False,
                                sum_rounding="rne", name="custom_unaligned"),
    fpsim.arith.TensorCoreModel(4, 10, "bf16", "rdown", sum_rounding="rdown",
                                name="custom_rdown"),
    fpsim.arith.TensorCoreModel(6, 16, "fp32", "rup", align_accumulator=False,
                                sum_rounding="rdown", name="custom_rup_unaligned")]


@pytest.mark.parametrize("model", TC_MODELS, ids=lambda m: getattr(m, "name", None))
def test_tensor_core_models_random_and_edge_operands(model):
    """Every preset (FP64 ones and block scales aside: NumPy, and MMA-Sim's fixture), with and
    without promotion every two instructions, with C, forward (a @ b) and backward-like
    (transposed, broadcast batch) shapes: the compiled engine gives the NumPy engine's codes
    on random operands and on operands full of zeros, inf, NaN, subnormals and extremes."""
    g = model.group
    K = 3 * g + 1 if model.structure != "fma" else 7      # a last, partial instruction
    for fmt in _tc_inputs(model):
        rng = np.random.default_rng(len(model.name) + g)
        a = operands(fmt, (2, 5, K), rng, spread=4)
        b = operands(fmt, (K, 7), rng, spread=4)
        c = operands(fmt, (5, 7), rng)
        edges = _tc_edges(fmt)
        ea, eb = a.copy(), b.copy()
        ea = np.where(rng.random(ea.shape) < 0.25, rng.choice(edges, ea.shape), ea)
        eb.flat[::3] = rng.choice(edges, eb.size)[::3]
        nan_sign = model.canonical_nan
        for chunk in (None, 2 * g):
            kw = dict(order="tensor_core", tensor_core=model, chunk=chunk)
            assert_same(a, b, **kw)
            assert_same(a, b, c=c, **kw)
            assert_same(ea, eb, c=c, nan_sign=nan_sign, **kw)
            assert_same(eb.T, ea[0].T, nan_sign=nan_sign, **kw)        # the backward's layouts
            assert_same(ea[:, :, ::-1].copy(), eb[::-1], nan_sign=nan_sign, **kw)


def assert_same_stats(a, b, **kw) -> None:
    """The compiled engine's statistics are the NumPy engine's, output by output; with
    ``return_stats="swamped"`` too (the same results and counts, no largest sums)."""
    got = fpsim.matmul(a, b, backend="numba", return_stats=True, **kw)
    want = fpsim.matmul(a, b, backend="numpy", return_stats=True, **kw)
    only = fpsim.matmul(a, b, backend="numba", return_stats="swamped", **kw)
    for y in (got[0], only[0]):
        same_codes(y, want[0], nan_sign=False)      # NaNs of both signs meet here
    assert only[1].max_partial is None
    for field in ("overflow", "swamped", "underflow", "max_partial"):
        for s in (got[1], only[1]) if field != "max_partial" else (got[1],):
            g, w = getattr(s, field), getattr(want[1], field)
            assert g.dtype == w.dtype and np.array_equal(g, w), field


@pytest.mark.parametrize("kw", [
    dict(accum="fp16"), dict(accum="bf16", rounding="rtz"), dict(accum="fp8_e4m3fnuz"),
    dict(accum="fp32"), dict(accum="fp32", order="chunked", chunk=16),
    dict(order="tensor_core", tensor_core="blackwell_fp8_f16"),
    dict(order="tensor_core", tensor_core="ampere_tf32", chunk=8),
    dict(accum="fp16", order="chunked", chunk=8), dict(accum="fp8_e5m2", order="fma"),
    dict(order="tensor_core", tensor_core="hopper_fp8", chunk=64),
    dict(order="tensor_core", tensor_core="volta_fp16_f16"),
    dict(order="tensor_core", tensor_core="cdna3_fp8"),
    dict(order="tensor_core", tensor_core="cdna2_bf16"),
    dict(order="tensor_core", tensor_core="cdna1_fp32", chunk=8)], ids=str)
@pytest.mark.usefixtures("unit")
def test_statistics_of_the_compiled_engine(kw):
    """return_stats (capture=True under fpsim.emulate) in the compiled engine: swamped
    additions and largest partial sums as the NumPy engine counts them, edge operands too."""
    rng = np.random.default_rng(3)
    a = operands("e4m3", (2, 5, 70), rng, spread=8)
    b = operands("e4m3", (70, 9), rng, spread=8)
    b[:, 0] = 2.0 ** -9                      # small terms swamped by a large first one
    a[..., 0] = 448.0
    assert_same_stats(a, b, **kw)
    a.flat[::17] = rng.choice(_tc_edges("e4m3"), a.size)[::17]
    assert_same_stats(a, b, **kw)


@pytest.mark.parametrize("kw", [dict(accum="fp16"), dict(accum="fp16", order="chunked", chunk=32),
                                dict(accum="fp32")], ids=str)
@pytest.mark.usefixtures("unit")
def test_statistics_with_zero_operands_and_an_overflow(kw):
    """The compiled statistics count quickly where every addend is non-zero and every partial
    sum finite; a zero operand (in a's row or b's row) and a partial sum that overflows with
    finite operands (the block counted again, addition by addition) give the NumPy engine's
    counts too."""
    big = 2.0 ** 120 if kw["accum"] == "fp32" else 240.0
    a = np.full((3, 40), big, np.float32)
    b = np.full((40, 1030), 16.0, np.float32)  # two column blocks: one overflows, one not
    b[1::2, 1024:] *= -1
    b[1::2, 1] *= -1
    a[1, 5] = 0.0
    b[7, 3] = b[7, 1027] = 0.0                 # a zero addend in each block
    assert_same_stats(a, b, **kw)
    assert np.isinf(fpsim.matmul(a, b, backend="numba", **kw)[0, 0])


@pytest.mark.parametrize("kw", [dict(accum="fp16"), dict(accum="fp32"),
                                dict(accum="fp16", order="chunked", chunk=16),
                                dict(accum="bf16", rounding="rtz")], ids=str)
@pytest.mark.usefixtures("unit")
def test_statistics_on_operands_full_of_zeros(kw):
    """Operands as sparse as ReLU activations and coarsely quantized weights (a third of
    each zero, of both signs) count on the quick path too: a zero addend leaves its sum
    unchanged and is not swamped, the others are counted as the NumPy engine counts them."""
    rng = np.random.default_rng(5)
    a = operands("e4m3", (2, 9, 70), rng, spread=8)
    b = operands("e4m3", (70, 11), rng, spread=8)
    b[:, 0] = 2.0 ** -9                      # small terms swamped by a large first one
    a[..., 0] = 448.0
    for x in (a, b):
        x[rng.random(x.shape) < 1 / 6] = 0.0
        x[rng.random(x.shape) < 1 / 6] = -0.0
    assert_same_stats(a, b, **kw)


@pytest.mark.parametrize("kw", [dict(accum="fp16"), dict(accum="fp32"),
                                dict(accum="fp16", order="chunked", chunk=8),
                                dict(order="tensor_core", tensor_core="hopper_fp8")], ids=str)
def test_statistics_of_empty_sums(kw):
    """No products (K = 0), with and without C: every statistic zero, as the NumPy engine
    gives them; the compiled engine allocates its statistics without zeroing them, as its
    kernels write every output's, so this path must zero them itself."""
    a, b = np.zeros((3, 0), np.float32), np.zeros((0, 5), np.float32)
    assert_same_stats(a, b, **kw)
    assert_same_stats(a, b, c=np.arange(-7.0, 8.0).reshape(3, 5), **kw)


@pytest.mark.parametrize("late", [False, True], ids=["first chunk", "last chunk"])
def test_swamped_counts_after_an_overflow_in_one_chunk(late):
    """return_stats="swamped" finds a block to count again from its sums, not its largest
    ones: a chunk that overflows first leaves inf in the outer sum, the last one in its own
    sum; the counts after it are the NumPy engine's either way (a sum past inf is swamped
    by nothing)."""
    a = np.ones((2, 24), np.float32)
    b = np.full((24, 3), 1.0, np.float32)
    big = slice(16, 24) if late else slice(0, 8)
    b[big] = 2.0 ** 14                         # four of them overflow FP16 (65504), and
    # the chunk's other four are added to inf
    b[:, 2] = 2.0 ** -12                       # and a column of swamped additions
    b[0, 2] = 1.0
    assert_same_stats(a, b, accum="fp16", order="chunked", chunk=8)
    assert np.isinf(fpsim.matmul(a, b, backend="numba", accum="fp16", order="chunked",
                                 chunk=8)[0, 0])


def test_swamped_counts_from_an_infinite_addend_c():
    """An inf in ``c`` starts a sum at inf with finite operands: counted again, as the NumPy
    engine counts (nothing swamped)."""
    a = np.ones((2, 6), np.float32)
    b = np.full((6, 3), 0.5, np.float32)
    c = np.array([[np.inf, 0.0, -np.inf], [1.0, 2.0, 3.0]], np.float32)
    assert_same_stats(a, b, accum="fp16", c=c)


def test_return_stats_refuses_other_words():
    """``return_stats`` takes True, False or "swamped" (the NumPy engine's stats leave the
    largest sums None too)."""
    x = np.ones((2, 3), np.float32)
    assert fpsim.matmul(x, x.T, backend="numpy", accum="fp16",
                        return_stats="swamped")[1].max_partial is None
    with pytest.raises(TypeError, match="'swamped'"):
        fpsim.matmul(x, x.T, return_stats="peak")


def test_tensor_core_accumulator_overflow_with_finite_operands():
    """FP32 operands near the top: the FP32 (or FP16) result overflows to inf, which later
    instructions keep, without an inf or NaN operand."""
    a = np.full((3, 40), 2.0 ** 127, np.float32)
    b = np.full((40, 4), 1.5, np.float32)
    b[::2] *= -1
    b[:8] = 1.75
    for name in ("hopper_tf32", "cdna3_xf32", "cdna1_fp32", "ampere_fp16_f16"):
        got = assert_same(a, b, order="tensor_core", tensor_core=name)
        assert np.isinf(got).all() or name == "ampere_fp16_f16"


@pytest.mark.parametrize("name", ["hopper_fp8", "ampere_fp16_f16", "blackwell_fp8_f16"])
@pytest.mark.parametrize("at", range(4))
def test_tensor_core_statistics_on_the_fast_path(name, at):
    """Statistics no longer turn the NVIDIA fast path off: it sums the products for them in
    the order the general loop does.  A group whose only non-zero product sits at position
    ``at`` of a four and is swamped by C counts as swamped, as in the NumPy engine; a group
    whose products cancel exactly counts as none."""
    g = TENSOR_CORES[name].group
    a = np.zeros((2, 3 * g), np.float32)
    b = np.ones((3 * g, 5), np.float32)
    a[:, 0] = 256.0                              # C of the second group: 256
    a[0, g + at] = 2.0 ** -9                     # its one product, swamped
    a[1, g + at], a[1, g + (at + 1) % 4] = 2.0 ** -9, -(2.0 ** -9)   # cancels
    a[:, 2 * g:] = 1.0                           # a third group that changes C
    kw = dict(order="tensor_core", tensor_core=name)
    assert_same_stats(a, b, **kw)
    sw = fpsim.matmul(a, b, backend="numba", return_stats=True, **kw)[1].swamped
    assert (sw[0] == 1).all() and (sw[1] == 0).all()


@pytest.mark.parametrize("name", ["cdna1_bf16", "cdna2_bf16", "cdna1_fp16", "cdna3_bf16_k4",
                                  "cdna3_fp8", "hopper_bf16", "hopper_fp8_f16"])
def test_tensor_core_fast_paths_and_their_limits(name):
    """Finite operands take the kernels' fast paths (products aligned and cut four at a time;
    FMA trees and CDNA3 sums that neither round nor flag the products) only while every
    product is a normal value of the result format: a row of products below FP32's least
    normal (which CDNA2 flushes) and one of products beyond its largest, of both signs (inf
    and -inf, so NaN), take the general loops.  Each gives the NumPy engine's codes."""
    fmt = "e4m3" if "fp8" in name else ("fp16" if "fp16" in name else "bf16")
    rng = np.random.default_rng(7)
    a = operands(fmt, (2, 6, 16), rng, spread=3)
    b = operands(fmt, (16, 9), rng, spread=3)
    kw = dict(order="tensor_core", tensor_core=name)
    assert_same(a, b, **kw)
    assert_same(a, b, c=operands(fmt, (6, 9), rng), **kw)
    # a row of two products in one CDNA3 FP8 half (even k): 2^16 and -2^-12, 28 binades below
    # (a fraction of a unit when aligned): cut toward zero it is gone, toward -inf it is one
    # unit, which FP32 holds just below 2^16
    a2, b2 = a.copy(), b.copy()
    a2[:, 0] = 0.0
    a2[:, 0, 2], b2[2] = 256.0, 256.0
    a2[:, 0, 4], b2[4] = -(2.0 ** -6), 2.0 ** -6
    got = assert_same(a2, b2, **kw)
    assert (got[:, 0] == 2.0 ** 16).all() or name == "hopper_fp8_f16"     # FP16: inf
    if fmt == "bf16":
        # each limit alone (together, either one keeps the fast paths off; mutants
        # jit-tame-flushed and jit-tame-beyond): products of 2^-127, below FP32's least
        # normal, which CDNA2 flushes one by one (two unflushed would make 2^-126, kept) ...
        tiny, b_tiny = a.copy(), b.copy()
        tiny[:, 0], b_tiny[:, 0] = 2.0 ** -64, 2.0 ** -63
        got = assert_same(tiny, b_tiny, **kw)
        assert (got[:, 0, 0] == 0).all() or "cdna2" not in name
        # ... and products of ±2^140, beyond FP32's largest: inf and -inf, so NaN
        huge, b_huge = a.copy(), b.copy()
        huge[:, 1], b_huge[:, 1] = 2.0 ** 70 * (-1.0) ** np.arange(16), 2.0 ** 70
        got = assert_same(huge, b_huge, **kw)
        assert np.isnan(got[:, 1, 1]).all() or "hopper" in name


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_compiled_profile_equals_numpy_measure(dtype):
    """lanes.profile's compiled pass gives lanes.measure's (sig, low, high) on random bit
    patterns (every binade, subnormals, inf and NaN among them), each float format's extremes,
    single values of every significand width, zeros only and an empty array."""
    from fpsim.arith.lanes import EMPTY, measure, profile

    info = np.finfo(dtype)
    itype = np.uint64 if dtype is np.float64 else np.uint32
    rng = np.random.default_rng(5)
    rand = rng.integers(0, np.iinfo(itype).max, 3000, dtype=itype, endpoint=True).view(dtype)
    edges = np.array([info.smallest_subnormal, info.tiny, info.max, 1.0, 3.0, -0.0, np.inf,
                      -np.inf, np.nan, info.tiny - info.smallest_subnormal], dtype)
    cases = [rand, edges, rand[np.isfinite(rand)] * dtype(0.0), np.empty(0, dtype)]
    cases += [np.array([1 + info.eps * k, 2.0 ** -k], dtype) for k in range(0, info.nmant + 1)]
    cases += [edges[i:i + 1] for i in range(len(edges))]
    for x in cases:
        assert profile(x) == measure(x, 1 << 16), x
    assert profile(np.zeros((3, 0), dtype)) == EMPTY


@pytest.mark.parametrize("fmt", ["tf32", NOSUB])
def test_truncation_to_tf32_skipped_only_where_it_changes_nothing(fmt):
    """driver._truncated (TF32/XF32 presets' read of FP32 operands) gives quantize's codes
    (toward zero) on operands it passes through unchanged (values of the format) and on those
    it cuts: wider significands, subnormals of a format without them, inf and NaN."""
    from fpsim.arith.driver import _truncated

    fmt = get_format(fmt)
    rng = np.random.default_rng(9)
    narrow = fpsim.quantize(rng.standard_normal(64), "e4m3").astype(np.float32)
    tiny = np.float32(2.0 ** fmt.emin) * np.array([0.5, 0.75, 1.0, -0.25], np.float32)
    payload = np.array([0x7FC00001], np.uint32).view(np.float32)   # quantize: 0x7FC00000
    for x in (narrow, narrow + np.float32(2.0 ** -20), np.append(narrow, tiny),
              np.append(narrow, np.inf), np.append(narrow, payload), narrow.astype(np.float64)):
        same_codes(_truncated(x, fmt), fpsim.quantize(x, fmt, rounding="rtz"))
    assert (_truncated(narrow, fmt) is narrow) == fmt.subnormals      # no copy for TF32


def test_read_only_and_broadcast_operands_share_one_compiled_kernel():
    """Read-only operands and C, a 2-D product (its batch index a read-only view) and a
    broadcast batch (its index a copy) reach a kernel as one set of array types (jit._arg):
    numba compiles it once, not again for each array flag (a tensor-core kernel's
    specialisation costs tens of seconds)."""
    rng = np.random.default_rng(3)
    a, b, c = (operands("fp16", s, rng) for s in ((4, 6), (6, 5), (4, 5)))
    for x in (a, b, c):
        x.flags.writeable = False
    assert_same(a, b, accum="fp16", c=c)
    assert_same(np.stack([a, a]), np.broadcast_to(b, (3, 1, 6, 5)), accum="fp16")
    assert len(compiled.kernels().sequential.signatures) == 1


# ----------------------------------------------------------------------------------------------
# binary16 sums on the host's binary16 unit (sequential_half)
# ----------------------------------------------------------------------------------------------
HALF = pytest.mark.skipif(not compiled.native_half(), reason="the host has no binary16 fused "
                          "multiply-add that rounds once (AVX512-FP16); the float64 kernels "
                          "run, tested above")


def half_operands(shape: tuple, rng: np.random.Generator) -> np.ndarray:
    """binary16 values over its whole range: zeros of both signs, subnormals, the largest
    finite values (sums overflow), and values whose products fall below half the least
    subnormal (sums round to zero)."""
    edges = np.array([0.0, -0.0, 2.0 ** -24, -(2.0 ** -24), 2.0 ** -14, 65504.0, -65504.0,
                      1.0, 3.0, 2.0 ** -20, 1000.0, 0.5])
    x = rng.standard_normal(shape) * 2.0 ** rng.integers(-20, 12, shape)
    x = np.where(rng.random(shape) < 0.3, rng.choice(edges, shape), x)
    return fpsim.quantize(x, "fp16")


def spied_half(monkeypatch) -> list:
    """Record each call of the binary16 kernel."""
    kern, calls = compiled.kernels(), []
    real = kern.sequential_half
    monkeypatch.setattr(kern, "sequential_half", lambda *a: calls.append(1) or real(*a))
    return calls


@HALF
@pytest.mark.parametrize("stats", [False, "swamped", True])
@pytest.mark.parametrize("order", ["sequential", "fma"])
def test_binary16_sums_on_the_binary16_unit(monkeypatch, stats, order):
    """Every step one binary16 fused multiply-add: the NumPy engine's codes, swamped counts,
    largest partial sums and overflow, from -0 or from a start C, on operands with zeros,
    subnormals, overflowing and vanishing sums."""
    calls = spied_half(monkeypatch)
    rng = np.random.default_rng(16)
    for trial in range(12):
        m, k, n = rng.integers(1, 40, 3)
        a, b = half_operands((m, k), rng), half_operands((k, n), rng)
        c = half_operands((m, n), rng) if trial % 2 else None
        kw = dict(accum="fp16", order=order, return_stats=stats, c=c)
        got = fpsim.matmul(a, b, backend="numba", **kw)
        want = fpsim.matmul(a, b, backend="numpy", **kw)
        if not stats:
            same_codes(got, want)
            continue
        same_codes(got[0], want[0])
        assert np.array_equal(got[1].swamped, want[1].swamped)
        assert np.array_equal(got[1].overflow, want[1].overflow)
        if stats is True:
            same_codes(got[1].max_partial, want[1].max_partial)
    assert len(calls) >= 12          # a call for each thread's blocks


@HALF
@pytest.mark.parametrize("stats", ["swamped", True])
def test_binary16_quick_swamped_counts(monkeypatch, stats):
    """The swamped count's quick test (``_half_swamped_step`` with ``quick``: a non-zero
    element of a, a row of b without zeros) beside the careful one: sums swamped by a large
    first product, zero elements of a, a zero in a row of b, and a row whose sums overflow
    (its block of rows summed again, counted the careful way; the other blocks not), against
    the NumPy engine."""
    calls = spied_half(monkeypatch)
    rng = np.random.default_rng(18)
    m, k, n = 19, 60, 70
    a = rng.standard_normal((m, k)) * 2.0 ** rng.integers(-3, 3, (m, k))
    a[rng.random((m, k)) < 0.05] = 0.0
    b = rng.standard_normal((k, n)) * 2.0 ** rng.integers(-4, 2, (k, n))
    b[0] = 2048.0                                  # a large first sum swamps what follows
    b[7, 3] = -0.0                                 # one zero in a row of b
    a[3] = np.abs(a[3]) + 40.0                     # row 3's sums overflow: its block again
    a, b = fpsim.quantize(a, "fp16"), fpsim.quantize(b, "fp16")
    for c in (None, fpsim.quantize(rng.standard_normal((m, n)), "fp16")):
        kw = dict(accum="fp16", return_stats=stats, c=c)
        got = fpsim.matmul(a, b, backend="numba", **kw)
        want = fpsim.matmul(a, b, backend="numpy", **kw)
        same_codes(got[0], want[0])
        assert np.array_equal(got[1].swamped, want[1].swamped)
        assert np.array_equal(got[1].overflow, want[1].overflow)
        if stats is True:
            same_codes(got[1].max_partial, want[1].max_partial)
        assert got[1].overflow[3].all() and not got[1].overflow[8:].any()
        assert got[1].swamped.sum() > m * n          # most steps after the first are swamped
    assert calls


@HALF
def test_binary16_fused_multiply_add_of_every_code(monkeypatch):
    """One step (K = 1, a start C) for every finite binary16 a against 24 b's, C drawn over
    the whole range: the exact product and sum rounded once, as the NumPy engine rounds it."""
    calls = spied_half(monkeypatch)
    rng = np.random.default_rng(17)
    codes16 = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float64)
    a = codes16[np.isfinite(codes16)][:, None]
    b = np.concatenate([[2.0 ** -24, -1.0, 65504.0, 2.0 ** -14],
                        half_operands((20,), rng)])[None, :]
    c = half_operands((a.shape[0], b.shape[1]), rng)
    same_codes(fpsim.matmul(a, b, accum="fp16", c=c, backend="numba"),
               fpsim.matmul(a, b, accum="fp16", c=c, backend="numpy"))
    assert calls


@HALF
def test_binary16_unit_ignores_flush_to_zero(monkeypatch):
    """torch.set_flush_denormal (MXCSR's FTZ and DAZ) leaves binary16 arithmetic alone: sums
    of subnormals keep their bits."""
    torch = pytest.importorskip("torch")
    calls = spied_half(monkeypatch)
    rng = np.random.default_rng(18)
    a = fpsim.quantize(rng.standard_normal((9, 50)) * 2.0 ** -13, "fp16")
    b = fpsim.quantize(rng.standard_normal((50, 7)) * 2.0 ** -3, "fp16")
    want = fpsim.matmul(a, b, accum="fp16", backend="numpy")
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        got = fpsim.matmul(a, b, accum="fp16", backend="numba")
    finally:
        torch.set_flush_denormal(False)
    same_codes(got, want)
    assert (np.abs(want) < 2.0 ** -14).any() and calls


@pytest.mark.parametrize("kw", [dict(rounding="rtz"), dict(order="chunked", chunk=8),
                                dict(order="pairwise"), dict(inputs=None)])
def test_binary16_unit_only_where_it_rounds_as_the_plan(monkeypatch, kw):
    """Other modes, orders with other roundings between, and operands that are not binary16
    values (float32 draws) keep the float64 kernels."""
    calls = spied_half(monkeypatch)
    rng = np.random.default_rng(19)
    a, b = rng.standard_normal((5, 20)), rng.standard_normal((20, 3))
    a, b = (fpsim.quantize(x, "fp32" if "inputs" in kw else "fp16") for x in (a, b))
    assert_same(a, b, accum="fp16", **kw)
    assert not calls


def test_native_half_follows_numba_target(monkeypatch):
    """The binary16 unit is used only where numba compiles for AVX512-FP16: the host's
    features, or NUMBA_CPU_FEATURES where set; FPSIM_NATIVE_HALF=0 turns it off."""
    from numba.core import config

    check = compiled.native_half.__wrapped__
    monkeypatch.setattr(config, "CPU_FEATURES", "+avx2,+fma,+avx512f")
    assert check() is False
    monkeypatch.setattr(config, "CPU_FEATURES", "+avx512f,+avx512fp16")
    assert check() is True
    monkeypatch.setenv("FPSIM_NATIVE_HALF", "0")
    assert check() is False


@pytest.mark.parametrize("stats", [False, True])
def test_counted_sums_round_once_where_float64_would_tie(stats):
    """bf16 sums (not float64's own rounding: TwoSum makes it round to odd) of 1 and the exact
    product (2^46 + 1) 2^-54 = 2^-8 + 2^-54 of two FP32 values: float64 rounds 1 + 2^-8 + 2^-54
    to the bf16 tie 1 + 2^-8, which would go to the even 1; rounded once it is 1 + 2^-7.  And
    under rdown 1 - 1 is -0 (IEEE 754 §6.3), which a nearest-even sum would make +0; with and
    without statistics (their loops fuse the product where float64's sum is the rounding)."""
    def both(a, b, **kw):
        got, want = (fpsim.matmul(a, b, backend=e, return_stats=stats, **kw)
                     for e in ("numba", "numpy"))
        if stats:
            assert np.array_equal(got[1].swamped, want[1].swamped)
            got, want = got[0], want[0]
        same_codes(got, want)
        return got

    a = np.array([[1.0, 8384513 * 2.0 ** -23]])
    b = np.array([[1.0], [8392705 * 2.0 ** -31]])
    assert Fraction(a[0, 1]) * Fraction(b[1, 0]) == Fraction(1, 2 ** 8) + Fraction(1, 2 ** 54)
    assert both(a, b, accum="bf16")[0, 0] == 1 + 2.0 ** -7
    zero = both(np.array([[1.0, -1.0]]), np.ones((2, 1)), accum="bf16", rounding="rdown")
    assert zero[0, 0] == 0 and math.copysign(1, zero[0, 0]) < 0
