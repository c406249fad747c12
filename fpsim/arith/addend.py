"""The addend C of D = A·B + C: checked, rounded to the accumulator's format, broadcast."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..convert import quantize
from ..formats import Format
from ..inputs import check_input
from .operands import Operands, _operand, _to_torch


def addend(c: Any, ops: Operands, fmt: Format, use_torch: bool) -> Any:
    """``c`` as float64 (batch, M, N), rounded to ``fmt`` (nearest even) and broadcast to the
    product's shape (NumPy rules), in the operands' array library."""
    x, _ = _operand(check_input(c, "c"), "c")        # the input gate, as for a and b
    shape = tuple(x.shape)
    try:
        fits = np.broadcast_shapes(shape, ops.shape) == ops.shape
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"matmul: c has shape {shape}, which does not broadcast to the "
                         f"product's shape {ops.shape}; pass c shaped like the result")
    M, _, N = ops.mkn
    full = (math.prod(ops.batch), M, N)
    if use_torch:
        import torch

        t = quantize(_to_torch(x, ops.device).to(torch.float64), fmt)
        return t.expand(ops.shape).reshape(full)
    arr = quantize(np.asarray(x.cpu().numpy() if hasattr(x, "cpu") else x, np.float64), fmt)
    return np.broadcast_to(arr, ops.shape).reshape(full)
