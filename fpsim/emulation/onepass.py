"""Operand quantization in compiled passes over a CPU tensor, where numba is there.

``fpsim.emulation.sites.quantize_operand`` copies an operand to float64, reduces it,
divides, encodes, decodes, multiplies and casts back: several passes and full-size temporaries
per call, most of an activation's cost under an operand-only recipe.  Here the same operations
run in the same order, so give the same bits (tests compare every code class), in fewer passes:

* ``tensor_scaled`` (per-tensor scaling): torch's ``aminmax`` for the scale, then one
  kernel (``fpsim._cast_kernels.scaled_table_quantize``) that divides, rounds with
  ``fpsim.convert``'s own lookup table, decodes and multiplies each element;
* ``mx_values`` (MX and NVFP4 blocks along the last axis, float32): one kernel for each
  block's amax, the scale rules' own code on the per-block arrays, one kernel that scales,
  rounds, decodes and multiplies back (``fpsim._cast_kernels.block_scaled_quantize``);
* ``block_values``: ``fpsim.mx.dequantize`` of blocks along the last axis in one pass
  (``fpsim._cast_kernels.block_dequantize``), for the codes ``capture=True`` needs.

Each returns None, and the caller takes the general path, wherever it does not apply (listed
in its docstring): no numba, another device or dtype, stochastic rounding, integer formats,
empty operands, NaN or inf in a per-tensor operand (its NaN scale), tensors that need
gradients, formats without a lookup table.
"""
from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .. import convert, parallel
from ..backend import ops_for
from ..blockrules import (element_values, get_block_format, nvfp4_block_scales,
                          nvfp4_tensor_scale_of, scale_rule, scale_values, shared_exponents)
from ..formats import Format
from ..rounding import STOCHASTIC
from ..scaling import amax_scale

_DTYPES = (torch.float32, torch.float64)


@functools.lru_cache(maxsize=32)
def _table(f: Format, rounding: str, wide: bool = True) -> tuple[Any, np.ndarray, Any, Any,
                                                                np.ndarray] | None:
    """(kernels, code table, shift, mask, decode table) of ``encode(x, f, rounding,
    saturate=True)``'s table plan for float64 ``x`` (``wide``) or float32 ``x``; None without
    numba or when that plan is not a lookup table."""
    jit = convert.jit_kernels()
    if jit is None:
        return None
    plan = convert.numpy_plan(f, rounding, True, True, "code", wide)
    index = getattr(plan, "index", None)
    if index is None:
        return None
    table, shift, below = index
    utype = np.uint64 if wide else np.uint32
    return jit, table, utype(shift), utype(below), convert.decode_table(f)


def tensor_scaled(x: Tensor, f: Format, rounding: str, axis: int, scale_dtype: str = "fp32"
                  ) -> tuple[Tensor, float] | None:
    """``x`` quantized to ``f`` with one amax scale (``fpsim.scaled_quantize``'s rules,
    saturating; ``scale_dtype`` its) and the scale, as ``quantize_operand`` computes them, or
    None where the compiled pass does not apply (see the module doc).  ``axis`` (the reduction
    axis) only sets the result's strides, as the general path's."""
    if (x.device.type != "cpu" or x.dtype not in _DTYPES or f.is_int or rounding in STOCHASTIC
            or x.numel() == 0 or (x.requires_grad and torch.is_grad_enabled())):
        return None
    plan = _table(f, rounding)
    if plan is None:
        return None
    lo, hi = torch.aminmax(x)
    span = max(-float(lo), float(hi))
    if not math.isfinite(span):                   # NaN or inf: a NaN scale, the general path
        return None
    scale = 1.0 if span == 0 else float(amax_scale(np.array([[span]]), f.max, scale_dtype,
                                                    0)[0, 0])
    jit, table, shift, below, values = plan
    moved = x.detach().movedim(axis, -1).contiguous()
    out = torch.empty(moved.shape, dtype=x.dtype)
    src, dst = moved.numpy().reshape(-1), out.numpy().reshape(-1)
    parallel.run(lambda a, b: jit.scaled_table_quantize(src[a:b], scale, table, shift, below,
                                                        values, dst[a:b]), src.size)
    return out.movedim(-1, axis), scale


