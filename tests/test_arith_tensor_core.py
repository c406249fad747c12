"""The tensor-core model against a plain-Python fused dot-add, and DeepSeek-V3's observation."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

import fpsim
from fpsim import get_format
from fpsim.arith import TENSOR_CORES, TensorCoreModel
from test_arith import add_rounded, round_fraction, same_bits

FP32 = get_format("fp32")


def exponent(x: float, emin: int) -> int:
    """floor(log2|x|), clamped at the format's least normal exponent (zeros: -126, MMA-Sim)."""
    return -126 if x == 0 else max(math.frexp(x)[1] - 1, emin)


def ref_tensor_core(xs, ys, model: TensorCoreModel, emin_a: int, emin_b: int,
                    chunk: int | None = None, c: float = 0.0) -> float:
    """MMA-Sim's fused dot-add, group after group, with exact rationals, from C = ``c``."""
    fmt, f = model.accum_format, model.frac_bits
    acc, outer = (0.0, c) if chunk else (c, -0.0)
    for g0 in range(0, len(xs), model.group):
        if chunk and g0 and g0 % chunk == 0:
            outer = add_rounded(outer, acc, FP32, "rne")
            acc = 0.0
        terms = [(Fraction(float(x)) * Fraction(float(y)),
                  exponent(float(x), emin_a) + exponent(float(y), emin_b))
                 for x, y in zip(xs[g0:g0 + model.group], ys[g0:g0 + model.group])]
        if model.align_accumulator:
            terms.append((Fraction(acc), exponent(acc, fmt.emin)))
        top = max((e for _, e in terms), default=0)
        quantum = Fraction(2) ** (top - f)
        total = sum((int(t / quantum) for t, _ in terms), 0) * quantum   # int(): toward zero
        if not model.align_accumulator:
            acc = add_rounded(acc, total, fmt, model.rounding)
        else:
            acc = round_fraction(total, fmt, model.rounding) if total else 0.0
            if abs(total) >= Fraction(2) ** (fmt.emax + 1):     # the exponent overflows: inf
                acc = math.copysign(math.inf, total)
    if chunk:
        return add_rounded(outer, acc, FP32, "rne")
    return acc


def operands(fmt: str, M: int, K: int, N: int, seed: int, positive: bool = False):
    rng = np.random.default_rng(seed)
    scale = np.exp2(rng.integers(-6, 6, (M, K)))              # spread the exponents
    a = rng.standard_normal((M, K)) * scale
    b = rng.standard_normal((K, N))
    if positive:
        a, b = np.abs(a), np.abs(b)
    return fpsim.quantize(a, fmt), fpsim.quantize(b, fmt)


CASES = [("hopper_fp8", "e4m3", None), ("hopper_fp8", "e5m2", 64), ("hopper_fp16", "fp16", None),
         ("volta_fp16", "fp16", None), ("ampere_bf16", "bf16", 16),
         (TensorCoreModel(8, 10, "fp16", "rne", align_accumulator=False), "e4m3", None)]


@pytest.mark.parametrize("model,fmt,chunk", CASES)
def test_tensor_core_matches_reference(model, fmt, chunk):
    a, b = operands(fmt, 3, 70, 2, seed=len(fmt))
    got = fpsim.matmul(a, b, inputs=fmt, order="tensor_core", tensor_core=model, chunk=chunk)
    model = TENSOR_CORES.get(model, model)
    emin = get_format(fmt).emin
    ref = [[ref_tensor_core(a[i], b[:, j], model, emin, emin, chunk) for j in range(2)]
           for i in range(3)]
    assert same_bits(got, np.array(ref))


def test_tensor_core_zeros_and_overflow_follow_mma_sim():
    """A zero times 2^127 still sets the alignment (MMA-Sim gives zeros the least exponent), and
    a truncated FP32 result beyond FP32's range is inf, which the statistics report."""
    a, b = np.float32([0, 2**-15]), np.float32([2**127, 2**-15])
    assert fpsim.matmul(a, b, inputs="bf16", order="tensor_core", tensor_core="ampere_bf16") == 0
    y, st = fpsim.matmul(np.float32([[1e20]]), np.float32([[1e20]]), inputs="bf16",
                         order="tensor_core", tensor_core="hopper_bf16", return_stats=True)
    assert np.isinf(y[0, 0]) and y[0, 0] > 0 and st.overflow[0, 0]


