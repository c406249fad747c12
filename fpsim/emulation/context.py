"""``fpsim.emulate``: run any PyTorch model's dot products under a recipe, and measure them.

Inside ``with fpsim.emulate(recipe) as em:`` every matrix-multiply-like op a model calls
(``F.linear``, ``addmm``, ``matmul``/``@``, ``mm``, ``bmm``, ``baddbmm``, two-operand
``einsum`` that is a batched product, the Q.K^T and P.V of ``scaled_dot_product_attention``
(its softmax, like any softmax over the last axis where attention is emulated, in FP64 rounded
once), and the statistics of ``layer_norm``, ``rms_norm`` and of ``x.pow(2).mean(-1)`` as HF's
RMSNorm writes it) is computed by :mod:`fpsim.emulation.sites` under the recipe that :class:`Rules`
selects for it: operands rounded to the recipe's formats, summed in its accumulator and order
(:func:`fpsim.matmul`), the result written in its output format.  Each op is a *site* named
``"<module path>:<op>"`` (``"transformer.h.0.attn.c_attn:addmm"``,
``"model.layers.1.self_attn:qk"``); the module path comes from forward pre-hooks on every
module, and a module that calls the same op again in one forward pass gets ``#2``, ``#3``...  With ``capture=True`` the context also
keeps per-site statistics (:class:`SiteStats`: operand amax, overflowed / saturated / flushed
operand elements, SNR of the result against FP64 arithmetic on the same operands, swamped
additions of an emulated accumulator) in ``em.sites``; ``em.table()`` lists them.

The forward pass only: emulated results carry no gradient.  Quantized weights are cached per
context (keyed by storage, shape and version, so an in-place update invalidates them).  torch is
imported when a context is entered, never by ``import fpsim``.
"""

from __future__ import annotations

from typing import Any

from ..inputs import check_flag
from .recipe import Recipe, Rules
from .sitestats import COLUMNS, SiteStats

class Emulation:
    """The context :func:`emulate` returns: enter it to emulate, read ``sites`` after.

    ``sites`` maps a site name to its :class:`SiteStats`, in the order the sites were first
    called (filled with ``capture=True``).
    """

    def __init__(self, rules: Rules, capture: bool) -> None:
        self.rules = rules
        self.capture = capture
        self.sites: dict[str, SiteStats] = {}
        self._state: Any = None

    def __enter__(self) -> "Emulation":
        if self._state is not None:
            raise RuntimeError("this fpsim.emulate context is already active; make a new one")
        from .intercept import Interceptor   # imports torch

        state = Interceptor(self)
        state.start()
        self._state = state
        return self

    def __exit__(self, *exc: Any) -> None:
        state, self._state = self._state, None
        state.stop()

    def table(self) -> list[dict[str, Any]]:
        """One row per site (:data:`COLUMNS`), in the order the sites were first called."""
        return [s.row() for s in self.sites.values()]

    def report(self) -> str:
        """:meth:`table` as aligned plain text."""
        rows = [[_cell(r[c]) for c in COLUMNS] for r in self.table()]
        widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c)
                  for i, c in enumerate(COLUMNS)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths))]
        lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows]
        return "\n".join(lines)


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def emulate(recipe: Recipe | Rules, *, capture: bool = False) -> Emulation:
    """A context manager that computes every dot-product site of any PyTorch model under
    ``recipe`` (one :class:`fpsim.emulation.recipe.Recipe` for all sites, or :class:`fpsim.emulation.recipe.Rules`
    selecting per module path and op kind); with ``capture`` it also records per-site
    statistics.  See the module docstring for the ops caught and how sites are named.

    >>> with fpsim.emulate(Recipe("e4m3", scaling="tensor"), capture=True) as em:
    ...     logits = model(ids)
    >>> print(em.report())
    """
    return Emulation(Rules.of(recipe), check_flag(capture, "capture"))
