"""fpsim.matmul / fpsim.dot against slow, independent references (plain loops over Fractions).

The reference rounds every exact sum with its own rounding routine (``round_fraction``), not
with fpsim's, and compares results bit for bit.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fpsim
from fpsim import Format, get_format
from fpsim.arith import driver

DIRECTED = ("rne", "rna", "rtz", "rup", "rdown", "rto")
HALF = Fraction(1, 2)


# ----------------------------------------------------------------------------------------------
# The reference
# ----------------------------------------------------------------------------------------------
def round_fraction(x: Fraction, fmt: Format, mode: str) -> float:
    """The non-zero exact value ``x`` rounded to ``fmt`` (with subnormals) under ``mode``."""
    neg, m = x < 0, abs(x)
    e = m.numerator.bit_length() - m.denominator.bit_length()
    if Fraction(2) ** e > m:
        e -= 1                                       # 2^e <= m < 2^(e+1)
    q = Fraction(2) ** (max(e, fmt.emin) - fmt.mbits)
    n = m / q
    whole, rest = n.numerator // n.denominator, n - n.numerator // n.denominator
    if rest:
        up = {"rne": rest > HALF or (rest == HALF and whole % 2 == 1), "rna": rest >= HALF,
              "rtz": False, "rup": not neg, "rdown": neg, "rto": whole % 2 == 0}[mode]
        whole += up
    v = whole * q
    if v > Fraction(fmt.max):
        to_inf = mode in ("rne", "rna") or (mode == "rup" and not neg) or (mode == "rdown" and neg)
        val = (math.inf if fmt.inf else math.nan if fmt.has_nan else fmt.max) if to_inf \
            else fmt.max
    else:
        val = float(v)
    return -val if neg else val


def exact_product(x: float, y: float) -> Fraction | float:
    """x*y exactly; a float only where it is zero, inf or NaN (keeping IEEE's sign rules)."""
    if math.isfinite(x) and math.isfinite(y) and x != 0 and y != 0:
        return Fraction(x) * Fraction(y)
    return x * y


def add_rounded(x: Fraction | float, y: Fraction | float, fmt: Format, mode: str) -> float:
    """x + y rounded once; an exact zero sum follows IEEE 754 section 6.3: x + x keeps the
    sign of the zero x, else +0, but -0 under rounding toward negative ("rdown")."""
    if any(isinstance(v, float) and not math.isfinite(v) for v in (x, y)):
        return float(x) + float(y)
    exact = Fraction(x) + Fraction(y)
    if exact == 0:
        signs = {math.copysign(1, v) if isinstance(v, float) else (1 if v >= 0 else -1)
                 for v in (x, y)}
        return math.copysign(0.0, signs.pop()) if len(signs) == 1 else (
            -0.0 if mode == "rdown" else 0.0)
    return round_fraction(exact, fmt, mode)


def identity(mode: str) -> float:
    """The zero z with z + p == p for every p, signed zeros included, under ``mode``."""
    return 0.0 if mode == "rdown" else -0.0


def ref_dot(xs, ys, accum, mode="rne", product=None) -> float:
    """Left to right: each product exact (or rounded to ``product``), each sum rounded."""
    acc, fmt = identity(mode), get_format(accum)
    for x, y in zip(xs, ys):
        p = exact_product(float(x), float(y))
        if product is not None and isinstance(p, Fraction):
            p = round_fraction(p, get_format(product), mode)
        acc = add_rounded(acc, p, fmt, mode)
    return acc


def ref_matmul(a, b, **kw) -> np.ndarray:
    return np.array([[ref_dot(a[i], b[:, j], **kw) for j in range(b.shape[1])]
                     for i in range(a.shape[0])])


def same_bits(x, y) -> bool:
    """Equal as float64 bit patterns (signed zeros distinct); any NaN equals any NaN."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    nan = np.isnan(x)
    return x.shape == y.shape and bool(np.all(nan == np.isnan(y))) and bool(
        np.all(x[~nan].view(np.uint64) == y[~nan].view(np.uint64)))


def grid(fmt: str) -> np.ndarray:
    """Every finite value of a format, both signs."""
    v = fpsim.values(fmt)
    return v


def adversarial(fmt: str, K: int, rng: np.random.Generator, specials: bool = True) -> np.ndarray:
    """A K-vector mixing ordinary, huge, tiny, cancelling and (optionally) special values."""
    vals = grid(fmt)
    f = get_format(fmt)
    big = vals[np.abs(vals) >= f.max / 16]
    tiny = vals[(vals != 0) & (np.abs(vals) <= 4 * f.min_normal)]
    ordinary = vals[(np.abs(vals) > 0.25) & (np.abs(vals) < 4)]
    pick = rng.integers(0, 10, K)
    out = np.where(pick < 5, rng.choice(ordinary, K), np.where(pick < 7, rng.choice(big, K),
                                                               rng.choice(tiny, K)))
    half = K // 2
    if K >= 4 and rng.random() < 0.5:                  # exact cancellation
        out[half:half + half // 2] = -out[:half // 2]
    if specials and rng.random() < 0.2:
        out[rng.integers(K)] = rng.choice([np.inf, -np.inf, np.nan])
    return out


# ----------------------------------------------------------------------------------------------
# Sequential accumulation, bit for bit
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("accum", ["fp16", "bf16"])
@pytest.mark.parametrize("mode", DIRECTED)
def test_sequential_matches_fraction_loop(accum, mode):
    rng = np.random.default_rng(sum(map(ord, accum + mode)))
    for trial in range(3):
        K = int(rng.integers(1, 40))
        a = np.stack([adversarial(accum, K, rng) for _ in range(3)])
        b = np.stack([adversarial(accum, K, rng) for _ in range(4)], axis=1)
        got = fpsim.matmul(a.astype(np.float32), b.astype(np.float32), accum=accum,
                           rounding=mode)
        assert same_bits(got, ref_matmul(a, b, accum=accum, mode=mode)), (trial, a, b, got)


def test_sequential_full_precision_operands_use_wide_lanes():
    """float32 operands (24-bit products need float64 lanes) into FP16 and FP32 accumulators."""
    rng = np.random.default_rng(1)
    a = (rng.standard_normal((3, 30)) * 100).astype(np.float32)
    b = (rng.standard_normal((30, 2)) / 100).astype(np.float32)
    a[0, :10] = 6e4
    a[1, 5], b[5, :] = 1e-30, 1e-10
    for accum in ("fp16", "fp32", "e8m13"):
        for mode in ("rne", "rna", "rup"):
            got = fpsim.matmul(a, b, accum=accum, rounding=mode)
            assert same_bits(got, ref_matmul(a, b, accum=accum, mode=mode)), (accum, mode)


@pytest.mark.parametrize("accum,m1,m2,bits", [("fp16", 1090, 1924, 10),
                                               ("fp32", 8390641, 16773151, 23)])
def test_double_rounding_traps(accum, m1, m2, bits):
    """1 + x*y lies just above a midpoint of ``accum``, closer to it than the lanes resolve
    (m1*m2 = 2^(2 bits + 1) + tiny): rounding the lanes' sum again would give 1, not 1 + ulp."""
    x = math.ldexp(m1, -bits)
    y = math.ldexp(m2, -2 * bits - 2)
    assert Fraction(x) * Fraction(y) > Fraction(1, 2 ** (bits + 1))
    dtype = np.float32 if accum == "fp16" else np.float64
    got = fpsim.dot(np.array([1.0, x], dtype), np.array([1.0, y], dtype), accum=accum)
    assert got == 1 + 2.0**-bits == ref_dot([1.0, x], [1.0, y], accum)


def test_overflow_to_inf_and_nan_propagation():
    a = np.array([[60000.0, 60000.0, -60000.0], [np.inf, 1.0, -np.inf], [np.nan, 0, 0]],
                 np.float32)
    b = np.ones((3, 1), np.float32)
    got = fpsim.matmul(a, b, accum="fp16")[:, 0]
    assert got[0] == np.inf and np.isnan(got[1]) and np.isnan(got[2])
    # round toward zero never reaches inf: 60000 + 60000 stops at the largest FP16
    assert fpsim.dot([60000.0, 60000.0], [1.0, 1.0], accum="fp16", rounding="rtz") == 65504
    # a format without inf overflows to NaN (E4M3)
    assert np.isnan(fpsim.dot([448.0, 448.0], [1.0, 1.0], accum="fp8_e4m3fn"))


def test_bf16_sums_beyond_float32_lanes_overflow_correctly():
    """Products that fit float32 lanes, sums that do not: the overflow guard must round."""
    a = np.full(300, 2.0**60, np.float32)
    for mode in ("rne", "rtz", "rdown", "rup"):
        got = fpsim.dot(a, a, accum="bf16", rounding=mode)
        assert same_bits(got, ref_dot(a, a, "bf16", mode)), mode


values16 = st.sampled_from(list(grid("fp16")) + [np.inf, -np.inf, np.nan, -0.0])


@settings(max_examples=150, deadline=None)
@given(xs=st.lists(values16, min_size=1, max_size=12), data=st.data(),
       mode=st.sampled_from(DIRECTED),
       accum=st.sampled_from(["fp16", "bf16", "e5m2", "e8m13", "tf32"]))
def test_dot_property_against_reference(xs, data, mode, accum):
    ys = data.draw(st.lists(values16, min_size=len(xs), max_size=len(xs)))
    got = fpsim.dot(np.array(xs, np.float32), np.array(ys, np.float32), accum=accum,
                    rounding=mode)
    assert same_bits(got, ref_dot(xs, ys, accum, mode))


def ref_pairwise(xs, ys, accum, mode="rne") -> float:
    """The balanced tree of ``order='pairwise'``: neighbours added level by level."""
    fmt = get_format(accum)
    level = [exact_product(float(x), float(y)) for x, y in zip(xs, ys)]
    if len(level) == 1:
        return add_rounded(identity(mode), level[0], fmt, mode)
    while len(level) > 1:
        pairs = [add_rounded(x, y, fmt, mode) for x, y in zip(level[0::2], level[1::2])]
        level = pairs + level[-1:] if len(level) % 2 else pairs
    return level[0]


@settings(max_examples=100, deadline=None)
@given(xs=st.lists(values16, min_size=1, max_size=12), data=st.data(),
       mode=st.sampled_from(DIRECTED), accum=st.sampled_from(["fp16", "bf16", "e5m2"]))
def test_pairwise_property_against_reference(xs, data, mode, accum):
    ys = data.draw(st.lists(values16, min_size=len(xs), max_size=len(xs)))
    got = fpsim.dot(np.array(xs, np.float32), np.array(ys, np.float32), accum=accum,
                    order="pairwise", rounding=mode)
    assert same_bits(got, ref_pairwise(xs, ys, accum, mode))


@pytest.mark.parametrize("product", ["fp16", "bf16", "e4m3"])
def test_rounded_products(product):
    rng = np.random.default_rng(7)
    a = adversarial("fp16", 25, rng, specials=False)[None, :]
    b = adversarial("fp16", 25, rng, specials=False)[:, None]
    for mode in ("rne", "rtz", "rup"):
        got = fpsim.matmul(a, b, accum="fp32", product=product, rounding=mode)
        assert same_bits(got, ref_matmul(a, b, accum="fp32", mode=mode, product=product))


def test_many_tiles_and_batches(monkeypatch):
    """Tiny tiles force every tiling path (batch blocks, ragged edges) through the loop."""
    rng = np.random.default_rng(3)
    a = fpsim.quantize(rng.standard_normal((2, 3, 5, 9)), "fp16")
    b = fpsim.quantize(rng.standard_normal((3, 9, 4)), "fp16")
    whole = fpsim.matmul(a, b, accum="fp16", rounding="rtz", backend="numpy")
    for tile in (1, 3, 7, 45):
        monkeypatch.setattr(driver, "TILE", tile)
        assert same_bits(fpsim.matmul(a, b, accum="fp16", rounding="rtz", backend="numpy"), whole)
    ref = np.array([ref_matmul(a[i, j], b[j], accum="fp16", mode="rtz")
                    for i in range(2) for j in range(3)]).reshape(whole.shape)
    assert same_bits(whole, ref)


# ----------------------------------------------------------------------------------------------
# fp64, pairwise, chunked, fma
# ----------------------------------------------------------------------------------------------
def test_fp64_sequential_is_a_float64_loop():
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((4, 50)), rng.standard_normal((50, 3))

    def loop(x, y):
        s = 0.0
        for u, v in zip(x, y):
            s += u * v
        return s

    ref = np.array([[loop(a[i], b[:, j]) for j in range(3)] for i in range(4)])
    # float64 operands: their products round, as in the loop
    assert same_bits(fpsim.matmul(a, b, accum="fp64", product="fp64"), ref)
    # exact products (float32 operands) are exact in the loop too
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    ref32 = np.array([[loop(a32[i].astype(float), b32[:, j].astype(float)) for j in range(3)]
                      for i in range(4)])
    assert same_bits(fpsim.matmul(a32, b32, accum="fp64"), ref32)


def gamma(n: int, u: float) -> float:
    return n * u / (1 - n * u)


def test_fp64_pairwise_is_the_float64_tree_and_close_to_numpy():
    rng = np.random.default_rng(5)
    K = 37
    a, b = rng.standard_normal((3, K)).astype(np.float32), rng.standard_normal((K, 2))
    b = b.astype(np.float32)

    def tree(terms):
        while len(terms) > 1:
            nxt = [terms[i] + terms[i + 1] for i in range(0, len(terms) - 1, 2)]
            terms = nxt + terms[-1:] if len(terms) % 2 else nxt
        return terms[0]

    got = fpsim.matmul(a, b, accum="fp64", order="pairwise")
    ref = np.array([[tree([float(x) * float(y) for x, y in zip(a[i], b[:, j])])
                     for j in range(2)] for i in range(3)])
    assert same_bits(got, ref)
    # numpy's BLAS sums in its own order: only the error bound relates the two
    bound = gamma(K, 2.0**-53) * (np.abs(a.astype(float)) @ np.abs(b.astype(float)))
    assert np.all(np.abs(got - a.astype(float) @ b.astype(float)) <= 2 * bound)


def test_fp32_pairwise_within_classical_bound():
    """Bit for bit against the Fraction tree (each node the exact sum rounded to FP32), and
    within the classical error bound."""
    rng = np.random.default_rng(6)
    K = 999                                          # odd at the first level and again later
    a, b = rng.standard_normal((2, K)).astype(np.float32), rng.standard_normal((K, 2))
    b = b.astype(np.float32)
    got = fpsim.matmul(a, b, accum="fp32", order="pairwise")
    seq = fpsim.matmul(a, b, accum="fp32")
    for i in range(2):
        for j in range(2):
            exact = sum(Fraction(float(x)) * Fraction(float(y)) for x, y in zip(a[i], b[:, j]))
            scale = sum(abs(Fraction(float(x)) * Fraction(float(y)))
                        for x, y in zip(a[i], b[:, j]))
            bound = gamma(math.ceil(math.log2(K)), 2.0**-24) * float(scale)
            assert abs(float(Fraction(float(got[i, j])) - exact)) <= bound
            assert same_bits(got[i, j], ref_pairwise(a[i], b[:, j], "fp32"))
    assert not same_bits(got, seq)                   # the order shows in the bits


@pytest.mark.parametrize("K, tree", [
    (3, lambda t, add: add(add(t[0], t[1]), t[2])),
    (5, lambda t, add: add(add(add(t[0], t[1]), add(t[2], t[3])), t[4])),
    (6, lambda t, add: add(add(add(t[0], t[1]), add(t[2], t[3])), add(t[4], t[5]))),
    (7, lambda t, add: add(add(add(t[0], t[1]), add(t[2], t[3])), add(add(t[4], t[5]), t[6]))),
])
def test_pairwise_tree_shape_written_out(K, tree):
    """The documented tree, written out by hand for small K (the odd term joins at the end of
    its level), on random e5m2 sums where other orders give other bits."""
    rng = np.random.default_rng(K)
    a = fpsim.quantize(rng.standard_normal((64, K)), "fp16").astype(np.float32)
    b = np.ones((K, 1), np.float32)
    got = fpsim.matmul(a, b, accum="e5m2", order="pairwise")[:, 0]
    fmt = get_format("e5m2")
    want = [tree([Fraction(float(x)) for x in row], lambda x, y: add_rounded(x, y, fmt, "rne"))
            for row in a]
    assert same_bits(got, np.array(want))
    assert not same_bits(got, fpsim.matmul(a, b, accum="e5m2")[:, 0])   # not the sequential sum


@pytest.mark.parametrize("accum", ["fp16", "bf16", "fp32"])
def test_chunked_equals_sequential_when_chunk_covers_k(accum):
    rng = np.random.default_rng(8)
    a = fpsim.quantize(rng.standard_normal((3, 40)) * 30, accum).astype(np.float32)
    b = fpsim.quantize(rng.standard_normal((40, 3)), accum).astype(np.float32)
    seq = fpsim.matmul(a, b, accum=accum)
    for chunk in (40, 41, 128):
        assert same_bits(fpsim.matmul(a, b, accum=accum, order="chunked", chunk=chunk), seq)


def test_chunked_promotes_blocks_into_fp32():
    rng = np.random.default_rng(9)
    a = fpsim.quantize(rng.random((2, 50)) * 40, "fp16")
    b = fpsim.quantize(rng.random((50, 2)), "fp16")
    got = fpsim.matmul(a, b, accum="fp16", order="chunked", chunk=16, rounding="rtz")
    fp32 = get_format("fp32")
    for i in range(2):
        for j in range(2):
            outer = -0.0
            for k0 in range(0, 50, 16):
                block = ref_dot(a[i, k0:k0 + 16], b[k0:k0 + 16, j], "fp16", "rtz")
                outer = add_rounded(outer, block, fp32, "rne")
            assert same_bits(got[i, j], outer)
    assert not same_bits(got, fpsim.matmul(a, b, accum="fp16", rounding="rtz"))


def test_fma_is_sequential_with_exact_products():
    rng = np.random.default_rng(10)
    a = adversarial("bf16", 20, rng, specials=False)[None, :]
    b = adversarial("bf16", 20, rng, specials=False)[:, None]
    for mode in ("rne", "rdown"):
        got = fpsim.matmul(a, b, accum="bf16", order="fma", rounding=mode)
        assert same_bits(got, fpsim.matmul(a, b, accum="bf16", rounding=mode))
        assert same_bits(got, ref_matmul(a, b, accum="bf16", mode=mode))
    with pytest.raises(ValueError, match="product='exact'"):
        fpsim.matmul(a, b, order="fma", product="fp16")


# ----------------------------------------------------------------------------------------------
# Statistics
# ----------------------------------------------------------------------------------------------
def test_stats_swamping_overflow_underflow():
    r, s = fpsim.dot([2048.0, 1, 1, 1, 1], [1.0, 1, 1, 1, 1], accum="fp16", return_stats=True)
    assert r == 2048 and s.swamped == 4 and s.max_partial == 2048 and not s.overflow
    r, s = fpsim.dot([300.0, 300.0], [300.0, 300.0], accum="fp16", return_stats=True)
    assert r == np.inf and s.overflow and s.max_partial == np.inf
    tiny = np.float32(2.0**-13)
    r, s = fpsim.dot(np.full(3, tiny), np.full(3, tiny), accum="fp32", product="fp16",
                     return_stats=True)
    assert r == 0 and s.underflow == 3 and s.swamped == 0
    a = np.array([[1.0, 1e-4, 1e-4], [1.0, -1.0, 0.5]], np.float32)
    r, s = fpsim.matmul(a, np.ones((3, 2), np.float32), accum="fp16", order="pairwise",
                        return_stats=True)
    assert s.swamped.shape == (2, 2) and list(s.swamped[:, 0]) == [2, 0]
    assert list(s.max_partial[:, 1]) == [1.0, 0.5]


# ----------------------------------------------------------------------------------------------
# Shapes, kinds and errors
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sa,sb", [((4,), (4,)), ((4,), (4, 3)), ((2, 4), (4,)), ((2, 4), (4, 3)),
                                   ((5, 2, 4), (4, 3)), ((2, 4), (5, 4, 3)),
                                   ((2, 1, 2, 4), (3, 4, 3)), ((0, 4), (4, 2)), ((2, 0), (0, 3))])
