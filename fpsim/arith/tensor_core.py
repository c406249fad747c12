"""A model of tensor-core accumulation: exact products, aligned and truncated in groups.

One tensor-core instruction (an MMA with reduction depth ``group``) computes D = A·B + C as a
fused dot-add: every product is exact; the products and the running accumulator C are aligned
to the largest exponent among them and each is truncated (toward zero) to ``frac_bits`` bits
below that exponent; the aligned terms are summed exactly; the sum is rounded to the
accumulator format.  This follows microsoft/MMA-Sim (Peichen Xie et al., "MMA-Sim: Bit-Accurate
Reference Model of Tensor Cores and Matrix Cores", arXiv 2511.10909, ``nv_fused_dot_add``):

* a product's exponent is the sum of its operands' exponents, each clamped at its format's
  least normal exponent (so a product's significand lies in [1, 4)); a zero counts with that
  least exponent, so a zero times a huge operand still sets the alignment, as in MMA-Sim;
* FP32 results are truncated toward zero (FP16 results round to nearest even); a result whose
  exponent exceeds the format's is ±inf, not the largest finite value (MMA-Sim truncates the
  significand only);
* fraction bits kept: Volta 23, Turing/Ampere/Ada 24, Hopper/Blackwell 25 for FP16/BF16/TF32;
  Ada and Hopper FP8 keep 13 and also truncate the FP32 result to 13 fraction bits (E8M13).

DeepSeek-V3 (arXiv 2412.19437, §3.3.2) measured the same effect on H800: FP8 GEMM accumulation
retains about 14 bits, giving a maximum relative error of nearly 2% at K = 4096; their fix is
to promote partial sums to FP32 every N_C = 128 elements (``chunk=128`` here).
"""

from __future__ import annotations

import math

from dataclasses import dataclass
from typing import Any, Callable

from ..convert import quantize
from ..formats import Format, get_format
from ..rounding import check_mode
from .accumulate import Adder, Operands, Stats, Steps, compile_step, counted
from .lanes import Lanes


@dataclass(frozen=True)
class TensorCoreModel:
    """How one tensor-core instruction accumulates (see the module docstring).

    ``group``: products per fused dot-add (the instruction's reduction depth k).
    ``frac_bits``: bits kept below the group's largest exponent after alignment.
    ``accum`` / ``rounding``: format and rounding of the instruction's result (the accumulator).
    ``align_accumulator``: whether the running accumulator is aligned and truncated with the
    products (NVIDIA: yes); if not, the group's sum is added to it with one rounding.
    """

    group: int
    frac_bits: int
    accum: str | Format = "fp32"
    rounding: str = "rtz"
    align_accumulator: bool = True
    name: str = "custom"

    def __post_init__(self) -> None:
        if not isinstance(self.group, int) or self.group < 1:
            raise ValueError(f"TensorCoreModel.group must be a positive integer, not {self.group!r}")
        if not isinstance(self.frac_bits, int) or not 0 <= self.frac_bits <= 48:
            raise ValueError("TensorCoreModel.frac_bits must be an integer in [0, 48] (aligned "
                             f"sums stay exact in float64), got {self.frac_bits!r}")
        check_mode(self.rounding)
        fmt = get_format(self.accum)
        if fmt.is_int or fmt.mbits > 50:
            raise ValueError(f"TensorCoreModel.accum {fmt.name!r}: choose a float format with at "
                             "most 50 mantissa bits (e.g. 'fp32', 'e8m13', 'fp16')")

    @property
    def accum_format(self) -> Format:
        return get_format(self.accum)


def _nv(name: str, group: int, frac_bits: int, accum: str = "fp32") -> TensorCoreModel:
    return TensorCoreModel(group, frac_bits, accum, "rtz", True, name)


