"""Triton kernels for fpsim's conversions: bit-identical to the NumPy reference, one pass.

Importing this package imports torch and triton; ``import fpsim`` never does.  Set
``TRITON_INTERPRET=1`` before the first import to run the kernels on CPU tensors.
"""

from .cast import decode, encode, quantize, supports
from .mx import MXPacked, mx_dequantize, mx_quantize

__all__ = ["MXPacked", "decode", "encode", "mx_dequantize", "mx_quantize", "quantize", "supports"]
