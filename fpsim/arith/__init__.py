"""Emulated dot products and matrix products: where the sum overflows or swamps."""

from .driver import MatmulStats, dot, matmul
from .plan import ORDERS
from .tensor_core import TENSOR_CORES, TensorCoreModel

__all__ = ["ORDERS", "MatmulStats", "TENSOR_CORES", "TensorCoreModel", "dot", "matmul"]
