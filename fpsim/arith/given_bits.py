"""``random_bits=`` of matmul's stochastic accumulation: one n-bit value per rounding, so that a
result is a pure function of (operands, random bits) on every backend.

The array has the result's shape plus one last axis of R values for each output, in this order
(docs/stochastic.md, "Random bits of a matrix product"):

* P = K values when ``product=`` rounds the products (else none): index k rounds the product
  of term k, a[..., k] · b[k, ...];
* then one value per addition, at P + i for addition i.  Orders "sequential", "fma" and
  "chunked": addition k adds term k to the running sum (which starts at -0, or at C; "chunked"
  restarts it at -0 every ``chunk`` terms), K in all.  Order "pairwise": the tree's additions
  level by level, each level's neighbours (0, 1), (2, 3), ... left to right (an odd last term
  moves up as it is), K - 1 in all (1 when K = 1: the term added to -0); with ``c`` one more at
  the end, C plus the tree's sum.

Roundings to nearest (``chunk``'s FP32 promotions, C, ``output``) take no random bits.
"""

from __future__ import annotations

from typing import Any

from ..stochastic import check_random_bits
from .lanes import Lanes
from .operands import Operands
from .plan import Plan


def count(plan: Plan, K: int, with_c: bool) -> tuple[int, int]:
    """(products, additions) of each output that round with random bits."""
    if K == 0:
        return 0, 0
    products = K if plan.product is not None else 0
    if plan.order == "pairwise":
        return products, max(K - 1, 1) + with_c
    return products, K


def check(random_bits: Any, plan: Plan, seed: Any, ops: Operands, with_c: bool) -> Any:
    """The caller's random bits as (batch, M, N, R) on the operands' kind and device, after
    ``fpsim.stochastic.check_random_bits`` (mode, ``srbits``, no ``seed``, integers, shape,
    range); None stays None."""
    if random_bits is None:
        return None
    M, K, N = ops.mkn
    products, additions = count(plan, K, with_c)
    shape = ops.shape + (products + additions,)
    rounded = f"{products} products + " if products else ""
    layout = (f"shape {shape}: the result's shape and, for each output, one value per rounding "
              f"({rounded}{additions} additions with order={plan.order!r}, K={K}"
              f"{', and c' if with_c and plan.order == 'pairwise' and K else ''}; "
              "docs/stochastic.md)")
    r = check_random_bits(random_bits, ops.a, plan.rounding, plan.srbits, seed, shape, layout)
    return r.reshape((-1, M, N, products + additions))


class TileBits:
    """One tile's random bits, rounding first, (R, bt, tm, tn), and where each rounding's are."""

    def __init__(self, lanes: Lanes, bits: Any, products: int) -> None:
        self.bits = lanes.xp.moveaxis(bits, -1, 0)
        self.bits = self.bits.contiguous() if lanes.torch else self.bits.copy()
        self.products = products

    def step(self, k: int) -> tuple[Any, Any]:
        """Term k of a running sum: (its product's bits or None, its addition's)."""
        return (self.bits[k] if self.products else None), self.bits[self.products + k]

    def product_bits(self) -> Any:
        """Every product's, stacked as the products are: (K, bt, tm, tn)."""
        return self.bits[:self.products] if self.products else None

    def additions(self, i: int, n: int) -> Any:
        """Additions i .. i + n - 1 of the tree, stacked: (n, bt, tm, tn)."""
        return self.bits[self.products + i:self.products + i + n]
