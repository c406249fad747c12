"""The rules of block-scaled formats (OCP MX v1.0 and NVFP4): formats, registry, scales.

This module holds what a block format *is* and how its scales follow from the data; the
container, ``quantize`` and ``dequantize`` live in ``fpsim.mx`` (whose module doc states
every rule), the element rounding in the core.  Everything here is public so that the Triton
twins in ``fpsim_kernels.mx`` use the very same functions and constants.  It imports only the
layers below the conversions (formats, rounding, backend), so the kernels can import it without
reaching back into the API.

The functions work on rows of blocks (``fpsim.blocks.to_rows``), NumPy or torch alike.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import names
from .backend import clip, divide, float64_bits, is_torch, is_wide, multiply, ops_for, to_uint8
from .formats import Format, get_format
from .packing import packed_size
from .rounding import F32, F64, decode_bits, round_bits

SCALE_ROUNDINGS = ("floor", "ceil", "ceil_amax", "even")
SCALE_ALIASES = {"rceil": "ceil"}
NVFP4_MIN_TENSOR_SCALE = 2.0**-126
_FRAC = (1 << 52) - 1           # float64 fraction field


@dataclass(frozen=True)
class BlockFormat:
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
    BlockFormat("mxfp8_e4m3", get_format("fp8_e4m3fn"), 8),
    BlockFormat("mxfp8_e5m2", get_format("fp8_e5m2"), 15),
    BlockFormat("mxfp6_e2m3", get_format("fp6_e2m3"), 2),
    BlockFormat("mxfp6_e3m2", get_format("fp6_e3m2"), 4),
    BlockFormat("mxfp4", get_format("fp4_e2m1"), 2),
    BlockFormat("mxint8", get_format("int8"), 0, elem_exp=-6),
    BlockFormat("nvfp4", get_format("fp4_e2m1"), 2, block_size=16,
                scale=get_format("fp8_e4m3fn")),
]

#: Every block format, by name.
BLOCK_FORMATS: dict[str, BlockFormat] = {f.name: f for f in _LIST}
#: Common names: torchao's and Transformer Engine's MXFP8 has E4M3 elements (their default;
#: E5M2 is spelled out).
BLOCK_ALIASES = {"mxfp8": "mxfp8_e4m3"}
#: Names that mean more than one format, refused with the choices: OCP MX v1.0 defines MXFP6
#: with E2M3 and with E3M2 elements, and neither torchao nor Transformer Engine makes one the
#: default.
AMBIGUOUS = {"mxfp6": ("mxfp6_e2m3", "mxfp6_e3m2")}


def is_block_format_name(name: Any) -> bool:
    """Whether the string ``name`` belongs to the block formats: a name, an alias, an
    ambiguous name (refused with the choices) or one spelled like them (``mxfp9``: refused as
    an unknown block format, with the closest)."""
    if not isinstance(name, str):
        return False
    key = names.normalize(name)
    return (key in BLOCK_FORMATS or key in BLOCK_ALIASES or key in AMBIGUOUS
            or key.startswith(("mxfp", "mxint", "nvfp")))


names.register("block format", is_block_format_name,
               "use fpsim.mx.quantize with one of " + ", ".join(BLOCK_FORMATS))


def get_block_format(fmt: str | BlockFormat) -> BlockFormat:
    """Resolve a block-format name (case and white space ignored) to a ``BlockFormat``.

    ``"mxfp8"`` is ``"mxfp8_e4m3"`` (``BLOCK_ALIASES``); ``"mxfp6"`` names two formats
    and is refused with both (``AMBIGUOUS``).

    >>> f = get_block_format("MXFP4")
    >>> f.name, f.elem.name, f.scale.name, f.block_size
    ('mxfp4', 'fp4_e2m1', 'e8m0', 32)
    >>> get_block_format("mxfp8").name
    'mxfp8_e4m3'
    """
    if isinstance(fmt, BlockFormat):
        return fmt
    if not isinstance(fmt, str):
        raise TypeError(f"block format must be a name or an MXFormat (BlockFormat), not "
                        f"{type(fmt).__name__}")
    choices = AMBIGUOUS.get(names.normalize(fmt))
    if choices:
        said = "; ".join(f"{c!r}: {BLOCK_FORMATS[c].elem.name} elements, max "
                         f"{BLOCK_FORMATS[c].max:g}" for c in choices)
        raise ValueError(f"{fmt!r} names more than one block format (OCP MX defines it with "
                         f"{' and with '.join(BLOCK_FORMATS[c].elem.name for c in choices)} "
                         f"elements): name one, {said}")
    return names.resolve("block format", fmt, BLOCK_FORMATS, BLOCK_ALIASES)


# --------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------
def scale_rule(spec: BlockFormat, scale_rounding: str | None) -> str | None:
    """The MX scale rule (None for NVFP4, whose E4M3 scales round to nearest even)."""
    if not spec.is_mx:
        if scale_rounding is not None:
            raise ValueError(f"{spec.name} block scales are E4M3 values rounded to nearest even; "
                             "scale_rounding applies to MX (E8M0) formats only: leave it None")
        return None
    if scale_rounding is None:
        return "floor"
    table = {m: m for m in SCALE_ROUNDINGS}
    return names.resolve("scale_rounding", scale_rounding, table, SCALE_ALIASES)


def check_tensor_scale(spec: BlockFormat, tensor_scale: Any, unpacking: bool = False) -> Any:
    """NVFP4's tensor scale as a float32-valued float (None: compute it); refused for MX."""
    if spec.is_mx:
        if tensor_scale is not None:
            raise ValueError(f"{spec.name} has no per-tensor scale; tensor_scale is for nvfp4")
        return None
    if tensor_scale is None:
        if unpacking:
            raise ValueError("nvfp4 needs its float32 tensor_scale to unpack: pass the "
                             "MXArray's tensor_scale")
        return None
    if isinstance(tensor_scale, (str, bytes, bool, np.bool_)):
        raise TypeError(f"tensor_scale={tensor_scale!r}: pass a number")
    with np.errstate(over="ignore"):
        value = float(np.float32(float(tensor_scale)))   # checked as float32 holds it
    if not (np.isfinite(value) and value >= NVFP4_MIN_TENSOR_SCALE):
        raise ValueError(f"tensor_scale={tensor_scale!r}: pass a finite positive number in "
                         "float32's normal range [2^-126, 3.4e38], as the computed scale is")
    return value


