"""A dot-product site computed under a ``fpsim.emulation.recipe.Recipe``, on torch tensors.

The functions ``linear``, ``matmul``, ``layernorm``, ``rmsnorm`` and
``layernorm_stats`` compute one site under a recipe; ``fpsim.emulate`` and the
experiments (per-site replay and end-to-end) use them, so all measure the same arithmetic.

Operands are quantized with ``fpsim.quantize`` (no scaling), ``fpsim.scaled_quantize``
(per-tensor or per-channel amax scaling) or ``fpsim.mx.quantize`` (MX and NVFP4 blocks),
then multiplied exactly and summed by torch, unless the recipe asks for another accumulator
or an explicit order, which ``fpsim.matmul`` emulates.  An FP32 accumulator is computed
in FP64 and rounded once to FP32 (a correctly rounded FP32 dot product, barring FP64 ties): the
same bits on any thread count and machine, which torch's own FP32 matmul (``native_sums="host"``,
fast) does not promise.  Scales
follow the reduction axis: per-channel means one scale per row of the left operand and per
column of the right one, so the scales factor out of every dot product.  This module imports
torch; ``import fpsim`` does not import it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .. import mx
from ..arith import compiled
from ..arith import matmul as emulated_matmul
from ..convert import quantize
from ..formats import Format, get_format
from ..rounding import STOCHASTIC
from ..scaling import amax_scale, scaled_quantize
from . import onepass
from .casts import Cast
from .recipe import TILE, FormatLike, Recipe

NATIVE_ACCUMULATORS = {"fp32": torch.float32, "fp64": torch.float64}  # rounded to; summed in FP64


# --------------------------------------------------------------------------------------------
# Operands
# --------------------------------------------------------------------------------------------
def rounding_limit(fmt: Format) -> float:
    """Magnitude from which a value no longer rounds to ``fmt``'s largest finite value (max + half
    an ulp)."""
    ulp = 1.0 if fmt.is_int else math.ldexp(1.0, fmt.emax - fmt.mbits)
    return fmt.max + ulp / 2


def quantize_operand(
    x: Tensor, fmt: FormatLike | None, recipe: Recipe, axis: int, seed: Any = None,
    with_limit: bool = True, tensor_scale: float | None = None,
) -> tuple[Tensor, Any]:
    """``x`` rounded to ``fmt`` under the recipe's scaling, reducing along ``axis``:
    ``quantize_cast`` of the recipe's ``fpsim.emulation.recipe.Recipe.cast``."""
    return quantize_cast(x, recipe.cast(fmt, axis), axis, seed, with_limit, tensor_scale)