def test_numpy_matmul_shapes(sa, sb):
    """NumPy's shape rules (1-D operands, broadcast batches, empty axes), each dot product
    checked bit for bit against the left-to-right reference on values whose sums depend on
    the order (1 + 2^-11 + 2^-11 in FP16 is 1 one way and 1 + 2^-10 the other)."""
    rng = np.random.default_rng(11)
    terms = np.float32([1.0, 2.0**-11, 2.0**-11, -1.0, 2.0**-12, 3.0, -0.75, 2.0**-13])
    a, b = rng.choice(terms, sa), rng.choice(terms, sb)
    for accum in ("fp16", "fp64"):
        got = fpsim.matmul(a, b, accum=accum)
        ref = matmul_by_shape_rules(a, b, accum)
        assert got.shape == ref.shape and same_bits(got, ref)
        assert got.dtype == (np.float64 if accum == "fp64" else np.float32)
    a, b = np.float32([[1.0, 2.0**-11, 2.0**-11]]), np.float32([[1.0], [1.0], [1.0]])
    assert fpsim.matmul(a, b, accum="fp16").tolist() == [[1.0]]            # not 1 + 2^-10
    assert fpsim.matmul(a[:, ::-1], b, accum="fp16").tolist() == [[1 + 2.0**-10]]


