"""Operands of an emulated matrix product: exact float lanes, NumPy shapes and batches."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backend import is_torch
from ..formats import Format, resolve_format


@dataclass
class Operands:
    """Both operands as (batch, rows, cols) with NumPy ``matmul``'s shape rules applied."""

    a: Any                      # (..., M, K) float32/float64 array or tensor
    b: Any                      # (..., K, N)
    formats: tuple              # the formats the operands' dtypes stand for (None: unknown)
    batch: tuple                # the broadcast batch shape
    shape: tuple                # the result's shape
    device: Any                 # the tensors' device, None for NumPy operands

    @property
    def mkn(self) -> tuple[int, int, int]:
        return self.a.shape[-2], self.a.shape[-1], self.b.shape[-1]


def prepare(a: Any, b: Any, use_torch: bool) -> Operands:
    """Check and convert both operands; errors name the shapes involved."""
    tensors = [x for x in (a, b) if is_torch(x)]
    device = tensors[0].device if tensors else None
    (a, fa), (b, fb) = _operand(a, "a"), _operand(b, "b")
    a, b = (_to_torch(a, device), _to_torch(b, device)) if use_torch else (_numpy(a), _numpy(b))
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError("matmul: operands must have at least one dimension (use * for scalars)")
    a2 = a.reshape((1,) + tuple(a.shape)) if a.ndim == 1 else a
    b2 = b.reshape(tuple(b.shape) + (1,)) if b.ndim == 1 else b
    (M, K), (K2, N) = a2.shape[-2:], b2.shape[-2:]
    if K != K2:
        raise ValueError(f"matmul: a has {K} columns but b has {K2} rows (shapes "
                         f"{tuple(a.shape)} and {tuple(b.shape)})")
    try:
        batch = np.broadcast_shapes(tuple(a2.shape[:-2]), tuple(b2.shape[:-2]))
    except ValueError:
        raise ValueError(f"matmul: batch dimensions {tuple(a2.shape[:-2])} and "
                         f"{tuple(b2.shape[:-2])} do not broadcast") from None
    shape = tuple(batch) + ((M,) if a.ndim > 1 else ()) + ((N,) if b.ndim > 1 else ())
    return Operands(a2, b2, (fa, fb), tuple(batch), shape, device)


def _dtype_format(name: str) -> Format | None:
    try:
        return resolve_format(name.replace("torch.", ""))
    except ValueError:
        return None


def _operand(x: Any, which: str) -> tuple[Any, Format | None]:
    """``x`` as a float32/float64 array or tensor holding its exact values, and the format its
    dtype stands for."""
    if is_torch(x):
        import torch

        if x.is_complex():
            raise TypeError(f"matmul: operand {which} is complex ({x.dtype}); pass real numbers")
        x = x.detach()
        fmt = _dtype_format(str(x.dtype))
        if x.dtype in (torch.float32, torch.float64):
            return x, fmt
        if x.is_floating_point():
            return x.to(torch.float32), fmt     # 16-bit and narrower floats: exact
        return _ints(x.to(torch.int64).cpu().numpy(), which), fmt
    arr = np.asarray(x)
    fmt = _dtype_format(arr.dtype.name)
    if arr.dtype in (np.float32, np.float64):
        return arr, fmt
    if arr.dtype.kind in "fV" and arr.dtype.itemsize <= 2:
        return arr.astype(np.float32), fmt      # float16, ml_dtypes bfloat16/float8: exact
    if arr.dtype.kind in "iub":
        return _ints(arr, which), fmt
    raise TypeError(f"matmul: operand {which} has dtype {arr.dtype}; pass real numbers "
                    "(float16/32/64, bfloat16, float8, integers)")


def _ints(x: np.ndarray, which: str) -> np.ndarray:
    """Integers as float64, refused beyond 2^53 in magnitude (tested on the integers: 2^53 + 1
    converts to 2^53, which a test on the floats would let through)."""
    f = x.astype(np.float64)
    if x.dtype.itemsize == 8 and x.size and (x.max() > 2**53 or x.min() < -(2**53)):
        raise ValueError(f"matmul: operand {which} holds integers beyond 2^53, which float64 "
                         "cannot hold exactly; scale them or convert them yourself")
    return f


def _to_torch(x: Any, device: Any) -> Any:
    import torch

    if is_torch(x):
        return x if device is None else x.to(device)
    t = torch.from_numpy(np.array(x, copy=True))
    return t if device is None else t.to(device)


def _numpy(x: Any) -> np.ndarray:
    return x.cpu().numpy() if is_torch(x) else x


def deliver(x: Any, device: Any) -> Any:
    """A result as the caller's kind: a tensor on the operands' device, else a NumPy array."""
    if device is None:
        return _numpy(x)
    import torch

    return (x if is_torch(x) else torch.from_numpy(x)).to(device)


def batched(x: Any, batch: tuple) -> tuple[Any, np.ndarray]:
    """``x`` as (own batch, rows, cols) and, for each broadcast batch entry, its own index."""
    own = tuple(x.shape[:-2])
    count = math.prod(own)
    x3 = x.reshape((count,) + tuple(x.shape[-2:]))
    pad = (1,) * (len(batch) - len(own)) + own
    idx = np.broadcast_to(np.arange(count).reshape(pad), batch).reshape(-1)
    return x3, idx