def quantize_cast(
    x: Tensor, c: Cast | None, axis: int, seed: Any = None, with_limit: bool = True,
    tensor_scale: float | None = None,
) -> tuple[Tensor, Any]:
    """``x`` quantized by ``c`` (fpsim's own scalings: ``none``, ``tensor``, ``channel``,
    ``block``, ``tile``, ``tile2d``; None keeps ``x``), reducing along ``axis`` (``seed``:
    stochastic rounding's, as ``fpsim.quantize`` takes it, by default from torch's
    generator; ``tensor_scale``: NVFP4's, when ``x`` is a piece of the tensor it was taken on).

    Returns the dequantized values (``x``'s dtype) and, per element (a float or a tensor that
    broadcasts against ``x``), the magnitude from which it is clamped or overflows instead of
    rounded: its ``rounding_limit`` times its scale (``with_limit=False``: block scaling
    leaves out that full-size tensor and returns None; callers that count no events).
    """
    if c is None:
        return x, math.inf
    fmt = c.fmt
    if seed is None and c.rounding in STOCHASTIC:
        seed = generator(x.device)
    if c.scaling == "block":
        if not with_limit and c.srbits is None and x.dim():
            q = onepass.mx_values(x.movedim(axis, -1), fmt, c.scale_rounding, c.rounding,
                                  tensor_scale)
            if q is not None:                     # None: not applicable; strides as below
                return q.movedim(-1, axis).contiguous(), None
        arr = mx.quantize(x, fmt, axis=axis, rounding=c.rounding, srbits=c.srbits,
                          scale_rounding=c.scale_rounding, seed=seed,
                          tensor_scale=tensor_scale)
        q = onepass.block_values(arr, x.dtype)     # None: not applicable
        q = arr.dequantize(x.dtype) if q is None else q
        if not with_limit:
            return q, None
        # the limit is the same over a block: the largest code of each block (as blocks of one
        # element) dequantized, then repeated along the axis: one full-size tensor, not several
        elem, lay = arr.fmt.elem, arr.layout
        top = dataclasses.replace(
            arr, codes=arr.codes.new_full(lay.scale_shape, elem.max_code),
            shape=lay.scale_shape, block_size=1)
        per_block = top.dequantize(torch.float64) * (rounding_limit(elem) / elem.max)
        limit = per_block.repeat_interleave(arr.block_size, dim=lay.axis).narrow(
            lay.axis, 0, lay.length)
        return q, limit
    f = get_format(fmt)
    if c.scaling == "none":
        q = quantize(x, f, rounding=c.rounding, saturate=c.saturate, srbits=c.srbits,
                     seed=seed)
        if c.full_subnormals:
            q = widen_subnormals(x, q, f, c.rounding, c.srbits, seed)
        return q, rounding_limit(f)
    if c.scaling == "site":
        scale = site_scale(c, f)
        q = quantize(x.to(torch.float64) / scale, f, rounding=c.rounding, saturate=c.saturate,
                     srbits=c.srbits, seed=seed) * scale
        return q.to(x.dtype), scale * rounding_limit(f)
    if c.scaling == "tile":
        q = tile_quantize(x.movedim(axis, -1), f, -1, c.rounding, c.srbits, seed)
        return q.movedim(-1, axis), math.inf
    if c.scaling == "tile2d":
        q = tile_quantize(x.movedim(axis, -2), f, -2, c.rounding, c.srbits, seed)
        return q.movedim(-2, axis), math.inf
    if c.scaling not in ("tensor", "channel"):
        raise ValueError(f"{c.describe()}: a {c.scaling} cast is applied by "
                         "fpsim.emulation.quantizers.cast, not quantize_cast")
    scale_dtype = "e8m0" if c.pow2 else "fp32"
    if c.scaling == "tensor" and c.srbits is None:
        fast = onepass.tensor_scaled(x, f, c.rounding, axis, scale_dtype)   # None: not applicable
        if fast is not None:
            q, scale = fast
            return q, torch.tensor(scale, dtype=torch.float64) * rounding_limit(f)
    # one scale per tensor or per row along the reduction axis; float64 keeps x / scale finite
    # for formats wider than float32, whose fp32 scales stop at 2^-126.  One contiguous copy:
    # scaled_quantize then reads its rows as a view (a strided one it would copy again)
    moved = x.movedim(axis, -1)
    channel = c.scaling == "channel"
    st = scaled_quantize(
        moved.reshape(-1, moved.shape[-1]).to(torch.float64,
                                              memory_format=torch.contiguous_format),
        f,
        granularity=c.scaling,
        axis=0 if channel else None,
        scale_dtype=scale_dtype,
        rounding=c.rounding,
        srbits=c.srbits,
        seed=seed,
    )
    q = st.values.reshape(moved.shape).movedim(-1, axis).to(x.dtype)
    scales = st.scales.double()
    if channel:
        scales = scales.reshape(*moved.shape[:-1], 1).movedim(-1, axis)
    return q, scales * rounding_limit(f)


def site_scale(c: Cast, f: Format) -> float:
    """A ``site`` cast's scale: its calibrated amax / ``f``'s largest value in FP32, within
    FP32's normal range (1 for an amax of 0; with ``pow2`` the smallest power of two at or
    above it), as per-tensor scaling computes it from a tensor's own amax
    (``fpsim.scaling.amax_scale``).

    >>> site_scale(Cast("e4m3_ieee", "site", amax=720.0), get_format("e4m3_ieee"))
    3.0
    >>> site_scale(Cast("e4m3_ieee", "site", amax=720.0, pow2=True), get_format("e4m3_ieee"))
    4.0
    """
    if c.amax is None:
        raise ValueError(f"{c.describe()}: per-site scaling reads the site's calibrated amax; "
                         "run the model under fpsim.emulate(..., amax=...), whose amax "
                         "fpsim.emulation.Calibration records")
    if c.amax == 0:
        return 1.0
    return float(amax_scale(np.array([c.amax]), f.max, "e8m0" if c.pow2 else "fp32", 0)[0])


