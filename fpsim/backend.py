"""The few array operations the rounding algorithm needs beyond Python operators.

NumPy and torch share the algorithm in :mod:`fpsim.rounding`; arithmetic, shifts, masks and
comparisons are written with operators, which both libraries implement the same way.  What they
spell differently (``where`` with scalars, clamping, bit casts, dtype changes) lives here, so the
algorithm itself stays backend-free.  torch is imported only when a tensor arrives.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class NumpyOps:
    """Backend for NumPy arrays."""

    name = "numpy"
    int32 = np.int32
    int64 = np.int64
    float32 = np.float32
    float64 = np.float64

    @staticmethod
    def where(cond: Any, a: Any, b: Any) -> Any:
        # a Python scalar takes the array's dtype, as torch does (np.where would widen to int64)
        if not isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
            a = b.dtype.type(a)
        elif not isinstance(b, np.ndarray) and isinstance(a, np.ndarray):
            b = a.dtype.type(b)
        return np.where(cond, a, b)

    @staticmethod
    def clamp_min(a: Any, lo: int) -> Any:
        return np.maximum(a, lo)

    @staticmethod
    def clamp_max(a: Any, hi: int) -> Any:
        return np.minimum(a, hi)

    @staticmethod
    def astype(a: Any, dtype: Any) -> Any:
        return a.astype(dtype)

    @staticmethod
    def view(a: Any, dtype: Any) -> Any:
        return a.view(dtype)

    @staticmethod
    def random_bits(shape: tuple, nbits: int, dtype: Any, seed: Any) -> Any:
        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        return rng.integers(0, 1 << nbits, size=shape, dtype=dtype)


class TorchOps:
    """Backend for torch tensors (any device)."""

    name = "torch"

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.int32 = torch.int32
        self.int64 = torch.int64
        self.float32 = torch.float32
        self.float64 = torch.float64

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        return self.torch.where(cond, a, b)

    def clamp_min(self, a: Any, lo: int) -> Any:
        return self.torch.clamp(a, min=lo)

    def clamp_max(self, a: Any, hi: int) -> Any:
        return self.torch.clamp(a, max=hi)

    @staticmethod
    def astype(a: Any, dtype: Any) -> Any:
        return a.to(dtype)

    @staticmethod
    def view(a: Any, dtype: Any) -> Any:
        return a.view(dtype)

    def random_bits(self, shape: tuple, nbits: int, dtype: Any, seed: Any, device: Any = None) -> Any:
        gen = None
        if seed is not None:
            gen = seed if isinstance(seed, self.torch.Generator) else \
                self.torch.Generator(device=device).manual_seed(int(seed))
        return self.torch.randint(0, 1 << nbits, shape, dtype=dtype, generator=gen, device=device)


_TORCH_OPS: TorchOps | None = None


def is_torch(x: Any) -> bool:
    """True for a torch tensor, without importing torch when it is not loaded."""
    return type(x).__module__.startswith("torch") and hasattr(x, "device")


def ops_for(x: Any) -> NumpyOps | TorchOps:
    global _TORCH_OPS
    if is_torch(x):
        if _TORCH_OPS is None:
            _TORCH_OPS = TorchOps()
        return _TORCH_OPS
    return NumpyOps()
