"""Emulated dot products and matrix products: where the sum overflows or swamps."""

from .accumulator import ORDERS, Accumulator
from .driver import MatmulStats, dot, matmul
from .tensor_core import TENSOR_CORES, TensorCoreModel

__all__ = ["Accumulator", "ORDERS", "MatmulStats", "TENSOR_CORES", "TensorCoreModel", "dot", "matmul"]