def widen_subnormals(x: Tensor, q: Tensor, f: Format, rounding: str = "rne",
                     srbits: int | None = None, seed: Any = None) -> Tensor:
    """``q`` (``x`` rounded to ``f``) with every nonzero value below ``f``'s smallest normal
    rounded instead at ``f``'s full mantissa width (the exponent range of FP32), so subnormals
    lose no bits; values ``f`` flushes to zero stay zero."""
    wide = Format(f"e8m{f.mbits}", 8, f.mbits)
    below = (q != 0) & (x.abs() < f.min_normal)
    return torch.where(below, quantize(x, wide, rounding=rounding, srbits=srbits, seed=seed),
                       q)


def generator(device: Any) -> torch.Generator:
    """A generator for one stochastic rounding, seeded from torch's global generator: a run
    seeded with ``torch.manual_seed`` draws the same bits again (capture included)."""
    seed = int(torch.randint(0, 2**62, (1,)))
    return torch.Generator(device=device).manual_seed(seed)


def tile_quantize(x: Tensor, f: Format, axis: int, rounding: str = "rne",
                  srbits: int | None = None, seed: Any = None) -> Tensor:
    """DeepSeek-V3 fine-grained scaling: amax scales per 1 x 128 tile along the reduction axis
    of a left operand (``axis=-1``), per 128 x 128 block of a right operand (``axis=-2``).

    Scales are amax / format max in FP32 (``fpsim.scaled_quantize``); an axis that is not
    a multiple of 128 ends in a short tile.  Amax scaling never overflows (limit: inf).
    """
    moved = x.movedim(axis, -1).double()
    if axis == -1:
        st = scaled_quantize(moved, f, granularity=("block", TILE), axis=-1,
                             rounding=rounding, srbits=srbits, seed=seed)
        return st.values.movedim(-1, axis).to(x.dtype)
    # right operand [..., K, N] moved to [..., N, K]: blocks of 128 columns x 128 reduction steps
    *batch, n, k = moved.shape
    pn, pk = -n % TILE, -k % TILE
    padded = torch.nn.functional.pad(moved, (0, pk, 0, pn))
    N, K = (n + pn) // TILE, (k + pk) // TILE
    blocks = padded.reshape(*batch, N, TILE, K, TILE).movedim(-3, -2)
    flat = blocks.reshape(-1, TILE * TILE)
    st = scaled_quantize(flat, f, granularity="channel", axis=0, rounding=rounding,
                         srbits=srbits, seed=seed)
    q = st.values.reshape(blocks.shape).movedim(-2, -3).reshape(padded.shape)[..., :n, :k]
    return q.movedim(-1, axis).to(x.dtype)


