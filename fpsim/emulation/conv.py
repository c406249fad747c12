"""A convolution computed under a recipe as the implicit GEMM that hardware runs.

Each output element of ``conv{1,2,3}d`` is one dot product over ``C_in / groups x kernel
volume`` (the reduction axis K, ordered as the weight's ``[C_in/groups, *kernel]``): the
activation patches are the rows of a left operand ``[groups, N * L, K]`` (``L`` output
positions), the weights the columns of a right operand ``[groups, K, C_out / groups]``, and the
product is :func:`fpsim.emulation.sites.matmul`'s: operands rounded to the recipe's formats with
their scales along K (per channel: one scale per output channel for the weights and per patch
for the activations; MX blocks of 32 along K), summed in its accumulator and order, the bias
added, the result written in its output format.  Per-tensor activation scales are taken on
the activation tensor, and so is NVFP4's per-tensor scale (one for the whole patch matrix,
not one per piece).

Memory is bounded: the patches are built piece by piece (at most :data:`PIECE` elements
each, views of the padded input until then), never as one whole im2col of a large activation;
each piece in one compiled gather where numba is there (:func:`_gathered`), else by torch's
strided copies (:func:`_rows`).

A transposed convolution is the direct convolution of the input spread out by the stride
(``stride - 1`` zeros between elements), padded by ``dilation * (kernel - 1) - padding``, with
the kernel flipped and its channel axes swapped: the same sums of products (the inserted zeros
add nothing).

An activation with one scale or none (per-tensor or unscaled formats) is quantized once,
before its patches are built (each patch reads the same rounded values).  Under host FP32 sums
(``native_sums="host"``) such a convolution is then torch's own on the quantized operands: the
host's sums in its own order, as a linear site's host GEMM.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import convert, parallel
from ..blockrules import nvfp4_tensor_scale
from ..mx import get_block_format
from .recipe import Recipe
from .sites import _product, operand_events, quantize_operand, round_output, unflush

#: Patch elements per piece (16 MiB of float32).
PIECE = 1 << 22


def direct(x: Tensor, w: Tensor, stride: Sequence[int], padding: Sequence[int],
           dilation: Sequence[int], transposed: bool, output_padding: Sequence[int],
           groups: int) -> tuple[Tensor, Tensor, list[int]]:
    """The direct (not transposed) convolution equivalent to ``aten.convolution``'s arguments:
    ``(input already padded, weight [C_out, C_in/groups, *kernel], stride)``."""
    d = x.dim() - 2
    if not transposed:
        pads = [p for i in reversed(range(d)) for p in (padding[i], padding[i])]
        return F.pad(x, pads), w, list(stride)
    k = w.shape[2:]
    if any(s > 1 for s in stride):
        spread = x.new_zeros(*x.shape[:2], *((n - 1) * s + 1 for n, s in zip(x.shape[2:], stride)))
        spread[(..., *(slice(None, None, s) for s in stride))] = x
        x = spread
    pads = []
    for i in reversed(range(d)):
        lo = dilation[i] * (k[i] - 1) - padding[i]
        pads += [lo, lo + output_padding[i]]
    return F.pad(x, pads), direct_weight(w, True, groups), [1] * d


def direct_weight(w: Tensor, transposed: bool, groups: int) -> Tensor:
    """The weight ``[C_out, C_in/groups, *kernel]`` of the direct convolution: a transposed
    convolution's ``[C_in, C_out/groups, *kernel]`` with its channel axes swapped per group and
    its kernel flipped."""
    if not transposed:
        return w
    cin, cout_g, k = w.shape[0], w.shape[1], w.shape[2:]
    wd = w.reshape(groups, cin // groups, cout_g, *k).transpose(1, 2)
    wd = wd.flip(list(range(3, 3 + len(k))))
    return wd.reshape(groups * cout_g, cin // groups, *k)


def patches(xp: Tensor, kernel: Sequence[int], stride: Sequence[int],
            dilation: Sequence[int]) -> Tensor:
    """A view ``[N, C, *out, *kernel]`` of the padded input's windows (no copy)."""
    v = xp
    d = len(kernel)
    for i in range(d):
        span = dilation[i] * (kernel[i] - 1) + 1
        v = v.unfold(2 + i, span, stride[i])
    if any(r > 1 for r in dilation):
        v = v[(..., *(slice(None, None, r) for r in dilation))]
    return v


