"""A model of tensor-core accumulation: exact products, aligned and truncated in groups.

One tensor-core instruction (an MMA with reduction depth ``group``) computes D = A·B + C as a
fused dot-add: every product is exact; the products and the running accumulator C are aligned
to the largest exponent among them and each is truncated (toward zero) to ``frac_bits`` bits
below that exponent; the aligned terms are summed exactly; the sum is rounded to the
accumulator format.  This follows microsoft/MMA-Sim (Peichen Xie et al., "MMA-Sim: Bit-Accurate
Reference Model of Tensor Cores and Matrix Cores", arXiv 2511.10909, ``nv_fused_dot_add``), and
is checked bit for bit against MMA-Sim's outputs (``tests/test_tensor_core_fixture.py``):

* a product's exponent is the sum of its operands' exponents, each clamped at its format's
  least normal exponent (so a product's significand lies in [1, 4)); a zero operand counts with
  exponent -126 whatever its format (MMA-Sim's ``extract_significand_exponent``), so a zero
  times a huge operand can still set the alignment;
* FP32 results are truncated toward zero (FP16 results round to nearest even); a result whose
  exponent exceeds the format's is ±inf, not the largest finite value (MMA-Sim truncates the
  significand only);
* a zero result is +0, also when it is a negative sum truncated to zero or a sum of -0 terms:
  MMA-Sim rebuilds the result from an integer significand (``math.trunc``/``round``), which
  has no sign; we found no hardware data that says otherwise;
* a NaN result is NVIDIA's canonical NaN, 0x7FFFFFFF in FP32 (0x7FFF in FP16) as MMA-Sim
  returns it (``canonical_nan``);
* fraction bits kept: Volta 23, Turing/Ampere/Ada 24, Hopper/Blackwell 25 for FP16/BF16/TF32;
  Ada and Hopper FP8 keep 13 and also truncate the FP32 result to 13 fraction bits (E8M13).

The AMD models (CDNA1/2 FMA trees, CDNA3 fused sums cut toward -inf) and the block-scaled
Blackwell instructions are variants of the same step, described by the fields of
``TensorCoreModel`` (``fpsim tensor-cores NAME`` prints them).  FP64 instructions (NVIDIA
DMMA, AMD FP64 MFMA) and AMD's FP32 MFMA are chains of correctly rounded fused multiply-adds
(``structure="fma"``; FP64 through ``fpsim.arith.fma.fma``, NumPy only).  TF32 and XF32
presets truncate FP32 operands to TF32 first, as MMA-Sim does (``truncate``).

DeepSeek-V3 (arXiv 2412.19437, §3.3.2) measured the same effect on H800: FP8 GEMM accumulation
retains about 14 bits, giving a maximum relative error of nearly 2% at K = 4096; their fix is
to promote partial sums to FP32 every N_C = 128 elements (``chunk=128`` here).
"""

from __future__ import annotations

import math

from typing import Any, Callable

import numpy as np

from ..convert import quantize
from ..formats import Format, get_format
from ..rounding import F64
from .accumulate import Adder, Operands, Stats, Steps, compile_step, counted
from .fma import fma
from .lanes import Lanes
from .tc_models import RUN, TENSOR_CORES, TensorCoreModel, get_model

__all__ = ["TENSOR_CORES", "TensorCoreModel", "get_model", "GroupStep", "run", "exponents",
           "canonical_nan"]

#: The exponent MMA-Sim gives a zero operand, whatever its format (extract_significand_exponent).
ZERO_EXPONENT = -126


def exponents(lanes: Lanes, x: Any, emin: int) -> Any:
    """floor(log2|x|) clamped at ``emin`` (the operand format's least normal exponent); zeros
    get -126 whatever the format (MMA-Sim's extract_significand_exponent)."""
    xp = lanes.xp
    mbits, top = (52, 0x7FF) if lanes.src is F64 else (23, 0xFF)
    # the exponent field (not frexp, which torch.compile's CPU code cannot vectorise); inf and
    # NaN get a large exponent, but their outputs are replaced by the non-finite sum anyway
    e = ((lanes.bits(x) >> mbits) & top) - (top >> 1)
    e = xp.maximum(e, xp.full_like(e, emin)) if lanes.torch else xp.maximum(e, emin)
    return xp.where(x == 0, xp.full_like(e, ZERO_EXPONENT), e)


def _pow2(lanes: Lanes, n: Any) -> Any:
    """2**n exactly, for integer n in [-1022, 1023], built from float64 bits."""
    return lanes.floats(lanes.ops.astype(n, lanes.idt) + 1023 << 52)