def matmul_by_shape_rules(a: np.ndarray, b: np.ndarray, accum: str) -> np.ndarray:
    """np.matmul's shapes, every entry a :func:`ref_dot` (left to right)."""
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    A = np.broadcast_to(a2, batch + a2.shape[-2:])
    B = np.broadcast_to(b2, batch + b2.shape[-2:])
    out = np.zeros(batch + (a2.shape[-2], b2.shape[-1]))
    for idx in np.ndindex(*batch):
        if out[idx].size and a2.shape[-1]:           # an empty sum is +0, as in np.matmul
            out[idx] = ref_matmul(A[idx], B[idx], accum=accum)
    if a.ndim == 1:
        out = out[..., 0, :]
    if b.ndim == 1:
        out = out[..., 0]
    return out


def test_inputs_and_output_rounding():
    rng = np.random.default_rng(12)
    a, b = rng.standard_normal((3, 6)), rng.standard_normal((6, 2))
    got = fpsim.matmul(a, b, inputs=("fp16", "e4m3"), accum="fp32", output="bf16")
    qa, qb = fpsim.quantize(a, "fp16"), fpsim.quantize(b, "e4m3")
    ref = fpsim.quantize(ref_matmul(qa, qb, accum="fp32"), "bf16")
    assert same_bits(got, ref)


