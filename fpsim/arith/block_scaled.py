"""MX and NVFP4 operands of the block-scaled tensor-core instructions (Blackwell ``mxf8f6f4``,
``mxf4nvf4``): the values the unit multiplies and the exponents it aligns them by.

The unit applies the block scales inside the fused dot-add (MMA-Sim's ``nv_fused_dot_add`` with
scales, ``nv_fused_dot_add_with_block_scale``):

* ``mxf8f6f4``: a product's exponent is the sum of its elements' exponents (clamped at the
  element format's least normal exponent, -126 for zeros) and of both scales' exponents;
* ``mxf4nvf4``: products are summed exactly in runs of 16; a run's exponent is the sum of its
  two scales' exponents alone (a UE4M3 scale's exponent clamped at -6, a zero scale's -126).

Both come out as a per-element exponent array beside the exactly scaled values, so the
tensor-core step needs nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backend import is_torch
from ..convert import decode
from ..mx import MXArray
from ..rounding import F64
from .lanes import Lanes
from .tc_models import TensorCoreModel
from .tensor_core import exponents


@dataclass
class Scaled:
    """Both operands as float64 values (elements times scales, exact) and exponents."""

    a: Any
    b: Any
    ea: Any
    eb: Any


def split(a: Any, b: Any, model: TensorCoreModel | None) -> Scaled | None:
    """None unless an operand is an ``fpsim.MXArray``; then both must be, blocked along
    K, for a block-scaled preset."""
    mx = isinstance(a, MXArray), isinstance(b, MXArray)
    scaled = model is not None and model.scaled is not None
    if not any(mx) and not scaled:
        return None
    if not scaled:
        raise ValueError("MXArray operands need order='tensor_core' with a block-scaled preset "
                         "(e.g. tensor_core='blackwell_mxf4nvf4'), or dequantize them first")
    if not all(mx):
        raise ValueError(f"tensor_core={model.name!r} applies block scales: pass both operands "
                         "as MXArrays (fpsim.mx.quantize, a with axis=-1, b with axis=-2)")
    (va, ea), (vb, eb) = (_operand(x, w, k, model) for x, w, k in
                          ((a, "a", len(a.shape) - 1), (b, "b", max(len(b.shape) - 2, 0))))
    return Scaled(va, vb, ea, eb)


def _operand(x: MXArray, which: str, k_axis: int, model: TensorCoreModel) -> tuple[Any, Any]:
    if x.axis != k_axis:
        raise ValueError(f"matmul: MXArray {which} is blocked along axis {x.axis}; the "
                         f"instructions take blocks along K (axis {k_axis} of {which}): "
                         f"quantize it with axis={k_axis - len(x.shape)}")
    if x.tensor_scale not in (None, 1.0):
        raise ValueError(f"matmul: MXArray {which} has tensor_scale {x.tensor_scale}, which "
                         "the instruction does not apply: quantize with tensor_scale=1.0, or "
                         "multiply the result by both tensor scales yourself")
    codes = x.codes.cpu().numpy() if is_torch(x.codes) else np.asarray(x.codes)
    scales = x.scales.cpu().numpy() if is_torch(x.scales) else np.asarray(x.scales)
    elems = decode(codes.astype(np.uint32), x.fmt.elem) * 2.0**x.fmt.elem_exp
    scale = decode(scales.astype(np.uint32), x.fmt.scale)
    if not x.fmt.is_mx:
        scale = np.abs(scale)                             # UE4M3: the sign bit is ignored
    scale = np.repeat(scale, x.block_size, axis=k_axis)
    scale = np.take(scale, np.arange(x.shape[k_axis]), axis=k_axis)
    lanes = Lanes(F64)
    es = exponents(lanes, scale, x.fmt.scale.emin).astype(np.float64)
    if model.scaled == "runs":
        return elems * scale, es
    return elems * scale, exponents(lanes, elems, x.fmt.elem.emin) + es
