"""Views of an array as fixed-size blocks along one axis, and back.

Block formats (MX, NVFP4, per-block scaling) share one layout: move ``axis`` to the end, pad it
with zeros to a multiple of the block size, and read the result in C order as rows of
``block_size`` elements.  Per-block quantities (scales) then form a vector with one entry per row,
which :func:`rows_to_scales` turns into an array shaped like the input with ``axis`` holding the
block count.  Works on NumPy arrays and torch tensors alike.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any

import numpy as np

from .backend import is_torch, ops_for


@dataclass(frozen=True)
class Layout:
    """How an array of ``shape`` splits into blocks of ``block_size`` along ``axis``."""

    shape: tuple[int, ...]
    axis: int           # non-negative
    block_size: int

    @property
    def length(self) -> int:
        """Elements along the blocked axis."""
        return self.shape[self.axis]

    @property
    def nblocks(self) -> int:
        """Blocks per row along the axis (the last one padded with zeros)."""
        return -(-self.length // self.block_size)

    @property
    def outer(self) -> tuple[int, ...]:
        """The shape without the blocked axis (in order)."""
        return self.shape[:self.axis] + self.shape[self.axis + 1:]

    @property
    def rows(self) -> int:
        """Total number of blocks."""
        return math.prod(self.outer) * self.nblocks

    @property
    def padded(self) -> int:
        """Elements along the axis after padding."""
        return self.nblocks * self.block_size

    @property
    def scale_shape(self) -> tuple[int, ...]:
        """Shape of per-block values: the input's, with ``axis`` holding the block count."""
        return self.shape[:self.axis] + (self.nblocks,) + self.shape[self.axis + 1:]


def layout(shape: tuple[int, ...], axis: int, block_size: int, pad: bool) -> Layout:
    """Validate ``axis``/``block_size`` for ``shape`` and describe the block layout."""
    try:
        shape = tuple(operator.index(s) for s in shape)
    except TypeError:
        raise TypeError(f"shape {shape!r}: pass a tuple of integers") from None
    if not shape:
        raise ValueError("block formats need an array with at least one dimension, got a scalar")
    if min(shape) < 0:
        raise ValueError(f"shape {shape}: sizes are non-negative")
    try:
        if isinstance(axis, (bool, np.bool_)):
            raise TypeError
        axis = operator.index(axis)
    except TypeError:
        raise TypeError(f"axis must be an integer, not {type(axis).__name__}") from None
    if not -len(shape) <= axis < len(shape):
        raise ValueError(f"axis {axis} is out of range for an array of {len(shape)} dimension(s)")
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) \
            or block_size < 1:
        raise ValueError(f"block_size={block_size!r}: pass a positive integer (MX uses 32, "
                         "NVFP4 16)")
    lay = Layout(shape, axis % len(shape), int(block_size))
    if not pad and lay.length % lay.block_size:
        raise ValueError(f"axis {axis} has length {lay.length}, not a multiple of block_size "
                         f"{block_size}: pass pad=True to pad the last block with zeros (stripped "
                         "again on dequantize), or choose a block size that divides it")
    return lay


def to_rows(x: Any, lay: Layout) -> Any:
    """``x`` (of ``lay.shape``) as a contiguous 2-D array of blocks, zero-padded."""
    if is_torch(x):
        moved = x.movedim(lay.axis, -1)
        if lay.padded != lay.length:
            full = moved.new_zeros(moved.shape[:-1] + (lay.padded,))
            full[..., :lay.length] = moved
            moved = full
        return moved.contiguous().reshape(lay.rows, lay.block_size)
    moved = np.moveaxis(x, lay.axis, -1)
    if lay.padded != lay.length:
        full = np.zeros(moved.shape[:-1] + (lay.padded,), dtype=x.dtype)
        full[..., :lay.length] = moved
        moved = full
    return np.ascontiguousarray(moved).reshape(lay.rows, lay.block_size)


def from_rows(rows: Any, lay: Layout) -> Any:
    """Inverse of :func:`to_rows`: strip the padding and move the axis back (contiguous)."""
    moved = rows.reshape(lay.outer + (lay.padded,))[..., :lay.length]
    return ops_for(rows).moveaxis(moved, -1, lay.axis)


def rows_to_scales(vec: Any, lay: Layout) -> Any:
    """One value per block (row order) as an array of ``lay.scale_shape``."""
    moved = vec.reshape(lay.outer + (lay.nblocks,))
    return ops_for(vec).moveaxis(moved, -1, lay.axis)


def scales_to_rows(scales: Any, lay: Layout) -> Any:
    """Inverse of :func:`rows_to_scales`: a 1-D vector in row (C, axis-last) order."""
    if tuple(scales.shape) != lay.scale_shape:
        raise ValueError(f"scales of shape {tuple(scales.shape)} do not match {lay.scale_shape} "
                         f"(shape {lay.shape}, blocks of {lay.block_size} along axis {lay.axis})")
    return ops_for(scales).moveaxis(scales, lay.axis, -1).reshape(-1)