# --------------------------------------------------------------------------------------------
# Scale rules
# --------------------------------------------------------------------------------------------
def row_amax_bits(rows: Any) -> Any:
    """Per-block max of |x| as the float's bits (NaN above inf: integer order is value order)."""
    ops = ops_for(rows)
    itype, mask = (ops.int64, 2**63 - 1) if is_wide(rows) else (ops.int32, 2**31 - 1)
    mag = ops.view(rows, itype) & mask
    if is_torch(rows):
        return mag.amax(dim=1) if rows.shape[0] else mag.new_zeros(0)
    return mag.max(axis=1, initial=0)


def shared_exponents(ops: Any, amax: Any, spec: BlockFormat, mode: str) -> tuple[Any, Any]:
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
    lim = float64_bits(limit)
    return (bits >> 52) - (lim >> 52) + ops.astype((bits & _FRAC) > (lim & _FRAC), ops.int64)


def mx_scale_rows(rows: Any, spec: BlockFormat, mode: str,
                  rounding: str) -> tuple[Any, Any, Any]:
    """MX: (scale codes, the elements divided by their block's scale, NaN-block mask).

    The scaled elements are ready for the core's saturating rounding to ``spec.elem`` (NaN
    blocks hold zeros); ``mx_element_codes`` finishes the codes.
    """
    ops = ops_for(rows)
    fdt = rows.dtype
    amax = ops.astype(ops.view(row_amax_bits(rows), fdt), ops.float64)
    s, nan = shared_exponents(ops, amax, spec, mode)
    factor = ops.astype(ops.view((1023 - s) << 52, ops.float64), fdt)   # 2^-s, exact
    scaled = rows * factor[:, None]
    if spec.elem_exp:
        scaled = scaled * 2.0**-spec.elem_exp     # |scaled| <= 2: exact (NaN blocks aside)
    if rounding in ("rup", "rdown", "rto"):
        scaled = keep_underflow(ops, rows, scaled)
    if bool(nan.any()):
        scaled = ops.where(nan[:, None], 0.0, scaled)
    return to_uint8(ops.where(nan, 255, s + 127)), scaled, nan


def mx_element_codes(spec: BlockFormat, codes: Any) -> Any:
    """MXINT8 is symmetric: code 0x80 (-128) clamps to 0x81 (-127); other formats as they are."""
    if spec.elem.is_int:
        return ops_for(codes).where(codes == 0x80, 0x81, codes)
    return codes


def keep_underflow(ops: Any, rows: Any, scaled: Any) -> Any:
    """Replace products that underflowed to ±0 by the least subnormal of the input's sign."""
    tiny = float(np.finfo(np.float64 if is_wide(scaled) else np.float32).smallest_subnormal)
    lost = (scaled == 0) & (rows != 0)
    return ops.where(lost, ops.astype(rows < 0, scaled.dtype) * (-2.0 * tiny) + tiny, scaled)


