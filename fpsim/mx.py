"""Block-scaled formats: OCP Microscaling (MX v1.0) and NVFP4, bit-exact.

A block of ``block_size`` consecutive elements along ``axis`` shares one scale.  MX formats
(``mxfp8_e4m3``, ``mxfp8_e5m2``, ``mxfp6_e2m3``, ``mxfp6_e3m2``, ``mxfp4``, ``mxint8``) use an
E8M0 power-of-two scale X = 2^s per 32 elements; ``nvfp4`` uses an FP8 E4M3 scale per 16 E2M1
elements and one float32 scale for the whole tensor.  Elements are rounded by the core
(:func:`fpsim.encode`, saturating), so every rounding mode of the core is available.

MX scale (``scale_rounding``; the block's amax is read exactly from its float bits):

* ``"floor"`` (OCP MX v1.0 §6.3, default): s = floor(log2(amax)) - emax_elem, emax_elem being
  8 (E4M3), 15 (E5M2), 2 (E2M3), 4 (E3M2), 2 (E2M1), 0 (INT8).  Elements beyond the element's
  largest value saturate to ±max (the spec clamps normal values).
* ``"ceil"`` (alias ``"rceil"``; NVIDIA's cuBLAS MXFP8 rule, torchao RCEIL): the smallest power of
  two with amax / X <= max_elem, so no element saturates.  Computed exactly; torchao computes
  amax / max_elem and its log2 in float32, which can differ for exponents of large magnitude.
* ``"ceil_amax"`` (torchao CEIL): s = ceil(log2(amax)) - emax_elem.
* ``"even"`` (torchao EVEN): amax is first rounded to the element's fraction width (a carry into
  the next binade is all that matters; ties and ties-away agree there), then ``"floor"``.

Choices where the spec leaves room, or where inputs are special (all documented and tested):

* s is clamped to E8M0's range: below -127 becomes -127 (code 0x00, X = 2^-127; torchao instead
  divides by 2^-126 there); above 127 gives the NaN scale.  "floor" reaches it only from float64
  inputs; the rounding-up rules also from float32 blocks near its largest value (e.g. MXINT8,
  whose emax_elem is 0, with "ceil" at amax 3.4e38).
* A block with any NaN or ±inf gets the NaN scale 0xFF (as microxcaling; the spec says a NaN
  scale makes the whole block NaN).  Its element codes are all 0; it dequantizes to NaN.
* An all-zero block takes amax = 2^-126 (FP32's smallest normal), as microxcaling does: scale
  code 0x00 for every FP element format, 0x01 for MXINT8 (whose emax_elem is 0).
* Element inputs are scaled exactly (multiplying by a power of two); a product that underflows
  float32 is replaced by the smallest subnormal of its sign for directed rounding modes, where only
  its sign and non-zeroness decide the element.
* MXINT8: elements are 8-bit two's complement k with value k * 2^-6, clamped symmetric to ±127
  (microxcaling): code 0x80 (-128) is never produced.

NVFP4 (torchao ``nvfp4_tensor.nvfp4_quantize``, float32 throughout; float64 input is rounded to
float32 first): tensor_scale = amax / (448 * 6); block scale = e4m3(clamp(block_amax / 6 /
tensor_scale, 2^-6, 448)) rounded to nearest even; elements = x / (tensor_scale * block_scale),
each operation rounded to float32, then rounded to E2M1 and clamped to ±6.  fpsim's choices: the
tensor amax ignores NaN/inf; tensor_scale is at least 2^-126 (FP32's smallest normal), which
also covers the all-zero tensor (no 0/0: block scales clamp to 2^-6, elements are 0); a block
with NaN or inf gets the E4M3 NaN code 0x7F and element codes 0.  Pass ``tensor_scale=1.0`` for
single-level scaling (torchao's ``per_tensor_scale=None`` gives the same codes).

Packed layout (``MXArray.pack``; the Triton kernel produces the same bytes): move ``axis`` to
the end, pad it with zeros to a multiple of ``block_size``, flatten in C order.  The scale bytes
are one per block in that order; the element bytes are that flat stream of codes packed by
:func:`fpsim.packing.pack_codes` (FP4: two per byte, first in the low nibble; FP6: four in three
bytes, little-endian; 8-bit: one per byte).  NVFP4's float32 tensor scale travels beside them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import blocks
from . import rounding as R
from .backend import is_torch, ops_for
from .convert import decode, encode
from .formats import Format, get_format, unknown_name_error
from .packing import pack_codes, unpack_codes

CHUNK = 1 << 16                 # elements per NumPy slice: temporaries stay in cache
SCALE_ROUNDINGS = ("floor", "ceil", "ceil_amax", "even")
_SCALE_ALIASES = {"rceil": "ceil"}
_FRAC = (1 << 52) - 1           # float64 fraction field
_NVFP4_MIN_TENSOR_SCALE = 2.0**-126


@dataclass(frozen=True)
class MXFormat:
    """A block-scaled format: element format, scale format and default block size.

    ``emax`` is the element's emax used for the shared exponent; element code values are
    ``decode(code, elem) * 2**elem_exp`` (MXINT8: -6, elsewhere 0).
    """

    name: str
    elem: Format
    emax: int
    block_size: int = 32
    scale: Format = get_format("e8m0")
    elem_exp: int = 0

    @property
    def max(self) -> float:
        """Largest element value (before scaling)."""
        return self.elem.max * 2.0**self.elem_exp

    @property
    def mbits(self) -> int:
        """Fraction bits of the element's largest binade (MXINT8: 6)."""
        return -self.elem_exp if self.elem.is_int else self.elem.mbits

    @property
    def is_mx(self) -> bool:
        """E8M0 power-of-two scales (OCP MX), as opposed to NVFP4's E4M3 scales."""
        return self.scale.name == "e8m0"

    def __str__(self) -> str:
        return self.name


