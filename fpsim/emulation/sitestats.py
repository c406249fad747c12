"""Per-site statistics that ``fpsim.emulate`` captures (plain Python: no torch)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: Columns of ``Emulation.table``, in order.
COLUMNS = ("site", "kind", "recipe", "rule", "calls", "elements", "amax", "overflow", "saturated",
           "flushed", "outputs", "nonfinite", "snr_db", "swamped")


@dataclass
class SiteStats:
    """What one site did, summed over its calls.

    ``recipe``: the name of the recipe that computed it (None: left to torch by the rules;
    ``"not emulated"``: an op that sums products and that fpsim does not emulate ran there);
    ``rule``: which rule of the ``fpsim.Rules`` chose it (``"rule 2"``, ``"default"``).
    ``elements``: operand elements (both operands, every call); ``amax``: the largest finite
    operand magnitude; ``overflow`` / ``saturated`` / ``flushed``: operand elements the recipe
    sent to inf/NaN, clamped at the format's largest value, or flushed to zero; ``nonzero``:
    operand elements that are not zero (as passed: a convolution's input, not its patches; not
    a column of ``fpsim.emulation.Emulation.table``), of which ``flushed`` is a part;
    ``outputs``:
    results, ``nonfinite`` those inf/NaN where the FP64 reference is finite; ``signal`` /
    ``noise``: energy of the FP64 reference and of the error, over results finite in both;
    ``swamped``: additions an emulated accumulator left unchanged although the addend was
    non-zero (None: the accumulator is torch's, not measured).  ``reference``: False under
    ``capture="counts"``, which computes no FP64 reference: ``snr_db`` is not measured (None in
    ``row``) and ``nonfinite`` counts every inf/NaN result.
    """

    site: str
    kind: str
    recipe: str | None
    rule: str | None = None
    calls: int = 0
    elements: int = 0
    amax: float = 0.0
    overflow: int = 0
    saturated: int = 0
    flushed: int = 0
    nonzero: int = 0
    outputs: int = 0
    nonfinite: int = 0
    signal: float = 0.0
    noise: float = 0.0
    swamped: int | None = None
    reference: bool = True

    @property
    def snr_db(self) -> float:
        """Signal-to-noise ratio of the results against FP64, in dB (inf: no error)."""
        if self.noise == 0:
            return math.inf if self.signal > 0 else math.nan
        return 10 * math.log10(self.signal / self.noise) if self.signal > 0 else -math.inf

    def row(self) -> dict[str, Any]:
        """The site as a table row keyed by ``COLUMNS``."""
        if self.recipe == "not emulated":            # only counted: nothing was measured
            return {c: getattr(self, c) if c in ("site", "kind", "recipe", "calls") else None
                    for c in COLUMNS}
        return {c: (self.snr_db if self.reference else None) if c == "snr_db"
                else getattr(self, c) for c in COLUMNS}
