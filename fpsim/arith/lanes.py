"""Working lanes for emulated dot products: which float type holds the arithmetic exactly.

Every rounding inside a dot product is done by ``fpsim.quantize`` on the exact value of a
product or sum.  Products are exact in float32 or float64 lanes when the operands' significands
and exponents are small enough; this module measures that on the data (``Profile``) and picks
the narrowest lanes that hold products exactly and leave two guard bits below the accumulator,
which the round-to-odd sum in ``fpsim.arith.accumulate`` needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backend import NumpyOps, is_torch, ops_for
from ..formats import Format
from ..rounding import F32, Source
from . import compiled

_NONE = 1 << 20  # exponent sentinel of an operand without finite non-zero values


@dataclass(frozen=True)
class Profile:
    """Values with at most ``sig`` significant bits, multiples of 2^low, magnitudes < 2^(high+1)."""

    sig: int
    low: int
    high: int

    @property
    def empty(self) -> bool:
        return self.sig == 0

    def times(self, other: Profile) -> Profile:
        """Profile of the exact products of values of ``self`` and ``other``."""
        if self.empty or other.empty:
            return EMPTY
        return Profile(self.sig + other.sig, self.low + other.low, self.high + other.high + 1)

    def fits(self, src: Source) -> bool:
        """Whether every such value is exactly a value of the float ``src``."""
        return self.empty or (self.sig <= src.mbits + 1 and self.low >= src.emin - src.mbits
                              and self.high <= src.emax)

    @property
    def bound(self) -> float:
        """An upper bound on the magnitudes (inf when beyond float64)."""
        return 0.0 if self.empty else (2.0 ** (self.high + 1) if self.high < 1023 else np.inf)


EMPTY = Profile(0, _NONE, -_NONE)


def profile(x: Any, chunk: int | None = None) -> Profile:
    """Measure the finite non-zero values of a float32/float64 array or torch tensor (inf and
    NaN are exact), a slice of ``chunk`` elements at a time so that memory stays small.  A tensor
    is measured on its own device (no copy to the host); its default slices are larger (2^22
    elements, not 2^16) since each one synchronises a GPU three times.  A float32/float64 array
    is measured in one compiled pass when numba is installed (``measure``).

    >>> profile(np.array([0.75, -6.0, 0.0, np.inf]))
    Profile(sig=2, low=-2, high=2)
    """
    if not is_torch(x) and chunk is None and x.dtype in (np.float32, np.float64) \
            and compiled.available():
        sig, low, high = compiled.kernels().profile(x.reshape(-1))
        return Profile(sig, low, high) if sig else EMPTY
    return measure(x, chunk)


def measure(x: Any, chunk: int | None = None) -> Profile:
    """``profile`` by NumPy (or torch) array operations, ``chunk`` elements at a time."""
    tensor = is_torch(x)
    flat = x.reshape(-1)
    size = flat.numel() if tensor else flat.size
    step = chunk or (1 << 22 if tensor else 1 << 16)
    sig, low, high = 0, _NONE, -_NONE
    for lo in range(0, size, step):
        part = flat[lo:lo + step]
        if tensor:
            v = part[part.isfinite() & (part != 0)].abs().double()
            if v.numel() == 0:
                continue
            mant, exp = v.frexp()                  # v = mant * 2^exp, 0.5 <= mant < 1
            m = (mant * 2.0**53).long()            # the significand as an exact integer
            tz = (m & -m).double().frexp()[1] - 1
        else:
            v = np.abs(part[np.isfinite(part) & (part != 0)]).astype(np.float64)
            if v.size == 0:
                continue
            mant, exp = np.frexp(v)
            m = (mant * 2.0**53).astype(np.int64)
            tz = np.frexp((m & -m).astype(np.float64))[1] - 1
        sig = max(sig, int((53 - tz).max()))
        low = min(low, int((exp - 53 + tz).min()))
        high = max(high, int(exp.max()) - 1)
    return Profile(sig, low, high) if sig else EMPTY


def guarded(src: Source, fmt: Format, extra: int = 2) -> bool:
    """Whether ``src`` holds ``fmt`` with ``extra`` more bits everywhere (round-to-odd needs two;
    stochastic rounding with n random bits n + 2)."""
    lowest = fmt.emin - (fmt.mbits if fmt.subnormals else 0)
    return (fmt.mbits + extra <= src.mbits and lowest - extra >= src.emin - src.mbits
            and fmt.emax <= src.emax)


def holds(src: Source, fmt: Format) -> bool:
    """Whether every finite value of ``fmt`` is a value of ``src``."""
    lowest = fmt.emin - (fmt.mbits if fmt.subnormals else 0)
    return (fmt.mbits <= src.mbits and lowest >= src.emin - src.mbits and fmt.emax <= src.emax)


def lane_max(src: Source) -> float:
    return float(np.finfo(np.float32 if src is F32 else np.float64).max)


class Lanes:
    """The array library (NumPy or torch, any device) and float width of the inner loop.

    The NumPy/torch differences are the backend shim's (``fpsim.backend``); this adds the
    float width and the device.
    """

    def __init__(self, src: Source, like: Any = None, compiled: bool = False) -> None:
        self.src = src
        self.torch = like is not None
        self.compiled = compiled        # loop bodies fused by torch.compile
        self.backend = "torch" if compiled else "auto"   # quantize's driver for tensors
        self.ops = ops_for(like) if self.torch else NumpyOps()
        self.xp = self.ops.torch if self.torch else np
        self.device = like.device if self.torch else None
        self._on = {"device": self.device} if self.torch else {}
        wide = src is not F32
        self.fdt = self.ops.float64 if wide else self.ops.float32
        self.idt = self.ops.int64 if wide else self.ops.int32

    def full(self, shape: tuple, value: float) -> Any:
        return self.xp.full(shape, value, dtype=self.fdt, **self._on)

    def zeros(self, shape: tuple, dtype: Any = None) -> Any:
        return self.xp.zeros(shape, dtype=dtype or self.fdt, **self._on)

    def cast(self, x: Any) -> Any:
        """``x`` in these lanes' float type (exact by construction of the lanes)."""
        return self.ops.astype(x, self.fdt)

    def bits(self, x: Any) -> Any:
        return x.view(self.idt)

    def floats(self, b: Any) -> Any:
        return b.view(self.fdt)

    def count(self, mask: Any) -> Any:
        """A boolean mask as integers, for counting."""
        return self.ops.astype(mask, self.ops.int64)
