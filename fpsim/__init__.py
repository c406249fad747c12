"""fpsim: bit-exact emulation of number formats, and what they do to neural-network arithmetic."""

from .arith import Accumulator, dot, matmul
from .convert import decode, encode, quantize, values
from .emulation import emulate
from .explain import Explanation, explain
from .formats import FORMATS, Format, get_format
from .rounding import MODES
from . import mx
from .emulation.recipe import Recipe, Rule, Rules
from .scaling import ScaledTensor, scaled_quantize
from .summary import ErrorSummary, summarize
from .bridge import as_dtype, codes_of

__all__ = ["Accumulator", "FORMATS", "Explanation", "Format", "MODES", "explain", "decode", "dot", "encode", "get_format", "matmul", "quantize", "values"]
__all__ += ["Recipe", "Rule", "Rules", "ScaledTensor", "emulate", "mx", "scaled_quantize"]
__all__ += ["ErrorSummary", "as_dtype", "codes_of", "summarize"]
__version__ = "0.1.0"