def test_stochastic_rounding_is_seeded_and_brackets_the_sum():
    a = np.array([1.0, 2.0**-11 + 2.0**-13], np.float32)
    draws = {float(fpsim.dot(a, [1.0, 1.0], accum="fp16", rounding="stochastic", seed=s))
             for s in range(40)}
    assert draws == {1.0, 1.0 + 2.0**-10}
    x = np.random.default_rng(0).standard_normal((3, 30)).astype(np.float32)
    one = fpsim.matmul(x, x.T, accum="bf16", rounding="stochastic", seed=5)
    assert same_bits(one, fpsim.matmul(x, x.T, accum="bf16", rounding="stochastic", seed=5))


@pytest.mark.parametrize("kwargs,match", [
    (dict(accum="fp17"), "accum: unknown format"),
    (dict(accum="int8"), "integer format"),
    (dict(order="random"), "unknown order"),
    (dict(order="chunked", chunk=0), "positive integer"),
    (dict(chunk=64), "chunk applies to"),
    (dict(accum="fp64", rounding="rtz"), "float64's own additions"),
    (dict(rounding="nearest"), "unknown rounding mode"),
    (dict(order="tensor_core"), "needs tensor_core="),
    (dict(tensor_core="hopper_fp8"), "needs order='tensor_core'"),
    (dict(order="tensor_core", tensor_core="h100"), "unknown tensor_core"),
    (dict(order="tensor_core", tensor_core="hopper_fp8", chunk=48), "multiple of"),
    (dict(order="tensor_core", tensor_core="hopper_fp8", accum="fp16"), "from the TensorCore"),
    (dict(backend="gpu"), "unknown backend"),
    (dict(backend="compiled", rounding="stochastic"), "cannot draw random bits"),
])
def test_bad_options_name_the_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fpsim.matmul(np.ones((2, 3)), np.ones((3, 2)), **kwargs)