def operand_events(x: Tensor, q: Tensor, limit: Any) -> dict[str, int]:
    """Counts of elements of ``x`` that overflowed to inf/NaN, saturated, or flushed to zero in
    ``q``.

    Saturated: ``q`` finite although ``|x|`` reached ``limit`` (see ``quantize_operand``).
    """
    if (isinstance(limit, (int, float)) or limit.numel() == 1) and x.is_floating_point() \
            and x.element_size() in (2, 4, 8):
        # the least value of x's dtype at or above the limit: |x| >= it, compared in x's
        # dtype (as torch compares a scalar), exactly when |x| >= limit
        bits = limit_bits(float(limit), x.dtype)
        limit = bits_value(bits, x.dtype)
        u, v = kernel_bits(x), kernel_bits(q)
        if u is not None and v is not None and x.shape == q.shape and x.dtype == q.dtype:
            over, saturated, flushed = compiled.kernels().operand_events(u[0], v[0], u[1], u[2],
                                                                          bits)
            return {"elements": x.numel(), "overflow": int(over),
                    "saturated": int(saturated), "flushed": int(flushed)}   # one pass
    lim = limit if isinstance(limit, (int, float)) else float(limit.min()) if limit.numel() \
        else math.inf
    if x.numel() and finite_below(x, lim) and finite_below(q, math.inf):
        # the common case in four passes without temporaries: nothing overflowed or saturated,
        # and as quantization keeps zeros (and makes no zero non-zero), the flushed elements
        # are the non-zeros lost
        return {"elements": x.numel(), "overflow": 0, "saturated": 0,
                "flushed": int(torch.count_nonzero(x)) - int(torch.count_nonzero(q))}
    fx, fq = torch.isfinite(x), torch.isfinite(q)
    return {
        "elements": x.numel(),
        "overflow": int((fx & ~fq).sum()),
        "saturated": int((fx & fq & (x.abs() >= limit)).sum()),
        "flushed": int((fx & (x != 0) & (q == 0)).sum()),
    }


def kernel_bits(t: Tensor) -> tuple[Any, int, int] | None:
    """``t``'s bits as the compiled capture kernels read them (``_jit_kernels.operand_scan``
    and ``operand_events``): a flat NumPy array of signed integers of its width, the mask of
    its magnitude bits and the magnitude bits of inf; None where they do not run (no numba,
    not on the CPU, not a real floating dtype of 2, 4 or 8 bytes).

    >>> kernel_bits(torch.tensor([-1.0]))[0].tolist() if compiled.available() else [-1082130432]
    [-1082130432]
    """
    if t.device.type != "cpu" or not t.is_floating_point() or t.element_size() not in (2, 4, 8) \
            or not compiled.available():
        return None
    return (_bits(t.detach()).reshape(-1).numpy(), (1 << (8 * t.element_size() - 1)) - 1,
            _inf_bits(t.dtype))


@functools.cache
def _inf_bits(dtype: torch.dtype) -> int:
    """The magnitude bits of inf in ``dtype`` (its largest finite value's + 1)."""
    return _magnitude(math.inf, dtype)


def _magnitude(x: float, dtype: torch.dtype) -> int:
    """The magnitude bits of ``x`` (non-negative) rounded to nearest in ``dtype``."""
    return int(_bits(torch.tensor([x], dtype=torch.float64).to(dtype))[0])


def limit_bits(limit: float, dtype: torch.dtype) -> int:
    """The magnitude bits of the least value of ``dtype`` at or above ``limit`` (>= 0): a
    finite ``x`` has ``|x| >= limit`` exactly when its magnitude bits reach them (inf's bits
    when no finite value of ``dtype`` does).

    >>> limit_bits(448.0, torch.float16), limit_bits(448.1, torch.float16)
    (24320, 24321)
    """
    bits = _magnitude(limit, dtype)
    return bits + 1 if bits_value(bits, dtype) < limit else bits


def bits_value(bits: int, dtype: torch.dtype) -> float:
    """The value of ``dtype`` whose bits are ``bits`` (``kernel_bits``' width).

    >>> bits_value(0x3F800000, torch.float32)
    1.0
    """
    return float(torch.tensor([bits]).to(_WIDTH[dtype.itemsize]).view(dtype)[0])


def finite_below(t: Tensor, limit: float) -> bool:
    """Whether every element of ``t`` (non-empty) is finite and of magnitude below ``limit``
    (NaN fails: ``aminmax`` propagates it)."""
    lo, hi = torch.aminmax(t.detach())
    m = max(-float(lo), float(hi))
    return math.isfinite(m) and m < limit


def _quantize_counted(
    x: Tensor, fmt: FormatLike | None, recipe: Recipe, axis: int, count: bool
) -> tuple[Tensor, dict[str, int] | None]:
    q, limit = quantize_operand(x, fmt, recipe, axis, with_limit=count)
    events = operand_events(x, q, limit) if count else None
    return unflush(x, q, recipe.cast(fmt, axis) or recipe), events


