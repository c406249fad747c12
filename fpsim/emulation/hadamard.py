"""The random Hadamard transform of NVFP4 training's weight-gradient GEMM (torch).

NVIDIA's NVFP4 recipe ("Pretraining Large Language Models with NVFP4", arXiv 2509.25149)
multiplies both operands of ``dW = x^T @ dy`` along their shared reduction axis (the tokens),
in blocks of 16, by ``T = H_16 diag(s) / 4`` (``H_16``: the Sylvester Hadamard matrix,
``s``: random signs) before quantizing them.  ``T`` is orthogonal, so in exact arithmetic
``(T x)^T (T dy) = x^T dy``: only the quantization sees the transform, which spreads outliers
over each block.  Here the transform is computed in FP64 and rounded once to the operand's
dtype; an axis that is not a multiple of ``n`` is padded with zeros (which add nothing to the
product).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor


def matrix(n: int = 16, seed: int = 0) -> Tensor:
    """``H_n diag(s) / sqrt(n)`` in FP64 (``n`` a power of four; signs ``s`` from ``seed``).

    >>> T = matrix(16); bool((T @ T.T == torch.eye(16, dtype=torch.float64)).all())
    True
    """
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], n)
    return torch.from_numpy(h * signs / math.sqrt(n))


def transform(x: Tensor, axis: int, n: int = 16, seed: int = 0) -> Tensor:
    """``x`` with every block of ``n`` along ``axis`` multiplied by ``matrix`` (FP64,
    rounded once to ``x``'s dtype); the axis is zero-padded to a multiple of ``n``."""
    t = matrix(n, seed).to(x.device)
    moved = x.movedim(axis, -1).double()
    pad = -moved.shape[-1] % n
    if pad:
        moved = torch.nn.functional.pad(moved, (0, pad))
    blocks = moved.reshape(*moved.shape[:-1], -1, n) @ t.T
    return blocks.reshape(moved.shape).movedim(-1, axis).to(x.dtype)
