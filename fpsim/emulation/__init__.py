"""The emulation layer: run any PyTorch model's dot products under a recipe.

- :mod:`.recipe`: the data model (:class:`Recipe`, :class:`Rule`, :class:`Rules`); NumPy only.
- :mod:`.context`: :func:`emulate` and the :class:`Emulation` it returns; imports torch only when
  a context is entered.
- :mod:`.ops`: the table of ops that sum products, and what fpsim does with each.
- :mod:`.intercept`: the ``TorchFunctionMode`` that routes each op to a site, with module paths;
  :mod:`.aten`: the ``TorchDispatchMode`` that catches every spelling after decomposition.
- :mod:`.sites`: one dot-product site computed under a recipe, on torch tensors;
  :mod:`.conv`: a convolution as an implicit GEMM; :mod:`.norms`: batch / group / instance
  norm statistics.
- :mod:`.grad`: what backward does through an emulated site (raises, for now).
- :mod:`.sitestats`: the per-site statistics that ``capture=True`` tabulates.
- :mod:`.casts` (NumPy only): :class:`~.casts.Cast`, how one GEMM operand is quantized, and
  :class:`~.casts.Backward`, a site's backward GEMMs; :mod:`.quantizers` and :mod:`.hadamard`
  apply them; :mod:`.backward` runs the forward, input-gradient and weight-gradient GEMMs as
  one autograd function; :mod:`.presets`: the published training recipes as data.
"""

from .context import Emulation, emulate
from .recipe import Recipe, Rule, Rules

__all__ = ["Emulation", "Recipe", "Rule", "Rules", "emulate"]
