"""The backend shim: everything NumPy and torch spell differently, in one place.

NumPy and torch share the algorithms of fpsim; arithmetic, shifts, masks and comparisons are
written with operators, which both libraries implement the same way.  What they spell
differently (``where`` with scalars, clamping, bit casts, dtype changes, exact division, input
dtypes, code dtypes, generators) lives here, so the algorithms stay backend-free.  torch is
imported only when a tensor arrives.  The ``backend=`` keyword's values are checked here too.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from .names import resolve


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
        return a.astype(dtype, copy=False)             # as torch's .to: no copy when it is one

    @staticmethod
    def view(a: Any, dtype: Any) -> Any:
        return a.view(dtype)

    @staticmethod
    def moveaxis(a: Any, source: int, destination: int) -> Any:
        """``a`` with an axis moved, contiguous."""
        return np.ascontiguousarray(np.moveaxis(a, source, destination))

    @staticmethod
    def abs(a: Any) -> Any:
        return np.abs(a)

    @staticmethod
    def isfinite(a: Any) -> Any:
        return np.isfinite(a)

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

    @staticmethod
    def moveaxis(a: Any, source: int, destination: int) -> Any:
        """``a`` with an axis moved, contiguous."""
        return a.movedim(source, destination).contiguous()

    @staticmethod
    def abs(a: Any) -> Any:
        return a.abs()

    @staticmethod
    def isfinite(a: Any) -> Any:
        return a.isfinite()

    def random_bits(self, shape: tuple, nbits: int, dtype: Any, seed: Any,
                    device: Any = None) -> Any:
        gen = None
        if seed is not None:
            gen = seed if is_torch_generator(seed) else \
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


# --------------------------------------------------------------------------------------------
# The backend= keyword
# --------------------------------------------------------------------------------------------
#: Every value of the ``backend=`` keyword; each function accepts those that apply to it.
BACKENDS = ("auto", "numpy", "numba", "torch", "compiled", "triton")


def check_backend(backend: str, allowed: tuple[str, ...]) -> str:
    """The canonical backend name, or a ValueError naming the values this function takes."""
    return resolve("backend", backend, {b: b for b in allowed})


def is_torch_generator(seed: Any) -> bool:
    """A ``torch.Generator``, recognised without importing torch."""
    return type(seed).__name__ == "Generator" and type(seed).__module__.startswith("torch")


# --------------------------------------------------------------------------------------------
# Small exact helpers for either backend
# --------------------------------------------------------------------------------------------
def float_input(x: Any, who: str, keep_float64: bool = True) -> Any:
    """float32 (or float64 when ``keep_float64``) NumPy array / torch tensor with the input's
    exact values; ``who`` names the function in the error for non-float input."""
    if is_torch(x):
        import torch

        if not x.is_floating_point():
            raise TypeError(f"{who} floating-point data, got a {x.dtype} tensor: convert it "
                            "with .float() first")
        return x if (x.dtype == torch.float64 and keep_float64) else x.to(torch.float32)
    arr = np.asarray(x)
    if arr.dtype.kind == "f" or (arr.dtype.kind == "V" and arr.dtype.itemsize <= 2):
        if arr.dtype == np.float64 and keep_float64:
            return arr
        with np.errstate(over="ignore"):        # float64 beyond float32: inf, as a cast does
            return arr.astype(np.float32, copy=False)
    raise TypeError(f"{who} floating-point data, got dtype {arr.dtype}: convert it with "
                    ".astype(np.float32) first")


def to_uint8(a: Any) -> Any:
    """``a`` as uint8 (codes of at most 8 bits)."""
    return a.to(ops_for(a).torch.uint8) if is_torch(a) else a.astype(np.uint8)


def is_wide(a: Any) -> bool:
    """float64 (or int64) lanes."""
    return (a.element_size() if is_torch(a) else a.dtype.itemsize) == 8


def _constant(a: Any, v: Any) -> Any:
    """``v`` in ``a``'s float type: a 1-element tensor for torch (so that no kernel replaces a
    division by a multiplication with the reciprocal), a NumPy scalar or array otherwise."""
    if is_torch(a):
        d = v if is_torch(v) else ops_for(a).torch.tensor([v], dtype=a.dtype)
        return d.to(dtype=a.dtype, device=a.device)
    return v.astype(a.dtype) if isinstance(v, np.ndarray) else a.dtype.type(v)


def divide(a: Any, v: Any) -> Any:
    """``a / v`` rounded once to ``a``'s float type (``v`` a number or an array)."""
    return a / _constant(a, v)


def multiply(a: Any, v: Any) -> Any:
    """``a * v`` rounded once to ``a``'s float type."""
    return a * _constant(a, v)


def clip(a: Any, lo: float, hi: float) -> Any:
    """``a`` clamped to [lo, hi], in ``a``'s dtype."""
    if is_torch(a):
        return a.clamp(lo, hi)
    return np.clip(a, a.dtype.type(lo), a.dtype.type(hi))


def float64_bits(v: float) -> int:
    """The bit pattern of the float64 ``v`` as a Python int (signed)."""
    return int(np.array(v, np.float64).view(np.int64))


def code_dtype(fmt: Any, torch: bool = False) -> Any:
    """Dtype of codes of ``fmt`` (a format, or a width in bits): NumPy's smallest unsigned
    integer type that holds them, or for torch uint8 up to 8 bits, int32 up to 31, else int64
    (torch's wide unsigned types lack arithmetic; int64 lanes hold a 64-bit code's two's
    complement bit pattern).  The one rule for encode, the kernels and packing."""
    bits = getattr(fmt, "bits", fmt)
    if torch:
        import torch as t

        return t.uint8 if bits <= 8 else t.int32 if bits <= 31 else t.int64
    return _CODE_DTYPES[bits]


_CODE_DTYPES = {b: np.dtype(np.uint8 if b <= 8 else np.uint16 if b <= 16 else
                            np.uint32 if b <= 32 else np.uint64) for b in range(1, 65)}


def on_nan_keyword(on_nan: str, deprecated: dict[str, Any], who: str) -> str:
    """``on_nan``, or the deprecated ``nan=`` keyword of ``who`` with a DeprecationWarning."""
    if "nan" in deprecated:
        warnings.warn(f"{who}(nan=...) is now {who}(on_nan=...)", DeprecationWarning,
                      stacklevel=3)
        on_nan = deprecated.pop("nan")
    if deprecated:
        raise TypeError(f"{who}() got an unexpected keyword argument {next(iter(deprecated))!r}")
    return on_nan
