"""The experiments' recipes: ``fpsim.emulation.recipe`` (the data model) and
``fpsim.emulation.sites`` (a GPT-2 site computed under a recipe on torch tensors), under the
names the experiments use.

The per-site replay computes through these, and the capture and the end-to-end runs are the
model under ``fpsim.emulate``, which computes each site through them too: all measure the same
arithmetic as ``fpsim.emulate`` does on any model.
"""

from __future__ import annotations

from fpsim.formats import Format
from fpsim.emulation.recipe import FP32, FP64, SCALINGS, TILE, FormatLike, Recipe, format_name
from fpsim.emulation.sites import (NATIVE_ACCUMULATORS, causal_matmul, layernorm,
                                   layernorm_stats, linear, matmul, operand_events,
                                   quantize_operand, round_output, rounding_limit, softmax,
                                   tile_quantize, unflush, widen_subnormals)

__all__ = ["FP32", "FP64", "FormatLike", "NATIVE_ACCUMULATORS", "Recipe", "SCALINGS", "TILE",
           "causal_matmul", "format_name", "layernorm", "layernorm_stats", "linear", "matmul",
           "operand_events",
           "quantize_operand", "round_output", "rounding_limit", "softmax", "tile_quantize",
           "unflush", "widen_subnormals"]


def split_format(ebits: int, mbits: int) -> Format:
    """The IEEE-style format eXmY (raises ValueError when it is not a valid format)."""
    if ebits == 0:
        raise ValueError(
            "no exponent bits: an integer, not a float (INT8 is in the fp8 experiment)"
        )
    return Format(f"e{ebits}m{mbits}", ebits, mbits)