def weight_matrix(w: Tensor, groups: int) -> Tensor:
    """``[C_out, C_in/groups, *kernel]`` as the right operand ``[groups, K, C_out/groups]``."""
    return w.reshape(groups, w.shape[0] // groups, -1).transpose(1, 2)


def im2col(xp: Tensor, kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int],
           groups: int) -> Tensor:
    """The whole left operand ``[groups, N * L, K]`` of a padded input (tests and small
    inputs; :func:`conv` builds it piece by piece)."""
    v = patches(xp, kernel, stride, dilation)
    return _rows(v, groups)


def _rows(v: Tensor, groups: int) -> Tensor:
    """Patches ``[n, C, *out, *kernel]`` as ``[groups, n * L, K]``: one strided copy per kernel
    offset into a ``[n, *out, C, kernel volume]`` buffer (several times faster than one copy of
    the permuted six-dimensional view, whose innermost axis is the kernel's)."""
    d = (v.dim() - 2) // 2
    n, c = v.shape[:2]
    out, kernel = v.shape[2:2 + d], v.shape[2 + d:]
    dest = v.new_empty(n, *out, c, math.prod(kernel))
    for j, k in enumerate(itertools.product(*map(range, kernel))):
        dest[..., j] = v[(..., *k)].movedim(1, -1)
    return dest.reshape(n * math.prod(out), groups, (c // groups) * math.prod(kernel)).transpose(0, 1)


def _gathered(xp: Tensor, kernel: Sequence[int], stride: Sequence[int],
              dilation: Sequence[int], groups: int, ns: tuple[int, int],
              first: tuple[int, int], out: Sequence[int]) -> Tensor | None:
    """:func:`_rows` of images ``ns`` and first output rows ``first`` of the padded input, as
    one compiled gather (:func:`fpsim._cast_kernels.gather_rows`, over the cores), or None
    where it does not apply (no numba, not a contiguous CPU float32/float64 tensor)."""
    jit = convert._jit()
    if (jit is None or xp.device.type != "cpu" or xp.dtype not in (torch.float32, torch.float64)
            or not xp.is_contiguous() or (xp.requires_grad and torch.is_grad_enabled())):
        return None
    sn, sc, sp = xp.stride(0), xp.stride(1), xp.stride()[2:]

    def grid(ranges: list[range], steps: list[int]) -> Tensor:
        """Sum of each range times its step, every combination, the last range fastest."""
        total = torch.zeros((), dtype=torch.int64)
        for i, (r, st) in enumerate(zip(ranges, steps)):
            shape = [1] * len(ranges)
            shape[i] = len(r)
            total = total + (torch.tensor(r, dtype=torch.int64) * st).reshape(shape)
        return total.reshape(-1)

    base = grid([range(*ns), range(*first), *(range(o) for o in out[1:])],
                [sn, *(st * s for st, s in zip(stride, sp))])
    cg = xp.shape[1] // groups
    off = grid([range(cg), *(range(k) for k in kernel)],
               [sc, *(dl * s for dl, s in zip(dilation, sp))])
    src = xp.detach().reshape(-1).numpy()
    rows = torch.empty(groups, base.numel(), off.numel(), dtype=xp.dtype)
    dst, b, o = rows.numpy(), base.numpy(), off.numpy()
    grain = max(1, parallel.GRAIN // max(1, off.numel()))
    for g in range(groups):
        o_g = o + g * cg * sc
        parallel.run(lambda lo, hi: jit.gather_rows(src, b[lo:hi], o_g, dst[g, lo:hi]),
                     b.size, grain)
    return rows


def conv(recipe: Recipe, x: Tensor, w: Tensor, bias: Tensor | None, stride: Sequence[int],
         padding: Sequence[int], dilation: Sequence[int], transposed: bool,
         output_padding: Sequence[int], groups: int, events: dict | None = None,
         qw: Tensor | None = None) -> Tensor:
    """``aten.convolution`` under ``recipe`` (see the module doc); fills ``events`` if given.

    ``qw``: the weight matrix already quantized (a cache the caller keeps), else quantized here.
    """
    xp, wd, stride = direct(x, w, stride, padding, dilation, transposed, output_padding, groups)
    kernel = wd.shape[2:]
    count = events is not None
    if qw is None:
        qw = quantize_weights(recipe, wd, groups, events)
    elif count:
        events["b"] = {"elements": wd.numel(), "overflow": 0, "saturated": 0, "flushed": 0}
    # one scale (or none) for the whole activation: quantized once, before the patches
    whole = recipe.inputs is not None and recipe.scaling in ("tensor", "none")
    if whole:
        xq, limit = quantize_operand(xp, recipe.inputs, recipe, axis=-1)
        if count:
            events["a"] = operand_events(xp, xq, limit)
        xp = unflush(xp, xq, recipe)
    if (whole or recipe.inputs is None) and recipe.native_sums == "host" and not recipe.emulated:
        # the host's FP32 sums in its own order, as a linear site's host GEMM: torch's convolution
        wq = qw.transpose(1, 2).reshape(wd.shape)
        d = len(kernel)
        y = torch.ops.aten.convolution(xp, wq, None, stride, [0] * d, dilation, False, [0] * d,
                                       groups)
    else:
        y = _implicit_gemm(recipe, xp, qw, kernel, stride, dilation, groups, whole, events)
    if bias is not None:
        y = y + bias.reshape(-1, *[1] * len(kernel))
    return round_output(y, recipe).contiguous()


def _implicit_gemm(recipe: Recipe, xp: Tensor, qw: Tensor, kernel: Sequence[int],
                   stride: Sequence[int], dilation: Sequence[int], groups: int, whole: bool,
                   events: dict | None) -> Tensor:
    """The direct convolution of padded ``xp`` by the quantized weight matrix ``qw`` as
    products of patch rows, piece by piece (activations quantized per piece unless ``whole``);
    ``[N, C_out, *out]``, no bias."""
    count = events is not None
    ts = _tensor_scale(recipe, xp)
    v = patches(xp, kernel, stride, dilation)
    n, out = v.shape[0], list(v.shape[2:2 + len(kernel)])
    cout = qw.shape[0] * qw.shape[2]
    per_unit = math.prod(out[1:]) * xp.shape[1] * math.prod(kernel)   # one n, one first out row
    step = max(1, PIECE // max(1, per_unit))
    y = xp.new_empty(n, *out, cout)
    for lo_n, hi_n, lo_o, hi_o in _pieces(n, out[0], step):
        rows = _gathered(xp, kernel, stride, dilation, groups, (lo_n, hi_n), (lo_o, hi_o), out)
        if rows is None:
            rows = _rows(v[lo_n:hi_n, :, lo_o:hi_o], groups)
        if not whole:
            q, limit = quantize_operand(rows, recipe.inputs, recipe, axis=-1,
                                        with_limit=count, tensor_scale=ts)
            if count:
                _add(events, "a", operand_events(rows, q, limit))
            rows = unflush(rows, q, recipe)
        piece_events: dict | None = {} if count else None
        part = _product(recipe, rows, qw, None, piece_events)
        if count and "accum" in piece_events:
            _add(events, "accum", piece_events["accum"])
        y[lo_n:hi_n, lo_o:hi_o] = part.transpose(0, 1).reshape(
            hi_n - lo_n, hi_o - lo_o, *out[1:], cout)
    return y.movedim(-1, 1)


def _tensor_scale(recipe: Recipe, xp: Tensor) -> float | None:
    """NVFP4's per-tensor scale taken on the (padded) activation tensor, else None."""
    if recipe.scaling != "block" or recipe.inputs is None or get_block_format(recipe.inputs).is_mx:
        return None
    return nvfp4_tensor_scale(xp.detach().reshape(1, -1).float())


def quantize_weights(recipe: Recipe, wd: Tensor, groups: int, events: dict | None) -> Tensor:
    """The right operand ``[groups, K, C_out/groups]`` rounded to the recipe's weight format,
    scaled along K."""
    wm = weight_matrix(wd, groups)
    q, limit = quantize_operand(wm, recipe.weight_format, recipe, axis=-2)
    if events is not None:
        events["b"] = operand_events(wm, q, limit)
    return unflush(wm, q, recipe)


def _pieces(n: int, rows: int, step: int) -> list[tuple[int, int, int, int]]:
    """``(n_lo, n_hi, row_lo, row_hi)`` covering ``n`` images of ``rows`` first output rows,
    at most ``step`` (image, row) pairs each."""
    if step >= rows:
        k = step // rows
        return [(lo, min(n, lo + k), 0, rows) for lo in range(0, n, k)]
    return [(i, i + 1, lo, min(rows, lo + step)) for i in range(n) for lo in range(0, rows, step)]


def _add(events: dict, role: str, ev: dict[str, Any]) -> None:
    """Sum one piece's counts into ``events[role]`` (largest partial sum: the max)."""
    have = events.get(role)
    if have is None:
        events[role] = dict(ev)
        return
    for k, v in ev.items():
        have[k] = max(have[k], v) if k == "max_partial" else have[k] + v
