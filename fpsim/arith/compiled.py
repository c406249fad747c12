"""The compiled kernels of the arithmetic (numba, the ``fast`` extra): whether they can run, and
the kernels themselves, loaded on first use.  One place that the engine (``jit``) and the
operand measure (``lanes.profile``) both ask, so that neither imports the other for it.

>>> from fpsim.arith import compiled
>>> compiled.available() in (True, False)
True
"""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def available() -> bool:
    """Whether numba can be imported (the ``fast`` extra)."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def kernels() -> Any:
    """Compile (or load from numba's disk cache) the kernels on first use."""
    if not available():
        raise ImportError("backend='numba' needs numba: pip install 'fpsim[fast]' (or numba)")
    from . import _jit_kernels

    return _jit_kernels
