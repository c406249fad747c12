"""The statistics of ``batch_norm``, ``instance_norm`` and ``group_norm`` under a recipe.

Each normalizes rows of its input: one row per channel over (batch, spatial) for batch norm,
per (sample, channel) over spatial for instance norm, per (sample, group) over
(channels of the group, spatial) for group norm.  A row's mean and sum of squared deviations
are the dot products of ``fpsim.emulation.sites.layernorm_stats`` (``x . 1`` and
``d . d``, ``d = x - mean``), so they are emulated exactly as LayerNorm's are; the
normalization and the affine parameters follow in the input's dtype.  Training-mode batch
norm (and instance norm with running statistics) also updates the running mean and the
unbiased running variance from those statistics, in place, as torch does.  A plain FP32/FP64
recipe computes torch's own op in FP64 and rounds once.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .recipe import Recipe
from .sites import NATIVE_ACCUMULATORS, _layernorm_parts

Stats = tuple[Tensor, Tensor, Tensor]   # centred quantized rows, row means, sums of squares


def row_stats(recipe: Recipe, rows: Tensor, events: dict | None = None) -> Stats:
    """``(d, mean, ssq)`` of each row of ``rows`` under ``recipe``."""
    return _layernorm_parts(recipe, rows, events)


def _shape_params(t: Tensor | None, dims: int) -> Tensor | None:
    """A per-channel vector shaped to broadcast over ``[N, C, *spatial]``."""
    return None if t is None else t.reshape(-1, *[1] * (dims - 2))


def _affine(y: Tensor, weight: Tensor | None, bias: Tensor | None) -> Tensor:
    y = y if weight is None else y * _shape_params(weight, y.dim())
    return y if bias is None else y + _shape_params(bias, y.dim())


def _update(running: Tensor | None, value: Tensor, momentum: float) -> None:
    if running is not None:
        running.mul_(1 - momentum).add_(value.to(running.dtype), alpha=momentum)


def batch_norm(recipe: Recipe, x: Tensor, running_mean: Tensor | None,
               running_var: Tensor | None, weight: Tensor | None, bias: Tensor | None,
               momentum: float, eps: float, events: dict | None = None) -> Tensor:
    """Training-mode ``F.batch_norm`` (statistics of the batch) under ``recipe``."""
    if recipe.plain:
        return _plain(recipe, x, (running_mean, running_var), lambda xd, rm, rv: F.batch_norm(
            xd, rm, rv, _d(weight), _d(bias), True, momentum, eps))
    rows = x.movedim(1, -1).reshape(-1, x.shape[1]).t()
    d, mean, ssq = row_stats(recipe, rows, events)
    m = rows.shape[-1]
    _update(running_mean, mean, momentum)
    _update(running_var, ssq / max(m - 1, 1), momentum)
    y = (d * torch.rsqrt(ssq[:, None] / m + eps)).t().reshape(x.movedim(1, -1).shape)
    return _affine(y.movedim(-1, 1), weight, bias)


def group_norm(recipe: Recipe, x: Tensor, groups: int, weight: Tensor | None,
               bias: Tensor | None, eps: float, events: dict | None = None) -> Tensor:
    """``F.group_norm`` under ``recipe`` (instance norm: one group per channel)."""
    if recipe.plain:
        return _plain(recipe, x, (), lambda xd: F.group_norm(xd, groups, _d(weight), _d(bias),
                                                             eps))
    rows = x.reshape(x.shape[0] * groups, -1)
    d, _, ssq = row_stats(recipe, rows, events)
    y = (d * torch.rsqrt(ssq[:, None] / rows.shape[-1] + eps)).reshape(x.shape)
    return _affine(y, weight, bias)


def instance_norm(recipe: Recipe, x: Tensor, running_mean: Tensor | None,
                  running_var: Tensor | None, weight: Tensor | None, bias: Tensor | None,
                  momentum: float, eps: float, events: dict | None = None) -> Tensor:
    """``F.instance_norm`` with statistics of the input (``use_input_stats``) under
    ``recipe``; running statistics, when given, updated with their mean over the batch."""
    n, c = x.shape[:2]
    if recipe.plain:
        return _plain(recipe, x, (running_mean, running_var), lambda xd, rm, rv: F.instance_norm(
            xd, rm, rv, _d(weight), _d(bias), True, momentum, eps))
    rows = x.reshape(n * c, -1)
    d, mean, ssq = row_stats(recipe, rows, events)
    m = rows.shape[-1]
    _update(running_mean, mean.reshape(n, c).mean(0), momentum)
    _update(running_var, (ssq / max(m - 1, 1)).reshape(n, c).mean(0), momentum)
    y = (d * torch.rsqrt(ssq[:, None] / m + eps)).reshape(x.shape)
    return _affine(y, weight, bias)


def _plain(recipe: Recipe, x: Tensor, running: tuple, op: Any) -> Tensor:
    """torch's own op on ``x`` and the running statistics in FP64 (copied back in place), the
    result rounded once to the recipe's accumulator."""
    copies = [None if t is None else t.double() for t in running]
    y = op(x.double(), *copies)
    for t, new in zip(running, copies):
        if t is not None:
            t.copy_(new)
    return y.to(NATIVE_ACCUMULATORS[recipe.accum]).to(x.dtype)


def _d(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.double()
