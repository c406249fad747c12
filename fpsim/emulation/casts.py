"""How one operand of a GEMM is quantized, and what a site's backward GEMMs do (NumPy only).

A training recipe runs three GEMMs per layer: forward ``y = x @ W``, input gradient
``dx = dy @ W^T`` and weight gradient ``dW = x^T @ dy``, each reducing along its own axis.
A ``Cast`` says how one operand is quantized along the reduction axis of the GEMM it
enters; ``Backward`` gives a ``fpsim.emulation.recipe.Recipe`` its backward GEMMs
(the gradient's cast, optional casts of ``x`` and ``W`` for them, the random Hadamard
transform of the weight-gradient operands and the accumulator).  The arithmetic (torch) is in
``fpsim.emulation.quantizers`` and ``fpsim.emulation.backward``; the published
recipes are data in ``fpsim.emulation.presets``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .. import mx
from ..arith.accumulator import Accumulator
from ..blockrules import is_block_format_name
from ..formats import Format, get_format
from ..inputs import check_flag
from ..rounding import check_mode
from ..stochastic import check_srbits


@dataclass(frozen=True)
class Scaling:
    """One scaling of a ``Cast``: what it does (``doc``), whether a
    ``fpsim.emulation.recipe.Recipe``'s ``scaling=`` takes it (``recipe``: it applies to any
    operand and keeps no state from call to call), whether a quantized tensor's values are the
    same whichever axis a GEMM reduces (``axis_free``: quantized once, reused by every GEMM),
    whether its format is an MX / NVFP4 block format (``block``), whether ``fpsim quantize
    --scaling`` takes it (``cli``: ``fpsim.scaled_quantize``'s, no reduction axis) and whether
    its amax comes from a calibration run, per site (``calibrated``: ``fpsim.emulate(...,
    amax=)``, ``fpsim.emulation.Calibration``), and whether its scales can be powers of two
    (``pow2``: a ``Cast``'s ``pow2=True``)."""

    doc: str
    recipe: bool = False
    axis_free: bool = False
    block: bool = False
    cli: bool = False
    calibrated: bool = False
    pow2: bool = False


#: Every scaling, the one table: fpsim's own (scale = amax / format max, values = code *
#: scale, as ``fpsim.scaled_quantize``; applied by
#: ``fpsim.emulation.sites.quantize_cast``) and Transformer Engine / torchao's (scale =
#: format max / amax in FP32, codes = cast(x * scale) saturated, values = code / scale in
#: FP32; applied by ``fpsim.emulation.quantizers.cast``).  A new scaling is an entry here
#: and its code in one of those two functions (``tests/test_training_presets.py`` checks that
#: every entry is applied); ``fpsim quantize --scaling`` (``cli``) and the range-vs-precision
#: study (``recipe`` and ``axis_free``) take their lists from it.
SCALINGS: dict[str, Scaling] = {
    "none": Scaling("values rounded to the format, no scale", recipe=True, axis_free=True,
                    cli=True),
    "tensor": Scaling("one amax scale per tensor", recipe=True, axis_free=True, cli=True,
                      pow2=True),
    "site": Scaling("one amax scale per site and operand, the same at every call: the "
                    "operand's largest |value| at that site in a calibration run / format "
                    "max; a value beyond it overflows (or saturates)", recipe=True,
                    axis_free=True, calibrated=True, pow2=True),
    "channel": Scaling("one amax scale per index beside the reduction axis", recipe=True,
                       cli=True, pow2=True),
    "block": Scaling("MX / NVFP4 blocks along the reduction axis", recipe=True, block=True,
                     cli=True),
    "tile": Scaling("DeepSeek-V3: amax scales per 1 x 128 tile along the reduction axis (a "
                    "Recipe's right operand: 128 x 128, tile2d)", recipe=True),
    "tile2d": Scaling("DeepSeek-V3: amax scales per 128 x 128 block"),
    "block2d": Scaling("NVFP4 16 x 16 blocks: the same values whichever axis a GEMM reduces",
                       block=True),
    "tensorwise": Scaling("TE / torchao: one scale per tensor from its amax", axis_free=True,
                          pow2=True),
    "rowwise": Scaling("TE / torchao: one scale per index beside the reduction axis",
                       pow2=True),
    "delayed": Scaling("TE DelayedScaling: the scale from the amax history of earlier calls",
                       axis_free=True),
}


@dataclass(frozen=True)
class Cast:
    """How one GEMM operand is quantized (see ``SCALINGS``): the one description of a
    cast, which recipes (``fpsim.emulation.recipe.Recipe.cast``), backward settings,
    presets and weight caches (it is hashable) use.

    ``fmt``: an eXmY format (an MX / NVFP4 name for ``block`` / ``block2d``); ``rounding``:
    ``rne``, ``stochastic`` (random bits from torch's global generator: ``torch.manual_seed``
    makes a run repeatable) or any other mode of [``fpsim.quantize``][]; ``srbits``: the
    number of random bits of a stochastic rounding (None: all, docs/stochastic.md);
    ``saturate``: clamp at the format's largest value (the scaled casts of TE and torchao
    always saturate); ``pow2``: every scale a power of two, the one that keeps the amax
    within the format's largest value (torchao's ``round_scales_to_power_of_2``, which rounds
    its multiplier max / amax down; fpsim's own scalings take the smallest power of two at or
    above amax / max, ``fpsim.scaled_quantize``'s ``scale_dtype="e8m0"``); ``history`` and
    ``margin``: delayed scaling's amax history length and margin in binades (TE
    ``DelayedScaling``); ``scale_rounding``: the MX scale rule (None: OCP floor);
    ``full_subnormals`` and ``flush=False``: the ablations of
    ``fpsim.emulation.recipe.Recipe`` (subnormals at full width, flushed values kept);
    ``amax``: a ``site`` cast's calibrated largest |value|, its scale ``amax / format max`` in
    FP32 as per-tensor scaling's (``fpsim.emulate`` fills it per site from its ``amax=``).

    >>> Cast("e5m2", "tensorwise", saturate=True).describe()
    'e5m2/tensorwise sat'
    """

    fmt: str | Format
    scaling: str = "none"
    rounding: str = "rne"
    saturate: bool = False
    pow2: bool = False
    history: int = 1024
    margin: int = 0
    scale_rounding: str | None = None
    srbits: int | None = None
    full_subnormals: bool = False
    flush: bool = True
    amax: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "rounding", check_mode(self.rounding))
        check_srbits(self.srbits, self.rounding)
        for flag in ("saturate", "pow2", "full_subnormals", "flush"):
            check_flag(getattr(self, flag), flag)
        if self.scaling == "none" and is_block_format_name(self.fmt):
            object.__setattr__(self, "scaling", "block")    # a block format's only scaling
        if self.scaling not in SCALINGS:
            raise ValueError(f"Cast scaling {self.scaling!r} is not one of {tuple(SCALINGS)}")
        if self.pow2 and not SCALINGS[self.scaling].pow2:
            raise ValueError(f"Cast(pow2=True) rounds scales to powers of two, and a "
                             f"{self.scaling!r} cast has none of its own to round: use one of "
                             f"{tuple(k for k, v in SCALINGS.items() if v.pow2)}, or drop pow2")
        if SCALINGS[self.scaling].block:
            spec = mx.get_mx_format(self.fmt)
            if self.scaling == "block2d" and spec.is_mx:
                raise ValueError("block2d is NVFP4's 16 x 16 weight blocks: use fmt='nvfp4'")
        elif is_block_format_name(self.fmt):
            raise ValueError(f"{self.fmt} is a block format, scaled by its blocks; leave "
                             f"scaling out (or 'block', 'block2d'), not {self.scaling!r}")
        elif get_format(self.fmt).is_int and self.scaling in ("tensorwise", "rowwise",
                                                               "delayed"):
            raise ValueError(f"{self.scaling} scaling casts to a floating-point format, "
                             f"not {self.fmt}")
        if self.full_subnormals and (self.scaling != "none" or get_format(self.fmt).is_int):
            raise ValueError(f"Cast({self.fmt!r}, {self.scaling!r}, full_subnormals=True): "
                             "full_subnormals is an ablation of unscaled floating-point "
                             "operands; use scaling='none' and an eXmY format")
        if self.amax is not None and (self.scaling != "site" or isinstance(self.amax, bool)
                                      or not isinstance(self.amax, (int, float))
                                      or not 0 <= self.amax < math.inf):
            raise ValueError(f"Cast({self.fmt!r}, {self.scaling!r}, amax={self.amax!r}): amax "
                             "is a site cast's calibrated largest |value|, a finite number "
                             ">= 0 with scaling='site'")
        if not (isinstance(self.history, int) and self.history >= 1):
            raise ValueError(f"history={self.history!r}: the amax history holds >= 1 steps")
        if not (isinstance(self.margin, int) and -127 <= self.margin <= 127):
            raise ValueError(f"margin={self.margin!r}: a whole number of binades")

    @property
    def name(self) -> str:
        """The format's name."""
        return self.fmt if isinstance(self.fmt, str) else self.fmt.name

    def describe(self) -> str:
        """A short label: format, scaling and the options that differ from the defaults."""
        words = [self.name if self.scaling == "none" else f"{self.name}/{self.scaling}"]
        if self.scaling == "delayed":
            words.append(f"h={self.history}" + (f" m={self.margin}" if self.margin else ""))
        for flag, word in ((self.saturate, "sat"), (self.pow2, "pow2"),
                           (self.rounding != "rne", self.rounding),
                           (self.srbits is not None, f"srbits={self.srbits}"),
                           (self.full_subnormals, "full-subnormals"),
                           (not self.flush, "no-flush")):
            if flag:
                words.append(word)
        return " ".join(words)


@dataclass(frozen=True)
class Backward:
    """The backward GEMMs of a site: ``dx = dy @ W^T`` and ``dW = x^T @ dy``.

    ``grad``: the cast of the output gradient ``dy`` in both (None: kept in the working
    precision).  ``inputs`` / ``weights``: casts of ``x`` in the weight-gradient GEMM and of
    ``W`` in the input-gradient GEMM (None: the forward's own settings, applied along the
    backward GEMM's reduction axis, as Transformer Engine re-quantizes a weight along the other
    axis for dgrad).  ``hadamard``: size of the random Hadamard transform applied to both
    operands of the weight-gradient GEMM along its reduction axis before they are quantized
    (0: none; NVFP4 training uses 16), its signs drawn from ``hadamard_seed``.  ``accum``:
    the backward GEMMs' [``fpsim.Accumulator``][] (a format name is shorthand for
    ``Accumulator(name)``; None: the forward's), summing with round-to-nearest-even.

    >>> Backward(grad=Cast("e5m2"), accum=Accumulator("bf16", "pairwise")).describe()
    'grad=e5m2 acc=bf16 pairwise'
    """

    grad: Cast | None = None
    inputs: Cast | None = None
    weights: Cast | None = None
    hadamard: int = 0
    hadamard_seed: int = 0
    accum: Accumulator | None = None

    def __post_init__(self) -> None:
        for role in ("grad", "inputs", "weights"):
            c = getattr(self, role)
            if c is not None and not isinstance(c, Cast):
                raise TypeError(f"Backward {role}= takes a Cast (or None), not {c!r}: "
                                f"Cast({c!r}) rounds without scaling")
        if self.accum is not None and not isinstance(self.accum, Accumulator):
            if not isinstance(self.accum, (str, Format)):
                raise TypeError(f"Backward accum= takes an Accumulator (or a format name, or "
                                f"None), not {self.accum!r}")
            object.__setattr__(self, "accum", Accumulator(self.accum))
        h = self.hadamard
        if not (isinstance(h, int) and not isinstance(h, bool) and (h == 0 or (
                h >= 4 and h & (h - 1) == 0 and h.bit_length() % 2 == 1))):
            raise ValueError(f"hadamard={h!r}: a power of four (16 for NVFP4: its 1/sqrt(n) "
                             "is then a power of two), or 0 for none")

    def describe(self) -> str:
        """A short label of what differs from the default."""
        words = [] if self.grad is None else [f"grad={self.grad.describe()}"]
        for role in ("inputs", "weights"):
            c = getattr(self, role)
            if c is not None:
                words.append(f"{role}={c.describe()}")
        if self.hadamard:
            words.append(f"rht{self.hadamard}")
        if self.accum is not None:
            words.append(f"acc={self.accum.describe()}")
        return " ".join(words) or "default"


def cast_name(c: Any) -> str | None:
    """The label of a Cast, the name of a format (None stays None)."""
    if c is None:
        return None
    if isinstance(c, Cast):
        return c.describe()
    return c if isinstance(c, str) else c.name