def nvfp4_tensor_scale(rows: Any, chunk: int = 1 << 16) -> float:
    """torchao's amax / (448 * 6) in float32 over finite values, at least 2^-126."""
    if is_torch(rows):
        amax_bits = row_amax_bits(rows)
    else:                                               # by slices: no full-size temporary
        step = max(1, chunk // rows.shape[1])
        parts = [row_amax_bits(rows[lo:lo + step]) for lo in range(0, rows.shape[0], step)]
        amax_bits = np.concatenate(parts or [np.zeros(0, np.int32)])
    return nvfp4_tensor_scale_of(amax_bits)


def nvfp4_tensor_scale_of(amax_bits: Any) -> float:
    """``nvfp4_tensor_scale`` from the blocks' float32 amax bits (``row_amax_bits``)."""
    finite = ops_for(amax_bits).where(amax_bits < 0x7F800000, amax_bits, 0)
    amax = finite.max() if finite.shape[0] else 0
    amax32 = np.array(int(amax), np.int32).view(np.float32)
    return float(max(amax32 / np.float32(448 * 6), np.float32(NVFP4_MIN_TENSOR_SCALE)))


def nvfp4_scale_rows(rows: Any, spec: BlockFormat, ts: float) -> tuple[Any, Any, Any]:
    """NVFP4: (E4M3 scale codes, the float32 elements divided by ts * scale, NaN-block mask).

    Every step in float32 rounded to nearest, as torchao; the block scale is rounded to E4M3
    by the core's ``round_bits`` (to nearest even, saturating), as the Triton twin does.
    """
    scodes, total, nan = nvfp4_block_scales(row_amax_bits(rows), spec, ts)
    scaled = divide(rows, total[:, None])
    if bool(nan.any()):
        scaled = ops_for(rows).where(nan[:, None], 0.0, scaled)
    return scodes, scaled, nan


def nvfp4_block_scales(amax_bits: Any, spec: BlockFormat, ts: float) -> tuple[Any, Any, Any]:
    """NVFP4 from each block's float32 amax bits (``row_amax_bits``): (E4M3 scale codes,
    the float32 divisor ts * scale of the block's elements, NaN-block mask)."""
    ops = ops_for(amax_bits)
    amax = ops.view(amax_bits, ops.float32)
    nan = amax_bits >= 0x7F800000
    amax = ops.where(nan, 0.0, amax)
    scale = clip(divide(divide(amax, 6.0), ts), 2.0**-6, 448.0)
    sbits = ops.view(scale, ops.int32)
    scodes = round_bits(ops, sbits & 0x7FFFFFFF, sbits < 0, F32, spec.scale, "rne",
                        saturate=True)
    total = multiply(ops.view(decode_bits(ops, scodes, F32, spec.scale), ops.float32), ts)
    if bool(nan.any()):
        scodes = ops.where(nan, spec.scale.nan_code, scodes)
    return to_uint8(scodes), total, nan


def scale_values(ops: Any, scales: Any, spec: BlockFormat, tensor_scale: float | None,
                 wide: bool) -> Any:
    """Per-block multiplier: 2^s (NaN for 0xFF), or NVFP4's tensor_scale * e4m3 scale."""
    fdt = ops.float64 if wide else ops.float32
    if spec.is_mx:
        s = ops.astype(scales, ops.int64)
        x = ops.view((s - 127 + 1023) << 52, ops.float64)
        return ops.astype(ops.where(s == 255, float("nan"), x), fdt)
    codes = ops.astype(scales, ops.int64)
    block = ops.view(decode_bits(ops, codes, F64, spec.scale), ops.float64)   # exact
    if wide:
        return block * tensor_scale
    return multiply(ops.astype(block, ops.float32), tensor_scale)


@functools.lru_cache(maxsize=32)
def element_values(spec: BlockFormat, wide: bool) -> np.ndarray:
    """Every element code's value (``decode(code) * 2**elem_exp``), float64 or float32."""
    codes = np.arange(spec.elem.num_codes, dtype=np.int64)
    vals = decode_bits(ops_for(codes), codes, F64, spec.elem).view(np.float64) \
        * 2.0**spec.elem_exp
    return vals.astype(np.float64 if wide else np.float32)


def check_packed(scales: Any, packed: Any, spec: BlockFormat, lay: Any) -> None:
    """One scale byte per block and exactly this format's and shape's element bytes (``lay``:
    a ``fpsim.blocks.Layout``); scale codes are bytes.  ValueError/TypeError naming the
    fix."""
    n_scales = int(np.prod(tuple(scales.shape)))
    if n_scales != lay.rows:
        raise ValueError(f"{n_scales} scale bytes given; shape {lay.shape} with blocks of "
                         f"{lay.block_size} along axis {lay.axis} has {lay.rows} blocks")
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