_LIST = [
    MXFormat("mxfp8_e4m3", get_format("fp8_e4m3fn"), 8),
    MXFormat("mxfp8_e5m2", get_format("fp8_e5m2"), 15),
    MXFormat("mxfp6_e2m3", get_format("fp6_e2m3"), 2),
    MXFormat("mxfp6_e3m2", get_format("fp6_e3m2"), 4),
    MXFormat("mxfp4", get_format("fp4_e2m1"), 2),
    MXFormat("mxint8", get_format("int8"), 0, elem_exp=-6),
    MXFormat("nvfp4", get_format("fp4_e2m1"), 2, block_size=16, scale=get_format("fp8_e4m3fn")),
]

#: Every block format, by name.
MX_FORMATS: dict[str, MXFormat] = {f.name: f for f in _LIST}


def get_mx_format(fmt: str | MXFormat) -> MXFormat:
    """Resolve a block-format name (case-insensitive) to an :class:`MXFormat`."""
    if isinstance(fmt, MXFormat):
        return fmt
    if not isinstance(fmt, str):
        raise TypeError(f"block format must be a name or an MXFormat, not {type(fmt).__name__}")
    key = fmt.strip().lower().replace("-", "_")
    if key in MX_FORMATS:
        return MX_FORMATS[key]
    raise unknown_name_error("block format", fmt, list(MX_FORMATS))


# --------------------------------------------------------------------------------------------
# The result
# --------------------------------------------------------------------------------------------
@dataclass
class MXArray:
    """A block-quantized array: one scale code per block, one element code per element.

    ``scales``: uint8 scale codes (E8M0, or E4M3 for NVFP4), shaped like the input with ``axis``
    holding the block count.  ``codes``: uint8 element codes, the input's shape (padding
    stripped).  ``tensor_scale``: NVFP4's float32 per-tensor scale (None for MX).
    """

    scales: Any
    codes: Any
    fmt: MXFormat
    axis: int
    block_size: int
    shape: tuple[int, ...]
    tensor_scale: float | None = None

    @property
    def layout(self) -> blocks.Layout:
        return blocks.Layout(tuple(self.shape), self.axis, self.block_size)

    @property
    def bits_per_element(self) -> float:
        """Storage per element, scales included (NVFP4's one tensor scale not counted)."""
        return self.fmt.elem.bits + self.fmt.scale.bits / self.block_size

    def dequantize(self, dtype: Any = np.float32) -> Any:
        """The values the codes stand for, as float32 (default) or float64.

        MX values are exact in float64, and in float32 unless they exceed its range (then ±inf:
        float64 inputs, or an amax near float32's max rounded up by a "ceil"/"even" scale).
        NVFP4 float32 follows torchao, element * fp32(tensor_scale * scale); float64 is the
        exact product.
        """
        return dequantize(self, dtype)

    def pack(self) -> tuple[Any, Any]:
        """``(scale_bytes, element_bytes)``, both 1-D uint8, in the layout of the module doc."""
        lay = self.layout
        scales = blocks.scales_to_rows(self.scales, lay)
        return scales, pack_codes(blocks.to_rows(self.codes, lay), self.fmt.elem.bits)

    @classmethod
    def unpack(cls, scales: Any, packed: Any, fmt: str | MXFormat, shape: tuple[int, ...], *,
               axis: int = -1, block_size: int | None = None,
               tensor_scale: float | None = None) -> "MXArray":
        """Rebuild an MXArray from :meth:`pack`'s bytes and the original shape and axis."""
        spec = get_mx_format(fmt)
        scales, packed = (np.frombuffer(b, np.uint8) if isinstance(b, (bytes, bytearray)) else b
                          for b in (scales, packed))
        size = spec.block_size if block_size is None else block_size
        lay = blocks.layout(tuple(shape), axis, size, pad=True)
        n_scales = scales.reshape(-1).shape[0]
        if n_scales != lay.rows:
            raise ValueError(f"{n_scales} scale bytes given; shape {lay.shape} with blocks of "
                             f"{lay.block_size} along axis {lay.axis} has {lay.rows} blocks")
        rows = unpack_codes(packed, spec.elem.bits, lay.rows * lay.block_size)
        codes = blocks.from_rows(rows.reshape(lay.rows, lay.block_size), lay)
        ts = _tensor_scale_arg(spec, tensor_scale, unpacking=True)
        return cls(blocks.rows_to_scales(scales.reshape(-1), lay), codes, spec, lay.axis,
                   lay.block_size, lay.shape, ts)