def test_tensor_core_propagates_inf_and_nan():
    a = np.array([[1.0, np.inf, 2.0], [np.inf, 1.0, 1.0]], np.float32)
    b = np.array([[1.0], [1.0], [-np.inf]], np.float32)
    got = fpsim.matmul(a, b, order="tensor_core", tensor_core="hopper_fp16")
    assert np.isnan(got[0, 0]) and np.isnan(got[1, 0])


def max_relative_error(K: int, chunk: int | None) -> float:
    a, b = operands("e4m3", 4, K, 4, seed=K, positive=True)
    got = fpsim.matmul(a, b, order="tensor_core", tensor_core="hopper_fp8", chunk=chunk)
    exact = a @ b                                            # float64: exact for these sums
    return float(np.max(np.abs(got - exact) / exact))


def test_hopper_fp8_error_grows_with_k_and_promotion_bounds_it():
    """DeepSeek-V3 §3.3.2: without promotion the error grows with K; promoting partial sums
    to FP32 every 128 products keeps it at the level of a single 128-term block."""
    plain = [max_relative_error(K, None) for K in (256, 1024, 4096)]
    promoted = [max_relative_error(K, 128) for K in (256, 1024, 4096)]
    assert plain[0] < plain[1] < plain[2]
    assert max(promoted) < 2.0**-9 and promoted[2] <= 1.5 * promoted[0]
    assert plain[2] > 16 * max(promoted)


def test_presets_follow_mma_sim():
    assert {m.frac_bits for n, m in TENSOR_CORES.items() if "fp8" not in n and "mx" not in n
            and m.structure != "fma"} == {23, 24, 25}
    fma = {n for n, m in TENSOR_CORES.items() if m.structure == "fma"}
    assert fma == {"ampere_fp64", "hopper_fp64", "cdna1_fp32", "cdna2_fp32", "cdna2_fp64",
                   "cdna3_fp32", "cdna3_fp64"}
    assert all(TENSOR_CORES[n].group == 1 and not TENSOR_CORES[n].canonical_nan for n in fma)
    assert TENSOR_CORES["cdna3_fp16_k4"].group == 4 and TENSOR_CORES["cdna3_fp16"].group == 8
    assert TENSOR_CORES["cdna2_bf16_k2"].group == 2 and TENSOR_CORES["cdna2_bf16"].group == 4
    assert TENSOR_CORES["blackwell_mxf4nvf4"].frac_bits == 35
    assert TENSOR_CORES["volta_fp16"].frac_bits == 23
    assert TENSOR_CORES["hopper_fp8"].frac_bits == TENSOR_CORES["ada_fp8"].frac_bits == 13
    assert TENSOR_CORES["hopper_fp8"].accum_format.mbits == 13
    assert TENSOR_CORES["hopper_fp8"].group == 32 and TENSOR_CORES["hopper_fp16"].group == 16
    with pytest.raises(ValueError, match="frac_bits"):
        TensorCoreModel(16, 60)
    with pytest.raises(ValueError, match="product='exact'"):
        fpsim.matmul(np.ones((1, 2)), np.ones((2, 1)), order="tensor_core",
                     tensor_core="hopper_fp8", product="fp16")


@pytest.mark.parametrize("aligned", [True, False])
def test_stochastic_tensor_core_model_is_seeded(aligned):
    model = TensorCoreModel(8, 10, "fp16", "stochastic", align_accumulator=aligned)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((16, 64)).astype(np.float32)
    b = rng.standard_normal((64, 16)).astype(np.float32)
    x, y, z = (fpsim.matmul(a, b, inputs="e4m3", order="tensor_core", tensor_core=model, seed=s)
               for s in (5, 5, 6))
    assert np.array_equal(x, y) and not np.array_equal(x, z)


def test_zero_operands_align_at_minus_126():
    """Issue 17's reproducers: MMA-Sim gives a zero operand exponent -126, so 0 x 448 does not
    cut off the low bits of the real products (fpsim used the format's least exponent)."""
    z = 1.875 * 2**-6
    for preset in ("hopper_fp8", "ada_fp8"):
        got = fpsim.matmul(np.array([0, z]), np.array([448, z]), inputs="e4m3",
                           order="tensor_core", tensor_core=preset)
        assert float(got).hex() == "0x1.c200000000000p-11"
    x = (1 + 2**-10) * 2**-12
    for preset in ("hopper_fp16", "turing_fp16"):
        got = fpsim.matmul(np.array([0, x]), np.array([1, x]), inputs="fp16",
                           order="tensor_core", tensor_core=preset)
        assert float(got).hex() == "0x1.0080100000000p-24"


