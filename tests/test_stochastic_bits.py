"""Stochastic rounding with n random bits (``srbits``) and given random bits (``random_bits``).

No sampling: every test enumerates all 2^n random values, so probabilities are counts.  The
reference is the P3109 draft's RoundToPrecision (StochasticA/B/C) and gfloat's StochasticOdd,
written on exact integers and Fractions here, independent of fpsim's bias arithmetic; gfloat's
own implementation is compared on the same random bits.  NumPy, torch and float32 vs float64
lanes must agree bit for bit (the Triton twin: tests/test_kernels.py).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

import fpsim
from fpsim.rounding import STOCHASTIC
from fpsim.stochastic import MAX_SRBITS, VARIANTS

K = 8                                   # dropped bits of the exhaustive tests: 2^8 patterns


def nearest(v: Fraction, odd_ties: bool) -> int:
    """``v`` rounded to the nearest integer, ties to even (or to odd)."""
    f = math.floor(v)
    if v - f != Fraction(1, 2):
        return f + (v - f > Fraction(1, 2))
    return f + ((f % 2 == 0) == odd_ties)


def rounds_up(mode: str, f: Fraction, n: int, r: np.ndarray) -> np.ndarray:
    """The draft's rule (gfloat's for ``stochastic_odd``): does fraction ``f`` of an ulp round
    up with random values ``r`` of ``n`` bits."""
    if mode == "stochastic":
        return math.floor(f * 2**n) + r >= 2**n
    if mode == "stochastic_b":
        return math.floor(f * 2 ** (n + 1)) + 2 * r + 1 >= 2 ** (n + 1)
    return nearest(f * 2**n, mode == "stochastic_odd") + r >= 2**n


# (format, lower neighbour, upper neighbour): normal, subnormal, from zero, above the largest
PLACES = [("e5m2", 256.0, 320.0), ("e5m2", 2.0**-16, 2 * 2.0**-16), ("e2m1", 0.0, 0.5),
          ("e2m1", 4.0, 6.0), ("e5m2", 57344.0, np.inf), ("p3109_k6p3se", 1.0, 1.25)]


@pytest.mark.parametrize("mode", STOCHASTIC)
@pytest.mark.parametrize("fmt, lo, hi", PLACES)
def test_every_dropped_pattern_and_every_random_value(fmt, lo, hi, mode):
    """x = lo + D/2^8 of an ulp for all 256 D, n = 1..10, all 2^n random values: each result
    is the neighbour the rule picks (inf above the largest value), so the count of round-ups is
    the rule's count exactly; negative inputs mirror it."""
    ulp = (hi - lo) if np.isfinite(hi) else 8192.0
    d = np.arange(2**K)
    x = (lo + d * (ulp / 2**K)).astype(np.float32)
    assert np.array_equal((x.astype(np.float64) - lo) * 2**K / ulp, d)       # exact inputs
    for n in range(1, K + 3):
        r = np.arange(2**n)
        xs, rs = np.repeat(x, r.size), np.tile(r, x.size)
        for sign in (1, -1):
            got = fpsim.quantize(sign * xs, fmt, rounding=mode, srbits=n, random_bits=rs)
            up = np.concatenate([rounds_up(mode, Fraction(int(k), 2**K), n, r) for k in d])
            assert np.array_equal(got, np.where(up, sign * hi, sign * lo)), (n, sign)
        counts = up.reshape(x.size, r.size).sum(1)
        if n >= K:                      # enough bits: the exact probability D / 2^8
            assert np.array_equal(counts, d * 2 ** (n - K))


@pytest.mark.parametrize("mode", STOCHASTIC)
def test_unbiased_only_when_the_random_bits_cover_the_dropped_bits(mode):
    """The mean over all 2^n random values is x itself for every one of the 256 patterns when
    n >= 8 dropped bits; with fewer bits some x is off (the hardware's few-bit bias):
    StochasticA only ever rounds down more (a bias toward zero of up to (2^(8-n) - 1)/2^8 ulp)."""
    d = np.arange(2**K)
    x = 256.0 + d * (64.0 / 2**K)                       # e5m2: 256 and 320, ulp 64
    for n in range(1, K + 3):
        r = np.arange(2**n)
        got = fpsim.quantize(np.repeat(x, r.size), "e5m2", rounding=mode, srbits=n,
                             random_bits=np.tile(r, x.size))
        bias = got.reshape(x.size, r.size).mean(1) - x
        if n >= K:
            assert np.array_equal(bias, np.zeros(x.size)), n
        else:
            assert np.any(bias != 0), n
            if mode == "stochastic":
                assert bias.max() == 0 and bias.min() == -(2 ** (K - n) - 1) * 64.0 / 2**K