def unflush(x: Tensor, q: Tensor, recipe: Recipe | Cast) -> Tensor:
    """``q`` with flushed elements (nonzero in ``x``, zero in ``q``) put back when the recipe's
    or the Cast's ``flush`` is off."""
    return q if recipe.flush else torch.where((q == 0) & (x != 0), x, q)


class Recent(dict):
    """A cache for ``_operands`` of the ``size`` right operands used last that are not
    parameters but recur, such as a decoder's cached cross-attention keys and values: quantized
    once per clip instead of at every token.  An entry keeps a copy of its operand and is used
    only while the operand still holds the same bits (``find``): a write through ``.data``
    changes no version counter.  ``widened`` keeps an entry's quantization in FP64 with it.

    >>> r = Recent(1); x = torch.ones(2); r[1] = (x, "q", None); r.find(1, x)[1]
    'q'
    >>> x.data[0] = 2; r.find(1, x) is None
    True
    """

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size
        self.recurred: set = set()             # keys that ``find`` found

    def find(self, key: Any, b: Tensor) -> tuple | None:
        """The entry of ``key`` when ``b`` holds the bits it was made from, else None."""
        entry = self.get(key)
        if entry is None or not torch.equal(_bits(entry[0]), _bits(b)):
            return None
        dict.__setitem__(self, key, self.pop(key))    # the most recently used last
        self.recurred.add(key)
        return entry

    def widened(self, q: Tensor) -> Tensor:
        """``q`` in FP64, kept with the entry whose quantization ``q`` is (the most recent
        first) once that entry has recurred (``find``), while it lives; made anew for a ``q``
        of no such entry (an encoder's keys, used once, keep no FP64 copy)."""
        for key, entry in reversed(self.items()):
            if entry[1] is q and key in self.recurred:
                if len(entry) == 3:
                    dict.__setitem__(self, key, (*entry, q.to(torch.float64)))
                return self[key][3]
        return q.to(torch.float64)

    def __setitem__(self, key: Any, entry: tuple) -> None:
        self.pop(key, None)
        self.recurred.discard(key)
        super().__setitem__(key, (entry[0].clone(), *entry[1:]))
        while len(self) > self.size:
            self.recurred.discard(old := next(iter(self)))
            del self[old]


_WIDTH = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}


def _bits(t: Tensor) -> Tensor:
    """``t``'s bits as integers (-0.0 and 0.0 differ, a NaN equals itself)."""
    return t.view(_WIDTH[t.element_size()])


def cached(cache: dict | None, b: Tensor, how: Any, count: bool,
           make: Callable[[], tuple[Any, dict | None]]) -> tuple[Any, dict | None]:
    """``make()``'s quantization of ``b`` and its events (None when not ``count``ed), kept in
    ``cache`` (a dict, or a ``Recent``; None: made each time) by ``b``'s storage, version
    (in-place updates bump it), shape, strides, dtype and ``how`` it is quantized.

    >>> cache, w = {}, torch.ones(2)
    >>> cached(cache, w, "e4m3", False, lambda: ("q", None))
    ('q', None)
    >>> cached(cache, w, "e4m3", False, lambda: ("made again", None))[0]
    'q'
    """
    key = (b.data_ptr(), b._version, tuple(b.shape), b.stride(), b.dtype, how)
    found = None if cache is None else cache.find(key, b) if isinstance(cache, Recent) \
        else cache.get(key)
    if found is None or (count and found[2] is None):
        found = (b, *make())
        if cache is not None:
            cache[key] = found
    return found[1], found[2]


def _operands(
    recipe: Recipe, a: Tensor, b: Tensor, events: dict | None, cache: dict | None = None
) -> tuple[Tensor, Tensor]:
    """Quantize ``a`` (reducing along its last axis) and ``b`` (along its second to last).

    ``cache`` keeps ``b``'s quantization (with ``b`` itself, whose storage then stays allocated)
    by storage, version (in-place updates bump it), shape and recipe: pass a dict for weights,
    which every batch and every replay of the same recipe would otherwise quantize again, or a
    ``Recent`` for operands that recur for a while.
    """
    count = events is not None
    qa, ev_a = _quantize_counted(a, recipe.inputs, recipe, -1, count)
    qb, ev_b = cached(cache, b, recipe.cast(recipe.weight_format, -2), count,
                      lambda: _quantize_counted(b, recipe.weight_format, recipe, -2, count))
    if count:
        events["a"], events["b"] = ev_a, ev_b
    return qa, qb