def block_values(arr: Any, dtype: torch.dtype) -> Tensor | None:
    """``arr.dequantize(dtype)`` (``arr``: a ``fpsim.mx.BlockArray`` of CPU tensors) in one
    compiled pass, or None where it does not apply (see the module doc)."""
    codes, lay = arr.codes, arr.layout
    jit = convert.jit_kernels()
    if (jit is None or not isinstance(codes, Tensor) or codes.device.type != "cpu"
            or dtype not in _DTYPES or lay.axis != codes.dim() - 1 or codes.numel() == 0):
        return None
    wide = dtype == torch.float64
    table = element_values(arr.fmt, wide)
    scales = arr.scales.reshape(-1, arr.scales.shape[-1])
    factor = scale_values(ops_for(scales), scales, arr.fmt, arr.tensor_scale, wide)
    src = codes.reshape(-1, codes.shape[-1]).contiguous().numpy()
    fac = factor.contiguous().numpy()
    out = torch.empty(codes.shape, dtype=dtype)
    dst = out.numpy().reshape(src.shape)
    parallel.run(lambda a, b: jit.block_dequantize(src[a:b], table, fac[a:b], lay.block_size,
                                                   dst[a:b]),
                 src.shape[0], max(1, parallel.GRAIN // max(1, src.shape[1])))
    return out


def mx_values(x: Tensor, fmt: Any, scale_rounding: str | None,
              rounding: str, tensor_scale: float | None = None) -> Tensor | None:
    """``mx.quantize(x, fmt, axis=-1, scale_rounding=..., rounding=..., tensor_scale=...)``
    dequantized to float32 (MX or NVFP4) in two compiled passes: each block's amax, then each
    element scaled, rounded, decoded and multiplied back, with the scale rules' own code between
    them (``fpsim.blockrules.shared_exponents``, ``fpsim.blockrules.nvfp4_block_scales``);
    or None where it does not apply: float64 or non-CPU ``x``, integer elements, directed
    roundings (which keep underflows), stochastic rounding, empty ``x``, no numba."""
    spec = get_block_format(fmt)
    mode = scale_rule(spec, scale_rounding)
    if (x.device.type != "cpu" or x.dtype != torch.float32 or spec.elem.is_int
            or spec.elem_exp or rounding not in ("rne", "rna", "rtz")
            or x.numel() == 0 or x.dim() == 0 or (x.requires_grad and torch.is_grad_enabled())):
        return None
    plan = _table(spec.elem, rounding, False)
    if plan is None:
        return None
    jit, table, shift, below, _ = plan
    src = x.detach().reshape(-1, x.shape[-1]).contiguous().numpy()
    nb = -(-x.shape[-1] // spec.block_size)
    amax_bits = np.empty((src.shape[0], nb), np.int32)
    jobs = functools.partial(parallel.run, n=src.shape[0],
                             grain=max(1, parallel.GRAIN // src.shape[1]))
    jobs(lambda a, b: jit.block_amax_bits(src[a:b], spec.block_size, amax_bits[a:b]))
    ops, ts = ops_for(amax_bits), None
    if spec.is_mx:
        amax = amax_bits.view(np.float32).astype(np.float64)
        s, nan = shared_exponents(ops, amax, spec, mode)
        factor = ((1023 - s) << 52).view(np.float64).astype(np.float32)     # 2^-s, exact
        codes = np.where(nan, 255, s + 127).astype(np.uint8)
    else:
        ts = (nvfp4_tensor_scale_of(amax_bits.reshape(-1)) if tensor_scale is None
              else tensor_scale)
        codes, factor, nan = nvfp4_block_scales(amax_bits.reshape(-1), spec, ts)
        codes, factor, nan = (a.reshape(amax_bits.shape) for a in (codes, factor, nan))
    scale = scale_values(ops, codes, spec, ts, False)
    values = element_values(spec, False)
    out = torch.empty(x.shape, dtype=torch.float32)
    dst = out.numpy().reshape(src.shape)
    jobs(lambda a, b: jit.block_scaled_quantize(src[a:b], spec.block_size, factor[a:b],
                                                not spec.is_mx, nan[a:b], scale[a:b], table,
                                                shift, below, values, dst[a:b]))
    return out
