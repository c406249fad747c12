"""The emulation layer: run any PyTorch model's dot products under a recipe.

- ``.recipe``: the data model (``Recipe``, ``Rule``, ``Rules``); NumPy only.
- ``.context``: ``emulate`` and the ``Emulation`` it returns; imports torch only when
  a context is entered.
- ``.ops``: the table of ops that sum products, and what fpsim does with each.
- ``.intercept``: the ``TorchFunctionMode`` that routes each op to a site, with module paths;
  ``.aten``: the ``TorchDispatchMode`` that catches every spelling after decomposition.
- ``.sites``: one dot-product site computed under a recipe, on torch tensors;
  ``.conv``: a convolution as an implicit GEMM; ``.norms``: batch / group / instance
  norm statistics.
- ``.grad``: what backward does through an emulated site (raises, for now).
- ``.sitestats``: the per-site statistics that ``capture=True`` tabulates.
- ``.casts`` (NumPy only): ``Cast``, how one GEMM operand is quantized, and
  ``Backward``, a site's backward GEMMs; ``.quantizers`` and ``.hadamard``
  apply them; ``.backward`` runs the forward, input-gradient and weight-gradient GEMMs as
  one autograd function; ``.presets``: the published training recipes as data.
"""

from .context import Calibration, Emulation, emulate
from .recipe import Recipe, Rule, Rules

__all__ = ["Calibration", "Emulation", "Recipe", "Rule", "Rules", "emulate"]
