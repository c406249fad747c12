"""``fpsim.matmul(..., random_bits=)``: the caller's n-bit value for every stochastic rounding of
the accumulation (docs/stochastic.md, "Random bits of a matrix product").

The reference here is written on Fractions and explicit float64 operands, independent of
fpsim's TwoSum and round-to-odd: each addition's exact sum is rounded with the documented rule
of its mode (``fpsim.stochastic.VARIANTS``: floor/nearest of f·2^n, plus r, carry out rounds up),
and the random value of each rounding is read from the documented layout.  NumPy and torch must
give its bits exactly, NaN, ±inf, ties of the n-bit rules and the top of the range included.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

import fpsim
from fpsim.formats import get_format
from fpsim.rounding import STOCHASTIC

torch = pytest.importorskip("torch")

BACKENDS = ["numpy", "torch"]


# -- the independent reference ------------------------------------------------------------

def nearest(v: Fraction, odd_ties: bool) -> int:
    """``v`` to the nearest integer, ties to even (or to odd)."""
    f = math.floor(v)
    if v - f != Fraction(1, 2):
        return f + (v - f > Fraction(1, 2))
    return f + ((f % 2 == 0) == odd_ties)


def rounds_up(mode: str, f: Fraction, n: int | None, r: int) -> bool:
    """The rule of each mode with n random bits r, on the dropped fraction f of an ulp
    (P3109 StochasticA/B/C, gfloat's StochasticOdd); n None: round to nearest even."""
    if n is None:
        return f > Fraction(1, 2)          # the tie is decided by the caller (even)
    if mode == "stochastic":
        return math.floor(f * 2**n) + r >= 2**n
    if mode == "stochastic_b":
        return math.floor(f * 2 ** (n + 1)) + 2 * r + 1 >= 2 ** (n + 1)
    return nearest(f * 2**n, mode == "stochastic_odd") + r >= 2**n


def round_exact(x: Fraction, fmt: str, mode: str, n: int | None, r: int) -> float:
    """A non-zero exact value rounded to ``fmt`` (a format with inf): its two neighbours on the
    binade's grid (the subnormal grid below the least normal), the upper one by the rule; above
    the largest finite value, inf."""
    F = get_format(fmt)
    a = abs(x)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    ulp = Fraction(2) ** (max(e, F.emin) - F.mbits)
    q = a / ulp
    lo = math.floor(q)
    f = q - lo
    up = rounds_up(mode, f, n, r) or (n is None and f == Fraction(1, 2) and lo % 2 == 1)
    m = (lo + up) * ulp
    v = math.inf if m > Fraction(F.max) else float(m)
    return math.copysign(v, x)


def add(x: float, y: float, fmt: str, mode: str, n: int | None, r: int) -> float:
    """x + y rounded once: specials by float arithmetic, an exact zero +0 (-0 + -0 is -0)."""
    if not (math.isfinite(x) and math.isfinite(y)):
        return x + y
    s = Fraction(x) + Fraction(y)
    if s == 0:
        return -0.0 if math.copysign(1, x) < 0 and math.copysign(1, y) < 0 else 0.0
    return round_exact(s, fmt, mode, n, r)


def product(a: float, b: float, fmt: str | None, mode: str, n: int, r: int) -> float:
    p = a * b                                          # exact: float32 operands
    assert not math.isfinite(p) or Fraction(p) == Fraction(a) * Fraction(b)
    if fmt is None or not math.isfinite(p) or p == 0:
        return p
    return round_exact(Fraction(p), fmt, mode, n, r)


def reference(a: np.ndarray, b: np.ndarray, bits: np.ndarray, *, accum: str, rounding: str,
              srbits: int, order: str = "sequential", chunk: int | None = None,
              product_fmt: str | None = None, c: np.ndarray | None = None) -> np.ndarray:
    """(M, N) results of a (M, K) @ b (K, N), one output at a time, each rounding reading its
    value of ``bits`` (M, N, R) where the documented layout puts it."""
    M, K = a.shape
    N = b.shape[1]
    P = K if product_fmt else 0
    out = np.zeros((M, N))
    for i in range(M):
        for j in range(N):
            r = [int(v) for v in bits[i, j]]
            p = [product(float(a[i, k]), float(b[k, j]), product_fmt, rounding, srbits,
                         r[k] if P else 0) for k in range(K)]
            cin = None
            if c is not None:
                cfmt = "fp32" if chunk else accum
                cv = float(c[i, j])
                cin = cv if cv == 0 or not math.isfinite(cv) else \
                    round_exact(Fraction(cv), cfmt, "rne", None, 0)
            if order == "pairwise":
                level, done = p, 0
                if K == 1:
                    level = [add(-0.0, p[0], accum, rounding, srbits, r[P])]
                    done = 1
                while len(level) > 1:
                    h = len(level) // 2
                    new = [add(level[2 * t], level[2 * t + 1], accum, rounding, srbits,
                               r[P + done + t]) for t in range(h)]
                    done += h
                    level = new + level[2 * h:]
                s = level[0]
                if cin is not None:
                    s = add(cin, s, accum, rounding, srbits, r[P + done])
            else:
                outer = (-0.0 if cin is None else cin) if chunk else None
                s = -0.0 if (cin is None or chunk) else cin
                for k in range(K):
                    if chunk and k and k % chunk == 0:
                        outer = add(outer, s, "fp32", "rne", None, 0)
                        s = -0.0
                    s = add(s, p[k], accum, rounding, srbits, r[P + k])
                if chunk:
                    s = add(outer, s, "fp32", "rne", None, 0)
            out[i, j] = s
    return out


def same_bits(got, want: np.ndarray) -> bool:
    """Equal as float64 codes, every NaN matching a NaN."""
    g = np.asarray(got.numpy() if hasattr(got, "numpy") else got, np.float64)
    nan = np.isnan(want)
    return bool(np.array_equal(np.isnan(g), nan)
                and np.array_equal(g[~nan].view(np.int64), want[~nan].view(np.int64)))


def run(backend: str, a, b, bits, c=None, **kw):
    if backend == "torch":
        a, b, bits = (torch.from_numpy(np.ascontiguousarray(x)) for x in (a, b, bits))
        c = None if c is None else torch.from_numpy(c)
    return fpsim.matmul(a, b, random_bits=bits, backend=backend, c=c, **kw)


def n_roundings(K: int, order: str, product_fmt, c) -> int:
    adds = (max(K - 1, 1) + (c is not None)) if order == "pairwise" else K
    return (K if product_fmt else 0) + adds


# -- the cases ----------------------------------------------------------------------------

ORDERS = [("sequential", None), ("fma", None), ("chunked", 3), ("pairwise", None)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("order, chunk", ORDERS)
@pytest.mark.parametrize("mode", STOCHASTIC)
def test_random_operands_match_the_reference(mode, order, chunk, backend):
    """Random operands, K = 1..9, every order and mode, e5m2 and bf16 accumulators, with and
    without rounded products and C; srbits 1..5 (float32 lanes) and 20 (float64 lanes)."""
    rng = np.random.default_rng([STOCHASTIC.index(mode), [o for o, _ in ORDERS].index(order)])
    for K, accum, n, pfmt, with_c in [(1, "e5m2", 2, None, False), (2, "e5m2", 3, None, True),
                                      (5, "e5m2", 1, None, False), (7, "bf16", 5, None, True),
                                      (9, "e5m2", 4, "e4m3", False), (6, "bf16", 20, None, False),
                                      (4, "bf16", 3, "e5m2", True), (1, "bf16", 2, None, True)]:
        if order == "fma" and pfmt:
            continue                              # fma rounds the product with the sum
        a = (rng.standard_normal((3, K)) * 4).astype(np.float32)
        b = (rng.standard_normal((K, 4)) * 4).astype(np.float32)
        c = (rng.standard_normal((3, 4)) * 4) if with_c else None
        R = n_roundings(K, order, pfmt, c)
        bits = rng.integers(0, 2**n, (3, 4, R))
        kw = dict(accum=accum, rounding=mode, srbits=n, order=order, chunk=chunk)
        want = reference(a, b, bits, product_fmt=pfmt, c=c, **kw)
        got = run(backend, a, b, bits, c=c, product=pfmt or "exact", **kw)
        assert same_bits(got, want), (K, accum, n, pfmt, with_c, got, want)


def every_r(x_row: list[float], y_col: list[float], n: int, order: str = "sequential"):
    """Operands whose row i computes the same dot product, with random value i for every
    rounding: all 2^n random values of each rounding at once."""
    a = np.tile(np.float32(x_row), (2**n, 1))
    b = np.float32(y_col)[:, None]
    R = n_roundings(len(x_row), order, None, None)
    bits = np.repeat(np.arange(2**n), R).reshape(2**n, 1, R)
    return a, b, bits


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", STOCHASTIC)
def test_ties_of_the_n_bit_rules(mode, backend):
    """1 + f·ulp in e5m2 (ulp 1/4 at 1) with f = 3/8 and 1/8 at n = 2: f·4 = 1.5 and 0.5 are
    ties, where StochasticC goes to even and StochasticOdd to odd; every random value."""
    n = 2
    for frac in (Fraction(3, 8), Fraction(1, 8), Fraction(5, 8), Fraction(1, 2)):
        a, b, bits = every_r([1.0, float(frac / 4)], [1.0, 1.0], n)
        kw = dict(accum="e5m2", rounding=mode, srbits=n)
        want = reference(a, b, bits, **kw)
        got = run(backend, a, b, bits, **kw)
        assert same_bits(got, want), (frac, got, want)
        ups = int((want[:, 0] > 1).sum())
        rule = sum(rounds_up(mode, frac, n, r) for r in range(2**n))
        assert ups == rule                        # the rule's own count: the reference is right


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", STOCHASTIC)
def test_specials_top_of_range_and_subnormals(mode, backend):
    """NaN, ±inf, inf·0, a sum just above e5m2's largest value 57344 (half an ulp: up is inf),
    exact cancellation to +0, -0 + -0, and subnormal sums (ulp 2^-16), each with every random
    value of 3 bits, in the sequential and pairwise orders."""
    n = 3
    sub = 2.0**-16
    rows = [[np.nan, 1.0, 2.0], [np.inf, 1.0, -3.0], [np.inf, -np.inf, 1.0], [np.inf, 0.0, 1.0],
            [57344.0, 4096.0, 1024.0], [-57344.0, -6144.0, 0.0], [57344.0, 57344.0, -57344.0],
            [1.5, -1.5, 0.0], [-0.0, -0.0, -0.0], [sub, sub * 0.375, sub * 0.5],
            [-sub * 0.25, -sub * 0.125, sub * 0.0625]]
    for order in ("sequential", "pairwise"):
        for row in rows:
            a, b, bits = every_r(row, [1.0, 1.0, 1.0], n, order)
            kw = dict(accum="e5m2", rounding=mode, srbits=n, order=order)
            want = reference(a, b, bits, **kw)
            got = run(backend, a, b, bits, **kw)
            assert same_bits(got, want), (order, row, got, want)


@pytest.mark.parametrize("mode", STOCHASTIC)
def test_numpy_and_torch_agree_on_batches(mode):
    """Broadcast batches, a vector operand (dot), and rounded products with C: NumPy and torch
    give the same bits for the same random bits, and the same bits again (a pure function)."""
    rng = np.random.default_rng(5)
    a = (rng.standard_normal((2, 3, 5, 11)) * 8).astype(np.float32)
    b = (rng.standard_normal((3, 11, 6)) * 8).astype(np.float32)
    for order, chunk, pfmt in [("sequential", None, None), ("pairwise", None, "e4m3"),
                               ("chunked", 4, "bf16")]:
        R = n_roundings(11, order, pfmt, None)
        bits = rng.integers(0, 2**6, (2, 3, 5, 6, R)).astype(np.uint16)
        kw = dict(accum="e5m2", rounding=mode, srbits=6, order=order, chunk=chunk,
                  product=pfmt or "exact")
        x = run("numpy", a, b, bits.astype(np.int64), **kw)
        t = run("torch", a, b, bits.astype(np.int64), **kw)
        assert same_bits(t, np.asarray(x, np.float64))
        assert same_bits(run("numpy", a, b, bits, **kw), np.asarray(x, np.float64))
    v, w = a[0, 0, 0], b[0, :, 0]
    bits = rng.integers(0, 4, (11,))
    d = fpsim.dot(v, w, accum="bf16", rounding=mode, srbits=2, random_bits=bits)
    want = reference(v[None], w[:, None], bits[None, None], accum="bf16", rounding=mode,
                     srbits=2)
    assert d.shape == () and same_bits(d, want[0, 0])


@pytest.mark.parametrize("order", ["sequential", "pairwise"])
def test_tiles_in_threads_read_their_own_bits(order):
    """45,000 outputs: NumPy walks two tiles (given bits draw nothing, so the tiles run in
    threads), torch one after the other; each output reads its own random values."""
    from fpsim.arith import driver

    rng = np.random.default_rng(2)
    a = rng.standard_normal((300, 5)).astype(np.float32)
    b = rng.standard_normal((5, 150)).astype(np.float32)
    assert 300 * 150 > driver.TILE
    bits = rng.integers(0, 8, (300, 150, n_roundings(5, order, None, None)))
    kw = dict(accum="e5m2", rounding="stochastic_b", srbits=3, order=order)
    x = run("numpy", a, b, bits, **kw)
    assert same_bits(run("torch", a, b, bits, **kw), np.asarray(x, np.float64))
    rows = [0, 299]
    want = reference(a[rows], b, bits[rows], **kw)
    assert same_bits(x[rows], want)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int32])
