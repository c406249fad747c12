"""Explain a block: the shared scale's bits and each element's bits and value, together.

A block format stores one scale code per block (E8M0 for MX, E4M3 for NVFP4, which also has a
float32 tensor scale) and one small code per element; a value is element x scale (x tensor
scale).  :func:`explain_block` quantizes the values as :func:`fpsim.mx.quantize` does (one row,
zero-padded to whole blocks) and describes each block's scale code and each element's code with
:func:`fpsim.explain.explain_code`, so the bits shown are the ones ``mx.quantize`` stores.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from .backend import is_torch
from .blockrules import BlockFormat, get_block_format
from .explain import Explanation, _show, explain_code
from .inputs import check_input


@dataclass(frozen=True)
class BlockElement:
    """One element of a block: its input, its element code's explanation, its value."""

    x: float
    element: Explanation     # the code in the element format (MXINT8: before its 2^-6)
    value: float             # element x scale (x tensor scale): what the block stands for
    error: float             # value - x, exact then rounded to float64 (nan where undefined)


@dataclass(frozen=True)
class BlockExplanation:
    """The blocks of some values in a block format; ``str()`` draws them, one line each."""

    fmt: BlockFormat
    scales: tuple[Explanation, ...]            # one per block
    elements: tuple[tuple[BlockElement, ...], ...]   # per block, the given values only
    padding: int                               # zero elements added to fill the last block
    block_size: int
    tensor_scale: float | None = None          # NVFP4's float32 scale of the whole tensor

    def lines(self, color: bool = False) -> list[str]:
        """The picture, line by line (``color``: ANSI-coloured bit fields)."""
        f = self.fmt
        ts = self.tensor_scale
        head = (f"{f.name}: {f.elem.name} elements, {f.scale.name} scale per {self.block_size}; "
                f"value = element x scale{'' if ts is None else ' x tensor scale'}")
        if self.padding:
            head += f" (last block padded with {self.padding} zero{'s' * (self.padding > 1)})"
        out = [head]
        if ts is not None:
            out.append(f"  tensor scale (float32)  {_show(ts)}")
        xw = max((len(_show(e.x)) for b in self.elements for e in b), default=1)
        for i, (scale, elems) in enumerate(zip(self.scales, self.elements)):
            label = f"block {i}" if len(self.scales) > 1 else "block"
            out.append(f"  {label} scale  {scale.layout(color)}  = {_show(scale.value)}")
            bw = max(len(e.element.layout()) for e in elems)
            for e in elems:
                pad = " " * (bw - len(e.element.layout()))
                err = "" if e.error != e.error else \
                    ("  (exact)" if e.error == 0 else f"  (error {e.error:+.3g})")
                out.append(f"    {_show(e.x):>{xw}}  {e.element.layout(color)}{pad}  "
                           f"= {_show(_element_value(f, e.element))} x {_show(scale.value)}"
                           f"{'' if ts is None else ' x ' + _show(ts)} = {_show(e.value)}{err}")
        return out

    def render(self, color: bool = False) -> str:
        return "\n".join(self.lines(color))

    def __str__(self) -> str:
        return self.render()


def _element_value(fmt: BlockFormat, e: Explanation) -> float:
    """The element code's value in the block's units (MXINT8: k x 2^-6)."""
    return e.value * 2.0**fmt.elem_exp


def explain_block(x: Any, fmt: str | BlockFormat, **options: Any) -> BlockExplanation:
    """Quantize the values ``x`` (a number or a 1-D sequence) to the block format ``fmt`` as
    one row, blocks of ``fmt.block_size`` in order, and describe the scale and element bits.

    ``options`` go to :func:`fpsim.mx.quantize` (``rounding``, ``scale_rounding``,
    ``block_size``, ``tensor_scale``).

    >>> print(explain_block([1.0, 0.3, -2.0, 5.0], "mxfp4"))   # doctest: +NORMALIZE_WHITESPACE
    mxfp4: fp4_e2m1 elements, e8m0 scale per 32; value = element x scale (last block padded with 28 zeros)
      block scale  01111111  = 1
          1  0 | 01 | 0  = 1 x 1 = 1  (exact)
        0.3  0 | 00 | 1  = 0.5 x 1 = 0.5  (error +0.2)
         -2  1 | 10 | 0  = -2 x 1 = -2  (exact)
          5  0 | 11 | 0  = 4 x 1 = 4  (error -1)
    """
    from . import mx

    spec = get_block_format(fmt)
    v = check_input(x)
    v = v.detach().cpu().double().numpy() if is_torch(v) else np.asarray(v, dtype=np.float64)
    if v.ndim > 1:
        raise ValueError(f"explain shows one row of blocks; x has shape {v.shape}: pass a 1-D "
                         "slice, e.g. x[0]")
    v = v.reshape(-1)
    if not v.size:
        raise ValueError("explain needs at least one value")
    q = mx.quantize(v, spec, **options)
    values = np.asarray(q.dequantize(np.float64), dtype=np.float64)
    size = q.block_size
    scales = tuple(explain_code(int(c), spec.scale) for c in np.asarray(q.scales).reshape(-1))
    elements = tuple(
        tuple(_element(float(v[i]), int(q.codes[i]), float(values[i]), spec)
              for i in range(b * size, min((b + 1) * size, v.size)))
        for b in range(len(scales)))
    return BlockExplanation(spec, scales, elements, -v.size % size, size, q.tensor_scale)


def _element(x: float, code: int, value: float, spec: BlockFormat) -> BlockElement:
    if all(np.isfinite((x, value))):
        error = float(Fraction(value) - Fraction(x))
    else:
        error = float("nan") if value != x else 0.0
    return BlockElement(x, explain_code(code, spec.elem), value, error)