#: Presets after MMA-Sim (arXiv 2511.10909).  ``group`` is the instruction's k, halved where
#: MMA-Sim splits k (Ampere/Ada m16n8k16 FP16/BF16, m16n8k8 TF32, m16n8k32 FP8); Hopper figures
#: are for wgmma (k = 8 TF32, 16 FP16/BF16, 32 FP8), Blackwell for tcgen05.mma.
TENSOR_CORES: dict[str, TensorCoreModel] = {m.name: m for m in [
    _nv("volta_fp16", 4, 23),
    _nv("turing_fp16", 8, 24),
    _nv("ampere_fp16", 8, 24),
    _nv("ampere_bf16", 8, 24),
    _nv("ampere_tf32", 4, 24),
    _nv("ada_fp8", 16, 13, "e8m13"),
    _nv("hopper_fp16", 16, 25),
    _nv("hopper_bf16", 16, 25),
    _nv("hopper_tf32", 8, 25),
    _nv("hopper_fp8", 32, 13, "e8m13"),
    _nv("blackwell_fp16", 16, 25),
    _nv("blackwell_fp8", 32, 25),
]}


def get_model(model: str | TensorCoreModel) -> TensorCoreModel:
    if isinstance(model, TensorCoreModel):
        return model
    if isinstance(model, str) and model in TENSOR_CORES:
        return TENSOR_CORES[model]
    raise ValueError(f"unknown tensor_core {model!r}: choose one of {', '.join(TENSOR_CORES)} "
                     "or pass a TensorCoreModel(group, frac_bits, ...)")


def exponents(lanes: Lanes, x: Any, emin: int) -> Any:
    """floor(log2|x|) clamped at ``emin`` (the operand format's least normal exponent); zeros
    get ``emin`` too (MMA-Sim's extract_significand_exponent)."""
    xp = lanes.xp
    e = xp.frexp(x)[1] - 1
    e = xp.maximum(e, xp.full_like(e, emin)) if lanes.torch else xp.maximum(e, emin)
    return xp.where(x == 0, xp.full_like(e, emin), e)


def _pow2(lanes: Lanes, n: Any) -> Any:
    """2**n exactly, for integer n in [-1022, 1023], built from float64 bits."""
    return lanes.floats(lanes.ops.astype(n, lanes.idt) + 1023 << 52)


class GroupStep:
    """One instruction: exact products of a group, aligned, truncated, summed, rounded."""

    def __init__(self, model: TensorCoreModel, steps: Steps, compiled: bool) -> None:
        self.model, self.steps, self.lanes = model, steps, steps.lanes
        f = model.frac_bits
        self.fmt = model.accum_format
        self.beyond = 2.0 ** (self.fmt.emax + 1)   # the least value whose exponent overflows
        self.trunc = Format(f"int{f + 3}", 0, f + 2, inf=False, nan="none")  # |term| < 2^(f+2)
        self.unaligned = None if model.align_accumulator else Adder(
            self.fmt, model.rounding, self.lanes, steps.rng, plain=False, may_overflow=True)
        self.step = compile_step(self._step) if compiled else self._step

    def _step(self, acc: Any, a: Any, b: Any, ea: Any, eb: Any, st: Stats) -> tuple[Any, Stats]:
        xp, lanes, f = self.lanes.xp, self.lanes, self.model.frac_bits
        p, st = self.steps.products(a, b, st)
        top = xp.amax(ea + eb, 0)
        if self.unaligned is None:
            top = xp.maximum(top, exponents(lanes, acc, self.fmt.emin))
        up, down = _pow2(lanes, f - top), _pow2(lanes, top - f)
        back = lanes.backend
        total = quantize(p * up, self.trunc, rounding="rtz", backend=back).sum(0)
        if self.unaligned is None:
            total = total + quantize(acc * up, self.trunc, rounding="rtz", backend=back)
        total = total * down
        psum = p.sum(0)
        raw = psum + acc if self.unaligned is None else psum
        total = xp.where(xp.isfinite(raw), total, raw)               # inf and NaN propagate
        if self.unaligned is None:
            new = quantize(total, self.fmt, rounding=self.model.rounding, seed=self.steps.rng,
                           backend=back)
            new = xp.where(abs(total) >= self.beyond, total * math.inf, new)  # exponent too big
        else:
            new = self.unaligned(acc, total)
        return new, counted(lanes, acc, psum, new, st)


def run(operands: Operands, exps: Operands, K: int, shape: tuple, step: GroupStep, st: Stats,
        chunk: int | None, promote: Callable | None) -> tuple[Any, Stats]:
    """Accumulate K products group by group; with ``chunk``, restart the tensor-core
    accumulator every ``chunk`` terms after ``promote`` folds it into an outer sum."""
    lanes = step.lanes
    acc = lanes.full(shape, 0.0)
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
