"""Block-scaled formats: OCP Microscaling (MX v1.0) and NVFP4, bit-exact.

A block of ``block_size`` consecutive elements along ``axis`` shares one scale.  MX formats
(``mxfp8_e4m3``, ``mxfp8_e5m2``, ``mxfp6_e2m3``, ``mxfp6_e3m2``, ``mxfp4``, ``mxint8``) use an
E8M0 power-of-two scale X = 2^s per 32 elements; ``nvfp4`` uses an FP8 E4M3 scale per 16 E2M1
elements and one float32 scale for the whole tensor.  Elements are rounded by the core
([``fpsim.encode``][], saturating), so every rounding mode of the core is available.

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

The formats, their registry and the scale rules are in ``fpsim.blockrules`` (re-exported
here); this module holds the container ([``BlockArray``][], alias ``MXArray``), ``quantize``,
``dequantize`` and the choice of the Triton kernel (through ``fpsim.dispatch``).

Packed layout (``MXArray.pack``; the Triton kernel produces the same bytes): move ``axis`` to
the end, pad it with zeros to a multiple of ``block_size``, flatten in C order.  The scale bytes
are one per block in that order; the element bytes are that flat stream of codes packed by
``fpsim.packing.pack_codes`` (FP4: two per byte, first in the low nibble; FP6: four in three
bytes, little-endian; 8-bit: one per byte).  NVFP4's float32 tensor scale travels beside them.

Memory: ``quantize``, ``dequantize``, ``pack`` and ``unpack`` work on pieces of whole blocks
(``fpsim.blocks.pieces``; ``CHUNK`` elements per NumPy piece and thread,
``TORCH_CHUNK`` per torch piece) written into preallocated outputs (uint8 codes and scales,
packed bytes, values), so a large operand costs its outputs plus a few pieces, not full-size
copies of the padded or transposed input, int64 gathers and intermediate values.  Pieces give
the bits of one piece: NumPy's stochastic rounding draws its random bits piece after piece from
one generator, in row order, and torch's draws them in one piece.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from . import blocks, dispatch, parallel
from .backend import float_input, is_torch, ops_for
from .blockrules import (BLOCK_FORMATS, NVFP4_MIN_TENSOR_SCALE, SCALE_ROUNDINGS, BlockFormat,
                         ceil_exponent, check_packed, check_tensor_scale, element_values,
                         get_block_format, mx_element_codes, mx_scale_rows, nvfp4_scale_rows,
                         nvfp4_tensor_scale, scale_rule, scale_values, shared_exponents)
from .convert import encode
from .inputs import check_flag, check_input, check_seed
from .packing import pack_pieces, packed_size, unpack_range
from .rounding import STOCHASTIC, check_mode
from .stochastic import check_random_bits, check_srbits

CHUNK = 1 << 18                 # elements per NumPy piece: a few MiB of temporaries per thread
TORCH_CHUNK = 1 << 24           # per torch piece: see _chunk

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

    def scale_values(self, dtype: Any = np.float32) -> Any:
        """The values of the scale codes in ``scales`` (same shape): 2^(code - 127) for E8M0
        (NaN for code 0xFF), the E4M3 value for NVFP4 (its float32 ``tensor_scale`` apart).
        float32 (default; every E8M0 and E4M3 value is exact in it) or float64.

        >>> import numpy as np, fpsim
        >>> b = fpsim.mx.quantize(np.float32([[0.1, -0.5, 1.0, 3.7]]), "mxfp4")
        >>> b.scales.tolist(), b.scale_values().tolist()
        ([[126]], [[0.5]])
        """
        wide = _wants_float64(dtype)
        return scale_values(ops_for(self.scales), self.scales, self.fmt,
                            None if self.fmt.is_mx else 1.0, wide)

    def dequantize(self, dtype: Any = np.float32) -> Any:
        """The values the codes stand for, as float32 (default) or float64.

        MX values are exact in float64, and in float32 unless they exceed its range (then ±inf:
        float64 inputs, or an amax near float32's max rounded up by a "ceil"/"even" scale).
        NVFP4 float32 follows torchao, element * fp32(tensor_scale * scale); float64 is the
        exact product.
        """
        return dequantize(self, dtype)

    def pack(self) -> tuple[Any, Any]:
        """``(scale_bytes, element_bytes)``, both 1-D uint8, in the layout of the module doc
        (the element bytes written piece by piece: temporaries of one piece)."""
        lay = self.layout
        scales = blocks.scales_to_rows(self.scales, lay)
        bits = self.fmt.elem.bits
        codes3 = blocks.grouped(self.codes, lay)
        out = _empty(self.codes, (packed_size(lay.rows * lay.block_size, bits),), "uint8")
        parts = (blocks.gather(codes3, lay, p) for p in blocks.pieces(lay, _chunk(self.codes)))
        return scales, pack_pieces(parts, bits, out)

    @classmethod
    def unpack(cls, scales: Any, packed: Any, fmt: str | BlockFormat, shape: tuple[int, ...], *,
               axis: int = -1, block_size: int | None = None,
               tensor_scale: float | None = None) -> "BlockArray":
        """Rebuild a BlockArray from [``pack``][]'s bytes and the original shape and axis.

        Bytes whose padding codes are not zero (as [``pack``][] writes them) were packed from
        another shape, axis or block size: ValueError."""
        spec = get_block_format(fmt)
        scales, packed = (np.frombuffer(b, np.uint8) if isinstance(b, (bytes, bytearray))
                          else b if is_torch(b) else np.asarray(b) for b in (scales, packed))
        size = spec.block_size if block_size is None else block_size
        if isinstance(shape, (int, np.integer)):
            shape = (shape,)
        lay = blocks.layout(tuple(shape), axis, size, pad=True)
        check_packed(scales, packed, spec, lay)
        ts = check_tensor_scale(spec, tensor_scale, unpacking=True)
        codes = _empty(packed, lay.shape, "uint8")
        codes3, size = blocks.grouped(codes, lay), lay.block_size
        for p in blocks.pieces(lay, _chunk(packed)):         # a piece of codes at a time
            rows = unpack_range(packed, spec.elem.bits, p.first * size, (p.first + p.rows) * size)
            blocks.check_padding(rows, lay, p.first)
            blocks.scatter(codes3, lay, p, rows)
        return cls(blocks.rows_to_scales(scales.reshape(-1), lay), codes, spec, lay.axis,
                   lay.block_size, lay.shape, ts)


MXArray = BlockArray


# --------------------------------------------------------------------------------------------
# Public functions
# --------------------------------------------------------------------------------------------
def quantize(x: Any, fmt: str | BlockFormat, *, axis: int = -1, block_size: int | None = None,
             scale_rounding: str | None = None, rounding: str = "rne", pad: bool = True,
             seed: Any = None, tensor_scale: float | None = None, srbits: int | None = None,
             random_bits: Any = None, backend: str = "auto") -> BlockArray:
    """Quantize ``x`` to a block format: one shared scale per ``block_size`` consecutive values
    along ``axis`` (zero-padded), one element code per value.  The rules are in the module doc.

    ``scale_rounding`` (MX only; None means ``"floor"``) picks the scale rule, ``rounding`` any
    core rounding mode for the elements (stochastic ones: ``seed``, ``srbits`` and
    ``random_bits`` of ``x``'s shape as [``fpsim.quantize``][] takes them).  ``pad=False`` refuses
    an axis that is not a multiple of ``block_size``.  ``tensor_scale`` (NVFP4 only) replaces the
    computed per-tensor scale.  NumPy in, NumPy out; torch in, torch out (bit-identical, except
    stochastic rounding, whose random bits differ unless given).  ``backend``: ``"auto"`` runs CUDA
    float32/float16/bfloat16 tensors on the Triton kernel (``kernels.mx_quantize``), ``"torch"``
    never, ``"triton"`` always (on CPU tensors too, through Triton's interpreter).

    >>> import numpy as np, fpsim
    >>> b = fpsim.mx.quantize(np.float32([[0.1, -0.5, 1.0, 3.7]]), "mxfp4")
    >>> b.scales.tolist(), b.codes.tolist()       # one E8M0 scale (2^-1), four FP4 codes
    ([[126]], [[0, 10, 4, 7]])
    """
    spec = get_block_format(fmt)
    mode = scale_rule(spec, scale_rounding)
    rounding, pad = check_mode(rounding), check_flag(pad, "pad")
    ts_arg = check_tensor_scale(spec, tensor_scale)
    srbits = check_srbits(srbits, rounding)
    x = check_input(x)
    rbits = check_random_bits(random_bits, x, rounding, srbits, seed)
    size = spec.block_size if block_size is None else block_size
    if dispatch.route_blocks(x, backend, pad, is_torch(x)):
        lay = blocks.layout(tuple(x.shape), axis, size, True)
        out = dispatch.mx_quantize(x, spec, axis=axis, block_size=size, scale_rounding=mode,
                                   rounding=rounding, seed=seed, tensor_scale=ts_arg,
                                   srbits=srbits, random_bits=rbits)
        codes = out.elements.reshape(lay.rows, lay.block_size)
        return BlockArray(blocks.rows_to_scales(out.scales, lay), blocks.from_rows(codes, lay),
                          spec, lay.axis, lay.block_size, lay.shape, out.tensor_scale)
    x = x if is_torch(x) else np.asarray(x)
    who = "block formats quantize"
    float_input(x.reshape(-1)[:0], who)                  # the dtype check, before the shape's
    lay = blocks.layout(tuple(x.shape), axis, size, pad)
    x3 = blocks.grouped(x, lay)
    # torch's stochastic rounding draws the random bits of one call from its seed: one piece
    parts = blocks.pieces(lay, lay.rows * lay.block_size if is_torch(x)
                          and rounding in STOCHASTIC else _chunk(x))
    r3 = None if rbits is None else blocks.grouped(rbits, lay)

    def rows_of(p: blocks.Piece) -> Any:
        return float_input(blocks.gather(x3, lay, p), who, keep_float64=spec.is_mx)

    ts = None
    if spec.is_mx:
        def scale_rows(r: Any) -> tuple[Any, Any, Any]:
            return mx_scale_rows(r, spec, mode, rounding)
    else:
        ts = ts_arg if ts_arg is not None else max(          # max of a monotone function
            _each(parts, lambda p: nvfp4_tensor_scale(rows_of(p), CHUNK), is_torch(x)),
            default=NVFP4_MIN_TENSOR_SCALE)

        def scale_rows(r: Any) -> tuple[Any, Any, Any]:
            return nvfp4_scale_rows(r, spec, ts)
    scales, codes = _empty(x, lay.scale_shape, "uint8"), _empty(x, lay.shape, "uint8")
    scales3, codes3 = blocks.grouped(scales, lay, per_block=True), blocks.grouped(codes, lay)
    rng = None if rbits is not None else seed if is_torch(x) else \
        np.random.default_rng(check_seed(seed))

    def quantize_piece(p: blocks.Piece) -> None:
        scodes, scaled, _ = scale_rows(rows_of(p))
        r = None if r3 is None else blocks.gather(r3, lay, p)
        ecodes = encode(scaled, spec.elem, rounding=rounding, saturate=True, seed=rng,
                        srbits=srbits, random_bits=r, on_nan="zero")
        blocks.scatter(scales3, lay, p, scodes, per_block=True)
        blocks.scatter(codes3, lay, p, mx_element_codes(spec, ecodes))

    with np.errstate(over="ignore", invalid="ignore"):     # NaN-scale blocks, zeroed after
        _each(parts, quantize_piece, is_torch(x) or rounding in STOCHASTIC)
    return BlockArray(scales, codes, spec, lay.axis, lay.block_size, lay.shape, ts)


def dequantize(mx: BlockArray, dtype: Any = np.float32) -> Any:
    """Values of a [``BlockArray``][] (float32 by default, or float64); NaN scales give NaN.
    Computed piece by piece into the output: temporaries of one piece per thread.

    >>> import numpy as np, fpsim
    >>> b = fpsim.mx.quantize(np.float32([0.1, -0.5, 1.0, 3.7]), "mxfp4")
    >>> fpsim.mx.dequantize(b).tolist()           # 3.7 saturates to 6 x 2^-1 (OCP's floor rule)
    [0.0, -0.5, 1.0, 3.0]
    """
    wide = _wants_float64(dtype)
    lay = mx.layout
    blocks.check_scales(mx.scales, lay)
    table = element_values(mx.fmt, wide)
    ops = ops_for(mx.codes)
    if is_torch(mx.codes):
        import torch

        table = torch.from_numpy(table).to(mx.codes.device)
    out = _empty(mx.codes, lay.shape, "float64" if wide else "float32")
    codes3, scales3, out3 = (blocks.grouped(mx.codes, lay),
                             blocks.grouped(mx.scales, lay, per_block=True),
                             blocks.grouped(out, lay))

    def dequantize_piece(p: blocks.Piece) -> None:
        codes = blocks.gather(codes3, lay, p)
        vals = table[codes.long()] if is_torch(codes) else table[codes]
        factor = scale_values(ops, blocks.gather(scales3, lay, p, per_block=True), mx.fmt,
                              mx.tensor_scale, wide)
        blocks.scatter(out3, lay, p, vals * factor[:, None])

    with np.errstate(over="ignore"):                      # beyond float32: inf, as documented
        _each(blocks.pieces(lay, _chunk(mx.codes)), dequantize_piece, is_torch(mx.codes))
    return out


def _wants_float64(dtype: Any) -> bool:
    try:
        name = str(dtype)[6:] if str(dtype).startswith("torch.") else np.dtype(dtype).name
    except TypeError:
        name = repr(dtype)
    if name not in ("float32", "float64"):
        raise ValueError(f"dtype={dtype!r}: dequantize to float32 or float64")
    return name == "float64"


def _chunk(a: Any) -> int:
    """Elements per piece for ``a``'s library.  torch's ops run on its own threads, and on a
    busy machine each op waits for them to wake (milliseconds, whatever its size): pieces of
    2^24 elements leave every GPT-2 124M weight in one piece and split only the operands whose
    temporaries dominate memory (the 768 x 50,257 LM head, the logits)."""
    return TORCH_CHUNK if is_torch(a) else CHUNK


def _empty(like: Any, shape: tuple[int, ...], dtype: str) -> Any:
    """An uninitialised NumPy array, or torch tensor on ``like``'s device, of ``dtype``."""
    if is_torch(like):
        import torch

        return torch.empty(shape, dtype=getattr(torch, dtype), device=like.device)
    return np.empty(shape, dtype)


def _each(parts: list[blocks.Piece], job: Callable[[blocks.Piece], Any],
          in_order: bool) -> list[Any]:
    """``job`` of every piece, in order (torch, which threads inside its ops, and one random
    stream), else on every core (``fpsim.parallel.run``); the results in order."""
    if in_order:
        return [job(p) for p in parts]
    grain = max(1, parallel.GRAIN // CHUNK)
    runs = parallel.run(lambda lo, hi: [job(p) for p in parts[lo:hi]], len(parts), grain)
    return [r for run in runs for r in run]