# --------------------------------------------------------------------------------------------
# Accumulation and output
# --------------------------------------------------------------------------------------------
#: a key of an ``events`` dict, True where its reader wants the accumulator's swamped additions
#: but not its largest partial sum (``fpsim.emulate``'s capture, which records no such column):
#: the compiled engine's sequential sums then do not track it, and ``events["accum"]``'s
#: ``max_partial`` is None
SWAMPED_ONLY = "swamped_only"


def _emulated_matmul(a: Tensor, b: Tensor, recipe: Recipe, events: dict | None) -> Tensor:
    """``a @ b`` (matmul broadcasting) with the accumulator emulated by ``fpsim.matmul``.

    Products are exact (float64 operands: a float64 multiply, as the FP64 hardware rounds
    it); fills ``events["accum"]`` with the accumulator's overflow, largest
    partial sum (None under ``SWAMPED_ONLY``) and swamped additions when ``events`` is given.
    """
    peak = events is not None and not events.get(SWAMPED_ONLY, False)
    y = emulated_matmul(
        a,
        b,
        accum=recipe.accumulator(),
        product="fp64" if a.dtype == torch.float64 else "exact",
        rounding=recipe.rounding,
        seed=generator(a.device) if recipe.rounding in STOCHASTIC else None,
        srbits=recipe.srbits,
        return_stats=False if events is None else True if peak else "swamped",
    )
    if events is None:
        return y.to(a.dtype)
    y, stats = y
    events["accum"] = {
        "outputs": y.numel(),
        "overflow": count_true(stats.overflow),
        "max_partial": None if not peak else float(stats.max_partial.max()) if y.numel()
        else 0.0,
        "swamped": int(stats.swamped.sum()),
    }
    return y.to(a.dtype)


def count_true(mask: Tensor) -> int:
    """The count of True in the boolean tensor ``mask``: NumPy's ``count_nonzero`` on the CPU
    (torch's sum of a bool tensor takes ten times longer on one thread), else torch's.

    >>> count_true(torch.tensor([True, False, True]))
    2
    """
    if mask.device.type == "cpu":
        return int(np.count_nonzero(mask.numpy()))
    return int(torch.count_nonzero(mask))


def _product(
    recipe: Recipe, a: Tensor, b: Tensor, bias: Tensor | None, events: dict | None,
    cache: dict | None = None,
) -> Tensor:
    """``a @ b (+ bias)`` accumulated as the recipe says, in ``a``'s dtype; bias added at the
    end (``cache``: ``_operands``' cache, which then keeps ``b`` widened to FP64 too)."""
    if recipe.emulated:
        y = _emulated_matmul(a, b, recipe, events)
        return y if bias is None else y + bias
    if recipe.native_sums == "host":              # torch's FP32 GEMM: fast, not reproducible
        y = a @ b                                 # then the bias, as torchao / TE add it
        return y if bias is None else y + bias
    acc, f64 = NATIVE_ACCUMULATORS[recipe.accum], torch.float64
    b = widened(b, cache)
    if bias is None:
        return (a.to(f64) @ b).to(acc).to(a.dtype)
    a2 = a.reshape(-1, a.shape[-1]).to(f64)
    y = torch.addmm(bias.to(f64), a2, b).to(acc).to(a.dtype)
    return y.view(*a.shape[:-1], b.shape[-1])


