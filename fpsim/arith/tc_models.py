"""Tensor-core models: what one matrix instruction does with its products, and the presets.

Every preset follows microsoft/MMA-Sim (Peichen Xie et al., "MMA-Sim: Bit-Accurate Reference
Model of Tensor Cores and Matrix Cores", arXiv 2511.10909), whose models its authors validated
against the GPUs; ``tests/data/mmasim_fixture.npz`` holds MMA-Sim's own outputs for each preset.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..formats import Format, get_format
from ..names import resolve
from ..rounding import check_mode

MMASIM = "MMA-Sim (arXiv 2511.10909), simulator/nv_ptx.py"
SUM_ROUNDINGS = ("rtz", "rdown", "rne")
SCALED = (None, "elements", "runs")
STRUCTURES = ("fused", "fma_tree", "fma")
RUN = 16            # mxf4nvf4: products summed exactly in runs of 16


#: The operand formats an instruction reads, by the inputs part of a preset's name (TF32 and
#: XF32 read FP32 registers, cut inside the unit: ``truncate``).
OPERANDS = {"fp16": ("fp16",), "bf16": ("bf16",), "tf32": ("fp32",), "xf32": ("fp32",),
            "fp32": ("fp32",), "fp64": ("fp64",), "fp8": ("e4m3", "e5m2"),
            "mxf8f6f4": ("e4m3", "e5m2", "e3m2", "e2m3", "e2m1"), "mxf4nvf4": ("e2m1",)}


def fits(fmt: Format, wide: Format) -> bool:
    """Whether every finite value of ``fmt`` is a value of ``wide``.

    >>> fits(get_format("e4m3_ieee"), get_format("e4m3")), fits(get_format("e3m4"), get_format("e4m3"))
    (True, False)
    """
    if fmt.signed and not wide.signed:
        return False
    if fmt.is_int:                   # a float holds the integers up to 2**(mbits + 1)
        if wide.is_int:
            return wide.min <= fmt.min and fmt.max <= wide.max
        top = max(-fmt.min, fmt.max)
        return top <= min(wide.max, 2 ** (wide.mbits + 1))
    return (not wide.is_int and fmt.mbits <= wide.mbits and fmt.max <= wide.max
            and fmt.min_subnormal >= wide.min_subnormal)


@dataclass(frozen=True)
class TensorCoreModel:
    """How one tensor-core instruction computes D = A·B + C (a fused dot-add).

    ``group``: products per fused dot-add (the instruction's reduction depth k, or half of it
    where the hardware splits k).
    ``frac_bits``: bits kept below the group's largest exponent after alignment.
    ``accum`` / ``rounding``: format and rounding of the instruction's result D (e8m13: an FP32
    register holding 13 fraction bits).
    ``align_accumulator``: whether the running accumulator C is aligned and cut with the
    products (NVIDIA: yes); if not, the group's sum is added to it with one rounding.
    ``sum_rounding``: how each aligned term is cut to ``frac_bits``: "rtz" (NVIDIA truncates),
    "rdown" (toward -inf) or "rne".
    ``scaled``: block scales applied inside the unit (operands are MXArrays): "elements" adds
    both scales' exponents to each product's (``mxf8f6f4``); "runs" sums products exactly in
    runs of 16 whose exponent is the scales' alone (``mxf4nvf4``); None: no block scales.
    ``sum_bits`` / ``c_bits`` (AMD CDNA3; None elsewhere): C is not aligned with the products;
    the products' cut sum and C are aligned to the larger of their exponents and cut toward
    -inf, the sum to ``sum_bits`` and C to ``c_bits`` bits, then added and rounded.
    ``halves`` (CDNA3 FP8): the even and odd products are fused apart first.
    ``canonical_nan``: NaN results are NVIDIA's 0x7FFFFFFF (MMA-Sim does not model AMD's NaN
    payloads; fpsim's NaN there is 0x7FC00000).
    ``structure``: "fused" (one fused dot-add per group), "fma_tree" (AMD CDNA1/2: each
    group's products rounded to the result format and added pairwise, each addition rounded,
    the group's sum then added to C with one more rounding; ``frac_bits`` unused) or "fma"
    (FP64 and FP32 instructions: a chain of fused multiply-adds, D = fma(a_k, b_k, D) for k in
    order, each rounded once to the result format, which may be FP64; ``frac_bits`` is the
    result's own mantissa width, ``group`` 1).
    ``flush_subnormals`` (fma_tree): subnormal operands and C become +0 and subnormal partial
    sums ±0 (CDNA2).
    ``instruction`` / ``source``: the PTX instructions modelled and where the figures come from.
    ``truncate``: a format the operands are cut to, toward zero, inside the unit ("tf32": TF32
    and XF32 instructions read only the top 19 bits of each FP32 register, MMA-Sim's
    ``truncate_to_tf32``; a NaN stays NaN, where MMA-Sim's bit truncation makes a NaN whose
    payload lies in the low 13 bits inf); None: operands are used as given.
    """

    group: int
    frac_bits: int
    accum: str | Format = "fp32"
    rounding: str = "rtz"
    align_accumulator: bool = True
    name: str = "custom"
    sum_rounding: str = "rtz"
    instruction: str = ""
    source: str = ""
    scaled: str | None = None
    sum_bits: int | None = None
    c_bits: int | None = None
    canonical_nan: bool = True
    halves: bool = False
    structure: str = "fused"
    flush_subnormals: bool = False
    truncate: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.group, int) or self.group < 1:
            raise ValueError("TensorCoreModel.group must be a positive integer, not "
                             f"{self.group!r}")
        fma = self.structure == "fma"
        if not isinstance(self.frac_bits, int) or not 0 <= self.frac_bits <= (52 if fma else 48):
            raise ValueError("TensorCoreModel.frac_bits must be an integer in [0, 48] (aligned "
                             f"sums stay exact in float64), got {self.frac_bits!r}")
        check_mode(self.rounding)
        if self.sum_rounding not in SUM_ROUNDINGS:
            raise ValueError(f"TensorCoreModel.sum_rounding {self.sum_rounding!r}: choose one of "
                             f"{', '.join(SUM_ROUNDINGS)}")
        if self.scaled not in SCALED:
            raise ValueError(f"TensorCoreModel.scaled {self.scaled!r}: choose None, 'elements' "
                             "or 'runs'")
        if self.scaled == "runs" and (self.group % RUN or self.frac_bits > 38):
            raise ValueError(f"TensorCoreModel with scaled='runs' needs a group that is a "
                             f"multiple of {RUN} and frac_bits <= 38 (runs are wider than "
                             "products)")
        if (self.sum_bits is None) != (self.c_bits is None) or (
                self.sum_bits is not None and not 0 < self.c_bits <= self.sum_bits <= 40):
            raise ValueError("TensorCoreModel.sum_bits and c_bits go together (AMD CDNA3: 31 "
                             "and 24), with 0 < c_bits <= sum_bits <= 40")
        if self.truncate is not None:
            get_format(self.truncate)
        if self.structure not in STRUCTURES:
            raise ValueError(f"TensorCoreModel.structure {self.structure!r}: choose one of "
                             f"{', '.join(STRUCTURES)}")
        fmt = get_format(self.accum)
        if fmt.is_int or (fmt.mbits > 50 and not (fma and fmt.name == "fp64")):
            raise ValueError(f"TensorCoreModel.accum {fmt.name!r}: choose a float format with at "
                             "most 50 mantissa bits (e.g. 'fp32', 'e8m13', 'fp16'), or 'fp64' "
                             "with structure='fma'")
        if fma and (self.rounding != "rne" or self.align_accumulator
                    or self.scaled is not None or self.sum_bits is not None):
            raise ValueError("TensorCoreModel with structure='fma' rounds each fused "
                             "multiply-add to nearest even: rounding='rne', "
                             "align_accumulator=False, no block scales, no sum_bits")

    @property
    def operands(self) -> tuple[Format, ...]:
        """The formats the preset's instruction reads, by the inputs part of its name (a
        custom model names none: any operands).

        >>> [f.name for f in TENSOR_CORES["hopper_fp8"].operands]
        ['fp8_e4m3fn', 'fp8_e5m2']
        """
        kind = next((p for p in self.name.split("_") if p in OPERANDS), None)
        return tuple(get_format(f) for f in OPERANDS.get(kind, ()))

    def reads(self, fmt: Format) -> bool:
        """Whether every finite value of ``fmt`` is a value of one of :attr:`operands` (so the
        instruction can take it unchanged); True for a custom model.

        >>> TENSOR_CORES["hopper_fp8"].reads(get_format("fp16"))
        False
        """
        return not self.operands or any(fits(fmt, wide) for wide in self.operands)

    @functools.cached_property
    def accum_format(self) -> Format:
        """The result format (parsed once per model: every product reads it several times)."""
        return get_format(self.accum)

    @functools.cached_property
    def c_format(self) -> Format:
        """The register format of C and D: FP16 or FP64 for such results, else FP32."""
        fmt = self.accum_format
        return fmt if fmt.name in ("fp16", "fp32", "fp64") else get_format("fp32")


def _nv(name: str, group: int, frac_bits: int, instruction: str, accum: str = "fp32",
        note: str = "") -> TensorCoreModel:
    rounding = "rne" if accum == "fp16" else "rtz"
    source = MMASIM + (f"; {note}" if note else "")
    return TensorCoreModel(group, frac_bits, accum, rounding, True, name, "rtz", instruction,
                           source, truncate="tf32" if "tf32" in name else None)


def _bs(name: str, group: int, frac_bits: int, scaled: str, instruction: str) -> TensorCoreModel:
    return TensorCoreModel(group, frac_bits, "fp32", "rtz", True, name, "rtz", instruction,
                           MMASIM + "; block scales applied inside the fused dot-add", scaled)


def _cdna3(name: str, group: int, instruction: str, halves: bool = False) -> TensorCoreModel:
    return TensorCoreModel(group, 24, "fp32", "rne", False, name, "rtz", instruction,
                           "MMA-Sim (arXiv 2511.10909), simulator/amd.py: fused_dot_rd_add",
                           None, 31, 24, False, halves,
                           truncate="tf32" if "xf32" in name else None)


def _cdna12(name: str, group: int, flush: bool, instruction: str) -> TensorCoreModel:
    return TensorCoreModel(group, 23, "fp32", "rne", False, name, "rtz", instruction,
                           "MMA-Sim (arXiv 2511.10909), simulator/amd.py: pairwise_dot",
                           canonical_nan=False, structure="fma_tree", flush_subnormals=flush)


def _fma(name: str, accum: str, instruction: str, simulator: str) -> TensorCoreModel:
    return TensorCoreModel(1, get_format(accum).mbits, accum, "rne", False, name, "rtz",
                           instruction, f"MMA-Sim (arXiv 2511.10909), simulator/{simulator}: a "
                           "chain of correctly rounded fma (the host's libm)",
                           canonical_nan=False, structure="fma")


_SPLIT = "k split in two fused dot-adds"
_F16 = "FP16 result rounded to nearest even after the fused sum"

#: Presets after MMA-Sim, named architecture_inputs[_f16] (``_f16``: FP16 result, else FP32).
#: ``group`` is the instruction's k, halved where MMA-Sim splits k (Ampere/Ada m16n8k16
#: FP16/BF16, m16n8k8 TF32, m16n8k32 FP8).  TF32 and XF32 presets truncate FP32 operands to
#: TF32 (``truncate``), as MMA-Sim does and the hardware reads them; round them first with
#: ``inputs="tf32"`` (nearest, as cuBLAS converts) to make the truncation a no-op.
TENSOR_CORES: dict[str, TensorCoreModel] = {m.name: m for m in [
    _nv("volta_fp16", 4, 23, "mma.m8n8k4.f32.f16.f16.f32"),
    _nv("volta_fp16_f16", 4, 23, "mma.m8n8k4.f16.f16.f16.f16", "fp16", _F16),
    _nv("turing_fp16", 8, 24, "mma.m16n8k8.f32.f16.f16.f32"),
    _nv("turing_fp16_f16", 8, 24, "mma.m16n8k8.f16.f16.f16.f16", "fp16", _F16),
    _nv("ampere_fp16", 8, 24, "mma.m16n8k16.f32.f16.f16.f32", note=_SPLIT),
    _nv("ampere_fp16_f16", 8, 24, "mma.m16n8k16.f16.f16.f16.f16", "fp16", f"{_SPLIT}; {_F16}"),
    _nv("ampere_bf16", 8, 24, "mma.m16n8k16.f32.bf16.bf16.f32", note=_SPLIT),
    _nv("ampere_tf32", 4, 24, "mma.m16n8k8.f32.tf32.tf32.f32", note=_SPLIT),
    _nv("ada_fp16", 8, 24, "mma.m16n8k16.f32.f16.f16.f32 (sm_89)", note=_SPLIT),
    _nv("ada_fp16_f16", 8, 24, "mma.m16n8k16.f16.f16.f16.f16 (sm_89)", "fp16",
        f"{_SPLIT}; {_F16}"),
    _nv("ada_bf16", 8, 24, "mma.m16n8k16.f32.bf16.bf16.f32 (sm_89)", note=_SPLIT),
    _nv("ada_tf32", 4, 24, "mma.m16n8k8.f32.tf32.tf32.f32 (sm_89)", note=_SPLIT),
    _nv("ada_fp8", 16, 13, "mma.m16n8k32 / m16n8k16 .f32.e4m3|e5m2 (sm_89)", "e8m13",
        f"{_SPLIT} (k32); result truncated to 13 fraction bits"),
    _nv("ada_fp8_f16", 16, 13, "mma.m16n8k32 / m16n8k16 .f16.e4m3|e5m2 (sm_89)", "fp16",
        f"{_SPLIT} (k32); {_F16}"),
    _nv("hopper_fp16", 16, 25, "wgmma.m64nNk16.f32.f16.f16"),
    _nv("hopper_fp16_f16", 16, 25, "wgmma.m64nNk16.f16.f16.f16", "fp16", _F16),
    _nv("hopper_bf16", 16, 25, "wgmma.m64nNk16.f32.bf16.bf16"),
    _nv("hopper_tf32", 8, 25, "wgmma.m64nNk8.f32.tf32.tf32"),
    _nv("hopper_fp8", 32, 13, "wgmma.m64nNk32.f32.e4m3|e5m2", "e8m13",
        "result truncated to 13 fraction bits"),
    _nv("hopper_fp8_f16", 32, 13, "wgmma.m64nNk32.f16.e4m3|e5m2", "fp16", _F16),
    _nv("blackwell_fp16", 16, 25, "tcgen05.mma kind::f16 .f32 (and mma.m16n8k16 on sm_100)"),
    _nv("blackwell_fp16_f16", 16, 25, "tcgen05.mma kind::f16 .f16.f16", "fp16", _F16),
    _nv("blackwell_bf16", 16, 25, "tcgen05.mma kind::f16 .f32.bf16"),
    _nv("blackwell_tf32", 8, 25, "tcgen05.mma kind::tf32"),
    _nv("blackwell_fp8", 32, 25, "tcgen05.mma kind::f8f6f4 .f32 (e4m3, e5m2, e2m1)"),
    _nv("blackwell_fp8_f16", 32, 25, "tcgen05.mma kind::f8f6f4 .f16", "fp16", _F16),
    _nv("rtx_blackwell_fp16", 16, 25, "mma.m16n8k16.f32.f16.f16.f32 (sm_120)"),
    _nv("rtx_blackwell_fp16_f16", 16, 25, "mma.m16n8k16.f16.f16.f16.f16 (sm_120)", "fp16", _F16),
    _nv("rtx_blackwell_bf16", 16, 25, "mma.m16n8k16.f32.bf16.bf16.f32 (sm_120)"),
    _nv("rtx_blackwell_tf32", 8, 25, "mma.m16n8k8.f32.tf32.tf32.f32 (sm_120)"),
    _nv("rtx_blackwell_fp8", 32, 25, "mma.m16n8k32.f32.e4m3|e5m2|e2m1 (sm_120, f8f6f4)"),
    _nv("rtx_blackwell_fp8_k16", 16, 25, "mma.m16n8k16.f32.e4m3|e5m2 (sm_120)"),
    _nv("rtx_blackwell_fp8_f16", 32, 25, "mma.m16n8k32.f16.e4m3|e5m2|e2m1 (sm_120)", "fp16",
        _F16),
    _fma("ampere_fp64", "fp64", "mma.m8n8k4.f64.f64.f64.f64 (sm_80; also sm_89, sm_100, "
         "sm_120)", "nv_ptx.py"),
    _fma("hopper_fp64", "fp64", "mma.m16n8k4 / m16n8k8 / m16n8k16 .f64 (sm_90)", "nv_ptx.py"),
    _fma("cdna1_fp32", "fp32", "v_mfma_f32_32x32x2f32, 16x16x4f32, 4x4x1f32 (MI100)", "amd.py"),
    _fma("cdna2_fp32", "fp32", "v_mfma_f32_32x32x2f32, 16x16x4f32, 4x4x1f32 (MI200)", "amd.py"),
    _fma("cdna2_fp64", "fp64", "v_mfma_f64_16x16x4f64, 4x4x4f64 (MI200)", "amd.py"),
    _fma("cdna3_fp32", "fp32", "v_mfma_f32_32x32x2_f32, 16x16x4_f32, 4x4x1_16b_f32 (MI300)", "amd.py"),
    _fma("cdna3_fp64", "fp64", "v_mfma_f64_16x16x4_f64, 4x4x4_4b_f64 (MI300)", "amd.py"),
    _cdna12("cdna1_fp16", 4, False, "v_mfma_f32_4x4x4f16, 32x32x4f16 (MI100)"),
    _cdna12("cdna1_bf16", 2, False, "v_mfma_f32_4x4x2bf16, 32x32x2bf16 (MI100)"),
    _cdna12("cdna2_fp16", 4, True, "v_mfma_f32_4x4x4f16, 32x32x4f16 (MI200)"),
    _cdna12("cdna2_bf16", 4, True, "v_mfma_f32_4x4x4bf16_1k, 32x32x4bf16_1k (MI200)"),
    _cdna12("cdna2_bf16_k2", 2, True, "v_mfma_f32_32x32x2bf16, 16x16x8bf16, 4x4x2bf16 (MI200, "
            "CDNA1 encodings)"),
    _cdna3("cdna3_fp16", 8, "v_mfma_f32_16x16x16_f16, 32x32x8_f16 (MI300)"),
    _cdna3("cdna3_bf16", 8, "v_mfma_f32_16x16x16_bf16, 32x32x8_bf16 (MI300)"),
    _cdna3("cdna3_fp16_k4", 4, "v_mfma_f32_32x32x4_2b_f16, 4x4x4_16b_f16 (MI300)"),
    _cdna3("cdna3_bf16_k4", 4, "v_mfma_f32_32x32x4_2b_bf16, 4x4x4_16b_bf16 (MI300)"),
    _cdna3("cdna3_xf32", 4, "v_mfma_f32_16x16x8_xf32, 32x32x4_xf32 (MI300)"),
    _cdna3("cdna3_fp8", 16, "v_mfma_f32_16x16x32_fp8/bf8, 32x32x16 (MI300; FNUZ formats)",
           halves=True),
    _bs("blackwell_mxf8f6f4", 32, 25, "elements",
        "tcgen05.mma kind::mxf8f6f4.block_scale (ue8m0, block 32)"),
    _bs("blackwell_mxf4nvf4", 64, 35, "runs",
        "tcgen05.mma kind::mxf4nvf4.block_scale (e2m1; ue8m0 block 16/32, ue4m3 block 16)"),
    _bs("rtx_blackwell_mxf8f6f4", 32, 25, "elements",
        "mma.m16n8k32.block_scale.block32.f32.*.ue8m0 (sm_120)"),
    _bs("rtx_blackwell_mxf4nvf4", 64, 35, "runs",
        "mma.m16n8k64.block_scale.f32.e2m1.e2m1 (sm_120; ue8m0 or ue4m3)"),
]}


def get_model(model: str | TensorCoreModel) -> TensorCoreModel:
    """A preset by name (as every name: case, surrounding space and ``-``/``_`` ignored), or
    the model itself."""
    if isinstance(model, TensorCoreModel):
        return model
    if not isinstance(model, str):
        raise TypeError(f"tensor_core must be a preset name or a TensorCoreModel, not "
                        f"{type(model).__name__}")
    return resolve("tensor_core", model, TENSOR_CORES, extra=" (fpsim tensor-cores lists them); "
                   "or pass a TensorCoreModel(group, frac_bits, ...)")