def test_every_integer_dtype_as_array_or_tensor(dtype):
    """Unsigned random bits (torch has no min/max for uint16..uint64 tensors) and signed ones,
    as NumPy arrays or tensors, for NumPy and torch operands: one result."""
    a = np.float32([[1.0, 2**-3, 2**-3, 2**-4]])           # e5m2: 1, 1.25, 1.5, 1.5
    b = np.ones((4, 1), np.float32)
    r = np.array([0, 2, 3, 0], dtype).reshape(1, 1, 4)
    kw = dict(accum="e5m2", rounding="stochastic", srbits=2)
    for bits in (r, torch.from_numpy(r)):
        assert fpsim.matmul(a, b, random_bits=bits, **kw).tolist() == [[1.5]]
        t = fpsim.matmul(torch.from_numpy(a), torch.from_numpy(b), random_bits=bits,
                         backend="torch", **kw)
        assert t.tolist() == [[1.5]]


def test_numba_is_not_used_with_random_bits(monkeypatch):
    """The compiled engine has no stochastic modes: backend="auto" runs NumPy (jit.run is never
    called, though it is for a nearest mode), backend="numba" says so."""
    from fpsim.arith import compiled, jit

    if not compiled.available():
        pytest.skip("numba is not installed")
    a = np.float32([[1.0, 2.0**-5, 3.0]])
    b = np.ones((3, 2), np.float32)
    bits = np.arange(6).reshape(1, 2, 3) % 4
    kw = dict(accum="e5m2", rounding="stochastic", srbits=2, random_bits=bits)
    want = fpsim.matmul(a, b, backend="numpy", **kw)

    def refuse(*args, **kwargs):
        raise AssertionError("the numba engine ran")

    monkeypatch.setattr(jit, "run", refuse)
    with pytest.raises(AssertionError, match="numba engine ran"):
        fpsim.matmul(a, b, accum="e5m2")          # the fallback below is a real choice
    assert same_bits(fpsim.matmul(a, b, **kw), np.asarray(want, np.float64))
    with pytest.raises(ValueError, match="backend='numba' does not run"):
        fpsim.matmul(a, b, backend="numba", **kw)