def widened(t: Tensor, cache: dict | None) -> Tensor:
    """``t`` in FP64, kept in ``cache`` (by storage, version, shape and strides) when one is
    given, so that a greedy decoder does not widen its output weight again at every token.
    The entry holds ``t`` too: its storage cannot be freed and reused by another tensor while
    the cache lives.  A ``Recent`` keeps it with the entry ``t`` is the quantization of."""
    if cache is None or t.dtype == torch.float64:
        return t.to(torch.float64)
    if isinstance(cache, Recent):
        return cache.widened(t)
    key = ("fp64", t.data_ptr(), t._version, tuple(t.shape), t.stride(), t.dtype)
    if key not in cache:
        cache[key] = (t, t.to(torch.float64))
    return cache[key][1]


def _row_dot(recipe: Recipe, u: Tensor, v: Tensor, events: dict | None = None) -> Tensor:
    """Dot products of ``u`` and ``v`` along their last axis, accumulated as the recipe says."""
    if recipe.emulated:
        return _emulated_matmul(u[..., None, :], v[..., :, None], recipe, events)[..., 0, 0]
    if recipe.native_sums == "host":
        return (u * v).sum(-1)
    acc = NATIVE_ACCUMULATORS[recipe.accum]
    return (u.double() * v.double()).sum(-1).to(acc).to(u.dtype)


def round_output(y: Tensor, recipe: Recipe) -> Tensor:
    """The site result written in the recipe's output format."""
    if recipe.output is None:
        return y
    seed = generator(y.device) if recipe.rounding in STOCHASTIC else None
    return quantize(y, recipe.output, rounding=recipe.rounding, saturate=recipe.saturate,
                    srbits=recipe.srbits, seed=seed)


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
    return round_output(_product(recipe, qx, qW, b, events, cache), recipe)


def matmul(recipe: Recipe, a: Tensor, b: Tensor, events: dict | None = None,
           cache: dict | None = None) -> Tensor:
    """Batched ``a @ b`` under ``recipe``; fills ``events`` if given (``cache``: ``b``'s
    quantization kept, as ``_operands`` says)."""
    qa, qb = _operands(recipe, a, b, events, cache)
    return round_output(_product(recipe, qa, qb, None, events, cache), recipe)


def causal_matmul(recipe: Recipe, p: Tensor, v: Tensor, events: dict | None = None) -> Tensor:
    """Attention's ``p @ v`` under ``recipe`` as a causal kernel computes it: query ``i`` sums
    over keys ``j <= i + S - T`` only (``p`` is ``[..., T, S]``), where ``matmul`` (the
    eager semantics) sums over every key with the masked probabilities at 0.

    The two differ only when ``v`` holds inf/NaN at a masked key: eagerly ``0 * inf`` is NaN
    and reaches every earlier query; here masked keys are skipped.  Finite results are the
    same bits as ``matmul``'s (a masked ``0 * v`` adds an exact zero).
    """
    qp, qv = _operands(recipe, p, v, events)
    T, S = qp.shape[-2], qv.shape[-2]
    keep = torch.ones(T, S, dtype=torch.bool, device=qp.device).tril(S - T)
    qp = torch.where(keep, qp, 0.0)      # a NaN probability at a masked key is skipped too
    bad = ~torch.isfinite(qv)
    if not bool(bad.any()):
        return round_output(_product(recipe, qp, qv, None, events), recipe)
    y = _product(recipe, qp, torch.where(bad, 0.0, qv), None, events)
    # the non-finite terms of kept keys, by IEEE rules: 0 * inf and NaN give NaN, +inf and
    # -inf together NaN, else the infinity (counts of indicator products, exact in float64)
    f64 = torch.float64
    pos_p, neg_p, zero_p = ((qp > 0) & keep).to(f64), ((qp < 0) & keep).to(f64), \
        ((qp == 0) & keep).to(f64)
    up, down = (qv == math.inf).to(f64), (qv == -math.inf).to(f64)
    nan = keep.to(f64) @ torch.isnan(qv).to(f64) + zero_p @ (up + down)
    plus, minus = pos_p @ up + neg_p @ down, pos_p @ down + neg_p @ up
    extra = torch.where(plus > 0, math.inf, 0.0) + torch.where(minus > 0, -math.inf, 0.0)
    extra = torch.where(nan > 0, math.nan, extra)
    return round_output(y + extra.to(y.dtype), recipe)