@pytest.mark.parametrize("preset", ["hopper_bf16", "ampere_fp16_f16", "hopper_fp8"])
def test_zero_results_are_positive_and_nan_is_canonical(preset):
    """A negative sum truncated to zero, and a sum of -0 terms, are +0 (MMA-Sim); NaN is
    NVIDIA's 0x7FFFFFFF (0x7FFF once cast to FP16)."""
    a = np.array([[-2.0**-75, 0.0], [-0.0, -0.0], [np.inf, 1.0]])
    b = np.array([[2.0**-75], [2.0**-30]])
    c = np.array([[0.0], [-0.0], [0.0]])
    for engine in ("numpy", "torch"):
        got = np.asarray(fpsim.matmul(a, b, c=c, order="tensor_core", tensor_core=preset,
                                      backend=engine))
        assert got[0, 0] == 0 and not np.signbit(got[0, 0]) and not np.signbit(got[1, 0])
        got = np.asarray(fpsim.matmul(a, np.array([[0.0], [1.0]]), order="tensor_core",
                                      tensor_core=preset, backend=engine))
        assert got.view(np.uint32)[2, 0] == 0x7FFFFFFF
        assert got.astype(np.float16).view(np.uint16)[2, 0] == 0x7FFF


@pytest.mark.parametrize("model,fmt,chunk", CASES)
def test_tensor_core_adds_c(model, fmt, chunk):
    """D = A·B + C: C is the first instruction's accumulator (FP32 outer sum with chunk)."""
    a, b = operands(fmt, 3, 40, 2, seed=7)
    c = np.array([[1.5, -2.0**-20], [0.0, 3e4], [-7.25, 2.0**-140]])
    got = fpsim.matmul(a, b, c=c, inputs=fmt, order="tensor_core", tensor_core=model,
                       chunk=chunk)
    model = TENSOR_CORES.get(model, model)
    emin = get_format(fmt).emin
    cq = fpsim.quantize(c, "fp32" if chunk else model.c_format)
    ref = [[ref_tensor_core(a[i], b[:, j], model, emin, emin, chunk, cq[i, j]) for j in range(2)]
           for i in range(3)]
    assert same_bits(got, np.array(ref))


def seq_sum(terms, fmt, start):
    acc = start
    for t in terms:
        acc = add_rounded(acc, t, fmt, "rne")
    return acc


@pytest.mark.parametrize("order", ["sequential", "pairwise", "chunked"])
def test_c_starts_or_ends_the_sum(order):
    """sequential: C starts the sum; pairwise: C is added to the tree's sum; chunked: C
    starts the FP32 outer sum."""
    a, b = operands("bf16", 2, 300, 3, seed=3)
    c = np.float32([[1e3], [-2.5]])                       # broadcast over N
    got = fpsim.matmul(a, b, c=c, accum="bf16", order=order)
    bf16 = get_format("bf16")
    for i in range(2):
        ci = float(c[i, 0])
        for j in range(3):
            p = [float(x) for x in a[i] * b[:, j]]
            if order == "pairwise":
                tree = float(fpsim.matmul(a[i], b[:, j], accum="bf16", order="pairwise"))
                want = add_rounded(ci, tree, bf16, "rne")
            elif order == "sequential":
                want = seq_sum(p, bf16, float(fpsim.quantize(ci, "bf16")))
            else:
                want = ci
                for k in range(0, len(p), 128):
                    want = add_rounded(want, seq_sum(p[k:k + 128], bf16, -0.0), FP32, "rne")
            assert same_bits(np.float32(got[i, j]), np.float32(want))


def test_c_must_broadcast():
    with pytest.raises(ValueError, match="c has shape"):
        fpsim.matmul(np.ones((2, 3)), np.ones((3, 4)), c=np.ones((3, 4)))