@pytest.mark.parametrize("kw, err, match", [
    (dict(), ValueError, "random bits go with a stochastic mode"),
    (dict(rounding="rne"), ValueError, "random bits go with a stochastic mode"),
    (dict(rounding="stochastic"), ValueError, "needs srbits="),
    (dict(rounding="stochastic", srbits=2, seed=1), ValueError, "not both"),
    (dict(rounding="stochastic", srbits=2, bits=np.zeros((2, 2, 3), int)), ValueError,
     r"it needs shape \(2, 2, 2\)"),
    (dict(rounding="stochastic", srbits=2, order="pairwise", bits=np.zeros((2, 2, 2), int)),
     ValueError, r"it needs shape \(2, 2, 1\).*1 additions with order='pairwise'"),
    (dict(rounding="stochastic", srbits=2, product="bf16", bits=np.zeros((2, 2, 2), int)),
     ValueError, r"\(2, 2, 4\).*2 products \+ 2 additions"),
    (dict(rounding="stochastic", srbits=2, bits=np.zeros((2, 2, 2), np.float32)), TypeError,
     "must be integers"),
    (dict(rounding="stochastic", srbits=2, bits=np.full((2, 2, 2), 4)), ValueError,
     r"hold 4..4: with srbits=2 each lies in \[0, 3\]"),
    (dict(rounding="stochastic", srbits=2, bits=np.full((2, 2, 2), -1)), ValueError,
     "hold -1..-1"),
    (dict(order="tensor_core", tensor_core="hopper_fp8", accum="fp32"), ValueError,
     "random bits go with a stochastic mode"),
])
def test_bad_random_bits_are_named(kw, err, match):
    a = np.ones((2, 2), np.float32)
    kw = dict(kw)
    bits = kw.pop("bits", np.zeros((2, 2, 2), np.int64))
    kw.setdefault("accum", "bf16")
    for backend in BACKENDS:
        with pytest.raises(err, match=match):
            run(backend, a, a, bits, **kw)
