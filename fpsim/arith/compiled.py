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


#: the LLVM target features under which a binary16 fused multiply-add is one instruction that
#: rounds once (x86's AVX512-FP16); without them LLVM computes it in float32 and rounds twice
HALF_FEATURES = ("+avx512fp16",)


@functools.cache
def native_half() -> bool:
    """Whether the kernels run binary16 sums on the host's own binary16 unit
    (``_jit_kernels.sequential_half``): numba compiles for a target with ``HALF_FEATURES``
    (the host's features, or ``NUMBA_CPU_FEATURES`` where set, as numba takes them).
    ``FPSIM_NATIVE_HALF=0`` turns it off (the float64 kernels then run: the same bits).

    >>> native_half() in (True, False)
    True
    """
    import os

    if not available() or os.environ.get("FPSIM_NATIVE_HALF", "1") == "0":
        return False
    from numba.core import config
    from numba.core.codegen import get_host_cpu_features

    features = config.CPU_FEATURES
    if features is None:
        features = get_host_cpu_features()
    return all(f in features.split(",") for f in HALF_FEATURES)