def _norm_operand(recipe: Recipe, x: Tensor, events: dict | None) -> Tensor:
    """A norm statistic's input quantized like a left operand, as a product's is (counted in
    ``events["a"]``; flushed values put back when the recipe's or its Cast's ``flush`` is
    off)."""
    qx, ev = _quantize_counted(x, recipe.inputs, recipe, -1, events is not None)
    if events is not None:
        events["a"] = ev
    return qx


def _layernorm_parts(
    recipe: Recipe, x: Tensor, events: dict | None
) -> tuple[Tensor, Tensor, Tensor]:
    """Centred quantized input ``d``, per-row mean and sum of squares ``d . d`` under ``recipe``."""
    qx = _norm_operand(recipe, x, events)
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
    recipe: Recipe,
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float,
    events: dict | None = None,
) -> Tensor:
    """LayerNorm over the last axis with its statistics computed under ``recipe`` (``weight``,
    ``bias``: None for none).

    A plain recipe is torch's LayerNorm computed in FP64 and rounded to the accumulator.
    """
    if recipe.plain:
        y = F.layer_norm(x.double(), (x.shape[-1],), _double(weight), _double(bias), eps)
        return y.to(NATIVE_ACCUMULATORS[recipe.accum]).to(x.dtype)
    d, _, ssq = _layernorm_parts(recipe, x, events)
    return _affine(d * torch.rsqrt(ssq[..., None] / x.shape[-1] + eps), weight, bias)


def sum_squares(recipe: Recipe, x: Tensor, events: dict | None = None) -> Tensor:
    """Per-row ``x . x`` (RMSNorm's statistic times the row length) under ``recipe``: ``x``
    quantized like a left operand, the dot product accumulated and written as the recipe says."""
    qx = _norm_operand(recipe, x, events)
    return round_output(_row_dot(recipe, qx, qx, events), recipe)


def rmsnorm(
    recipe: Recipe, x: Tensor, weight: Tensor | None, eps: float, events: dict | None = None
) -> Tensor:
    """RMSNorm over the last axis, ``x / sqrt(mean(x^2) + eps) * weight``, with the mean square
    computed under ``recipe`` (a plain recipe: all in FP64, rounded to the accumulator)."""
    if recipe.plain:
        xd = x.double()
        y = _affine(xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps), _double(weight), None)
        return y.to(NATIVE_ACCUMULATORS[recipe.accum]).to(x.dtype)
    ms = sum_squares(recipe, x, events)[..., None] / x.shape[-1]
    return _affine(x * torch.rsqrt(ms + eps), weight, None)


def _double(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.double()


def _affine(y: Tensor, weight: Tensor | None, bias: Tensor | None) -> Tensor:
    """``y * weight + bias``, either left out when None."""
    y = y if weight is None else y * weight
    return y if bias is None else y + bias


def softmax(x: Tensor, chunk: int = 1 << 20) -> Tensor:
    """Softmax over the last axis computed in FP64 and rounded to ``x``'s dtype (deterministic).

    Without autograd, rows go through FP64 ``chunk`` elements at a time (each row is computed
    alone, so the bits are those of one call; an encoder's ``[8, 6, 1500, 1500]`` attention
    scores would otherwise be widened whole, 0.9 GB, several times slower).

    >>> x = torch.randn(5, 3, 7)                  # 15 rows, two at a time
    >>> torch.equal(softmax(x, chunk=14), torch.softmax(x.double(), -1).float())
    True
    """
    n = x.shape[-1] if x.dim() else 1
    if x.numel() <= chunk or (torch.is_grad_enabled() and x.requires_grad):
        return torch.softmax(x.double(), dim=-1).to(x.dtype)
    rows, out = x.reshape(-1, n), torch.empty(x.shape, dtype=x.dtype, device=x.device)
    step, flat = max(1, chunk // n), out.view(-1, n)
    for i in range(0, rows.shape[0], step):
        flat[i:i + step] = torch.softmax(rows[i:i + step].double(), dim=-1)
    return out