def test_bad_operands_name_the_problem():
    with pytest.raises(ValueError, match="a has 3 columns but b has 4 rows"):
        fpsim.matmul(np.ones((2, 3)), np.ones((4, 2)))
    with pytest.raises(ValueError, match="at least one dimension"):
        fpsim.matmul(np.float32(2.0), np.ones(3))
    with pytest.raises(ValueError, match="do not broadcast"):
        fpsim.matmul(np.ones((2, 2, 3)), np.ones((3, 3, 2)))
    with pytest.raises(ValueError, match="not exact in float64.*inputs='fp32'"):
        fpsim.matmul(np.full((1, 2), 0.1), np.full((2, 1), 0.1))
    with pytest.raises(TypeError, match="pass real numbers"):
        fpsim.matmul(np.ones((2, 2), complex), np.ones((2, 2)))
    with pytest.raises(ValueError, match="dot takes two vectors"):
        fpsim.dot(np.ones((2, 2)), np.ones(2))


# ----------------------------------------------------------------------------------------------
# torch
# ----------------------------------------------------------------------------------------------
torch = pytest.importorskip("torch")

CONFIGS = [dict(accum="fp16", rounding="rtz"), dict(accum="bf16", order="pairwise"),
           dict(accum="fp16", order="chunked", chunk=8, inputs="e4m3"),
           dict(accum="fp32", product="bf16", rounding="rup"),
           dict(order="tensor_core", tensor_core="hopper_fp8", inputs="e5m2", chunk=32)]