@pytest.mark.parametrize("x, n, ups", [(259, 3, 0), (259, 5, 2), (277, 3, 3), (288, 3, 4),
                                       (311, 3, 7)])
def test_gfloat_suite_cases(x, n, ups):
    """gfloat's test_stochastic_rounding (e5m2, RoundMode.Stochastic = StochasticC): 259 with
    3 bits never rounds up (every-bit rounding: 3/64 of the time), with 5 bits 2 of 32; 277
    with 3 bits 3 of 8 (every-bit: 21/64); 288 half; 311 7 of 8."""
    r = np.arange(2**n)
    got = fpsim.quantize(np.full(r.size, float(x)), "e5m2", rounding="stochastic_c", srbits=n,
                         random_bits=r)
    assert set(np.unique(got)) <= {256.0, 320.0} and int((got == 320).sum()) == ups


def some_inputs(seed: int = 0, size: int = 4000) -> np.ndarray:
    """float32 values of every magnitude (far below the subnormals of every format included),
    both signs, specials, and ties with a tail 2^-23 below them (beyond float32 lanes' 30 bits
    when far below the smallest subnormal: the sticky bit decides StochasticC there)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(size) * np.exp2(rng.integers(-60, 17, size))).astype(np.float32)
    tails = [2.0**-9 * 2.0 ** -(n + 1) * (1 + 2.0**-23) for n in range(16, MAX_SRBITS + 1)]
    x[:5 + len(tails)] = [np.nan, np.inf, -np.inf, 0.0, -0.0] + tails
    return x


@pytest.mark.parametrize("mode", STOCHASTIC)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e2m1", "bf16", "int8", "p3109_k8p1se",
                                 "p3109_k8p3ue", "e8m0"])
def test_a_pure_function_of_input_and_random_bits(fmt, mode):
    """Given random bits the codes are a function of (input, random bits): NumPy, torch, and
    float32 vs float64 lanes (the same values in both) agree bit for bit for n = 1..28, and a
    second call repeats the first."""
    torch = pytest.importorskip("torch")
    x = some_inputs()
    if not fpsim.get_format(fmt).signed:
        x = np.abs(x)
    rng = np.random.default_rng(1)
    for n in (1, 2, 3, 5, 8, 13, 16, 20, MAX_SRBITS):
        r = rng.integers(0, 2**n, x.shape)
        kw = dict(rounding=mode, srbits=n, on_nan="zero")
        a = fpsim.encode(x, fmt, random_bits=r, **kw)
        assert np.array_equal(a, fpsim.encode(x, fmt, random_bits=r, **kw))
        assert np.array_equal(a, fpsim.encode(x.astype(np.float64), fmt, random_bits=r, **kw))
        t = fpsim.encode(torch.from_numpy(x), fmt, random_bits=torch.from_numpy(r),
                         backend="torch", **kw)
        assert np.array_equal(a.astype(np.int64), t.numpy().astype(np.int64)), n


def test_the_sticky_bit_beyond_float32_lanes():
    """2^-9 (e4m3's smallest subnormal) times 2^-(n+1) (1 + 2^-23): StochasticC sees the fraction
    just above a tie, 1/2 + 2^-24 of a random step, and rounds it to 1 step; float32 lanes
    drop its tail past their 30 bits and keep only that it was there (n = 16..28)."""
    for n in range(16, MAX_SRBITS + 1):
        x = np.float32(2.0**-9 * 2.0 ** -(n + 1) * (1 + 2.0**-23))
        r = np.array([2**n - 2, 2**n - 1])
        got = fpsim.quantize(np.full(2, x), "e4m3", rounding="stochastic_c", srbits=n,
                             random_bits=r)
        assert list(got) == [0.0, 2.0**-9], n


def gfloat_info(fmt: str):
    gf = pytest.importorskip("gfloat")
    from gfloat import formats

    f = fpsim.get_format(fmt)
    if fmt.startswith("p3109"):
        fi = formats.format_info_p3109(f.bits, f.mbits + 1, gf.Signedness.Signed,
                                       gf.Domain.Extended if f.inf else gf.Domain.Finite)
    else:
        fi = getattr(formats, f"format_info_ocp_{fmt}")
    return gf, fi


@pytest.mark.parametrize("mode", STOCHASTIC)
@pytest.mark.parametrize("fmt", ["e5m2", "e4m3", "e2m1", "e3m2", "p3109_k8p3se", "p3109_k8p1se",
                                 "p3109_k6p4sf"])
def test_gfloat_bit_for_bit(fmt, mode):
    """gfloat's round_ndarray with the variant of the same rule (VARIANTS) and the same random
    bits: every value a quarter, eighth.. of an ulp apart over the whole range (beyond the
    largest value and below the smallest subnormal too), both signs, n = 1..13."""
    gf, fi = gfloat_info(fmt)
    f = fpsim.get_format(fmt)
    grid = fpsim.values(fmt)
    grid = grid[grid >= 0]
    top = f.max + 4 * (grid[-1] - grid[-2])
    steps = np.concatenate([grid, [top]])
    x = np.concatenate([np.linspace(a, b, 17)[:-1] for a, b in zip(steps[:-1], steps[1:])])
    x = np.concatenate([x, -x, [f.min_subnormal / 3, f.min_subnormal / 1000]]).astype(np.float32)
    x = x.astype(np.float64)
    saturate = not (f.inf or f.has_nan)               # no inf, no NaN: gfloat needs sat=True
    rng = np.random.default_rng(2)
    gmode = getattr(gf.RoundMode, VARIANTS[mode][1])
    for n in (1, 2, 3, 5, 8, 13):
        r = rng.integers(0, 2**n, x.shape)
        got = fpsim.quantize(x, fmt, rounding=mode, srbits=n, random_bits=r, saturate=saturate)
        ref = gf.round_ndarray(fi, x, gmode, saturate, r, n)
        assert np.array_equal(got, ref, equal_nan=True), (n, x[got != ref][:4])


def test_names_and_the_default():
    """Without srbits every variant is exact stochastic rounding with the same bits; P3109's
    and gfloat's names point to fpsim's."""
    x = some_inputs(3)
    codes = [fpsim.encode(x, "e4m3", rounding=m, seed=9, on_nan="zero") for m in STOCHASTIC]
    assert all(np.array_equal(codes[0], c) for c in codes[1:])
    assert fpsim.rounding.check_mode("Stochastic-A") == "stochastic"
    with pytest.raises(ValueError, match="stochastic_b"):
        fpsim.quantize(1.0, "e4m3", rounding="StochasticFast")


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_seeded_draws_of_n_bits(backend):
    """srbits with a seed: n-bit draws, reproducible, on the NumPy and torch routes."""
    x = np.full(4096, 1 + 2.0**-5, np.float32)         # 1/4 of an e4m3 ulp: 2 bits decide
    if backend == "torch":
        x = pytest.importorskip("torch").from_numpy(x)

    def q(n: int) -> np.ndarray:
        got = fpsim.quantize(x, "e4m3", rounding="stochastic", srbits=n, seed=4, backend=backend)
        return np.asarray(got)

    assert np.array_equal(q(1), q(1))
    assert set(np.unique(q(1))) == {1.0}                # floor(1/4 * 2) + r < 2: never up
    assert 0.2 < (q(2) > 1).mean() < 0.3                # 1/4, sd 0.007


@pytest.mark.parametrize("kw, err, match", [
    (dict(rounding="rne", srbits=4), ValueError, "stochastic mode"),
    (dict(rounding="stochastic", srbits=0), ValueError, "from 1 to 28"),
    (dict(rounding="stochastic", srbits=29), ValueError, "from 1 to 28"),
    (dict(rounding="stochastic", srbits=True), ValueError, "whole number"),
    (dict(rounding="stochastic", random_bits=[1, 2]), ValueError, "needs srbits"),
    (dict(rounding="rne", random_bits=[1, 2]), ValueError, "stochastic mode"),
    (dict(rounding="stochastic", srbits=2, random_bits=[1, 4]), ValueError, r"\[0, 3\]"),
    (dict(rounding="stochastic", srbits=2, random_bits=[1, -1]), ValueError, r"\[0, 3\]"),
    (dict(rounding="stochastic", srbits=2, random_bits=[1]), ValueError, "shape"),
    (dict(rounding="stochastic", srbits=2, random_bits=[1.0, 2.0]), TypeError, "integers"),
    (dict(rounding="stochastic", srbits=2, random_bits=[1, 2], seed=3), ValueError, "not both"),
])
def test_bad_options_are_named(kw, err, match):
    with pytest.raises(err, match=match):
        fpsim.quantize(np.array([1.1, 2.2]), "e4m3", **kw)
    with pytest.raises(err, match=match):
        fpsim.encode(np.array([1.1, 2.2]), "e4m3", **kw)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("mode, n, p", [("stochastic", 2, 0), ("stochastic", 3, 1 / 8),
                                        ("stochastic_c", 2, 0), ("stochastic_odd", 2, 1 / 4),
                                        ("stochastic_b", 2, 1 / 4)])
def test_matmul_rounds_the_exact_sum_with_n_bits(mode, n, p, backend):
    """1·1 + 2^-12·2^-12 = 1 + 2^-24 into e8m21 (ulp 2^-21): the dropped fraction is 1/8, which
    no float32 lane holds beside 1.  Two bits: StochasticA and C never round up, gfloat's odd
    and StochasticB one time in four; three bits: 1/8 (5-sigma window over 8,000 sums)."""
    m = 8_000
    a = np.tile(np.float32([1.0, 2.0**-12]), (m, 1))
    b = np.float32([[1.0], [2.0**-12]])
    if backend == "torch":
        torch = pytest.importorskip("torch")
        a, b = torch.from_numpy(a), torch.from_numpy(b)
    r = fpsim.matmul(a, b, accum="e8m21", rounding=mode, srbits=n, seed=3, backend=backend)
    r = np.asarray(r.numpy() if backend == "torch" else r, np.float64)
    assert set(np.unique(r)) <= {1.0, 1 + 2.0**-21}
    ups = int((r > 1).sum())
    assert abs(ups - m * p) <= 5 * math.sqrt(m * p * (1 - p)), (ups, m * p)


def test_matmul_srbits_checks():
    a = np.ones((2, 2), np.float32)
    with pytest.raises(ValueError, match="stochastic mode"):
        fpsim.matmul(a, a, accum="bf16", srbits=4)
    with pytest.raises(ValueError, match="float64 lanes hold 52"):
        fpsim.matmul(a, a, accum="e8m40", rounding="stochastic", srbits=12)


def test_block_formats_take_the_bits_of_each_element():
    """mx.quantize and scaled_quantize: random bits travel with their element (the same codes
    when x and its bits are transposed and quantized along the other axis), and the element
    codes are the core's on the scaled values with those bits."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((4, 64)) * 3).astype(np.float32)
    r = rng.integers(0, 2**4, x.shape)
    kw = dict(rounding="stochastic_c", srbits=4)
    a = fpsim.mx.quantize(x, "mxfp4", random_bits=r, **kw)
    t = fpsim.mx.quantize(x.T.copy(), "mxfp4", axis=0, random_bits=r.T.copy(), **kw)
    assert np.array_equal(a.codes, t.codes.T)
    scale = np.repeat(2.0 ** (a.scales.astype(np.float64) - 127), 32, axis=1)
    want = fpsim.encode(x / scale, "e2m1", saturate=True, random_bits=r, **kw)
    assert np.array_equal(a.codes, want)
    st = fpsim.scaled_quantize(x, "e4m3", random_bits=r, **kw)
    assert np.array_equal(st.codes, fpsim.encode(x / st.scales, "e4m3", saturate=True,
                                                 random_bits=r, **kw))
    perm = rng.permutation(x.size)
    sp = fpsim.scaled_quantize(x.reshape(-1)[perm], "e4m3", random_bits=r.reshape(-1)[perm], **kw)
    assert np.array_equal(sp.codes, st.codes.reshape(-1)[perm])


def test_nn_and_recipes_take_srbits():
    """fake_quantize (forward bits given, gradient with n random bits), GradFormats and Recipe
    carry srbits to fpsim.quantize; with random bits all 2^n - 1 StochasticA rounds up every
    inexact value (floor(f 2^n) >= 1), with 0 never."""
    torch = pytest.importorskip("torch")
    from fpsim.nn import GradFormats, fake_quantize

    x = torch.tensor([1.03, -1.2, 2.0], requires_grad=True)
    ups = fake_quantize(x, "e4m3", rounding="stochastic", srbits=3,
                        random_bits=torch.full((3,), 7), grad_fmt="e5m2",
                        grad_rounding="stochastic", grad_srbits=2)
    downs = fake_quantize(x, "e4m3", rounding="stochastic", srbits=3,
                          random_bits=torch.zeros(3, dtype=torch.int64))
    assert ups.tolist() == [1.125, -1.25, 2.0] and downs.tolist() == [1.0, -1.125, 2.0]
    ups.sum().backward()
    assert x.grad.tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="stochastic mode"):
        GradFormats("e5m2", srbits=8)
    g = GradFormats("e5m2", "e5m2", "stochastic", srbits=8)
    assert g.backward().grad.srbits == 8
    with pytest.raises(ValueError, match="stochastic mode"):
        fpsim.Recipe("e4m3", srbits=8)
    assert fpsim.Recipe("e4m3", rounding="stochastic", srbits=8).to_json()["srbits"] == 8


