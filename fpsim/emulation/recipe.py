"""Recipes: how each dot-product site of a network is computed (NumPy only, no torch).

A :class:`Recipe` names the operand formats, the scaling that maps operands into them, the
accumulator (format, summation order, chunk) and the format the result is written in.
:class:`Rules` picks a recipe per site of any model: by glob on the module path (``"*.attn*"``)
and by op kind (``KINDS``), first match wins.  :func:`fpsim.emulate` runs a PyTorch model under
them; the experiments use the same recipes on GPT-2.  The arithmetic itself (torch) is in
:mod:`fpsim.emulation.sites`.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from dataclasses import dataclass
from typing import Any, Sequence

from .. import mx
from ..formats import Format, get_format
from ..inputs import check_flag
from ..rounding import check_mode, check_saturate
from ..stochastic import check_srbits

SCALINGS = ("none", "tensor", "channel", "block", "tile")
TILE = 128  # DeepSeek-V3 fine-grained scaling: 1 x TILE activations, TILE x TILE weights
NATIVE = ("fp32", "fp64")  # accumulators summed in FP64 by torch and rounded once to themselves
#: Op kinds a :class:`Rule` selects: ``linear`` (F.linear, addmm: a layer's product and bias),
#: ``matmul`` (matmul / @ / mm / bmm / baddbmm / einsum), ``attention`` (the Q.K^T and P.V of
#: scaled_dot_product_attention), ``norm`` (LayerNorm / RMSNorm statistics).
KINDS = ("linear", "matmul", "attention", "norm")
FormatLike = str | Format


def format_name(fmt: FormatLike | None) -> str | None:
    """Name of a scalar or block format (None stays None)."""
    return None if fmt is None else (fmt if isinstance(fmt, str) else fmt.name)


@dataclass(frozen=True)
class Recipe:
    """How a dot-product site is computed.

    The formats are the positional arguments: ``Recipe("e4m3")`` rounds both operands to E4M3,
    ``Recipe("e4m3", "e5m2")`` the left one to E4M3 and the right one to E5M2, ``Recipe()`` is
    plain FP32; everything else is keyword-only.  ``name`` (keyword) labels the recipe in reports;
    without it the name is derived from the fields (:meth:`describe`: ``"e4m3/tensor"``,
    ``"bf16 out=bf16"``, ``"fp32 acc=fp16 sequential"``).

    ``inputs``: format of the activation operand (None keeps FP32); ``weights``: format of the
    second operand (None: the same as ``inputs``).  ``scaling``: ``none``, per-``tensor`` or
    per-``channel`` amax scaling (scale = amax / format max in FP32 from the tensor itself at
    every call: "current" scaling, which cannot overflow; delayed scaling is in ``practice``) or
    ``block`` (``inputs`` is an MX / NVFP4 name of :mod:`fpsim.mx`; ``scale_rounding`` its
    scale rule, None: the OCP floor) or ``tile`` (DeepSeek-V3: one scale per 1 x 128 tile of
    the left operand and per 128 x 128 block of the right one, along the reduction axis).
    ``accum``, ``order``, ``chunk``, ``tensor_core``: the accumulator; ``order=None`` with an
    FP32/FP64 accumulator is torch's native matmul, anything else goes through
    :func:`fpsim.matmul` (``tensor_core``: a preset of ``fpsim.arith.TENSOR_CORES``, with
    ``order="tensor_core"``).  ``output``: the
    format the result is rounded to (None keeps it).  ``saturate``: clamp overflow to the
    largest finite value instead of inf/NaN (operands without scaling and the output).
    ``rounding``: the rounding mode of operands, accumulator and output; ``srbits``: its number
    of random bits when stochastic (None: every dropped bit; e.g. ``rounding="stochastic",
    srbits=8``, docs/stochastic.md).  ``flush``: False keeps nonzero operand values that round to zero at their FP32 value (an
    ablation that removes underflow, not a real format).  ``full_subnormals``: values below the
    smallest normal that do not flush keep the format's full mantissa width, as if its exponent
    range went on downwards (an ablation that removes the precision subnormals lose; needs
    ``scaling='none'`` and a floating-point format).
    """

    inputs: FormatLike | None = None
    weights: FormatLike | None = None
    _: dataclasses.KW_ONLY
    name: str = ""
    scaling: str = "none"
    accum: str = "fp32"
    order: str | None = None
    chunk: int | None = None
    tensor_core: str | None = None
    output: FormatLike | None = None
    saturate: bool = False
    rounding: str = "rne"
    flush: bool = True
    scale_rounding: str | None = None
    full_subnormals: bool = False
    srbits: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"Recipe name must be a string, got {self.name!r}")
        check_saturate(self.saturate)
        check_srbits(self.srbits, check_mode(self.rounding))
        for flag in ("flush", "full_subnormals"):     # "no" would count as True
            check_flag(getattr(self, flag), flag)
        accum = get_format(self.accum).name
        if accum in NATIVE:                          # "FP32", "float32": torch's native sum too
            object.__setattr__(self, "accum", accum)
        if self.scaling not in SCALINGS:
            raise ValueError(
                f"recipe {self.name!r}: scaling {self.scaling!r} is not one of {SCALINGS}"
            )
        for fmt in (self.inputs, self.weights):
            if fmt is None:
                continue
            if self.scaling == "block":
                mx.get_mx_format(fmt)
            elif isinstance(fmt, str) and fmt.lower() in mx.MX_FORMATS:
                raise ValueError(
                    f"recipe {self.name!r}: {fmt} is a block format; use scaling='block'"
                )
            else:
                try:
                    get_format(fmt)
                except ValueError as e:
                    raise ValueError(
                        f"Recipe: {str(e).rstrip('.')}. The positional arguments are the "
                        "operand formats (inputs, weights); a label goes in name=..."
                    ) from None
        if self.scaling != "none" and self.inputs is None:
            raise ValueError(
                f"recipe {self.name!r}: scaling {self.scaling!r} needs an input format"
            )
        if self.output is not None:
            get_format(self.output)
        if self.full_subnormals and (
            self.scaling != "none" or any(
                get_format(f).is_int for f in (self.inputs, self.weights) if f is not None
            )
        ):
            raise ValueError(
                f"recipe {self.name!r}: full_subnormals is an ablation of unscaled "
                "floating-point operands; use scaling='none' and an eXmY format"
            )
        if (self.order == "tensor_core") != (self.tensor_core is not None):
            raise ValueError(
                f"recipe {self.name!r}: order='tensor_core' goes with a tensor_core preset"
            )
        if not self.name:
            object.__setattr__(self, "name", self.describe())

    def describe(self) -> str:
        """A name made of the fields that differ from plain FP32: operand formats (``"e4m3"``,
        ``"e4m3*e5m2"`` when the weights differ), ``/scaling``, then ``acc=``, the order and
        chunk, ``out=`` and the ablations (``sat``, ``no-flush``, ...).

        >>> Recipe("e4m3", scaling="tensor").describe(), Recipe(accum="fp64").describe()
        ('e4m3/tensor', 'fp64')
        """
        if self.plain:
            return self.accum
        ops = format_name(self.inputs) or "fp32"
        w = format_name(self.weights)
        if w is not None and w != ops:
            ops += f"*{w}"
        words = [ops if self.scaling == "none" else f"{ops}/{self.scaling}"]
        if self.emulated or self.accum != "fp32":
            acc = f"acc={format_name(self.accum)}"
            acc += "" if self.order is None else f" {self.order}"
            acc += "" if self.tensor_core is None else f"={self.tensor_core}"
            words.append(acc if self.chunk is None else f"{acc}/{self.chunk}")
        if self.output is not None:
            words.append(f"out={format_name(self.output)}")
        for flag, word in ((self.saturate, "sat"), (not self.flush, "no-flush"),
                           (self.full_subnormals, "full-subnormals")):
            if flag:
                words.append(word)
        if self.rounding != "rne":
            words.append(self.rounding)
        if self.scale_rounding is not None:
            words.append(f"scale={self.scale_rounding}")
        return " ".join(words)

    @property
    def emulated(self) -> bool:
        """True when the accumulation needs :func:`fpsim.matmul` (not torch's FP32/FP64 matmul)."""
        return self.order is not None or self.accum not in NATIVE

    @property
    def plain(self) -> bool:
        """True for plain FP32 or FP64 arithmetic: no format anywhere, a native accumulator."""
        return (
            self.inputs is None
            and self.weights is None
            and self.output is None
            and not self.emulated
        )

    @property
    def weight_format(self) -> FormatLike | None:
        return self.inputs if self.weights is None else self.weights

    def to_json(self) -> dict[str, Any]:
        """The recipe's fields with formats as names."""
        d = dataclasses.asdict(self)
        for key in ("inputs", "weights", "output"):
            d[key] = format_name(getattr(self, key))
        return d


FP32 = Recipe()
FP64 = Recipe(accum="fp64")


@dataclass(frozen=True)
class Rule:
    """``recipe`` for the sites whose module path matches the glob ``path`` (``fnmatch``:
    ``"*"`` any path, ``"model.layers.*.mlp.*"``, ``""`` the root module) and whose op kind is
    ``kind`` (one of ``KINDS``; None: any kind).  ``recipe=None`` leaves those sites to torch."""

    recipe: Recipe | None
    path: str = "*"
    kind: str | None = None

    def __post_init__(self) -> None:
        if self.kind is not None and self.kind not in KINDS:
            raise ValueError(f"rule kind {self.kind!r} is not one of {KINDS} (or None: any)")

    def matches(self, path: str, kind: str) -> bool:
        """True when this rule applies to an op of ``kind`` in the module at ``path``."""
        return (self.kind is None or self.kind == kind) and fnmatch.fnmatchcase(path, self.path)


@dataclass(frozen=True)
class Rules:
    """Per-site recipes: the first of ``rules`` that matches a site gives its recipe, else
    ``default`` (the deterministic FP32 reference; None leaves unmatched sites to torch).

    For example "linear layers in E4M3 with per-tensor scaling, attention in BF16, norms in
    FP32"::

        Rules([Rule(Recipe("e4m3", scaling="tensor"), kind="linear"),
               Rule(Recipe("bf16", output="bf16"), kind="attention")])
    """

    rules: Sequence[Rule] = ()
    default: Recipe | None = FP32

    def __post_init__(self) -> None:
        bad = [r for r in self.rules if not isinstance(r, Rule)]
        if bad:
            raise TypeError(f"Rules takes Rule objects, got {bad[0]!r}: wrap it as Rule(recipe, "
                            "path=..., kind=...)")
        object.__setattr__(self, "rules", tuple(self.rules))

    def select(self, path: str, kind: str) -> Recipe | None:
        """The recipe of an op of ``kind`` in the module at ``path`` (None: torch computes it)."""
        for rule in self.rules:
            if rule.matches(path, kind):
                return rule.recipe
        return self.default

    @classmethod
    def of(cls, recipe: "Recipe | Rules") -> "Rules":
        """``recipe`` for every site, or ``recipe`` itself when it is already Rules."""
        if isinstance(recipe, Rules):
            return recipe
        if not isinstance(recipe, Recipe):
            raise TypeError(f"expected a Recipe or Rules, got {type(recipe).__name__}")
        return cls((), default=recipe)