@pytest.mark.parametrize("config", CONFIGS)
def test_torch_tensors_give_the_numpy_bits(config):
    rng = np.random.default_rng(13)
    a = (rng.standard_normal((2, 5, 40)) * 8).astype(np.float32)
    b = (rng.standard_normal((40, 3)) * 8).astype(np.float32)
    ref, ref_stats = fpsim.matmul(a, b, return_stats=True, **config)
    got, stats = fpsim.matmul(torch.from_numpy(a).to(torch.bfloat16), torch.from_numpy(b),
                              return_stats=True, **config)
    ref_bf = fpsim.matmul(torch.from_numpy(a).to(torch.bfloat16).float().numpy(), b, **config)
    assert isinstance(got, torch.Tensor) and same_bits(got.numpy(), ref_bf)
    got32, stats32 = fpsim.matmul(torch.from_numpy(a), torch.from_numpy(b), return_stats=True,
                                  backend="torch", **config)
    assert same_bits(got32.numpy(), ref)
    for name in ("overflow", "max_partial", "swamped", "underflow"):
        assert np.array_equal(getattr(stats32, name).numpy(), getattr(ref_stats, name)), name


def test_torch_stochastic_rounding_is_seeded():
    x = torch.from_numpy(np.random.default_rng(1).standard_normal((4, 40)).astype(np.float32))
    one = fpsim.matmul(x, x.T, accum="bf16", rounding="stochastic", seed=3)
    assert torch.equal(one, fpsim.matmul(x, x.T, accum="bf16", rounding="stochastic", seed=3))
    nearest = fpsim.matmul(x, x.T, accum="bf16")
    scale = x.abs() @ x.abs().T
    assert not torch.equal(one, nearest) and bool(((one - nearest).abs() <= scale / 16).all())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