# --------------------------------------------------------------------------------------------
# Public functions
# --------------------------------------------------------------------------------------------
def quantize(x: Any, fmt: str | MXFormat, *, axis: int = -1, block_size: int | None = None,
             scale_rounding: str | None = None, rounding: str = "rne", pad: bool = True,
             seed: Any = None, tensor_scale: float | None = None,
             backend: str = "auto") -> MXArray:
    """Quantize ``x`` to a block format along ``axis``; see the module doc for the rules.

    ``scale_rounding`` (MX only; None means ``"floor"``) picks the scale rule, ``rounding`` any
    core rounding mode for the elements (``seed`` for ``"stochastic"``).  ``pad=False`` refuses
    an axis that is not a multiple of ``block_size``.  ``tensor_scale`` (NVFP4 only) replaces the
    computed per-tensor scale.  NumPy in, NumPy out; torch in, torch out (bit-identical, except
    stochastic rounding, whose random bits differ).  CUDA float32/float16/bfloat16 tensors run
    the Triton kernel (``kernels.mx_quantize``) unless ``backend="torch"``; ``"triton"`` forces
    it (on CPU tensors too, through Triton's interpreter).
    """
    spec = get_mx_format(fmt)
    mode = _scale_mode(spec, scale_rounding)
    R.check_mode(rounding)
    ts_arg = _tensor_scale_arg(spec, tensor_scale)
    if _use_kernel(x, backend, pad):
        return _quantize_kernel(x, spec, axis, block_size, scale_rounding, rounding, seed, ts_arg)
    work = _float_input(x, nvfp4=not spec.is_mx)
    lay = blocks.layout(tuple(work.shape), axis,
                        spec.block_size if block_size is None else block_size, pad)
    rows = blocks.to_rows(work, lay)
    if spec.is_mx:
        scales, codes = _quantize_rows(rows, lambda r, rng: _mx_rows(
            r, spec, mode, rounding, rng), seed)
        ts = None
    else:
        ts = _nvfp4_tensor_scale(rows) if ts_arg is None else ts_arg
        scales, codes = _quantize_rows(rows, lambda r, rng: _nvfp4_rows(
            r, spec, ts, rounding, rng), seed)
    return MXArray(blocks.rows_to_scales(scales, lay), blocks.from_rows(codes, lay), spec,
                   lay.axis, lay.block_size, lay.shape, ts)


def _use_kernel(x: Any, backend: str, pad: bool) -> bool:
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"unknown backend {backend!r}; choose 'auto', 'torch' or 'triton'")
    if backend == "torch" or not is_torch(x):
        return False
    if backend == "triton":
        return True
    import importlib.util

    import torch

    return (pad and x.device.type == "cuda"
            and x.dtype in (torch.float32, torch.float16, torch.bfloat16)
            and importlib.util.find_spec("triton") is not None
            and importlib.util.find_spec("kernels") is not None)


