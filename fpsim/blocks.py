"""Views of an array as fixed-size blocks along one axis, and back.

Block formats (MX, NVFP4, per-block scaling) share one layout: move ``axis`` to the end, pad it
with zeros to a multiple of the block size, and read the result in C order as rows of
``block_size`` elements.  Per-block quantities (scales) then form a vector with one entry per row,
which ``rows_to_scales`` turns into an array shaped like the input with ``axis`` holding the
block count.  Works on NumPy arrays and torch tensors alike.

Large arrays are handled in ``pieces``: runs of whole blocks that follow each other in row
order, read by ``gather`` (a contiguous, zero-padded copy of one piece, or a view when the
piece already is one) and written back by ``scatter`` into a preallocated output, so that
temporaries are the size of a piece, not of the array.
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
    def before(self) -> int:
        """Elements of the axes before the blocked axis (their product)."""
        return math.prod(self.shape[:self.axis])

    @property
    def after(self) -> int:
        """Elements of the axes after the blocked axis (their product)."""
        return math.prod(self.shape[self.axis + 1:])

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
    """Inverse of ``to_rows``: strip the padding and move the axis back (contiguous)."""
    moved = rows.reshape(lay.outer + (lay.padded,))[..., :lay.length]
    return ops_for(rows).moveaxis(moved, -1, lay.axis)


def rows_to_scales(vec: Any, lay: Layout) -> Any:
    """One value per block (row order) as an array of ``lay.scale_shape``."""
    moved = vec.reshape(lay.outer + (lay.nblocks,))
    return ops_for(vec).moveaxis(moved, -1, lay.axis)


def scales_to_rows(scales: Any, lay: Layout) -> Any:
    """Inverse of ``rows_to_scales``: a 1-D vector in row (C, axis-last) order."""
    check_scales(scales, lay)
    return ops_for(scales).moveaxis(scales, lay.axis, -1).reshape(-1)


def check_scales(scales: Any, lay: Layout) -> None:
    """Per-block values must have ``lay.scale_shape``."""
    if tuple(scales.shape) != lay.scale_shape:
        raise ValueError(f"scales of shape {tuple(scales.shape)} do not match {lay.scale_shape} "
                         f"(shape {lay.shape}, blocks of {lay.block_size} along axis {lay.axis})")


# --------------------------------------------------------------------------------------------
# Pieces
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Piece:
    """Whole blocks that follow each other in row order: outer indices ``a`` (over the axes
    before the blocked one, flattened) and ``b`` (the axes after it), blocks ``k`` along the
    axis; they are rows ``first .. first + rows`` of ``to_rows``."""

    a: slice
    k: slice
    b: slice
    first: int
    rows: int


def pieces(lay: Layout, size: int) -> list[Piece]:
    """Pieces of at most ``size`` elements (but at least one block) covering every block once,
    in row order; none for an empty array.

    A piece is a run of blocks of one row along the axis when such a row holds at least
    ``size`` elements, else whole rows for a range of ``b``, else for a range of ``a``."""
    per = max(1, size // lay.block_size)               # blocks per piece
    na, nb, nk = lay.before, lay.after, lay.nblocks
    if na * nb * nk == 0:
        return []
    if nk >= per:
        return [Piece(slice(a, a + 1), slice(k, min(nk, k + per)), slice(b, b + 1),
                      (a * nb + b) * nk + k, min(nk, k + per) - k)
                for a in range(na) for b in range(nb) for k in range(0, nk, per)]
    if nk * nb >= per:
        step = per // nk
        return [Piece(slice(a, a + 1), slice(0, nk), slice(b, min(nb, b + step)),
                      (a * nb + b) * nk, (min(nb, b + step) - b) * nk)
                for a in range(na) for b in range(0, nb, step)]
    step = per // (nk * nb)
    return [Piece(slice(a, min(na, a + step)), slice(0, nk), slice(0, nb), a * nb * nk,
                  (min(na, a + step) - a) * nb * nk) for a in range(0, na, step)]


def _span(lay: Layout, p: Piece, per_block: bool) -> tuple[slice, int]:
    """The piece's indices along the axis (elements, or blocks when ``per_block``) and its
    padded width there."""
    if per_block:
        return p.k, p.k.stop - p.k.start
    size = lay.block_size
    return (slice(p.k.start * size, min(lay.length, p.k.stop * size)),
            (p.k.stop - p.k.start) * size)


def grouped(a: Any, lay: Layout, per_block: bool = False) -> Any:
    """``a`` (of ``lay.shape``, or ``lay.scale_shape`` with ``per_block``) as a 3-D array (axes
    before, the blocked axis, axes after): a view of a contiguous ``a``, else one copy.  What
    ``gather`` reads and ``scatter`` writes."""
    return a.reshape(lay.before, lay.nblocks if per_block else lay.length, lay.after)


def gather(x3: Any, lay: Layout, p: Piece, per_block: bool = False) -> Any:
    """Rows ``p.first .. p.first + p.rows`` of ``to_rows`` of ``x`` (``x3`` is
    ``grouped`` ``x``): a contiguous ``(p.rows, block_size)`` array, zero-padded (a view
    when the piece is one already); with ``per_block``, the piece's per-block values as a 1-D
    vector."""
    span, width = _span(lay, p, per_block)
    part = x3[p.a, span, p.b]
    moved = part.movedim(1, 2) if is_torch(part) else part.transpose(0, 2, 1)
    if moved.shape[2] != width:
        full = moved.new_zeros(moved.shape[:2] + (width,)) if is_torch(moved) else \
            np.zeros(moved.shape[:2] + (width,), moved.dtype)
        full[..., :moved.shape[2]] = moved
        moved = full
    flat = moved.contiguous() if is_torch(moved) else np.ascontiguousarray(moved)
    return flat.reshape(-1) if per_block else flat.reshape(p.rows, lay.block_size)


def scatter(out3: Any, lay: Layout, p: Piece, rows: Any, per_block: bool = False) -> None:
    """Inverse of ``gather``: write the piece's ``rows`` (padding dropped) into ``out3``,
    the ``grouped`` view of the output."""
    span, width = _span(lay, p, per_block)
    part = out3[p.a, span, p.b]
    src = rows.reshape(part.shape[0], part.shape[2], width)[..., :part.shape[1]]
    part[...] = src.movedim(2, 1) if is_torch(src) else src.transpose(0, 2, 1)


def check_padding(rows: Any, lay: Layout, first: int = 0) -> None:
    """Refuse unpacked codes ``rows`` (blocks ``first ..`` in row order) whose padding is not
    zero, as ``fpsim.mx.BlockArray.pack`` writes it: such bytes were packed from another
    layout, and reading them as this one would silently drop or shift values."""
    tail = lay.length - (lay.nblocks - 1) * lay.block_size    # codes kept in a row's last block
    if tail == lay.block_size:
        return
    last = rows.reshape(-1, lay.block_size)[(lay.nblocks - 1 - first) % lay.nblocks::lay.nblocks]
    if bool((last[:, tail:] != 0).any()):
        raise ValueError(f"the padding of shape {lay.shape} (axis {lay.axis}, blocks of "
                         f"{lay.block_size}) holds non-zero codes: these bytes were packed "
                         "from another shape, axis or block size")
