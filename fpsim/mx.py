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

The formats, their registry and the scale rules are in :mod:`fpsim.blockrules` (re-exported
here); this module holds the container (:class:`BlockArray`, alias ``MXArray``), ``quantize``,
``dequantize`` and the choice of the Triton kernel (through :mod:`fpsim.dispatch`).

Packed layout (``MXArray.pack``; the Triton kernel produces the same bytes): move ``axis`` to
the end, pad it with zeros to a multiple of ``block_size``, flatten in C order.  The scale bytes
are one per block in that order; the element bytes are that flat stream of codes packed by
:func:`fpsim.packing.pack_codes` (FP4: two per byte, first in the low nibble; FP6: four in three
bytes, little-endian; 8-bit: one per byte).  NVFP4's float32 tensor scale travels beside them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import blocks, dispatch, parallel
from .backend import float_input, is_torch, ops_for
from .blockrules import (BLOCK_FORMATS, SCALE_ROUNDINGS, BlockFormat, ceil_exponent,
                         check_tensor_scale, element_values, get_block_format, mx_element_codes,
                         mx_scale_rows, nvfp4_scale_rows, nvfp4_tensor_scale, scale_rule,
                         scale_values, shared_exponents)
from .convert import encode
from .inputs import check_flag, check_input, check_seed
from .packing import pack_codes, packed_size, unpack_codes
from .rounding import check_mode

CHUNK = 1 << 16                 # elements per NumPy slice: temporaries stay in cache

#: Old names, kept as aliases: the containers carry NVFP4 too, so the neutral names lead.
MXFormat = BlockFormat
MX_FORMATS = BLOCK_FORMATS
get_mx_format = get_block_format

__all__ = ["BLOCK_FORMATS", "BlockArray", "BlockFormat", "MXArray", "MXFormat", "MX_FORMATS",
           "SCALE_ROUNDINGS", "ceil_exponent", "dequantize", "get_block_format",
           "get_mx_format", "quantize", "shared_exponents"]


# --------------------------------------------------------------------------------------------
# The result
# --------------------------------------------------------------------------------------------
@dataclass
class BlockArray:
    """A block-quantized array: one scale code per block, one element code per element.

    ``scales``: uint8 scale codes (E8M0, or E4M3 for NVFP4), shaped like the input with ``axis``
    holding the block count.  ``codes``: uint8 element codes, the input's shape (padding
    stripped).  ``tensor_scale``: NVFP4's float32 per-tensor scale (None for MX).
    """

    scales: Any
    codes: Any
    fmt: BlockFormat
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
    def unpack(cls, scales: Any, packed: Any, fmt: str | BlockFormat, shape: tuple[int, ...], *,
               axis: int = -1, block_size: int | None = None,
               tensor_scale: float | None = None) -> "BlockArray":
        """Rebuild a BlockArray from :meth:`pack`'s bytes and the original shape and axis.

        Bytes whose padding codes are not zero (as :meth:`pack` writes them) were packed from
        another shape, axis or block size: ValueError."""
        spec = get_block_format(fmt)
        scales, packed = (np.frombuffer(b, np.uint8) if isinstance(b, (bytes, bytearray))
                          else b if is_torch(b) else np.asarray(b) for b in (scales, packed))
        size = spec.block_size if block_size is None else block_size
        if isinstance(shape, (int, np.integer)):
            shape = (shape,)
        lay = blocks.layout(tuple(shape), axis, size, pad=True)
        n_scales = scales.reshape(-1).shape[0]
        if n_scales != lay.rows:
            raise ValueError(f"{n_scales} scale bytes given; shape {lay.shape} with blocks of "
                             f"{lay.block_size} along axis {lay.axis} has {lay.rows} blocks")
        _check_packed(scales, packed, spec, lay)
        rows = unpack_codes(packed, spec.elem.bits, lay.rows * lay.block_size)
        if bool((rows.reshape(lay.outer + (lay.padded,))[..., lay.length:] != 0).any()):
            raise ValueError(f"the padding of shape {lay.shape} (axis {lay.axis}, blocks of "
                             f"{lay.block_size}) holds non-zero codes: these bytes were packed "
                             "from another shape, axis or block size")
        codes = blocks.from_rows(rows.reshape(lay.rows, lay.block_size), lay)
        ts = check_tensor_scale(spec, tensor_scale, unpacking=True)
        return cls(blocks.rows_to_scales(scales.reshape(-1), lay), codes, spec, lay.axis,
                   lay.block_size, lay.shape, ts)


MXArray = BlockArray


def _check_packed(scales: Any, packed: Any, spec: BlockFormat, lay: blocks.Layout) -> None:
    """The element bytes are exactly this format's and shape's; scale codes are bytes."""
    need = packed_size(lay.rows * lay.block_size, spec.elem.bits)
    have = int(np.prod(tuple(packed.shape)))
    if have != need:
        raise ValueError(f"{have} element bytes given; {spec.name} ({spec.elem.bits}-bit codes) "
                         f"of shape {lay.shape} in blocks of {lay.block_size} packs into {need}: "
                         "unpack with the format and shape that were packed")
    s = scales if is_torch(scales) else np.asarray(scales)
    if s.dtype.is_floating_point if is_torch(s) else s.dtype.kind not in "iu":
        raise TypeError(f"scale codes must be integers (uint8), got dtype {s.dtype}")
    if int(np.prod(tuple(s.shape))) and (int(s.min()) < 0 or int(s.max()) > 255):
        raise ValueError(f"scale codes lie in [0, 255] (one byte each); got {int(s.min())}.."
                         f"{int(s.max())}")


