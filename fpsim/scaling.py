"""Scaled quantization: one scale per tensor, per channel or per block, in any small format.

``scaled_quantize`` divides each group of values by a scale chosen from the group's absolute
maximum (absmax), rounds the quotients to the format with the core, and multiplies back, so the
same data can be compared under per-tensor, per-channel and per-block scaling.

Rules (fpsim's choices, each tested):

* Symmetric (default): scale = amax / qmax, qmax being the format's largest value (FP) or
  2^(bits-1) - 1 (integers, clamped symmetric: int8 uses -127..127, never -128).
* Asymmetric (``symmetric=False``, integer formats only; PyTorch's MinMax observer): the range
  [min(x_min, 0), max(x_max, 0)] maps onto all 2^bits codes: scale = range / (2^bits - 1),
  zero_point = clamp(qmin - round(min / scale), qmin, qmax) (ties to even);
  code = clamp(round(x / scale) + zero_point, qmin, qmax); value = (code - zero_point) * scale.
* ``scale_dtype="fp32"``: the quotient above computed in the data's float type (float32 ops for
  float32 data, as PyTorch's observers) and rounded to float32, times 2^margin, then kept
  within float32's normal range [2^-126, max].  ``"e8m0"``: the smallest power of two with
  amax / scale <= qmax (range / scale <= 2^bits - 1 when asymmetric), computed exactly, times
  2^margin, clamped to E8M0's [2^-127, 2^127].
* ``margin``: headroom in binades, as Transformer Engine's FP8 recipe: the scale is multiplied
  by 2^margin (a positive margin leaves amax that many binades below the format's maximum).
* A group of zeros has scale 1 (and zero point 0): no 0/0.  A group containing NaN has a NaN
  scale, codes 0 and NaN values throughout, like an MX block with a NaN scale.  ±inf does not
  take the group with it: the scale (and zero point) comes from the group's finite values, and
  ±inf rounds as any value beyond the largest with saturation (``fpsim.encode`` with
  ``saturate=True``): ±inf where the format has inf (E5M2), else ±qmax (E4M3, FP4, integers).
* Elements: x / scale rounded once to the data's float type (float32, or float64 for float64
  data and for formats whose range float32 cannot hold, e.g. e9m2), then to the format with ``rounding`` and saturation to ±qmax.  Values are
  decode(code) * scale in that float type, then cast to the input's dtype when it is float16 or
  bfloat16 (one rounding, as [``fpsim.quantize``][] keeps the dtype).

``granularity``: ``"tensor"`` (one scale), ``"channel"`` (one per index along ``axis``, default 0,
e.g. a weight's output channels: scales keep that axis and have size 1 elsewhere) or
``("block", n)`` (blocks of n along ``axis``, default -1, zero-padded; scales have the input's
shape with ``axis`` holding the block count, as [``fpsim.mx``][]).

Memory: the scales come from a reduction over each group, read piece by piece; the elements
are then quantized in pieces of ``CHUNK`` elements per thread into preallocated outputs,
so a large operand (e.g. GPT-2's 768 x 50,257 LM head in float64) costs its outputs plus a few
pieces, not several full-size temporaries.  The pieces give the same bits as one (stochastic rounding,
whose random bits are drawn for the whole tensor at once, is done in one piece).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import blocks, parallel
from .backend import clip, divide, float_input, is_torch, ops_for
from .blockrules import ceil_exponent
from .convert import decode, encode, quantize
from .formats import Format, get_format
from .inputs import check_flag, check_input
from .rounding import F32, STOCHASTIC, check_mode
from .stochastic import check_random_bits, check_srbits

SCALE_DTYPES = ("fp32", "e8m0")
_WIDE_INT = Format("int16", 0, 15, inf=False, nan="none")   # rounds quotients to integers
_FP32_MIN_NORMAL = 2.0**-126
_FP32_MAX = float(np.finfo(np.float32).max)
#: Elements per chunk and per thread of ``fpsim.parallel``: scales come from a reduction
#: over the whole tensor, then quantization runs chunk by chunk into the outputs, so
#: temporaries stay this size (4 MiB of float64 per thread) instead of several copies of a
#: large operand, and each chunk's casts are still large enough to be split over the threads.
CHUNK = 1 << 19


@dataclass
class ScaledTensor:
    """Result of [``scaled_quantize``][]: dequantized values, scales, zero points and codes."""

    values: Any
    codes: Any
    scales: Any
    zero_points: Any | None
    fmt: Format
    granularity: str | tuple[str, int]
    axis: int | None


def scaled_quantize(x: Any, fmt: str | Format, *, granularity: Any = "tensor",
                    axis: int | None = None, scale_dtype: str = "fp32", margin: int = 0,
                    symmetric: bool = True, rounding: str = "rne", seed: Any = None,
                    srbits: int | None = None, random_bits: Any = None) -> ScaledTensor:
    """Quantize ``x`` to ``fmt`` with a scale per group, as FP8 training and INT8 inference do.

    Each group (the whole tensor, each channel along ``axis``, or each block of n values) is
    divided by a scale chosen so that its absolute maximum lands on the format's largest value
    (``symmetric=False``: min/max onto every integer code), rounded to ``fmt`` with
    ``rounding`` (saturating), and multiplied back.  Returns a [``ScaledTensor``][]:
    ``values`` (dequantized; float16 or bfloat16 in, the same dtype out, as
    [``fpsim.quantize``][]), ``codes`` (the format's bit codes),
    ``scales`` (float32, or powers of two with ``scale_dtype="e8m0"``) and ``zero_points``
    (asymmetric integers only).  ``granularity``: ``"tensor"``, ``"channel"`` (``axis``
    default 0) or ``("block", n)`` (``axis`` default -1, zero-padded).  ``margin`` multiplies
    the scale by 2^margin (Transformer Engine's headroom).  NumPy in, NumPy out; torch in,
    torch out, bit-identical (stochastic rounding aside, unless ``random_bits`` of ``x``'s
    shape are given; ``srbits``: as [``fpsim.quantize``][]).  The exact rules (NaN groups, zero
    groups, the scale's own rounding) are in the module doc, [``fpsim.scaling``][].

    >>> import numpy as np, fpsim
    >>> x = np.array([896.0, -3.0, 0.1, 0.0], np.float32)
    >>> s = fpsim.scaled_quantize(x, "e4m3")      # one scale: 896 / 448 (E4M3's max) = 2
    >>> float(s.scales), s.values.tolist(), s.codes.tolist()
    (2.0, [896.0, -3.0, 0.1015625, 0.0], [126, 188, 21, 0])
    >>> fpsim.scaled_quantize(x.astype(np.float16), "e4m3").values.dtype
    dtype('float16')
    >>> b = fpsim.scaled_quantize(x, "int8", granularity=("block", 2), scale_dtype="e8m0")
    >>> b.scales.tolist(), b.values.tolist()      # a power-of-two scale per block of 2
    ([8.0, 0.0009765625], [896.0, 0.0, 0.099609375, 0.0])
    """
    symmetric = check_flag(symmetric, "symmetric")
    fmt = _check_format(get_format(fmt), symmetric)
    rounding = check_mode(rounding)
    srbits = check_srbits(srbits, rounding)
    rbits = check_random_bits(random_bits, check_input(x), rounding, srbits, seed)
    if scale_dtype not in SCALE_DTYPES:
        raise ValueError(f"scale_dtype={scale_dtype!r}: choose 'fp32' or 'e8m0'")
    if isinstance(margin, bool) or not isinstance(margin, (int, np.integer)) \
            or not -127 <= margin <= 127:
        raise ValueError(f"margin={margin!r}: pass a whole number of binades in [-127, 127]")
    work = float_input(check_input(x), "scaled_quantize takes")
    if not F32.holds(fmt):             # quotients beyond float32's range: work in float64
        work = ops_for(work).astype(work, ops_for(work).float64)
    kind, axis, lay = _grouping(granularity, axis, tuple(work.shape))
    rows = _to_rows(work, kind, axis, lay)
    rrows = None if rbits is None else _to_rows(rbits, kind, axis, lay)
    ops = ops_for(rows)
    groups, length = rows.shape
    # stochastic rounding draws the whole tensor's random bits in one call: one chunk keeps them
    parts = _chunks(groups, length, groups * length if rounding in STOCHASTIC
                    else CHUNK * parallel.workers())
    qmax = fmt.max if not fmt.is_int else float(2**fmt.mbits - 1)
    if symmetric:
        span, levels = _reduce_chunked(rows, parts, "max", absolute=True), qmax
        if bool((span == math.inf).any()):               # +-inf: the scale of the finite values
            span = _reduce_chunked(rows, parts, "max", absolute=True, finite=True)
        bad = span != span                              # NaN
    else:
        lo, hi = _reduce_chunked(rows, parts, "min"), _reduce_chunked(rows, parts, "max")
        if bool(((lo == -math.inf) | (hi == math.inf)).any()):
            lo, hi = (_reduce_chunked(rows, parts, how, finite=True) for how in ("min", "max"))
        with np.errstate(over="ignore"):                     # beyond float32: max scale
            span, levels = hi - lo, float(2**fmt.bits - 1)
        bad = (lo != lo) | (hi != hi)
    empty = span == 0
    scale = amax_scale(ops.where(bad | empty, 1.0, span), levels, scale_dtype, int(margin))
    scale = ops.where(bad, float("nan"), ops.where(empty, 1.0, scale))

    zp = None
    if fmt.is_int:
        qmin = -(2**fmt.mbits)
        clamp = (-qmax, qmax)
        if not symmetric:
            zp = qmin - _round_int(ops.where(bad, 0.0, divide(lo, scale)))
            zp = ops.where(bad | empty, 0.0, clip(zp, qmin, qmax))
            clamp = (qmin, qmax)
    vals = codes = None
    for r, c in parts:                 # elementwise, chunk by chunk into the outputs
        t = ops.where(bad[r], 0.0, divide(rows[r, c], scale[r]))
        sr = {"srbits": srbits, "random_bits": None if rrows is None else rrows[r, c]}
        if fmt.is_int:
            shift = 0.0 if zp is None else ops.astype(zp[r], t.dtype)
            q = clip(_round_int(t, rounding, seed, **sr) + shift, *clamp)
            part_codes = encode(q, fmt)
            grid = q - shift
        else:
            part_codes = encode(t, fmt, rounding=rounding, saturate=True, seed=seed,
                                on_nan="zero", **sr)
            grid = ops.astype(decode(part_codes, fmt), t.dtype)
        # NaN scale: NaN values.  A grid point past the dtype's largest value (a row holding
        # +-FLT_MAX whose scale rounded up) dequantizes to inf, as IEEE arithmetic and torch
        # give; the codes and scales stay exact.
        with np.errstate(over="ignore"):
            part_vals = grid * ops.astype(scale[r], t.dtype)
        if len(parts) == 1:
            vals, codes = part_vals, part_codes
            break
        if vals is None:
            vals, codes = _empty_like(part_vals, rows.shape), _empty_like(part_codes, rows.shape)
        vals[r, c], codes[r, c] = part_vals, part_codes

    shape = tuple(work.shape)
    vals = _in_dtype(vals, x)
    scales = _scales_out(ops.astype(scale, ops.float32), kind, axis, lay, shape)
    if zp is not None:
        zp = _scales_out(ops.astype(zp, ops.int32), kind, axis, lay, shape)
    return ScaledTensor(_from_rows(vals, kind, axis, lay, shape),
                        _from_rows(codes, kind, axis, lay, shape), scales, zp, fmt,
                        granularity, axis)


# --------------------------------------------------------------------------------------------
# Pieces
# --------------------------------------------------------------------------------------------
def _check_format(fmt: Format, symmetric: bool) -> Format:
    if not fmt.signed or not fmt.zero:
        raise ValueError(f"{fmt.name} is unsigned: scaled quantization needs a signed format "
                         "(int8 with symmetric=False gives an asymmetric zero-point scheme)")
    if fmt.bits > 16:
        raise ValueError(f"{fmt.name} has {fmt.bits} bits: scaled quantization targets formats "
                         "of at most 16 bits (FP8, FP6, FP4, int8, int4, fp16, bf16)")
    if not symmetric and not fmt.is_int:
        raise ValueError(f"symmetric=False (a zero point) is defined for integer formats; "
                         f"{fmt.name} is a float format: use symmetric=True")
    return fmt


def _in_dtype(vals: Any, x: Any) -> Any:
    """``vals`` cast to the input's float dtype when it is narrower (float16, bfloat16: one
    rounding of each value, as ``fpsim.quantize`` keeps the dtype); float32 otherwise."""
    dtype = getattr(x, "dtype", None)
    if dtype is None or (vals.dtype == dtype):
        return vals
    if is_torch(x):
        return vals.to(dtype) if x.is_floating_point() and x.element_size() < 4 else vals
    dtype = np.dtype(dtype)
    if (dtype.kind == "f" or dtype.kind == "V") and dtype.itemsize < 4:
        with np.errstate(over="ignore"):
            return vals.astype(dtype)
    return vals


def _grouping(granularity: Any, axis: int | None,
              shape: tuple[int, ...]) -> tuple[str, int | None, blocks.Layout | None]:
    """(kind, resolved axis, block layout or None)."""
    if granularity == "tensor":
        if axis is not None:
            raise ValueError("granularity='tensor' uses one scale for everything: leave axis None")
        return "tensor", None, None
    if granularity == "channel":
        if not shape:
            raise ValueError("granularity='channel' needs an array with at least one dimension")
        lay = blocks.layout(shape, 0 if axis is None else axis, 1, pad=True)   # validates axis
        return "channel", lay.axis, None
    if (isinstance(granularity, tuple) and len(granularity) == 2 and granularity[0] == "block"):
        lay = blocks.layout(shape, -1 if axis is None else axis, granularity[1], pad=True)
        return "block", lay.axis, lay
    raise ValueError(f"granularity={granularity!r}: choose 'tensor', 'channel' or ('block', n)")


def _to_rows(work: Any, kind: str, axis: int | None, lay: blocks.Layout | None) -> Any:
    """Each group as one row of a 2-D array: the tensor, channels, or blocks."""
    if kind == "block":
        return blocks.to_rows(work, lay)
    if kind == "tensor":
        return work.reshape(1, -1)
    moved = ops_for(work).moveaxis(work, axis, 0)
    return moved.reshape(moved.shape[0], math.prod(moved.shape[1:]))  # -1 fails for 0 channels


def _from_rows(rows: Any, kind: str, axis: int | None, lay: blocks.Layout | None,
               shape: tuple[int, ...]) -> Any:
    if kind == "block":
        return blocks.from_rows(rows, lay)
    if kind == "tensor":
        return rows.reshape(shape)
    moved = rows.reshape((shape[axis],) + shape[:axis] + shape[axis + 1:])
    return ops_for(moved).moveaxis(moved, 0, axis)


def _scales_out(col: Any, kind: str, axis: int | None, lay: blocks.Layout | None,
                shape: tuple[int, ...]) -> Any:
    """Per-group column (G, 1) shaped for the user (see the module doc)."""
    if kind == "block":
        return blocks.rows_to_scales(col, lay)
    if kind == "tensor":
        return col.reshape(())
    return col.reshape(tuple(s if d == axis else 1 for d, s in enumerate(shape)))


def _chunks(groups: int, length: int, size: int) -> list[tuple[slice, slice]]:
    """(rows, columns) slices covering a ``groups`` x ``length`` array in pieces of about ``size``
    elements: whole rows when a row is shorter than ``size``, else pieces of one row; one
    piece (the whole) when the array is empty."""
    if groups * length == 0:
        return [(slice(None), slice(None))]
    if length >= size:
        return [(slice(g, g + 1), slice(c, c + size))
                for g in range(groups) for c in range(0, length, size)]
    step = size // length
    return [(slice(g, g + step), slice(None)) for g in range(0, groups, step)]


def _reduce_chunked(rows: Any, parts: list[tuple[slice, slice]], how: str,
                    absolute: bool = False, finite: bool = False) -> Any:
    """``_reduce`` of ``rows`` (of ``|rows|`` when ``absolute``; ``finite``: with +-inf
    read as 0) piece by piece: max/min of each row and 0, NaN-propagating, with temporaries of
    one piece."""
    out = None
    for r, c in parts:
        piece = rows[r, c]
        ops = ops_for(piece)
        if finite:
            piece = ops.where(ops.abs(piece) == math.inf, 0.0, piece)
        red = _reduce(ops.abs(piece) if absolute else piece, how)
        if out is None:                # 0: where every row's reduction starts (see _reduce)
            out = _empty_like(red, (rows.shape[0], 1))
            out[:] = 0
        out[r] = _merge(out[r], red, how)
    return out


def _merge(a: Any, b: Any, how: str) -> Any:
    """Elementwise max/min of two columns, NaN-propagating."""
    if is_torch(a):
        return (a.maximum if how == "max" else a.minimum)(b)
    return (np.maximum if how == "max" else np.minimum)(a, b)


def _empty_like(a: Any, shape: tuple[int, ...]) -> Any:
    """An uninitialised array of ``shape`` with ``a``'s dtype (and device)."""
    return a.new_empty(shape) if is_torch(a) else np.empty(shape, a.dtype)


def _reduce(a: Any, how: str) -> Any:
    """max/min of each row and 0 (a column), NaN-propagating; 0 for empty rows."""
    if is_torch(a):
        if a.shape[1] == 0:
            return a.new_zeros((a.shape[0], 1))
        r = (a.amax if how == "max" else a.amin)(dim=1, keepdim=True)
        return r.clamp(min=0) if how == "max" else r.clamp(max=0)
    return (np.max if how == "max" else np.min)(a, axis=1, keepdims=True, initial=0.0)


def amax_scale(span: Any, levels: float, scale_dtype: str, margin: int) -> Any:
    """float32-valued scales (in float64 lanes) for positive spans: ``span / levels`` rounded
    to FP32 (``scale_dtype="fp32"``) or up to a power of two (``"e8m0"``), times ``2^margin``.

    >>> amax_scale(np.array([448.0 * 3]), 448.0, "fp32", 0).tolist()
    [3.0]
    """
    ops = ops_for(span)
    if scale_dtype == "e8m0":
        k = ceil_exponent(ops, ops.astype(span, ops.float64), levels) + margin
        return ops.view((ops.clamp_max(ops.clamp_min(k, -127), 127) + 1023) << 52, ops.float64)
    with np.errstate(over="ignore"):             # beyond float32: inf, clamped to its max below
        s = ops.astype(ops.astype(divide(span, levels), ops.float32), ops.float64) * 2.0**margin
    return ops.clamp_max(ops.clamp_min(s, _FP32_MIN_NORMAL), _FP32_MAX)


def _round_int(t: Any, rounding: str = "rne", seed: Any = None, **sr: Any) -> Any:
    """Round to integers with the core (saturating far beyond every clamp used here); ``sr``:
    ``srbits`` and ``random_bits`` as ``fpsim.quantize`` takes them."""
    return quantize(t, _WIDE_INT, rounding=rounding, seed=seed, **sr)