def test_a_recipe_rounds_operands_and_sums_with_n_bits():
    """A linear site under Recipe(rounding="stochastic", srbits=4): operands land between their
    rdown and rup roundings, and an emulated bf16 accumulator takes the bits too."""
    torch = pytest.importorskip("torch")
    from fpsim.emulation.sites import linear, quantize_operand

    torch.manual_seed(0)
    x, w = torch.randn(3, 8), torch.randn(8, 5)
    rec = fpsim.Recipe("e4m3", rounding="stochastic", srbits=4)
    q, _ = quantize_operand(x, "e4m3", rec, -1)
    lo, hi = (fpsim.quantize(x, "e4m3", rounding=m) for m in ("rdown", "rup"))
    assert bool(((q == lo) | (q == hi)).all())
    y = linear(fpsim.Recipe(accum="bf16", order="sequential", rounding="stochastic_c",
                            srbits=4), x, w, None)
    assert y.shape == (3, 5) and bool(torch.isfinite(y).all())


def test_the_worked_example_of_the_docs():
    """docs/semantics.md and docs/stochastic.md: e5m2, 3 random bits, round-ups out of 8 at 277
    (21/64 of an ulp) and at 260 (4/64: f 2^3 = 0.5, a tie at 3 bits), per mode; the first
    example's values."""
    r = np.arange(8)
    want = {277.0: [2, 3, 3, 3], 260.0: [0, 1, 0, 1]}
    for x, counts in want.items():
        got = [int((fpsim.quantize(np.full(8, x), "e5m2", rounding=m, srbits=3,
                                   random_bits=r) > 300).sum()) for m in STOCHASTIC]
        assert got == counts, x
    q = fpsim.quantize(np.full(8, 277.0), "e5m2", rounding="stochastic", srbits=3, random_bits=r)
    assert q.tolist() == [256.0] * 6 + [320.0] * 2


