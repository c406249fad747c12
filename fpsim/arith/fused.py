"""One float64 addition, then one rounding: the exact sum without TwoSum, where it is provably
the same.

The accumulator's sum x + y rounded once to a nearest mode of ``F`` equals float64's sum
``fl(x + y)`` rounded to ``F`` unless ``fl`` lands exactly on a rounding boundary ``mu`` of
``F`` (a midpoint between two values, or the overflow threshold max + half a spacing) that the
exact sum is not: nearest rounding is monotone and never crosses a float64 number, and ``F``'s
values and boundaries are float64 numbers (``guarded``).  Landing there needs
``0 < |x + y - mu| <= 2^(e - 53)`` (half a float64 ulp at ``mu``, ``mu`` in binade ``e``, never
a power of two).  Then ``x + y - mu`` is a non-zero multiple of the grid both addends and
``mu`` lie on, which is impossible when that grid is coarser than ``2^(e - 53)``:

* ``mu`` lies on 2^(e - m - 1) (``m``: F's fraction bits, at most 50): coarser.
* An accumulator value lies on 2^(emin - m), coarser for every ``e <= emax`` when
  ``emin - m >= emax - 52`` (FP16: -24 >= -37; not BF16 or FP32, whose range is wide).
* An exact product ``p`` added to an accumulator value ``acc``: ``|mu - acc|`` is at least half
  a spacing, 2^(e - m - 1), so ``|p| > 2^(e - m - 2)`` and ``p``, of at most ``sig`` significant
  bits, lies on 2^(e - m - 1 - sig): coarser when ``sig <= 51 - m`` (FP16 products: 22 <= 41).
* Two products (the first level of the pairwise tree): they lie on 2^low (the data's least
  product bit), coarser when ``low >= emax - 52``; measured per call.

So sequential and chunked sums (accumulator plus product) qualify for FP16-like accumulators
whatever the data; pairwise ones when the products' least bit allows.  Tests compare the two
adders on sums built to land float64 on every boundary.
"""

from __future__ import annotations

from typing import Any

from ..convert import quantize
from ..formats import Format
from ..rounding import F64
from .lanes import Lanes, Profile, guarded
from .plan import Plan


def applies(plan: Plan, prod: Profile, numpy: bool) -> bool:
    """Whether float64's own sum rounded once to ``plan.accum`` is the exact sum rounded once
    for every addition of this product (see the module's proof); NumPy lanes only."""
    acc = plan.accum
    ok = (numpy and plan.model is None and not plan.plain and plan.product is None
          and plan.rounding in ("rne", "rna") and prod.fits(F64) and guarded(F64, acc)
          and acc.emin - acc.mbits >= acc.emax - 52 and prod.sig <= 51 - acc.mbits)
    if plan.order == "pairwise":
        ok = ok and prod.low >= acc.emax - 52
    return ok


class OneRounding:
    """``x + y`` in float64, rounded once to ``fmt``: ``accumulate.Adder``'s result where
    ``applies`` holds."""

    srbits = None                   # nearest modes only: no random bits

    def __init__(self, fmt: Format, rounding: str, lanes: Lanes) -> None:
        self.fmt, self.rounding, self.lanes = fmt, rounding, lanes

    def __call__(self, x: Any, y: Any, r: None = None) -> Any:
        """``r``: always None (nearest modes take no random bits), as ``Adder`` has it."""
        return quantize(x + y, self.fmt, rounding=self.rounding)
