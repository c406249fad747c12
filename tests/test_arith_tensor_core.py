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
    """floor(log2|x|), clamped at the format's least normal exponent (zeros: that exponent)."""
    return emin if x == 0 else max(math.frexp(x)[1] - 1, emin)


def ref_tensor_core(xs, ys, model: TensorCoreModel, emin_a: int, emin_b: int,
                    chunk: int | None = None) -> float:
    """MMA-Sim's fused dot-add, group after group, with exact rationals."""
    fmt, f = model.accum_format, model.frac_bits
    acc, outer = 0.0, -0.0
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
    assert {m.frac_bits for n, m in TENSOR_CORES.items() if "fp8" not in n} == {23, 24, 25}
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