def ref_fma_chain(xs, ys, c: float, accum: str) -> float:
    """MMA-Sim's FP64/FP32 instructions: acc = fma(x, y, acc) left to right from C, each
    rounded once (FP64: test_fma's Fraction reference; FP32: the exact product added)."""
    from test_fma import ref_fma

    acc = c
    for x, y in zip(xs, ys):
        if accum == "fp64":
            acc = ref_fma(float(x), float(y), acc)
        else:
            from test_arith import exact_product
            acc = add_rounded(acc, exact_product(float(x), float(y)), FP32, "rne")
    return acc


@pytest.mark.parametrize("preset", ["ampere_fp64", "hopper_fp64", "cdna2_fp64", "cdna3_fp64",
                                    "cdna1_fp32", "cdna3_fp32"])
def test_fma_presets_chain_fused_multiply_adds(preset):
    """FP64 (DMMA, FP64 MFMA) and FP32 MFMA: one correctly rounded fma per product, in
    order, from C; wide exponents, cancellation, subnormals, zeros and inf."""
    model = TENSOR_CORES[preset]
    fmt = model.accum_format.name
    rng = np.random.default_rng(len(preset))
    M, K, N = 5, 13, 4
    lo, hi = (-540, 500) if fmt == "fp64" else (-75, 60)
    a = rng.standard_normal((M, K)) * np.exp2(rng.integers(lo, hi, (M, K)))
    b = rng.standard_normal((K, N)) * np.exp2(rng.integers(lo, hi, (K, N)) // 4)
    a, b = fpsim.quantize(a, fmt), fpsim.quantize(b, fmt)
    a[0, 3], a[1, :] = 0.0, -0.0
    a[2, 4] = np.inf
    b[:, 0] = abs(b[:, 0])
    b[:, 1] = -b[:, 0]
    a[3] = a[4]
    b[5, :] = 2.0 ** get_format(fmt).emin
    c = fpsim.quantize(rng.standard_normal((M, N)) * np.exp2(rng.integers(lo, hi, (M, N))), fmt)
    c[1, :] = -0.0
    c[4] = -fpsim.quantize(a[4].astype(np.float64) @ b.astype(np.float64), fmt)
    got = fpsim.matmul(a, b, c=c, order="tensor_core", tensor_core=preset)
    assert got.dtype == (np.float64 if fmt == "fp64" else np.float32)
    want = np.array([[ref_fma_chain(a[i], b[:, j], float(c[i, j]), fmt) for j in range(N)]
                     for i in range(M)])
    assert same_bits(got, want)
    assert np.signbit(got[1, 0]) and not np.signbit(got[1, 1])  # IEEE: -0·x + -0 is -0


def test_fp64_presets_need_numpy_and_no_chunk():
    torch = pytest.importorskip("torch")
    a = torch.ones((2, 4), dtype=torch.float64)
    with pytest.raises(ValueError, match="NumPy backend only"):
        fpsim.matmul(a, a.T, order="tensor_core", tensor_core="hopper_fp64", backend="torch")
    got = fpsim.matmul(a, a.T, order="tensor_core", tensor_core="hopper_fp64")   # CPU: NumPy
    assert torch.equal(got, torch.full((2, 2), 4.0, dtype=torch.float64))
    with pytest.raises(ValueError, match="FP64 already"):
        fpsim.matmul(np.ones((2, 8)), np.ones((8, 2)), order="tensor_core",
                     tensor_core="ampere_fp64", chunk=4)


@pytest.mark.parametrize("preset", ["ampere_tf32", "hopper_tf32", "cdna3_xf32"])
def test_tf32_presets_truncate_fp32_operands(preset):
    """TF32/XF32 instructions read the top 19 bits of each FP32 operand (MMA-Sim's
    truncate_to_tf32): raw FP32 operands give the result of their bit-truncated copies,
    which differs from rounding them to nearest first."""
    rng = np.random.default_rng(9)
    a = rng.standard_normal((4, 16)).astype(np.float32)
    b = rng.standard_normal((16, 3)).astype(np.float32)
    cut = [(x.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32) for x in (a, b)]
    options = dict(order="tensor_core", tensor_core=preset)
    got = fpsim.matmul(a, b, **options)
    assert same_bits(got, fpsim.matmul(*cut, **options))
    assert not same_bits(got, fpsim.matmul(a, b, inputs="tf32", **options))