@pytest.mark.parametrize("config", CONFIGS)
def test_cuda_gives_the_cpu_bits(config):
    rng = np.random.default_rng(14)
    a, b = rng.standard_normal((4, 64)).astype(np.float32), rng.standard_normal((64, 5))
    b = b.astype(np.float32)
    got = fpsim.matmul(torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda(), **config)
    assert got.device.type == "cuda"
    assert same_bits(got.cpu().numpy(), fpsim.matmul(a, b, **config))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit internals on import
def test_compiled_engine_gives_the_same_bits():
    """One configuration (compiling takes seconds): adversarial data, two tile shapes."""
    rng = np.random.default_rng(15)
    a = np.stack([adversarial("fp16", 30, rng) for _ in range(5)]).astype(np.float32)
    b = np.stack([adversarial("fp16", 30, rng) for _ in range(4)], axis=1).astype(np.float32)
    config = dict(accum="fp16", rounding="rtz")
    for rows in (5, 2):
        got = fpsim.matmul(a[:rows], b, backend="compiled", **config)
        assert isinstance(got, np.ndarray)
        assert same_bits(got, fpsim.matmul(a[:rows], b, **config))


@pytest.mark.slow
def test_stochastic_accumulation_is_unbiased():
    """Small addends into an FP16 sum: stochastic rounding keeps the mean exact (round-to-odd
    first would round 2^-30 up as often as a quarter ulp)."""
    tiny = np.tile(np.float32([1, 2**-30]), (100_000, 1))
    up = fpsim.matmul(tiny, np.ones((2, 1), np.float32), accum="fp16", rounding="stochastic",
                      seed=0)
    assert (up > 1).sum() <= 3                         # expected 100000 * 2^-20 = 0.1
    K, rows = 2000, 20_000
    a = np.concatenate([[1.0], np.full(K, 2.0**-12)]).astype(np.float32)[None, :].repeat(rows, 0)
    r = fpsim.matmul(a, np.ones((K + 1, 1), np.float32), accum="fp16", rounding="stochastic",
                     seed=1)
    exact = 1 + K * 2.0**-12
    # each output is a sum of K independent steps of at most 2^-10 spread: sd <= 2^-10 sqrt(K)
    assert abs(r.mean() - exact) < 5 * 2.0**-10 * np.sqrt(K / rows)
    assert set(np.unique(fpsim.quantize(r, "fp16") == r)) == {True}  # results are FP16 values


def test_threaded_tiles_keep_floating_point_warnings_quiet():
    """inf * 0 and inf - inf inside the emulated sums are expected: no RuntimeWarning may reach
    the caller, from the worker threads either (NumPy's errstate does not cross threads)."""
    import warnings

    rng = np.random.default_rng(3)
    a = rng.standard_normal((600, 8))
    b = rng.standard_normal((8, 600))
    a[::7, 0], b[0, ::5] = np.inf, 0.0
    b[1, ::3] = -np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for kw in ({"inputs": "fp16", "accum": "fp16"}, {"inputs": "e4m3", "order": "tensor_core",
                                       "tensor_core": "hopper_fp8"}):
            out = fpsim.matmul(a, b, **kw)
            assert np.isnan(out).any() and np.isfinite(out).any()


# ----------------------------------------------------------------------------------------------
# One float64 addition then one rounding (fused.py) against the round-to-odd adder
# ----------------------------------------------------------------------------------------------
def _boundary_sums(fmt: Format, sig: int) -> tuple[np.ndarray, np.ndarray]:
    """Every finite value x of ``fmt`` with addends y of ``sig`` significant bits that bring
    x + y onto, or 1-2 units of y's last bit either side of, the rounding boundary just above
    and just below x (midpoints, and max + half a spacing): where float64's sum could land
    on a boundary the exact sum is not."""
    v = fpsim.values(fmt)
    top = np.concatenate([v, [fmt.max + (fmt.max - v[-2])]])        # one spacing beyond max
    mids = (top[1:] + top[:-1]) / 2
    lanes = Format("lanes", 11, sig - 1)
    xs, ys = [], []
    for x, mu in ((v[:-1], mids[:-1]), (v[1:], mids[:-1]), (v, mids)):
        y = fpsim.quantize(mu - x, lanes)
        for k in (-2, -1, 0, 1, 2):
            step = np.abs(y) * 2.0**(1 - sig)                          # about y's last bit
            xs.append(x)
            ys.append(y + k * np.where(y == 0, 2.0**-60, step))
    return np.concatenate(xs), fpsim.quantize(np.concatenate(ys), lanes)


