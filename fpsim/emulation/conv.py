"""A convolution computed under a recipe as the implicit GEMM that hardware runs.

Each output element of ``conv{1,2,3}d`` is one dot product over ``C_in / groups x kernel
volume`` (the reduction axis K, ordered (kernel offset, channel) with the channels fastest, as
an implicit GEMM over channels-last (NHWC) data runs it in cuDNN and CUTLASS): the
activation patches are the rows of a left operand ``[groups, N * L, K]`` (``L`` output
positions), the weights the columns of a right operand ``[groups, K, C_out / groups]``, and the
product is ``fpsim.emulation.sites.matmul``'s: operands rounded to the recipe's formats with
their scales along K (per channel: one scale per output channel for the weights and per patch
for the activations; MX blocks of 32 along K), summed in its accumulator and order, the bias
added, the result written in its output format.  Per-tensor activation scales are taken on
the activation tensor, and so is NVFP4's per-tensor scale (one for the whole patch matrix,
not one per piece).

Memory is bounded: the patches are built piece by piece (at most ``PIECE`` elements
each, views of the padded input until then), never as one whole im2col of a large activation;
each piece in one compiled gather where numba is there (``_gathered``), else by torch's
strided copies (``_rows``).

A transposed convolution is the direct convolution of the input spread out by the stride
(``stride - 1`` zeros between elements), padded by ``dilation * (kernel - 1) - padding``, with
the kernel flipped and its channel axes swapped: the same sums of products (the inserted zeros
add nothing).

An activation with one scale or none (per-tensor or unscaled formats) is quantized once,
before its patches are built (each patch reads the same rounded values); so is one in MX or
NVFP4 blocks whose size divides ``C_in/groups`` (every block of a patch row is then one block
of one input pixel's channels, or of the padding's zeros: quantized along the channels once,
the same values; other channel counts are quantized patch row by patch row).  Under host FP32 sums
(``native_sums="host"``) such a convolution is then torch's own on the quantized operands: the
host's sums in its own order, as a linear site's host GEMM.

When a gradient is wanted, ``trainable`` adds the backward GEMMs: the input gradient as
the transposed convolution's implicit GEMM, the weight gradient over the whole patch matrix.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import convert, parallel
from ..blockrules import nvfp4_tensor_scale
from ..mx import get_block_format
from .backward import axis_free, training_casts
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
    """``[C_out, C_in/groups, *kernel]`` as the right operand ``[groups, K, C_out/groups]``,
    K ordered (kernel offset, channel), channels fastest."""
    return w.movedim(1, -1).reshape(groups, w.shape[0] // groups, -1).transpose(1, 2)


def weight_of(m: Tensor, shape: Sequence[int]) -> Tensor:
    """The weight ``shape`` ``[C_out, C_in/groups, *kernel]`` of a right operand ``m``
    (``weight_matrix`` undone)."""
    return m.transpose(1, 2).reshape(shape[0], *shape[2:], shape[1]).movedim(-1, 1)


def im2col(xp: Tensor, kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int],
           groups: int) -> Tensor:
    """The whole left operand ``[groups, N * L, K]`` of a padded input (a weight gradient's,
    and tests'; ``conv`` builds it piece by piece)."""
    v = patches(xp, kernel, stride, dilation)
    out = list(v.shape[2:2 + len(kernel)])
    rows = _gathered(xp, kernel, stride, dilation, groups, (0, xp.shape[0]), (0, out[0]), out)
    return _rows(v, groups) if rows is None else rows


def _rows(v: Tensor, groups: int) -> Tensor:
    """Patches ``[n, C, *out, *kernel]`` as ``[groups, n * L, K]``: one strided copy per kernel
    offset into a ``[n, *out, groups, kernel volume, C/groups]`` buffer (several times faster
    than one copy of the permuted six-dimensional view)."""
    d = (v.dim() - 2) // 2
    n, c = v.shape[:2]
    out, kernel = v.shape[2:2 + d], v.shape[2 + d:]
    dest = v.new_empty(n, *out, groups, math.prod(kernel), c // groups)
    for j, k in enumerate(itertools.product(*map(range, kernel))):
        dest[..., j, :] = v[(..., *k)].movedim(1, -1).reshape(n, *out, groups, c // groups)
    return dest.reshape(n * math.prod(out), groups, -1).transpose(0, 1)


def _gathered(xp: Tensor, kernel: Sequence[int], stride: Sequence[int],
              dilation: Sequence[int], groups: int, ns: tuple[int, int],
              first: tuple[int, int], out: Sequence[int]) -> Tensor | None:
    """``_rows`` of images ``ns`` and first output rows ``first`` of the padded input, as
    one compiled gather (``fpsim._cast_kernels.gather_rows``, over the cores), or None
    where it does not apply (no numba, not a contiguous CPU float32/float64 tensor)."""
    jit = convert.jit_kernels()
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
    off = grid([*(range(k) for k in kernel), range(cg)],
               [*(dl * s for dl, s in zip(dilation, sp)), sc])
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
    return _direct_conv(recipe, xp, wd, bias, stride, dilation, groups, events, qw)[0]


def _direct_conv(recipe: Recipe, xp: Tensor, wd: Tensor, bias: Tensor | None,
                 stride: Sequence[int], dilation: Sequence[int], groups: int,
                 events: dict | None,
                 qw: Tensor | None = None) -> tuple[Tensor, Tensor | None, Tensor]:
    """The direct convolution of padded ``xp`` by ``wd`` under ``recipe``, the activation as
    quantized whole (None where it is quantized patch by patch) and the weight matrix as
    quantized."""
    kernel = wd.shape[2:]
    count = events is not None
    if qw is None:
        qw = quantize_weights(recipe, wd, groups, events)
    elif count:
        events["b"] = {"elements": wd.numel(), "overflow": 0, "saturated": 0, "flushed": 0}
    quant = None
    # one scale (or none) for the whole activation, or blocks within each pixel's channels:
    # quantized once, before the patches
    if recipe.inputs is None or recipe.scaling in ("tensor", "none"):
        xq, limit = quantize_operand(xp, recipe.inputs, recipe, axis=-1)
        if count:
            events["a"] = operand_events(xp, xq, limit)
        xp = unflush(xp, xq, recipe.cast(recipe.inputs) or recipe)
    elif _channel_blocks(recipe, xp.shape[1] // groups):
        per_pixel = xp.reshape(xp.shape[0], groups, -1, *xp.shape[2:])
        xq, limit = quantize_operand(per_pixel, recipe.inputs, recipe, axis=2, with_limit=count)
        if count:
            events["a"] = operand_events(per_pixel, xq, limit)
        xp = unflush(per_pixel, xq, recipe).reshape(xp.shape)
    else:
        ts = _tensor_scale(recipe, xp)

        def quant(rows: Tensor) -> Tensor:
            q, limit = quantize_operand(rows, recipe.inputs, recipe, axis=-1,
                                        with_limit=count, tensor_scale=ts)
            if count:
                _add(events, "a", operand_events(rows, q, limit))
            return unflush(rows, q, recipe)
    if quant is None and recipe.native_sums == "host" and not recipe.emulated:
        # the host's FP32 sums in its own order, as a linear site's host GEMM: torch's convolution
        wq = weight_of(qw, wd.shape)
        d = len(kernel)
        y = torch.ops.aten.convolution(xp, wq, None, stride, [0] * d, dilation, False, [0] * d,
                                       groups)
    else:
        y = _implicit_gemm(recipe, xp, qw, kernel, stride, dilation, groups, quant, events)
    if bias is not None:
        y = y + bias.reshape(-1, *[1] * len(kernel))
    return round_output(y, recipe).contiguous(), (xp if quant is None else None), qw


def _implicit_gemm(acc: Recipe, xp: Tensor, qw: Tensor, kernel: Sequence[int],
                   stride: Sequence[int], dilation: Sequence[int], groups: int,
                   quant: Callable[[Tensor], Tensor] | None, events: dict | None,
                   piece: int | None = None) -> Tensor:
    """The direct convolution of padded ``xp`` by the quantized weight matrix ``qw`` as
    products of patch rows summed as ``acc`` says, piece by piece (at most ``piece``, by
    default ``PIECE``, patch elements; each quantized by ``quant`` unless None);
    ``[N, C_out, *out]``, no bias."""
    v = patches(xp, kernel, stride, dilation)
    n, out = v.shape[0], list(v.shape[2:2 + len(kernel)])
    cout = qw.shape[0] * qw.shape[2]
    per_unit = math.prod(out[1:]) * xp.shape[1] * math.prod(kernel)   # one n, one first out row
    step = max(1, (PIECE if piece is None else piece) // max(1, per_unit))
    y = xp.new_empty(n, *out, cout)
    for lo_n, hi_n, lo_o, hi_o in _pieces(n, out[0], step):
        rows = _gathered(xp, kernel, stride, dilation, groups, (lo_n, hi_n), (lo_o, hi_o), out)
        if rows is None:
            rows = _rows(v[lo_n:hi_n, :, lo_o:hi_o], groups)
        if quant is not None:
            rows = quant(rows)
        piece_events: dict | None = {} if events is not None else None
        part = _product(acc, rows, qw, None, piece_events)
        if piece_events and "accum" in piece_events:
            _add(events, "accum", piece_events["accum"])
        y[lo_n:hi_n, lo_o:hi_o] = part.transpose(0, 1).reshape(
            hi_n - lo_n, hi_o - lo_o, *out[1:], cout)
    return y.movedim(-1, 1)


def _channel_blocks(recipe: Recipe, cin_g: int) -> bool:
    """Whether the activation's scale blocks (MX, NVFP4) fall within each pixel's channels:
    K runs channels fastest, so when the block size divides ``C_in/groups`` every block of a
    patch row is one block of one input pixel's channels (or of the zero padding), and the
    input quantized along its channels once gives every patch's values."""
    return (recipe.scaling == "block" and recipe.inputs is not None
            and cin_g % get_block_format(recipe.inputs).block_size == 0)


def _tensor_scale(recipe: Recipe, xp: Tensor) -> float | None:
    """NVFP4's per-tensor scale taken on the (padded) activation tensor, else None."""
    if recipe.scaling != "block" or recipe.inputs is None or get_block_format(recipe.inputs).is_mx:
        return None
    return nvfp4_tensor_scale(xp.detach().reshape(1, -1).float())


def quantize_weights(recipe: Recipe, wd: Tensor, groups: int, events: dict | None) -> Tensor:
    """The right operand ``[groups, K, C_out/groups]`` rounded to the recipe's weight format,
    scaled along K (every convolution's first step: it refuses training casts here)."""
    if training_casts(recipe):
        raise ValueError(f"recipe {recipe.name!r}: a convolution site takes formats (with the "
                         "recipe's scaling), not training casts (Cast: TE / torchao scalings, "
                         "2-D blocks, delays), which apply to linear and matmul sites; give "
                         "convolutions their own Rule(..., kind='conv')")
    wm = weight_matrix(wd, groups)
    q, limit = quantize_operand(wm, recipe.weight_format, recipe, axis=-2)
    if events is not None:
        events["b"] = operand_events(wm, q, limit)
    return unflush(wm, q, recipe.cast(recipe.weight_format, -2) or recipe)


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


# --------------------------------------------------------------------------------------------
# Training: the three GEMMs of a convolution
# --------------------------------------------------------------------------------------------
def trainable(site: Any, x: Tensor, w: Tensor, bias: Tensor | None, stride: Sequence[int],
              padding: Sequence[int], dilation: Sequence[int], transposed: bool,
              output_padding: Sequence[int], groups: int, events: dict | None) -> Tensor:
    """A convolution of ``fpsim.emulation.backward.Site`` ``site`` with its backward
    GEMMs emulated as the hardware runs them (a gradient is wanted):

    - forward: ``conv``;
    - input gradient: the transposed convolution of ``dy`` by the weight, an implicit GEMM
      reducing over ``C_out/groups x kernel volume``: ``dy`` cast by ``backward.grad``, the
      weight by ``backward.weights`` or else the forward's setting, along that reduction;
    - weight gradient: patch rows transposed times ``dy``, reducing over every image and
      output position (the whole patch matrix is built): patches cast by ``backward.inputs``
      or the forward's setting, ``dy`` by ``backward.grad``, both along that reduction (the
      Hadamard transform first when ``backward.hadamard`` is set);
    - the bias gradient: ``dy`` summed in FP64, rounded once.

    Padding, the stride spreading of a transposed convolution and the kernel flip are torch's
    own differentiable copies around the direct convolution (``direct``).
    """
    xp, wd, st = direct(x, w, stride, padding, dilation, transposed, output_padding, groups)
    return _ConvGemms.apply(xp, wd, bias, site, (tuple(st), tuple(dilation), groups), events)


class _ConvGemms(torch.autograd.Function):
    """The direct convolution's forward GEMM, with its two backward GEMMs as the gradient."""

    @staticmethod
    def forward(ctx: Any, xp: Tensor, wd: Tensor, bias: Tensor | None, site: Any,
                geometry: tuple, events: dict | None) -> Tensor:
        stride, dilation, groups = geometry
        y, xq, qw = _direct_conv(site.recipe, xp, wd, bias, stride, dilation, groups, events)
        ctx.site, ctx.geometry, ctx.xq, ctx.qw = site, geometry, xq, qw
        ctx.save_for_backward(xp, wd)
        return y

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple:
        xp, wd = ctx.saved_tensors
        site, (stride, dilation, groups) = ctx.site, ctx.geometry
        dy = dy.contiguous()
        dxp = dwd = dbias = None
        with torch._C.DisableTorchFunction(), torch.no_grad():
            qdy, sdy, dy_events = None, None, None
            if ctx.needs_input_grad[0]:
                dxp, qdy, sdy, dy_events = _dgrad(site, xp, wd, ctx.qw, dy, stride, dilation,
                                                  groups)
            if ctx.needs_input_grad[1]:
                dwd = _wgrad(site, xp, ctx.xq, wd, dy, stride, dilation, groups, qdy, sdy,
                             dy_events)
            if ctx.needs_input_grad[2]:
                dbias = dy.double().sum([0, *range(2, dy.dim())]).to(dy.dtype)
        return dxp, dwd, dbias, None, None, None


def _dgrad(site: Any, xp: Tensor, wd: Tensor, qwm: Tensor, dy: Tensor, stride: Sequence[int],
           dilation: Sequence[int],
           groups: int) -> tuple[Tensor, Tensor | None, Any, dict | None]:
    """The input gradient (see ``trainable``; ``qwm``: the forward's quantized weight
    matrix, reused where its cast does not depend on the axis), and ``dy`` as quantized whole
    for it (None where it is quantized patch by patch), its scale and events."""
    r, acc = site.recipe, site.accumulator()
    gspec, _, wspec = site.specs()
    d = len(wd.shape) - 2
    span = [dl * (k - 1) + 1 for dl, k in zip(dilation, wd.shape[2:])]
    extra = [n - ((o - 1) * s + sp) for n, o, s, sp in
             zip(xp.shape[2:], dy.shape[2:], stride, span)]    # rows the forward never read

    def spread(t: Tensor) -> Tensor:                     # dy as the transposed conv's input
        return direct(t, wd, stride, [0] * d, dilation, True, extra, groups)[0]

    wt = direct_weight(wd, True, groups)
    if site.backward_recipe.weights is None and axis_free(wspec, r):
        qwd = weight_of(qwm, wd.shape)                   # the forward's values, as hardware
        qw = weight_matrix(direct_weight(qwd, True, groups), groups)
    else:
        qw, _ = site.operand(weight_matrix(wt, groups), wspec, "w", -2, None, "b")
    ev = {} if site.capture else None
    if axis_free(gspec, r):                      # one scale or none: dy quantized once, reused
        qdy, sdy = site.operand(dy, gspec, "dy", -1, ev, "a")
        dxp = _implicit_gemm(acc, spread(qdy), qw, wd.shape[2:], [1] * d, dilation, groups,
                             None, ev)
    else:                                        # along each patch row: in one piece
        qdy = sdy = None
        dyp = spread(dy)

        def quant(rows: Tensor) -> Tensor:
            return site.operand(rows, gspec, "dy", -1, ev, "a")[0]
        dxp = _implicit_gemm(acc, dyp, qw, wd.shape[2:], [1] * d, dilation, groups, quant, ev,
                             piece=dyp.numel() * math.prod(wd.shape[2:]))
    dy_events = None if ev is None else ev.get("a")
    if ev is not None:
        site.record("dgrad", dy, ev, dxp, lambda: torch.ops.aten.convolution(
            spread(dy).double(), wt.double(), None, [1] * d, [0] * d, dilation, False, [0] * d,
            groups))
    return dxp, qdy, sdy, dy_events


def _wgrad(site: Any, xp: Tensor, xq: Tensor | None, wd: Tensor, dy: Tensor,
           stride: Sequence[int], dilation: Sequence[int], groups: int, qdy: Tensor | None,
           sdy: Any, dy_events: dict | None) -> Tensor:
    """The weight gradient (see ``trainable``): ``Site.wgrad`` on the whole patch
    matrix ``[groups, M, K]`` and ``dy`` as ``[groups, M, C_out/groups]``."""
    kernel = wd.shape[2:]

    def rows_of(t: Tensor) -> Tensor:
        return im2col(t, kernel, stride, dilation, groups)

    def per_group(t: Tensor) -> Tensor:                  # [N, C_out, *out] -> [g, M, C_out/g]
        return t.movedim(1, -1).reshape(-1, groups, t.shape[1] // groups).transpose(0, 1)

    saved = {"qa": None if xq is None else rows_of(xq), "sa": None}
    dm = site.wgrad(rows_of(xp), weight_matrix(wd, groups), per_group(dy), saved,
                    None if qdy is None else per_group(qdy), sdy, dy_events)
    return weight_of(dm, wd.shape)
