"""Emulated outputs without a backward pass: norm statistics, aten-level products.

Product sites and convolutions seen at the Python level have emulated gradient GEMMs
(``fpsim.emulation.backward``, ``fpsim.emulation.conv.trainable``).  Any other emulated
result that autograd would track is returned through ``NoBackward``, whose backward raises
a clear error (which site, what to do) instead of differentiating torch's own op on operands
the recipe never used, or failing on the emulation's in-place arithmetic.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

MESSAGE = ("fpsim.emulate: backward() reached {site!r}, where an op without an emulated "
           "backward pass ran: a norm statistic, or a product or convolution torch decomposed "
           "before fpsim saw it (tensordot, multi_dot, nn.MultiheadAttention, aten.convolution "
           "called directly; F.linear, F.conv*, matmul and attention have one). Leave those to "
           "torch in training (Rule(None, kind='norm'), Rule(None, kind='matmul')), or run the "
           "forward pass under torch.no_grad()")


def wants_grad(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors among ``args`` and ``kwargs`` that autograd tracks (none outside grad mode)."""
    if not torch.is_grad_enabled():
        return []
    leaves, _ = tree_flatten((args, kwargs))
    return [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]


class NoBackward(torch.autograd.Function):
    """Identity forward (a copy of ``y``); backward raises ``MESSAGE`` for ``site``."""

    @staticmethod
    def forward(ctx: Any, site: str, y: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
        ctx.site = site
        return y.clone()

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        raise RuntimeError(MESSAGE.format(site=ctx.site))


def guard(out: Any, inputs: list[torch.Tensor], site: str) -> Any:
    """``out`` with each floating tensor in it made to raise on backward (see the module doc)."""
    def one(t: Any) -> Any:
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            return NoBackward.apply(site, t.detach(), *inputs)
        return t
    return tree_map(one, out)