class GroupStep:
    """One instruction: exact products of a group, aligned, truncated, summed, rounded."""

    def __init__(self, model: TensorCoreModel, steps: Steps, compiled: bool) -> None:
        self.model, self.steps, self.lanes = model, steps, steps.lanes
        f = model.frac_bits
        self.fmt = model.accum_format
        # the least value whose exponent overflows (none beyond FP64's)
        self.beyond = math.ldexp(1.0, self.fmt.emax + 1) if self.fmt.emax < 1023 else math.inf
        # |term| < 2^(f+2), one more bit for a term rounded up; a run of 16 FP4 products with
        # UE4M3 scales: < 16 * 36 * 4 * 2^f
        width = f + 3 + (12 if model.scaled == "runs" else 0)
        self.trunc = Format(f"int{width + 1}", 0, width, inf=False, nan="none")
        fp64 = model.structure == "fma" and self.fmt.name == "fp64"
        if fp64 and self.lanes.torch:
            raise ValueError(f"tensor_core={model.name!r} (FP64 fused multiply-adds) runs on "
                             "the NumPy backend only: pass backend='numpy' (CPU tensors work)")
        self.unaligned = None if model.align_accumulator or fp64 else Adder(
            self.fmt, model.rounding, self.lanes, steps.rng, plain=False, may_overflow=True)
        fn = {"fma_tree": self._tree_step, "fma": self._fma_step}.get(
            model.structure, self._step if model.sum_bits is None else self._cdna3_step)
        self.step = compile_step(fn) if compiled else fn

    def _step(self, acc: Any, a: Any, b: Any, ea: Any, eb: Any, st: Stats) -> tuple[Any, Stats]:
        xp, lanes, f = self.lanes.xp, self.lanes, self.model.frac_bits
        p, st = self.steps.products(a, b, st)
        e = ea + eb
        if self.model.scaled == "runs":              # exact sums of 16, the scales' exponent
            p = p.reshape((-1, RUN) + tuple(p.shape[1:])).sum(1)
            e = e[::RUN]
        top = xp.amax(e, 0)
        if self.unaligned is None:
            top = xp.maximum(top, exponents(lanes, acc, self.fmt.emin))
        up, down = _pow2(lanes, f - top), _pow2(lanes, top - f)
        back = lanes.backend
        cut = self.model.sum_rounding
        total = quantize(p * up, self.trunc, rounding=cut, backend=back).sum(0)
        if self.unaligned is None:
            total = total + quantize(acc * up, self.trunc, rounding=cut, backend=back)
        total = total * down
        psum = p.sum(0)
        raw = psum + acc if self.unaligned is None else psum
        total = xp.where(xp.isfinite(raw), total, raw)               # inf and NaN propagate
        if self.unaligned is None:
            new = quantize(total, self.fmt, rounding=self.model.rounding, seed=self.steps.rng,
                           backend=back)
            new = xp.where(abs(total) >= self.beyond, total * math.inf, new)  # exponent too big
            new = new + 0.0                                       # a zero result is +0
        else:
            new = self.unaligned(acc, total)
        return new, counted(lanes, acc, psum, new, st)


    def _cdna3_step(self, acc: Any, a: Any, b: Any, ea: Any, eb: Any,
                    st: Stats) -> tuple[Any, Stats]:
        """AMD CDNA3 (MMA-Sim's ``amd_fused_dot_rd_add``): the products alone are aligned and
        cut to ``frac_bits`` (with ``halves``: the even and the odd products apart, each sum
        then cut toward -inf to ``frac_bits`` below the larger); their sum and C are aligned
        to the larger exponent and cut toward -inf, the sum to ``sum_bits``, C to ``c_bits``
        (with ``halves``: C is dropped 26 or more binades below); the total is rounded to the
        result.  A product beyond FP32's range is ±inf (NaN when both signs occur)."""
        xp, lanes, m = self.lanes.xp, self.lanes, self.model
        p, st = self.steps.products(a, b, st)
        e = ea + eb
        if m.halves:
            if p.shape[0] == 1:                      # a lone product: an empty odd half
                p, e = xp.concatenate([p, 0 * p]), xp.concatenate([e, e])
            (v0, t0), (v1, t1) = self._fused(p[0::2], e[0::2]), self._fused(p[1::2], e[1::2])
            top = xp.maximum(t0, t1)
            psum = self._floor(v0, top, m.frac_bits) + self._floor(v1, top, m.frac_bits)
        else:
            psum, top = self._fused(p, e)
        ec = exponents(lanes, acc, self.fmt.emin)
        top = xp.maximum(top, ec)
        c = self._floor(acc, top, m.c_bits)
        if m.halves:
            c = xp.where(ec >= top - 25, c, 0.0)
        total = (self._floor(psum, top, m.sum_bits) + c) + 0.0        # an exact zero is +0
        big = 2.0 ** (get_format("fp32").emax + 1)
        pos, neg = xp.any(p >= big, 0), xp.any(p <= -big, 0)
        total = xp.where(pos, math.inf, xp.where(neg, -math.inf, total))
        total = xp.where(pos & neg, math.nan, total)
        raw = p.sum(0) + acc
        total = xp.where(xp.isfinite(raw), total, raw)               # inf and NaN propagate
        new = quantize(total, self.fmt, rounding=m.rounding, seed=self.steps.rng,
                       backend=lanes.backend)
        return new, counted(lanes, acc, p.sum(0), new, st)

    def _fused(self, p: Any, e: Any) -> tuple[Any, Any]:
        """The products aligned to their largest exponent, cut to ``frac_bits`` with
        ``sum_rounding`` and summed exactly; and that exponent."""
        top, f = self.lanes.xp.amax(e, 0), self.model.frac_bits
        cut = quantize(p * _pow2(self.lanes, f - top), self.trunc,
                       rounding=self.model.sum_rounding, backend=self.lanes.backend).sum(0)
        return cut * _pow2(self.lanes, top - f), top

    def _floor(self, x: Any, top: Any, bits: int) -> Any:
        """``x`` cut toward -inf to ``bits`` fraction bits below exponent ``top``."""
        wide = Format(f"int{bits + 8}", 0, bits + 7, inf=False, nan="none")
        return quantize(x * _pow2(self.lanes, bits - top), wide, rounding="rdown",
                        backend=self.lanes.backend) * _pow2(self.lanes, top - bits)

    def _tree_step(self, acc: Any, a: Any, b: Any, ea: Any, eb: Any,
                   st: Stats) -> tuple[Any, Stats]:
        """AMD CDNA1/2 (MMA-Sim's ``pairwise_dot``): products rounded to the result format,
        added pairwise (each sum rounded), the group's sum added to C; CDNA2 flushes subnormal
        operands and C to +0 and subnormal sums to ±0."""
        xp, lanes, m = self.lanes.xp, self.lanes, self.model
        flush = m.flush_subnormals
        tiny = 2.0 ** self.fmt.emin

        def rounded(x: Any) -> Any:
            x = quantize(x, self.fmt, rounding=m.rounding, backend=lanes.backend)
            return xp.where(abs(x) < tiny, x * 0.0, x) if flush else x

        if flush:                                    # |x| < 2^(its least normal exponent)
            a = xp.where(abs(a) < _pow2(lanes, ea), 0.0, a)
            b = xp.where(abs(b) < _pow2(lanes, eb), 0.0, b)
            acc = xp.where(abs(acc) < tiny, 0.0, acc)
        p, st = self.steps.products(a, b, st)

        def tree(x: Any) -> Any:
            n = x.shape[0]
            if n == 1:
                return rounded(x[0] + 0.0)           # fma(a, b, +0): -0 products give +0
            return rounded(tree(x[:n // 2]) + tree(x[n // 2:]))

        group = tree(p)
        new = rounded(acc + group)
        return new, counted(lanes, acc, group, new, st)

    def _fma_step(self, acc: Any, a: Any, b: Any, ea: Any, eb: Any,
                  st: Stats) -> tuple[Any, Stats]:
        """FP64/FP32 instructions (MMA-Sim's ``fma`` chains): D = fma(a_k, b_k, D) for each k in
        order, rounded once to nearest even.  FP32 products are exact in float64 lanes, so the
        round-to-odd Adder rounds a·b + D once; FP64 needs ``fpsim.arith.fma.fma``."""
        p, st = self.steps.products(a, b, st)
        for k in range(p.shape[0]):
            new = fma(a[k], b[k], acc) if self.unaligned is None else self.unaligned(acc, p[k])
            st = counted(self.lanes, acc, p[k], new, st)
            acc = new
        return acc, st


def run(operands: Operands, exps: Operands, K: int, shape: tuple, step: GroupStep, st: Stats,
        chunk: int | None, promote: Callable | None, init: Any = None) -> tuple[Any, Stats]:
    """Accumulate K products group by group, the first instruction's C being ``init`` (+0 when
    None); with ``chunk``, restart the tensor-core accumulator every ``chunk`` terms after
    ``promote`` folds it into an outer sum."""
    lanes = step.lanes
    acc = lanes.full(shape, 0.0) if init is None else init
    outer = None
    for g0 in range(0, K, step.model.group):
        if chunk and g0 and g0 % chunk == 0:
            outer, st = promote(outer, acc, st)
            acc = lanes.full(shape, 0.0)
        g1 = min(K, g0 + step.model.group)
        a, b = operands(g0, g1)
        ea, eb = exps(g0, g1)
        acc, st = step.step(acc, a, b, ea, eb, st)
    return promote(outer, acc, st) if chunk else (acc, st)


def canonical_nan(x: Any) -> Any:
    """``x`` with every NaN replaced by NVIDIA's canonical NaN (all payload bits set:
    0x7FFFFFFF in float32, 0x7FFFFFFFFFFFFFFF in float64), as tensor cores and MMA-Sim give it;
    cast to FP16 it is 0x7FFF, MMA-Sim's FP16 NaN."""
    wide = str(x.dtype) in ("float64", "torch.float64")
    nan = (np.array(0x7FFFFFFFFFFFFFFF, np.int64).view(np.float64) if wide
           else np.array(0x7FFFFFFF, np.int32).view(np.float32))
    if isinstance(x, np.ndarray):
        return np.where(np.isnan(x), nan, x)
    import torch

    return torch.where(x.isnan(), torch.from_numpy(nan).to(x.device), x)