@pytest.mark.parametrize("name, sig", [("fp16", 22), ("fp16", 41), ("e5m3", 30)])
@pytest.mark.parametrize("mode", ["rne", "rna"])
def test_one_float64_rounding_equals_round_to_odd_at_every_boundary(name, sig, mode):
    """fused.OneRounding against accumulate.Adder (TwoSum, round to odd, one rounding) on sums
    built to land float64 on each of the format's midpoints and its overflow threshold, with
    addends of up to the proof's largest significant-bit count (51 - mbits)."""
    from fpsim.arith import accumulate, fused
    from fpsim.arith.lanes import Lanes
    from fpsim.rounding import F64

    fmt = get_format(name)
    assert sig <= 51 - fmt.mbits and fmt.emin - fmt.mbits >= fmt.emax - 52
    x, y = _boundary_sums(fmt, sig)
    x, y = np.concatenate([x, -x]), np.concatenate([y, -y])
    lanes = Lanes(F64)
    with np.errstate(invalid="ignore", over="ignore"):
        want = accumulate.Adder(fmt, mode, lanes, None, plain=False, may_overflow=False)(x, y)
        got = fused.OneRounding(fmt, mode, lanes)(x, y)
    assert np.array_equal(got.view(np.int64), want.view(np.int64))


@pytest.mark.parametrize("order", ["sequential", "chunked", "pairwise"])
def test_fp16_matmul_one_rounding_path_equals_round_to_odd_path(order, monkeypatch):
    """The FP16-accumulated product through float64's own sums (fused.py) gives the bits of
    the round-to-odd path, on operands spanning FP16's range (subnormal products included) and
    long cancelling sums."""
    from fpsim.arith import fused

    rng = np.random.default_rng(3)
    a = (rng.standard_normal((24, 300)) * 2.0 ** rng.integers(-14, 8, (24, 300)))
    b = (rng.standard_normal((300, 20)) * 2.0 ** rng.integers(-14, 6, (300, 20)))
    a, b = a.astype(np.float16), b.astype(np.float16)
    a[:, 150:] = -a[:, :150]                                     # long cancellations
    kw = dict(accum="fp16", order=order, chunk=None if order != "chunked" else 64,
              backend="numpy")
    got = fpsim.matmul(a, b, **kw)
    used = []
    applies = fused.applies
    monkeypatch.setattr(fused, "applies", lambda *x: used.append(applies(*x)) or False)
    want = fpsim.matmul(a, b, **kw)
    assert used and (used[0] or order == "pairwise")
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_boundary_sums_find_double_rounding_beyond_the_proofs_bound():
    """The sums above are adversarial: with addends of 44 significant bits (beyond FP16's
    bound of 41) float64's sum does land on boundaries, and one rounding after it is wrong."""
    from fpsim.arith import accumulate, fused
    from fpsim.arith.lanes import Lanes
    from fpsim.rounding import F64

    fmt = get_format("fp16")
    x, y = _boundary_sums(fmt, 44)
    with np.errstate(invalid="ignore", over="ignore"):
        want = accumulate.Adder(fmt, "rne", Lanes(F64), None, plain=False, may_overflow=False)(x, y)
        got = fused.OneRounding(fmt, "rne", Lanes(F64))(x, y)
    assert not np.array_equal(got.view(np.int64), want.view(np.int64))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_profile_measures_a_tensor_on_its_device_as_numpy_does(dtype):
    """The lanes' measure of a torch tensor (taken where the tensor lives, no host copy) equals
    NumPy's, chunk boundaries included, and a hand count on a small case."""
    torch = pytest.importorskip("torch")
    from fpsim.arith.lanes import EMPTY, Profile, profile

    # 0.75 = 3 * 2^-2 (2 bits), 2^-149 / 2^-1074 the smallest subnormal, max finite (24/53 bits)
    tiny = np.finfo(dtype).smallest_subnormal
    big = np.finfo(dtype).max
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 0.75, -tiny, big], dtype)
    rng = np.random.default_rng(5)
    x = np.concatenate([special, rng.standard_normal(1000).astype(dtype), special])
    for chunk in (None, 7):
        want = profile(x, chunk)
        assert profile(torch.from_numpy(x), chunk) == want
    mbits = np.finfo(dtype).nmant + 1
    emin = int(np.log2(np.finfo(dtype).smallest_normal)) - (mbits - 1)
    assert want.sig == mbits and want.low == emin and want.high == np.finfo(dtype).maxexp - 1
    assert profile(torch.tensor([0.75, -1.5], dtype=torch.float32)) == Profile(2, -2, 0)
    assert profile(torch.tensor([0.0, np.nan, np.inf])) == EMPTY