def _quantize_kernel(x: Any, spec: MXFormat, axis: int, block_size: int | None,
                     scale_rounding: str | None, rounding: str, seed: Any,
                     ts: float | None) -> MXArray:
    """The same result from the Triton kernel: one code per element in row order, unpacked."""
    import kernels

    size = spec.block_size if block_size is None else block_size
    lay = blocks.layout(tuple(x.shape), axis, size, True)
    out = kernels.mx_quantize(x, spec, axis=axis, block_size=size, scale_rounding=scale_rounding,
                              rounding=rounding, seed=seed, tensor_scale=ts, pack=False)
    codes = blocks.from_rows(out.elements.reshape(lay.rows, lay.block_size), lay)
    return MXArray(blocks.rows_to_scales(out.scales, lay), codes, spec, lay.axis,
                   lay.block_size, lay.shape, out.tensor_scale)


def dequantize(mx: MXArray, dtype: Any = np.float32) -> Any:
    """Values of an :class:`MXArray` (float32 by default, or float64); NaN scales give NaN."""
    wide = _wants_float64(dtype)
    lay = mx.layout
    codes = blocks.to_rows(mx.codes, lay)
    scales = blocks.scales_to_rows(mx.scales, lay)
    table = _value_table(mx.fmt, wide)
    if is_torch(codes):
        import torch

        vals = torch.from_numpy(table).to(codes.device)[codes.long()]
        ops = ops_for(codes)
    else:
        vals = table[codes]
        ops = ops_for(vals)
    factor = _scale_values(ops, scales, mx, wide)
    with np.errstate(over="ignore"):                      # beyond float32: inf, as documented
        return blocks.from_rows(vals * factor[:, None], lay)


# --------------------------------------------------------------------------------------------
# Argument handling
# --------------------------------------------------------------------------------------------
def _scale_mode(spec: MXFormat, scale_rounding: str | None) -> str | None:
    """The MX scale rule (None for NVFP4, whose E4M3 scales round to nearest even)."""
    if not spec.is_mx:
        if scale_rounding is not None:
            raise ValueError(f"{spec.name} block scales are E4M3 values rounded to nearest even; "
                             "scale_rounding applies to MX (E8M0) formats only: leave it None")
        return None
    mode = _SCALE_ALIASES.get(scale_rounding or "floor", scale_rounding or "floor")
    if mode not in SCALE_ROUNDINGS:
        raise ValueError(f"unknown scale_rounding {scale_rounding!r}; choose one of "
                         f"{', '.join(SCALE_ROUNDINGS)} (or 'rceil', an alias of 'ceil')")
    return mode


def _tensor_scale_arg(spec: MXFormat, tensor_scale: Any, unpacking: bool = False) -> Any:
    if spec.is_mx:
        if tensor_scale is not None:
            raise ValueError(f"{spec.name} has no per-tensor scale; tensor_scale is for nvfp4")
        return None
    if tensor_scale is None:
        if unpacking:
            raise ValueError("nvfp4 needs its float32 tensor_scale to unpack: pass the "
                             "MXArray's tensor_scale")
        return None
    with np.errstate(over="ignore"):
        value = float(np.float32(float(tensor_scale)))   # checked as float32 holds it
    if not (np.isfinite(value) and value >= 2.0**-126):
        raise ValueError(f"tensor_scale={tensor_scale!r}: pass a finite positive number in "
                         "float32's normal range [2^-126, 3.4e38], as the computed scale is")
    return value


def _float_input(x: Any, nvfp4: bool) -> Any:
    """float32 (or float64 for MX) NumPy array / torch tensor with the input's exact values."""
    if is_torch(x):
        import torch

        if not x.is_floating_point():
            raise TypeError(f"block formats quantize floating-point data, got a {x.dtype} "
                            "tensor: convert it with .float() first")
        if x.dtype == torch.float64 and not nvfp4:
            return x
        return x.to(torch.float32)
    arr = np.asarray(x)
    if arr.dtype.kind == "f" or (arr.dtype.kind == "V" and arr.dtype.itemsize <= 2):
        if arr.dtype == np.float64 and not nvfp4:
            return arr
        return arr.astype(np.float32, copy=False)
    raise TypeError(f"block formats quantize floating-point data, got dtype {arr.dtype}: "
                    "convert it with .astype(np.float32) first")


def _wants_float64(dtype: Any) -> bool:
    try:
        name = str(dtype)[6:] if str(dtype).startswith("torch.") else np.dtype(dtype).name
    except TypeError:
        name = repr(dtype)
    if name not in ("float32", "float64"):
        raise ValueError(f"dtype={dtype!r}: dequantize to float32 or float64")
    return name == "float64"


