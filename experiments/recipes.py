"""Recipes: how one dot-product site is computed, and that computation on torch tensors.

A :class:`Recipe` names the operand formats, the scaling that maps operands into them, the
accumulator (format, summation order, chunk) and the format the result is written in.  The
functions :func:`linear`, :func:`matmul`, :func:`layernorm` and :func:`layernorm_stats` compute
a GPT-2 site under a recipe; both the per-site replay and the end-to-end ``ops`` use them, so
the two measure the same arithmetic.

Operands are quantized with :func:`fpsim.quantize` (no scaling), :func:`fpsim.scaled_quantize`
(per-tensor or per-channel amax scaling) or :func:`fpsim.mx.quantize` (MX and NVFP4 blocks),
then multiplied exactly and summed by torch, unless the recipe asks for another accumulator
or an explicit order, which :func:`fpsim.matmul` emulates.  An FP32 accumulator is computed
in FP64 and rounded once to FP32 (a correctly rounded FP32 dot product, barring FP64 ties): the
same bits on any thread count and machine, which torch's own FP32 matmul does not promise.  Scales
follow
the reduction axis: per-channel means one scale per row of the left operand and per column of
the right one, so the scales factor out of every dot product.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

import fpsim
from fpsim import Format, get_format
from fpsim import mx

SCALINGS = ("none", "tensor", "channel", "block", "tile")
TILE = 128  # DeepSeek-V3 fine-grained scaling: 1 x TILE activations, TILE x TILE weights
NATIVE_ACCUMULATORS = {"fp32": torch.float32, "fp64": torch.float64}  # rounded to; summed in FP64
FormatLike = str | Format


def format_name(fmt: FormatLike | None) -> str | None:
    """Name of a scalar or block format (None stays None)."""
    return None if fmt is None else (fmt if isinstance(fmt, str) else fmt.name)


@dataclass(frozen=True)
class Recipe:
    """How a dot-product site is computed.

    ``inputs``: format of the activation operand (None keeps FP32); ``weights``: format of the
    second operand (None: the same as ``inputs``).  ``scaling``: ``none``, per-``tensor`` or
    per-``channel`` amax scaling (scale = amax / format max in FP32 from the tensor itself at
    every call: "current" scaling, which cannot overflow; delayed scaling is in ``practice``) or
    ``block`` (``inputs`` is an MX / NVFP4 name of :mod:`fpsim.mx`; ``scale_rounding`` its
    scale rule, None: the OCP floor) or ``tile`` (DeepSeek-V3: one scale per 1 x 128 tile of
    the left operand and per 128 x 128 block of the right one, along the reduction axis).
    ``accum``, ``order``, ``chunk``, ``tensor_core``: the accumulator; ``order=None`` with an
    FP32/FP64 accumulator is torch's native matmul, anything else goes through
    :func:`fpsim.matmul` (``tensor_core``: a preset of ``fpsim.arith.TENSOR_CORES``, with
    ``order="tensor_core"``).  ``output``: the
    format the result is rounded to (None keeps it).  ``saturate``: clamp overflow to the
    largest finite value instead of inf/NaN (operands without scaling and the output).
    ``flush``: False keeps nonzero operand values that round to zero at their FP32 value (an
    ablation that removes underflow, not a real format).  ``full_subnormals``: values below the
    smallest normal that do not flush keep the format's full mantissa width, as if its exponent
    range went on downwards (an ablation that removes the precision subnormals lose; needs
    ``scaling='none'`` and a floating-point format).
    """

    name: str
    inputs: FormatLike | None = None
    weights: FormatLike | None = None
    scaling: str = "none"
    accum: str = "fp32"
    order: str | None = None
    chunk: int | None = None
    tensor_core: str | None = None
    output: FormatLike | None = None
    saturate: bool = False
    rounding: str = "rne"
    flush: bool = True
    scale_rounding: str | None = None
    full_subnormals: bool = False

    def __post_init__(self) -> None:
        if self.scaling not in SCALINGS:
            raise ValueError(
                f"recipe {self.name!r}: scaling {self.scaling!r} is not one of {SCALINGS}"
            )
        for fmt in (self.inputs, self.weights):
            if fmt is None:
                continue
            if self.scaling == "block":
                mx.get_mx_format(fmt)
            elif isinstance(fmt, str) and fmt.lower() in mx.MX_FORMATS:
                raise ValueError(
                    f"recipe {self.name!r}: {fmt} is a block format; use scaling='block'"
                )
            else:
                get_format(fmt)
        if self.scaling != "none" and self.inputs is None:
            raise ValueError(
                f"recipe {self.name!r}: scaling {self.scaling!r} needs an input format"
            )
        if self.output is not None:
            get_format(self.output)
        if self.full_subnormals and (
            self.scaling != "none" or any(
                get_format(f).is_int for f in (self.inputs, self.weights) if f is not None
            )
        ):
            raise ValueError(
                f"recipe {self.name!r}: full_subnormals is an ablation of unscaled "
                "floating-point operands; use scaling='none' and an eXmY format"
            )
        if (self.order == "tensor_core") != (self.tensor_core is not None):
            raise ValueError(
                f"recipe {self.name!r}: order='tensor_core' goes with a tensor_core preset"
            )

    @property
    def emulated(self) -> bool:
        """True when the accumulation needs :func:`fpsim.matmul` (not torch's FP32/FP64 matmul)."""
        return self.order is not None or self.accum not in NATIVE_ACCUMULATORS

    @property
    def plain(self) -> bool:
        """True for plain FP32 or FP64 arithmetic: no format anywhere, a native accumulator."""
        return (
            self.inputs is None
            and self.weights is None
            and self.output is None
            and not self.emulated
        )

    @property
    def weight_format(self) -> FormatLike | None:
        return self.inputs if self.weights is None else self.weights

    def to_json(self) -> dict[str, Any]:
        """The recipe's fields with formats as names."""
        d = dataclasses.asdict(self)
        for key in ("inputs", "weights", "output"):
            d[key] = format_name(getattr(self, key))
        return d


FP32 = Recipe("fp32")
FP64 = Recipe("fp64", accum="fp64")


# --------------------------------------------------------------------------------------------
# Operands
# --------------------------------------------------------------------------------------------
def rounding_limit(fmt: Format) -> float:
    """Magnitude from which a value no longer rounds to ``fmt``'s largest finite value (max + half
    an ulp)."""
    ulp = 1.0 if fmt.is_int else math.ldexp(1.0, fmt.emax - fmt.mbits)
    return fmt.max + ulp / 2


def quantize_operand(
    x: Tensor, fmt: FormatLike | None, recipe: Recipe, axis: int
) -> tuple[Tensor, Any]:
    """``x`` rounded to ``fmt`` under the recipe's scaling, reducing along ``axis``.

    Returns the dequantized values (``x``'s dtype) and, per element (a float or a tensor that
    broadcasts against ``x``), the magnitude from which it is clamped or overflows instead of
    rounded: its :func:`rounding_limit` times its scale.
    """
    if fmt is None:
        return x, math.inf
    if recipe.scaling == "block":
        arr = mx.quantize(x, fmt, axis=axis, rounding=recipe.rounding,
                          scale_rounding=recipe.scale_rounding)
        top = dataclasses.replace(arr, codes=torch.full_like(arr.codes, arr.fmt.elem.max_code))
        elem = arr.fmt.elem
        return arr.dequantize(x.dtype), top.dequantize(torch.float64) * (
            rounding_limit(elem) / elem.max
        )
    f = get_format(fmt)
    if recipe.scaling == "none":
        q = fpsim.quantize(x, f, rounding=recipe.rounding, saturate=recipe.saturate)
        if recipe.full_subnormals:
            q = widen_subnormals(x, q, f, recipe.rounding)
        return q, rounding_limit(f)
    if recipe.scaling == "tile":
        return tile_quantize(x, f, axis, recipe.rounding), math.inf
    # one scale per tensor or per row along the reduction axis; float64 keeps x / scale finite
    # for formats wider than float32, whose fp32 scales stop at 2^-126
    moved = x.movedim(axis, -1)
    channel = recipe.scaling == "channel"
    st = fpsim.scaled_quantize(
        moved.reshape(-1, moved.shape[-1]).double(),
        f,
        granularity=recipe.scaling,
        axis=0 if channel else None,
        rounding=recipe.rounding,
    )
    q = st.values.reshape(moved.shape).movedim(-1, axis).to(x.dtype)
    scales = st.scales.double()
    if channel:
        scales = scales.reshape(*moved.shape[:-1], 1).movedim(-1, axis)
    return q, scales * rounding_limit(f)


def widen_subnormals(x: Tensor, q: Tensor, f: Format, rounding: str = "rne") -> Tensor:
    """``q`` (``x`` rounded to ``f``) with every nonzero value below ``f``'s smallest normal
    rounded instead at ``f``'s full mantissa width (the exponent range of FP32), so subnormals
    lose no bits; values ``f`` flushes to zero stay zero."""
    wide = Format(f"e8m{f.mbits}", 8, f.mbits)
    below = (q != 0) & (x.abs() < f.min_normal)
    return torch.where(below, fpsim.quantize(x, wide, rounding=rounding), q)


def tile_quantize(x: Tensor, f: Format, axis: int, rounding: str = "rne") -> Tensor:
    """DeepSeek-V3 fine-grained scaling: amax scales per 1 x 128 tile along the reduction axis
    of a left operand (``axis=-1``), per 128 x 128 block of a right operand (``axis=-2``).

    Scales are amax / format max in FP32 (:func:`fpsim.scaled_quantize`); an axis that is not
    a multiple of 128 ends in a short tile.  Amax scaling never overflows (limit: inf).
    """
    moved = x.movedim(axis, -1).double()
    if axis == -1:
        st = fpsim.scaled_quantize(moved, f, granularity=("block", TILE), axis=-1,
                                   rounding=rounding)
        return st.values.movedim(-1, axis).to(x.dtype)
    # right operand [..., K, N] moved to [..., N, K]: blocks of 128 columns x 128 reduction steps
    *batch, n, k = moved.shape
    pn, pk = -n % TILE, -k % TILE
    padded = torch.nn.functional.pad(moved, (0, pk, 0, pn))
    N, K = (n + pn) // TILE, (k + pk) // TILE
    blocks = padded.reshape(*batch, N, TILE, K, TILE).movedim(-3, -2)
    flat = blocks.reshape(-1, TILE * TILE)
    st = fpsim.scaled_quantize(flat, f, granularity="channel", axis=0, rounding=rounding)
    q = st.values.reshape(blocks.shape).movedim(-2, -3).reshape(padded.shape)[..., :n, :k]
    return q.movedim(-1, axis).to(x.dtype)


def operand_events(x: Tensor, q: Tensor, limit: Any) -> dict[str, int]:
    """Counts of elements of ``x`` that overflowed to inf/NaN, saturated, or flushed to zero in
    ``q``.

    Saturated: ``q`` finite although ``|x|`` reached ``limit`` (see :func:`quantize_operand`).
    """
    fx, fq = torch.isfinite(x), torch.isfinite(q)
    return {
        "elements": x.numel(),
        "overflow": int((fx & ~fq).sum()),
        "saturated": int((fx & fq & (x.abs() >= limit)).sum()),
        "flushed": int((fx & (x != 0) & (q == 0)).sum()),
    }


def _quantize_counted(
    x: Tensor, fmt: FormatLike | None, recipe: Recipe, axis: int, count: bool
) -> tuple[Tensor, dict[str, int] | None]:
    q, limit = quantize_operand(x, fmt, recipe, axis)
    events = operand_events(x, q, limit) if count else None
    return unflush(x, q, recipe), events


def unflush(x: Tensor, q: Tensor, recipe: Recipe) -> Tensor:
    """``q`` with flushed elements (nonzero in ``x``, zero in ``q``) put back when ``flush`` is
    off."""
    return q if recipe.flush else torch.where((q == 0) & (x != 0), x, q)


def _operands(
    recipe: Recipe, a: Tensor, b: Tensor, events: dict | None, cache: dict | None = None
) -> tuple[Tensor, Tensor]:
    """Quantize ``a`` (reducing along its last axis) and ``b`` (along its second to last).

    ``cache`` keeps ``b``'s quantization by storage, shape and recipe: pass one for weights,
    which every batch and every replay of the same recipe would otherwise quantize again.
    """
    count = events is not None
    qa, ev_a = _quantize_counted(a, recipe.inputs, recipe, -1, count)
    key = (
        b.data_ptr(),
        tuple(b.shape),
        b.stride(),
        recipe.weight_format,
        recipe.scaling,
        recipe.rounding,
        recipe.saturate,
        recipe.flush,
        recipe.scale_rounding,
        recipe.full_subnormals,
    )
    if cache is None or key not in cache or (count and cache[key][1] is None):
        found = _quantize_counted(b, recipe.weight_format, recipe, -2, count)
        if cache is not None:
            cache[key] = found
    else:
        found = cache[key]
    qb, ev_b = found
    if count:
        events["a"], events["b"] = ev_a, ev_b
    return qa, qb


# --------------------------------------------------------------------------------------------
# Accumulation and output
# --------------------------------------------------------------------------------------------
def _emulated_matmul(a: Tensor, b: Tensor, recipe: Recipe, events: dict | None) -> Tensor:
    """``a @ b`` (matmul broadcasting) with the accumulator emulated by :func:`fpsim.matmul`.

    Products are exact; fills ``events["accum"]`` with the accumulator's overflow, largest
    partial sum and swamped additions when ``events`` is given.
    """
    y = fpsim.matmul(
        a,
        b,
        accum=recipe.accum,
        order=recipe.order or "sequential",
        chunk=recipe.chunk,
        rounding=recipe.rounding,
        tensor_core=recipe.tensor_core,
        return_stats=events is not None,
    )
    if events is None:
        return y.to(a.dtype)
    y, stats = y
    events["accum"] = {
        "outputs": y.numel(),
        "overflow": int(stats.overflow.sum()),
        "max_partial": float(stats.max_partial.max()) if y.numel() else 0.0,
        "swamped": int(stats.swamped.sum()),
    }
    return y.to(a.dtype)


def _product(
    recipe: Recipe, a: Tensor, b: Tensor, bias: Tensor | None, events: dict | None
) -> Tensor:
    """``a @ b (+ bias)`` accumulated as the recipe says, in ``a``'s dtype; bias added at the
    end."""
    if recipe.emulated:
        y = _emulated_matmul(a, b, recipe, events)
        return y if bias is None else y + bias
    acc, f64 = NATIVE_ACCUMULATORS[recipe.accum], torch.float64
    if bias is None:
        return (a.to(f64) @ b.to(f64)).to(acc).to(a.dtype)
    a2 = a.reshape(-1, a.shape[-1]).to(f64)
    y = torch.addmm(bias.to(f64), a2, b.to(f64)).to(acc).to(a.dtype)
    return y.view(*a.shape[:-1], b.shape[-1])


def _row_dot(recipe: Recipe, u: Tensor, v: Tensor, events: dict | None = None) -> Tensor:
    """Dot products of ``u`` and ``v`` along their last axis, accumulated as the recipe says."""
    if recipe.emulated:
        return _emulated_matmul(u[..., None, :], v[..., :, None], recipe, events)[..., 0, 0]
    acc = NATIVE_ACCUMULATORS[recipe.accum]
    return (u.double() * v.double()).sum(-1).to(acc).to(u.dtype)


def round_output(y: Tensor, recipe: Recipe) -> Tensor:
    """The site result written in the recipe's output format."""
    if recipe.output is None:
        return y
    return fpsim.quantize(y, recipe.output, rounding=recipe.rounding, saturate=recipe.saturate)


# --------------------------------------------------------------------------------------------
# Sites
# --------------------------------------------------------------------------------------------
def linear(
    recipe: Recipe,
    x: Tensor,
    W: Tensor,
    b: Tensor | None,
    events: dict | None = None,
    cache: dict | None = None,
) -> Tensor:
    """Conv1D ``x @ W + b`` (``W`` is ``[in, out]``) under ``recipe``; fills ``events`` if given.

    ``cache`` (a dict the caller keeps per model) holds quantized weights between calls.
    """
    qx, qW = _operands(recipe, x, W, events, cache)
    return round_output(_product(recipe, qx, qW, b, events), recipe)


def matmul(recipe: Recipe, a: Tensor, b: Tensor, events: dict | None = None) -> Tensor:
    """Batched ``a @ b`` under ``recipe``; fills ``events`` if given."""
    qa, qb = _operands(recipe, a, b, events)
    return round_output(_product(recipe, qa, qb, None, events), recipe)


def _layernorm_parts(
    recipe: Recipe, x: Tensor, events: dict | None
) -> tuple[Tensor, Tensor, Tensor]:
    """Centred quantized input ``d``, per-row mean and sum of squares ``d . d`` under ``recipe``."""
    qx, limit = quantize_operand(x, recipe.inputs, recipe, axis=-1)
    if events is not None:
        events["a"] = operand_events(x, qx, limit)
    mean = round_output(_row_dot(recipe, qx, torch.ones_like(qx)), recipe) / x.shape[-1]
    d = qx - mean[..., None]
    return d, mean, round_output(_row_dot(recipe, d, d, events), recipe)


def layernorm_stats(recipe: Recipe, x: Tensor, events: dict | None = None) -> tuple[Tensor, Tensor]:
    """Per-row mean and sum of squares ``sum((x - mean)^2)`` of LayerNorm, under ``recipe``.

    Both are dot products: ``x`` is quantized like a left operand, ``x . 1`` and ``d . d``
    (``d = x - mean``) are accumulated and written in the recipe's output format.
    """
    _, mean, ssq = _layernorm_parts(recipe, x, events)
    return mean, ssq


def layernorm(
    recipe: Recipe, x: Tensor, weight: Tensor, bias: Tensor, eps: float, events: dict | None = None
) -> Tensor:
    """LayerNorm with its statistics computed under ``recipe``.

    A plain recipe is torch's LayerNorm computed in FP64 and rounded to the accumulator.
    """
    if recipe.plain:
        y = F.layer_norm(x.double(), (x.shape[-1],), weight.double(), bias.double(), eps)
        return y.to(NATIVE_ACCUMULATORS[recipe.accum]).to(x.dtype)
    d, _, ssq = _layernorm_parts(recipe, x, events)
    return d * torch.rsqrt(ssq[..., None] / x.shape[-1] + eps) * weight + bias


def softmax(x: Tensor) -> Tensor:
    """Softmax over the last axis computed in FP64 and rounded to ``x``'s dtype (deterministic)."""
    return torch.softmax(x.double(), dim=-1).to(x.dtype)