def test_gfloat_0_5_2_float_comparison_is_not_copied():
    """Below the smallest subnormal, the float just under a boundary of the fraction: e5m2,
    the largest float below 2^-18 (fraction just under 1/4) with n = 2, r = 3 (StochasticA) and
    n = 1, r = 1 (StochasticB) stays 0, as the draft's integer rule says."""
    x = np.array([np.nextafter(2.0**-18, 0)])
    assert fpsim.quantize(x, "e5m2", rounding="stochastic", srbits=2, random_bits=[3])[0] == 0
    assert fpsim.quantize(x, "e5m2", rounding="stochastic_b", srbits=1, random_bits=[1])[0] == 0
    assert fpsim.quantize(x, "e5m2", rounding="stochastic", srbits=2, random_bits=[3]).dtype \
        == np.float64


def test_cli_quantize_takes_srbits(tmp_path, capsys):
    from fpsim.cli import main

    np.save(tmp_path / "in.npy", np.full(64, 259.0))
    assert main(["quantize", str(tmp_path / "in.npy"), str(tmp_path / "out.npy"), "-f", "e5m2",
                 "-r", "stochastic_c", "--srbits", "3", "--seed", "1"]) == 0
    assert set(np.load(tmp_path / "out.npy")) == {256.0}       # 3 bits: never up (docs)
    assert main(["quantize", str(tmp_path / "in.npy"), str(tmp_path / "x.npy"), "-f", "e5m2",
                 "--srbits", "3"]) != 0
    assert "stochastic mode" in capsys.readouterr().err and not (tmp_path / "x.npy").exists()
