"""MX and NVFP4 block kernels: scales and packed elements in one pass, as ``fpsim.mx`` packs them.

Each program owns ``NB`` consecutive blocks of ``BS`` elements (a ``[NB, BS]`` tile in
registers): it loads them once, reduces each block's amax on the integer bits, derives the
block scale, scales, rounds and packs the elements, and writes the scale bytes and element bytes
of ``fpsim.mx.MXArray.pack``.  The block rules are line-for-line twins of
``fpsim.blockrules`` (``shared_exponents``, ``ceil_exponent``, ``mx_scale_rows``,
``nvfp4_scale_rows``, ``scale_values``), whose public functions the host side calls too;
elements are rounded by ``fpsim_kernels.rounding.round_bits``.  NVFP4's per-tensor scale needs the
whole tensor's amax first: it is computed by ``fpsim.blockrules.nvfp4_tensor_scale`` (one extra
read) unless given.

Blocks run along the last axis of a contiguous tensor; another ``axis`` is moved there first
(a copy).  A ragged last block is zero-padded in registers, as ``fpsim.mx`` pads it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

from fpsim import blocks
from fpsim.backend import float64_bits
from fpsim.blockrules import (BLOCK_FORMATS, BlockFormat, check_packed, check_tensor_scale,
                              get_block_format, nvfp4_tensor_scale, scale_rule)
from fpsim.packing import packed_size, unpack_codes
from fpsim.rounding import check_mode

from .cast import FLOAT_DTYPES, codes_per_group, load_bits, load_packed, stochastic_args, \
    stochastic_bits, store_packed
from .rounding import _stochastic, decode_bits, format_spec, round_bits

TILE = 4096                     # elements per program (NB = TILE // block_size blocks)
NUM_WARPS = 8
_FRAC = tl.constexpr((1 << 52) - 1)                 # float64 fraction field
_E4M3 = tl.constexpr(format_spec(BLOCK_FORMATS["nvfp4"].scale))


class MXPacked(NamedTuple):
    """What ``mx_quantize`` returns: ``fpsim.mx.quantize(...).pack()`` and the NVFP4 scale."""

    scales: torch.Tensor        # uint8, one per block, in row order (blocked axis last)
    elements: torch.Tensor      # uint8, the element codes packed by fpsim.packing.pack_codes
    tensor_scale: float | None  # NVFP4's float32 per-tensor scale; None for MX


# --------------------------------------------------------------------------------------------
# Device code: twins of fpsim.blockrules
# --------------------------------------------------------------------------------------------
@triton.jit
def shared_exponents(amax, EMAX: tl.constexpr, MAX_BITS: tl.constexpr, MBITS: tl.constexpr,
                     MODE: tl.constexpr):
    """Exponent s of X = 2^s per block from float64 amax, and where the scale is NaN."""
    amax = tl.where(amax == 0, 2.0**-126, amax)       # all-zero block, as microxcaling
    bits = amax.to(tl.int64, bitcast=True)
    field = bits >> 52
    frac = bits & _FRAC
    e = field - 1023
    if MODE == "floor":
        s = e - EMAX
    elif MODE == "ceil":
        s = ceil_exponent(amax, MAX_BITS)
    elif MODE == "ceil_amax":
        s = e - EMAX + (frac != 0).to(tl.int64)
    else:
        tl.static_assert(MODE == "even", "unknown scale rounding")
        carry = frac >= (1 << 52) - (1 << (51 - MBITS))
        s = e - EMAX + carry.to(tl.int64)
    nan = (field == 2047) | (s > 127)
    return tl.where(nan, 0, tl.maximum(s, -127)), nan


@triton.jit
def ceil_exponent(v, LIM: tl.constexpr):
    """Smallest integer k with v / 2^k <= limit (float64 bits ``LIM``), for positive normal v."""
    bits = v.to(tl.int64, bitcast=True)
    return (bits >> 52) - (LIM >> 52) + ((bits & _FRAC) > (_FRAC & LIM)).to(tl.int64)


@triton.jit
def _mx_blocks(x, amax_bits, rand, ELEM: tl.constexpr, EMAX: tl.constexpr,
               MAX_BITS: tl.constexpr, MBITS: tl.constexpr, ELEM_EXP: tl.constexpr,
               SCALE_MODE: tl.constexpr, MODE: tl.constexpr, IS_INT: tl.constexpr,
               SRBITS: tl.constexpr):
    """Scale codes ``[NB]`` and element codes ``[NB, BS]``: the twin of
    ``blockrules.mx_scale_rows`` (and the core's rounding, ``mx_element_codes``)."""
    amax = amax_bits.to(tl.float32, bitcast=True).to(tl.float64)
    s, nan = shared_exponents(amax, EMAX, MAX_BITS, MBITS, SCALE_MODE)
    factor = ((1023 - s) << 52).to(tl.float64, bitcast=True).to(tl.float32)   # 2^-s, exact
    scaled = x * factor[:, None]
    if ELEM_EXP != 0:
        scaled = scaled * 2.0**-ELEM_EXP              # |scaled| <= 2: exact (NaN blocks aside)
    sbits = scaled.to(tl.int32, bitcast=True)
    if MODE == "rup" or MODE == "rdown" or MODE == "rto":   # keep_underflow: ±2^-149
        lost = (scaled == 0) & (x != 0)
        sbits = tl.where(lost, tl.where(x < 0, -0x7FFFFFFF, 1), sbits)
    sbits = tl.where(nan[:, None], 0, sbits)
    codes = round_bits(sbits & 0x7FFFFFFF, sbits < 0, ELEM, MODE, True, True, rand, "code",
                       SRBITS)
    if IS_INT:
        codes = tl.where(codes == 0x80, 0x81, codes)  # symmetric: -128 clamps to -127
    return tl.where(nan, 255, s + 127).to(tl.int32), codes


@triton.jit
def _nvfp4_blocks(x, amax_bits, rand, ts, ELEM: tl.constexpr, MODE: tl.constexpr,
                  SRBITS: tl.constexpr):
    """Scale and element codes: the twin of ``blockrules.nvfp4_scale_rows`` (float32, each
    op rounded to nearest)."""
    amax = amax_bits.to(tl.float32, bitcast=True)
    nan = amax_bits >= 0x7F800000
    amax = tl.where(nan, 0.0, amax)
    scale = tl.math.div_rn(tl.math.div_rn(amax, tl.full(amax.shape, 6.0, tl.float32)),
                           tl.full(amax.shape, ts, tl.float32))
    scale = tl.minimum(tl.maximum(scale, 2.0**-6), 448.0)
    sbits = scale.to(tl.int32, bitcast=True)
    scodes = round_bits(sbits & 0x7FFFFFFF, sbits < 0, _E4M3, "rne", True, True, None, "code")
    total = decode_bits(scodes, _E4M3).to(tl.float32, bitcast=True) * ts
    scaled = tl.math.div_rn(x, tl.broadcast_to(total[:, None], x.shape))
    ebits = tl.where(nan[:, None], 0, scaled.to(tl.int32, bitcast=True))
    scodes = tl.where(nan, 0x7F, scodes)
    codes = round_bits(ebits & 0x7FFFFFFF, ebits < 0, ELEM, MODE, True, True, rand, "code",
                       SRBITS)
    return scodes, codes


@triton.jit
def _tile(n_blocks, row_blocks, length, BS: tl.constexpr, NB: tl.constexpr,
          RAGGED: tl.constexpr):
    """Block ids ``[NB]`` (int64), element offsets in the input ``[NB, BS]`` and their mask."""
    t = tl.program_id(0).to(tl.int64) * NB + tl.arange(0, NB)
    k = tl.arange(0, BS)[None, :]
    live = (t < n_blocks)[:, None]
    if RAGGED:                                        # rows of `length` padded to whole blocks
        col = (t % row_blocks)[:, None] * BS + k
        return t, (t // row_blocks)[:, None] * length + col, (col < length) & live
    return t, t[:, None] * BS + k, live & (k < BS)


@triton.jit(do_not_specialize=["seed", "ts"])
def _mx_quantize_kernel(x_ptr, scale_ptr, elem_ptr, rbits_ptr, n_blocks, row_blocks, length,
                        n_bytes, seed, ts, ELEM: tl.constexpr, EMAX: tl.constexpr,
                        MAX_BITS: tl.constexpr, MBITS: tl.constexpr, ELEM_EXP: tl.constexpr,
                        SCALE_MODE: tl.constexpr, MODE: tl.constexpr, NV: tl.constexpr,
                        IS_INT: tl.constexpr, BITS: tl.constexpr, PER: tl.constexpr,
                        BS: tl.constexpr, NB: tl.constexpr, RAGGED: tl.constexpr,
                        SRBITS: tl.constexpr, GIVEN: tl.constexpr):
    t, offs, inside = _tile(n_blocks, row_blocks, length, BS, NB, RAGGED)
    bits = load_bits(x_ptr, offs, inside)
    amax_bits = tl.max(bits & 0x7FFFFFFF, axis=1)     # NaN above inf: integer order
    x = bits.to(tl.float32, bitcast=True)
    rand = None
    if _stochastic(MODE):
        rand = stochastic_bits(seed, rbits_ptr, offs, inside, NB, BS, SRBITS, GIVEN)
    if NV:
        scodes, codes = _nvfp4_blocks(x, amax_bits, rand, ts, ELEM, MODE, SRBITS)
    else:
        scodes, codes = _mx_blocks(x, amax_bits, rand, ELEM, EMAX, MAX_BITS, MBITS, ELEM_EXP,
                                   SCALE_MODE, MODE, IS_INT, SRBITS)
    tl.store(scale_ptr + t, scodes.to(tl.uint8), mask=t < n_blocks)
    if PER == 1:
        tl.store(elem_ptr + t[:, None] * BS + tl.arange(0, BS)[None, :], codes.to(tl.uint8),
                 mask=(t < n_blocks)[:, None])
    else:
        G: tl.constexpr = NB * BS // PER
        rows = tl.program_id(0).to(tl.int64) * G + tl.arange(0, G)
        store_packed(elem_ptr, rows, tl.reshape(codes, (G, PER)), n_bytes, BITS, PER)


@triton.jit(do_not_specialize=["ts"])
def _mx_dequantize_kernel(scale_ptr, elem_ptr, y_ptr, n_blocks, row_blocks, length, n_bytes, ts,
                          ELEM: tl.constexpr, ELEM_EXP: tl.constexpr, NV: tl.constexpr,
                          BITS: tl.constexpr, PER: tl.constexpr, BS: tl.constexpr,
                          NB: tl.constexpr, RAGGED: tl.constexpr):
    t, offs, inside = _tile(n_blocks, row_blocks, length, BS, NB, RAGGED)
    live = t < n_blocks
    if PER == 1:
        codes = tl.load(elem_ptr + t[:, None] * BS + tl.arange(0, BS)[None, :],
                        mask=live[:, None], other=0).to(tl.int32)
    else:
        G: tl.constexpr = NB * BS // PER
        rows = tl.program_id(0).to(tl.int64) * G + tl.arange(0, G)
        codes = tl.reshape(load_packed(elem_ptr, rows, n_bytes, BITS, PER), (NB, BS))
    vbits = decode_bits(codes, ELEM)
    vals = vbits.to(tl.float32, bitcast=True)
    if ELEM_EXP != 0:
        vals = vals * 2.0**ELEM_EXP
    sc = tl.load(scale_ptr + t, mask=live, other=0).to(tl.int32)
    if NV:                                            # scale_values: fp32(scale) * ts
        factor = decode_bits(sc, _E4M3).to(tl.float32, bitcast=True) * ts
        scale_nan = sc == 0x7F
    else:                                             # 2^(s-127), NaN for 0xFF
        factor = ((sc.to(tl.int64) - 127 + 1023) << 52).to(tl.float64, bitcast=True)
        factor = factor.to(tl.float32)
        scale_nan = sc == 255
    out = (vals * factor[:, None]).to(tl.int32, bitcast=True)
    # NaN bits as NumPy makes them (a GPU multiply would give its own canonical NaN)
    out = tl.where(scale_nan[:, None], 0x7FC00000, out)
    out = tl.where(vals != vals, vbits, out)
    tl.store(y_ptr + offs, out.to(tl.float32, bitcast=True), mask=inside)


# --------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------
def _layout(shape: tuple[int, ...], spec: BlockFormat, axis: int,
            block_size: int | None) -> blocks.Layout:
    lay = blocks.layout(shape, axis, spec.block_size if block_size is None else block_size,
                        pad=True)
    bs, per = lay.block_size, codes_per_group(spec.elem)
    if bs & (bs - 1) or bs % per or bs > TILE:
        raise NotImplementedError(f"block_size={bs}: the kernels need a power of two up to "
                                  f"{TILE} that holds whole packed groups of {per} codes")
    return lay


def _shape_args(lay: blocks.Layout) -> tuple[dict, tuple[int]]:
    nb = TILE // lay.block_size
    args = dict(n_blocks=lay.rows, row_blocks=lay.nblocks, length=lay.length)
    const = dict(BS=lay.block_size, NB=nb, RAGGED=lay.padded != lay.length,
                 num_warps=NUM_WARPS)
    return args | const, (max(1, triton.cdiv(lay.rows, nb)),)


def _rows_last(x: torch.Tensor, lay: blocks.Layout) -> torch.Tensor:
    return x.movedim(lay.axis, -1).contiguous()


def mx_quantize(x: torch.Tensor, fmt: str | BlockFormat, *, axis: int = -1,
                block_size: int | None = None, scale_rounding: str | None = None,
                rounding: str = "rne", seed: Any = None, tensor_scale: float | None = None,
                srbits: int | None = None, random_bits: Any = None,
                pack: bool = True) -> MXPacked:
    """``fpsim.mx.quantize(x, fmt, ...).pack()`` (plus NVFP4's tensor scale) in one kernel pass.

    Arguments as ``fpsim.mx.quantize`` (padding always on); ``x`` a float32, float16 or
    bfloat16 tensor.  Stochastic rounding draws Philox bits (``seed`` as
    ``kernels.quantize``), so its codes differ from fpsim's NumPy ones, unless the caller
    gives ``random_bits`` (``x``'s shape, ``srbits`` bits each: then the same).  ``pack=False``
    gives one uint8 code per element instead, in the same order (padding included): the
    ``blocks.to_rows`` view of ``MXArray.codes``, flattened.
    """
    spec = get_block_format(fmt)
    if not isinstance(x, torch.Tensor) or x.dtype not in FLOAT_DTYPES:
        raise TypeError("expected a float32, float16 or bfloat16 torch tensor")
    mode = scale_rule(spec, scale_rounding)
    ts = check_tensor_scale(spec, tensor_scale)
    lay = _layout(tuple(x.shape), spec, axis, block_size)
    work = _rows_last(x, lay)
    if not spec.is_mx and ts is None:
        ts = nvfp4_tensor_scale(blocks.to_rows(x.float(), lay))
    elem = spec.elem
    per = codes_per_group(elem) if pack else 1
    count = lay.rows * lay.block_size
    scales = torch.empty(lay.rows, dtype=torch.uint8, device=x.device)
    elements = torch.empty(packed_size(count, elem.bits) if pack else count, dtype=torch.uint8,
                           device=x.device)
    args, grid = _shape_args(lay)
    rounding = check_mode(rounding)
    seed, srbits, rbits = stochastic_args(x, rounding, seed, srbits, random_bits)
    _mx_quantize_kernel[grid](
        work, scales, elements, elements if rbits is None else _rows_last(rbits, lay),
        n_bytes=elements.numel(), seed=seed, SRBITS=srbits, GIVEN=rbits is not None,
        ts=1.0 if ts is None else ts, ELEM=format_spec(elem), EMAX=spec.emax,
        MAX_BITS=float64_bits(spec.max), MBITS=spec.mbits, ELEM_EXP=spec.elem_exp,
        SCALE_MODE=mode if spec.is_mx else "floor", MODE=rounding, NV=not spec.is_mx,
        IS_INT=elem.is_int, BITS=elem.bits, PER=per, **args)
    return MXPacked(scales, elements, ts)


def mx_dequantize(scales: torch.Tensor, elements: torch.Tensor, fmt: str | BlockFormat,
                  shape: tuple[int, ...], *, axis: int = -1, block_size: int | None = None,
                  tensor_scale: float | None = None) -> torch.Tensor:
    """float32 values of packed MX/NVFP4 bytes: ``fpsim.mx.MXArray.unpack(...).dequantize()``."""
    spec = get_block_format(fmt)
    ts = check_tensor_scale(spec, tensor_scale, unpacking=True)
    lay = _layout(tuple(shape), spec, axis, block_size)
    check_packed(scales, elements, spec, lay)
    if lay.length % lay.block_size:         # ragged rows: their padding must be zero codes
        blocks.check_padding(unpack_codes(elements, spec.elem.bits, lay.rows * lay.block_size),
                             lay)
    moved = lay.outer + (lay.length,)
    y = torch.empty(moved, dtype=torch.float32, device=elements.device)
    args, grid = _shape_args(lay)
    _mx_dequantize_kernel[grid](
        scales.contiguous(), elements.contiguous(), y, n_bytes=elements.numel(),
        ts=1.0 if ts is None else ts, ELEM=format_spec(spec.elem), ELEM_EXP=spec.elem_exp,
        NV=not spec.is_mx, BITS=spec.elem.bits, PER=codes_per_group(spec.elem), **args)
    return y.movedim(-1, lay.axis).contiguous()