# --------------------------------------------------------------------------------------------
# Rows of blocks
# --------------------------------------------------------------------------------------------
def _row_amax_bits(rows: Any) -> Any:
    """Per-block max of |x| as the float's bits (NaN above inf: integer order is value order)."""
    ops = ops_for(rows)
    itype, mask = (ops.int64, 2**63 - 1) if _is_wide(rows) else (ops.int32, 2**31 - 1)
    mag = ops.view(rows, itype) & mask
    if is_torch(rows):
        return mag.amax(dim=1) if rows.shape[0] else mag.new_zeros(0)
    return mag.max(axis=1, initial=0)


def _quantize_rows(rows: Any, fn: Any, seed: Any) -> tuple[Any, Any]:
    """Run ``fn(rows, rng)`` once (torch) or over slices of rows (NumPy), giving codes."""
    if is_torch(rows):
        return fn(rows, seed)
    rng = np.random.default_rng(seed)
    step = max(1, CHUNK // rows.shape[1])
    scales = np.empty(rows.shape[0], np.uint8)
    codes = np.empty(rows.shape, np.uint8)
    with np.errstate(over="ignore", invalid="ignore"):     # NaN-scale blocks, zeroed after
        for lo in range(0, rows.shape[0], step):
            scales[lo:lo + step], codes[lo:lo + step] = fn(rows[lo:lo + step], rng)
    return scales, codes


def shared_exponents(ops: Any, amax: Any, spec: MXFormat, mode: str) -> tuple[Any, Any]:
    """Exponent s of X = 2^s per block from float64 amax, and where the scale is NaN.

    Integer-only on amax's bits: floor(log2(amax)) is the exponent field, exact for every float.
    """
    amax = ops.where(amax == 0, 2.0**-126, amax)       # all-zero block, as microxcaling
    bits = ops.view(amax, ops.int64)
    field = bits >> 52
    frac = bits & _FRAC
    e = field - 1023
    if mode == "floor":
        s = e - spec.emax
    elif mode == "ceil":
        s = ceil_exponent(ops, amax, spec.max)
    elif mode == "ceil_amax":
        s = e - spec.emax + ops.astype(frac != 0, ops.int64)
    elif mode == "even":
        carry = frac >= (1 << 52) - (1 << (51 - spec.mbits))
        s = e - spec.emax + ops.astype(carry, ops.int64)
    else:
        raise AssertionError(mode)
    nan = (field == 2047) | (s > 127)
    return ops.where(nan, 0, ops.clamp_min(s, -127)), nan


def ceil_exponent(ops: Any, v: Any, limit: float) -> Any:
    """Smallest integer k with v / 2^k <= limit, exactly, for positive normal float64 ``v``.

    With v = V * 2^e and limit = L * 2^l (V, L in [1, 2)): k = e - l, plus 1 when V > L.
    """
    bits = ops.view(v, ops.int64)
    lim = _f64_bits(limit)
    return (bits >> 52) - (lim >> 52) + ops.astype((bits & _FRAC) > (lim & _FRAC), ops.int64)


def _mx_rows(rows: Any, spec: MXFormat, mode: str, rounding: str, rng: Any) -> tuple[Any, Any]:
    ops = ops_for(rows)
    fdt = rows.dtype
    amax = ops.astype(ops.view(_row_amax_bits(rows), fdt), ops.float64)
    s, nan = shared_exponents(ops, amax, spec, mode)
    factor = ops.astype(ops.view((1023 - s) << 52, ops.float64), fdt)   # 2^-s, exact
    scaled = rows * factor[:, None]
    if spec.elem_exp:
        scaled = scaled * 2.0**-spec.elem_exp     # |scaled| <= 2: exact (NaN blocks aside)
    if rounding in ("rup", "rdown", "rto"):
        scaled = _keep_underflow(ops, rows, scaled)
    if bool(nan.any()):
        scaled = ops.where(nan[:, None], 0.0, scaled)
    codes = encode(scaled, spec.elem, rounding=rounding, saturate=True, seed=rng, nan="zero")
    if spec.elem.is_int:
        codes = ops.where(codes == 0x80, 0x81, codes)   # symmetric: -128 clamps to -127
    return _u8(ops.where(nan, 255, s + 127)), codes


def _keep_underflow(ops: Any, rows: Any, scaled: Any) -> Any:
    """Replace products that underflowed to ±0 by the least subnormal of the input's sign."""
    tiny = float(np.finfo(np.float64 if _is_wide(scaled) else np.float32).smallest_subnormal)
    lost = (scaled == 0) & (rows != 0)
    return ops.where(lost, ops.astype(rows < 0, scaled.dtype) * (-2.0 * tiny) + tiny, scaled)


def _nvfp4_tensor_scale(rows: Any) -> float:
    """torchao's amax / (448 * 6) in float32 over finite values, at least 2^-126."""
    if is_torch(rows):
        amax_bits = _row_amax_bits(rows)
    else:                                               # by slices: no full-size temporary
        step = max(1, CHUNK // rows.shape[1])
        parts = [_row_amax_bits(rows[lo:lo + step]) for lo in range(0, rows.shape[0], step)]
        amax_bits = np.concatenate(parts or [np.zeros(0, np.int32)])
    finite = ops_for(amax_bits).where(amax_bits < 0x7F800000, amax_bits, 0)
    amax = finite.max() if finite.shape[0] else 0
    amax32 = np.array(int(amax), np.int32).view(np.float32)
    return float(max(amax32 / np.float32(448 * 6), np.float32(_NVFP4_MIN_TENSOR_SCALE)))


def _nvfp4_rows(rows: Any, spec: MXFormat, ts: float, rounding: str,
                rng: Any) -> tuple[Any, Any]:
    ops = ops_for(rows)
    amax_bits = _row_amax_bits(rows)
    amax = ops.view(amax_bits, ops.float32)
    nan = amax_bits >= 0x7F800000
    amax = ops.where(nan, 0.0, amax)
    scale = _div(_div(amax, 6.0), ts)
    scale = _clip(scale, 2.0**-6, 448.0)
    scodes = encode(scale, spec.scale, saturate=True)
    total = _mul(ops.astype(decode(scodes, spec.scale), ops.float32), ts)
    scaled = _div(rows, total[:, None])
    if bool(nan.any()):
        scaled = ops.where(nan[:, None], 0.0, scaled)
        scodes = ops.where(nan, spec.scale.nan_code, scodes)
    codes = encode(scaled, spec.elem, rounding=rounding, saturate=True, seed=rng, nan="zero")
    return _u8(scodes), codes


def _scale_values(ops: Any, scales: Any, mx: MXArray, wide: bool) -> Any:
    """Per-block multiplier: 2^s (NaN for 0xFF), or NVFP4's tensor_scale * e4m3 scale."""
    fdt = ops.float64 if wide else ops.float32
    if mx.fmt.is_mx:
        s = ops.astype(scales, ops.int64)
        x = ops.view((s - 127 + 1023) << 52, ops.float64)
        return ops.astype(ops.where(s == 255, float("nan"), x), fdt)
    block = decode(scales, mx.fmt.scale)           # float64, exact
    if wide:
        return block * mx.tensor_scale
    return _mul(ops.astype(block, ops.float32), mx.tensor_scale)


@functools.lru_cache(maxsize=32)
def _value_table(spec: MXFormat, wide: bool) -> np.ndarray:
    vals = decode(np.arange(spec.elem.num_codes, dtype=np.uint32), spec.elem) \
        * 2.0**spec.elem_exp
    return vals.astype(np.float64 if wide else np.float32)


# --------------------------------------------------------------------------------------------
# Small exact helpers shared by both backends
# --------------------------------------------------------------------------------------------
def _f64_bits(v: float) -> int:
    return int(np.array(v, np.float64).view(np.int64))


def _u8(a: Any) -> Any:
    if is_torch(a):
        import torch

        return a.to(torch.uint8)
    return a.astype(np.uint8)


def _is_wide(a: Any) -> bool:
    """float64 (or int64) lanes."""
    return (a.element_size() if is_torch(a) else a.dtype.itemsize) == 8


def _const(a: Any, v: float) -> Any:
    """``v`` as a float32 constant for ``a``'s backend: a 1-element tensor for torch, so that
    no kernel replaces a division by a multiplication with the reciprocal."""
    if is_torch(a):
        import torch

        return torch.tensor([v], dtype=a.dtype, device=a.device)
    return a.dtype.type(v)


def _div(a: Any, v: Any) -> Any:
    return a / (v if hasattr(v, "shape") and v.shape else _const(a, v))


def _mul(a: Any, v: float) -> Any:
    return a * _const(a, v)


def _clip(a: Any, lo: float, hi: float) -> Any:
    if is_torch(a):
        return a.clamp(lo, hi)
    return np.clip(a, a.dtype.type(lo), a.dtype.type(hi))