# --------------------------------------------------------------------------------------------
# Public functions
# --------------------------------------------------------------------------------------------
def quantize(x: Any, fmt: str | BlockFormat, *, axis: int = -1, block_size: int | None = None,
             scale_rounding: str | None = None, rounding: str = "rne", pad: bool = True,
             seed: Any = None, tensor_scale: float | None = None,
             backend: str = "auto") -> BlockArray:
    """Quantize ``x`` to a block format along ``axis``; see the module doc for the rules.

    ``scale_rounding`` (MX only; None means ``"floor"``) picks the scale rule, ``rounding`` any
    core rounding mode for the elements (``seed`` for ``"stochastic"``).  ``pad=False`` refuses
    an axis that is not a multiple of ``block_size``.  ``tensor_scale`` (NVFP4 only) replaces the
    computed per-tensor scale.  NumPy in, NumPy out; torch in, torch out (bit-identical, except
    stochastic rounding, whose random bits differ).  ``backend``: ``"auto"`` runs CUDA
    float32/float16/bfloat16 tensors on the Triton kernel (``kernels.mx_quantize``), ``"torch"``
    never, ``"triton"`` always (on CPU tensors too, through Triton's interpreter).
    """
    spec = get_block_format(fmt)
    mode = scale_rule(spec, scale_rounding)
    rounding, pad = check_mode(rounding), check_flag(pad, "pad")
    ts_arg = check_tensor_scale(spec, tensor_scale)
    x = check_input(x)
    size = spec.block_size if block_size is None else block_size
    if dispatch.route_blocks(x, backend, pad, is_torch(x)):
        lay = blocks.layout(tuple(x.shape), axis, size, True)
        out = dispatch.mx_quantize(x, spec, axis=axis, block_size=size, scale_rounding=mode,
                                   rounding=rounding, seed=seed, tensor_scale=ts_arg)
        codes = out.elements.reshape(lay.rows, lay.block_size)
        return BlockArray(blocks.rows_to_scales(out.scales, lay), blocks.from_rows(codes, lay),
                          spec, lay.axis, lay.block_size, lay.shape, out.tensor_scale)
    work = float_input(x, "block formats quantize", keep_float64=spec.is_mx)
    lay = blocks.layout(tuple(work.shape), axis, size, pad)
    rows = blocks.to_rows(work, lay)
    ts = None
    if spec.is_mx:
        def scale_rows(r: Any) -> tuple[Any, Any, Any]:
            return mx_scale_rows(r, spec, mode, rounding)
    else:
        ts = nvfp4_tensor_scale(rows, CHUNK) if ts_arg is None else ts_arg

        def scale_rows(r: Any) -> tuple[Any, Any, Any]:
            return nvfp4_scale_rows(r, spec, ts)
    scales, codes = _quantize_rows(rows, spec, scale_rows, rounding, seed)
    return BlockArray(blocks.rows_to_scales(scales, lay), blocks.from_rows(codes, lay), spec,
                      lay.axis, lay.block_size, lay.shape, ts)


def dequantize(mx: BlockArray, dtype: Any = np.float32) -> Any:
    """Values of a :class:`BlockArray` (float32 by default, or float64); NaN scales give NaN."""
    wide = _wants_float64(dtype)
    lay = mx.layout
    codes = blocks.to_rows(mx.codes, lay)
    scales = blocks.scales_to_rows(mx.scales, lay)
    table = element_values(mx.fmt, wide)
    if is_torch(codes):
        import torch

        vals = torch.from_numpy(table).to(codes.device)[codes.long()]
        ops = ops_for(codes)
    else:
        vals = table[codes]
        ops = ops_for(vals)
    factor = scale_values(ops, scales, mx.fmt, mx.tensor_scale, wide)
    with np.errstate(over="ignore"):                      # beyond float32: inf, as documented
        return blocks.from_rows(vals * factor[:, None], lay)


def _wants_float64(dtype: Any) -> bool:
    try:
        name = str(dtype)[6:] if str(dtype).startswith("torch.") else np.dtype(dtype).name
    except TypeError:
        name = repr(dtype)
    if name not in ("float32", "float64"):
        raise ValueError(f"dtype={dtype!r}: dequantize to float32 or float64")
    return name == "float64"


def _quantize_rows(rows: Any, spec: BlockFormat, scale_rows: Any, rounding: str,
                   seed: Any) -> tuple[Any, Any]:
    """Scale codes and element codes: ``scale_rows`` gives the scaled elements, the core rounds
    them (saturating); once for torch, over slices of rows for NumPy."""
    def codes_of(r: Any, rng: Any) -> tuple[Any, Any]:
        scodes, scaled, _ = scale_rows(r)
        codes = encode(scaled, spec.elem, rounding=rounding, saturate=True, seed=rng,
                       on_nan="zero")
        return scodes, mx_element_codes(spec, codes)

    if is_torch(rows):
        return codes_of(rows, seed)
    rng = np.random.default_rng(check_seed(seed))
    step = max(1, CHUNK // rows.shape[1])
    scales = np.empty(rows.shape[0], np.uint8)
    codes = np.empty(rows.shape, np.uint8)

    def part(first: int, stop: int) -> None:
        for lo in range(first, stop, step):
            hi = min(stop, lo + step)
            scales[lo:hi], codes[lo:hi] = codes_of(rows[lo:hi], rng)

    with np.errstate(over="ignore", invalid="ignore"):     # NaN-scale blocks, zeroed after
        if rounding == "stochastic":                       # one seed, one sequence of bits
            part(0, rows.shape[0])
        else:                                              # row slices on every core
            parallel.run(part, rows.shape[0], max(1, parallel.GRAIN // max(1, rows.shape[1])))
    return scales, codes
