"""The one door from fpsim to the Triton kernels (the top-level package ``kernels``).

Only this module imports ``kernels``, and only inside its functions, so ``import fpsim`` stays
NumPy-only and ``kernels`` may import the layers below the API (formats, rounding, backend,
blocks, blockrules) without an import cycle.  It also decides which driver runs a tensor.
"""

from __future__ import annotations

import importlib.util
import numbers
import os
from typing import Any

from .backend import check_backend, is_torch_generator
from .formats import Format
from .rounding import F32

#: ``backend=`` values of quantize/encode (``mx.quantize``: the same without ``"numpy"``).
CONVERT_BACKENDS = ("auto", "numpy", "torch", "triton")
BLOCK_BACKENDS = ("auto", "torch", "triton")


def device_kind(x: Any) -> str:
    """The device type of torch tensor ``x`` (``"cpu"``, ``"cuda"``...) as every ``"auto"``
    choice of engine reads it: CUDA tensors run the Triton kernels or the torch engine, CPU ones
    NumPy.  The one place the choice looks at the device, so a test can send CPU tensors down the
    CUDA path (the experiments' ``--device cuda`` test)."""
    return x.device.type


def kernel_input(x: Any) -> bool:
    """A CUDA float32/float16/bfloat16 tensor, with triton and ``kernels`` installed: the
    kernels' inputs (the "use the Triton kernel?" test of every entry point)."""
    import torch

    return (device_kind(x) == "cuda" and x.dtype in (torch.float32, torch.float16, torch.bfloat16)
            and importlib.util.find_spec("triton") is not None
            and importlib.util.find_spec("fpsim_kernels") is not None)


def route(x: Any, backend: str, fmt: Format, seed: Any = None) -> str:
    """Which driver runs a tensor in quantize/encode: ``"numpy"`` (CPU tensors by default:
    chunked, table-driven, zero-copy), ``"triton"`` (CUDA tensors where the kernels apply),
    else ``"torch"``; ``backend`` forces one."""
    backend = check_backend(backend, CONVERT_BACKENDS)
    if backend == "auto":
        if (F32.holds(fmt) and (seed is None or isinstance(seed, numbers.Integral)
                                or is_torch_generator(seed)) and kernel_input(x)):
            return "triton"
        return "torch" if (device_kind(x) != "cpu" or is_torch_generator(seed)) else "numpy"
    if backend == "numpy" and x.device.type != "cpu":
        raise ValueError("backend='numpy' needs a CPU tensor; move it with .cpu() or use 'torch'")
    return backend


def route_blocks(x: Any, backend: str, pad: bool, tensor: bool) -> bool:
    """Whether ``mx.quantize`` runs the Triton kernel (``tensor``: ``x`` is a torch tensor)."""
    backend = check_backend(backend, BLOCK_BACKENDS)
    if backend == "torch" or not tensor:
        return False
    return backend == "triton" or (pad and kernel_input(x))


def kernels_for(x: Any) -> Any:
    """The ``kernels`` package, once it is known that Triton can run ``x``: a CUDA tensor, or
    any tensor under ``TRITON_INTERPRET=1``.  Otherwise a RuntimeError that names the fix
    (Triton's own, "0 active drivers", names none)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        import torch

        where = None
        if not torch.cuda.is_available():
            where = "no CUDA GPU is available"
        elif device_kind(x) != "cuda":
            where = f"the tensor is on {x.device}"
        if where:
            raise RuntimeError(
                f"backend='triton' runs the Triton kernels on CUDA tensors, but {where}: use "
                "backend='auto' (NumPy/torch, the same bits), move the tensor with .cuda(), or "
                "run the kernels on the CPU in Triton's interpreter by setting the environment "
                "variable TRITON_INTERPRET=1 before triton is imported (slow)")
    import fpsim_kernels as kernels

    return kernels


def quantize(x: Any, fmt: Format, **options: Any) -> Any:
    """``kernels.quantize``."""
    return kernels_for(x).quantize(x, fmt, **options)


def encode(x: Any, fmt: Format, **options: Any) -> Any:
    """``kernels.encode``, unpacked (codes shaped like ``x``, as ``fpsim.encode``)."""
    return kernels_for(x).encode(x, fmt, pack=False, **options)


def mx_quantize(x: Any, spec: Any, **options: Any) -> Any:
    """``kernels.mx_quantize``, unpacked: one code per element in row order."""
    return kernels_for(x).mx_quantize(x, spec, pack=False, **options)
