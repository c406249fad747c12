"""Explain a value: its bit fields, class, exact decoded value and rounding error in a format."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from .backend import is_torch
from .blockrules import BLOCK_FORMATS, BlockFormat
from .convert import decode, encode
from .formats import Format, get_format
from .inputs import check_input
from .names import normalize


@dataclass(frozen=True)
class Explanation:
    """The layout of ``x`` rounded to ``fmt``; ``str()`` gives a one-line picture of it."""

    x: float
    fmt: Format
    code: int
    sign: str
    exponent: str
    mantissa: str
    unbiased_exponent: int | None
    kind: str  # "zero", "subnormal", "normal", "inf", "nan" (or "integer")
    value: float
    error: float  # value - x, exact then rounded to float64

    @property
    def fields(self) -> tuple[str, str, str]:
        return self.sign, self.exponent, self.mantissa

    def layout(self, color: bool = False) -> str:
        """The fields separated by bars (empty fields left out), ANSI-coloured if ``color``."""
        paint = (lambda f, c: f"\033[{c}m{f}\033[0m") if color else (lambda f, c: f)
        return " | ".join(paint(f, c) for f, c in zip(self.fields, _FIELD_COLORS) if f)

    def significand(self) -> str:
        """The value as ±1.fffb × 2^e (or 0.fffb for subnormals), where it is a float."""
        sgn = "-" if self.sign == "1" else "+"
        if self.kind in ("normal", "subnormal"):
            lead = "1" if self.kind == "normal" else "0"
            frac = f".{self.mantissa}" if self.mantissa else ""
            return f"{sgn}{lead}{frac}b × 2^{self.unbiased_exponent}"
        return ""

    def __str__(self) -> str:
        return self.render()

    def render(self, color: bool = False) -> str:
        """The one-line picture: fields, significand, value and error (see ``str()``)."""
        parts = [self.layout(color)]
        sig = self.significand()
        if sig:
            parts.append(f"  = {sig}")
        parts.append(f" = {_show(self.value)}" if sig else f"  = {_show(self.value)}")
        if self.kind not in ("nan",) and self.error == self.error:
            parts.append(f"  (error {self.error:+.3g})" if self.error else "  (exact)")
        elif self.x != self.x and self.kind != "nan":
            parts.append(f"  (NaN input: {self.fmt.name} has no NaN code; encode(on_nan='zero') "
                         "gives 0)")
        return "".join(parts)


#: ANSI colours of the sign, exponent and mantissa fields (magenta, green, cyan).
_FIELD_COLORS = ("35", "32", "36")


def _show(v: float) -> str:
    if v != v:
        return "nan"
    if v in (float("inf"), float("-inf")):
        return "+inf" if v > 0 else "-inf"
    if v == 0:
        return "-0" if math.copysign(1.0, v) < 0 else "0"
    if v == int(v) and abs(v) < 2**53:
        return str(int(v))
    return repr(v)


def explain(x: Any, fmt: str | Format | BlockFormat, rounding: str = "rne",
            **options: Any) -> Any:
    """Round the scalar ``x`` (a number, or an array or tensor of one element) to ``fmt`` and
    describe the result field by field: an :class:`Explanation`, whose ``str()`` is one line.

    With a block format (``"mxfp4"``, ``"nvfp4"``...: :data:`fpsim.mx.BLOCK_FORMATS`), ``x``
    may hold several values, quantized together in blocks: a
    :class:`fpsim.blockexplain.BlockExplanation` shows each block's scale bits and each
    element's bits and value (``options`` then go to :func:`fpsim.mx.quantize`).

    >>> import fpsim
    >>> print(fpsim.explain(0.1, "bf16"))
    0 | 01111011 | 1001101  = +1.1001101b × 2^-4 = 0.10009765625  (error +9.77e-05)
    >>> fpsim.explain(500.0, "e4m3", saturate=True).value      # OCP E4M3's largest: 448
    448.0
    >>> print(fpsim.explain([0.5, -3.0], "mxfp4").lines()[1])
      block scale  01111110  = 0.5
    """
    if isinstance(fmt, BlockFormat) or (isinstance(fmt, str) and normalize(fmt) in BLOCK_FORMATS):
        from .blockexplain import explain_block

        return explain_block(x, fmt, rounding=rounding, **options)
    fmt = get_format(fmt)
    v = check_input(x)
    v = v.detach() if is_torch(v) else np.asarray(v)
    if math.prod(v.shape) != 1:
        raise ValueError(f"explain describes one number; x has shape {tuple(v.shape)}: pass one "
                         "element, e.g. x[0]")
    item = v.reshape(-1)[0].item()                    # a Python int for integer dtypes
    xv = float(item)
    if isinstance(item, int) and item != xv:
        raise ValueError(f"{item} is not a float64 exactly; explain rounds one float64 value")
    code = int(encode(xv, fmt, rounding=rounding, on_nan="zero", **options))
    return _describe(code, fmt, xv)


def explain_code(code: int, fmt: str | Format) -> Explanation:
    """Describe the code ``code`` of ``fmt`` (any code: NaN and inf codes included)."""
    fmt = get_format(fmt)
    if not 0 <= int(code) < fmt.num_codes:
        raise ValueError(f"code {code} out of range for {fmt.name}: {fmt.bits}-bit codes lie in "
                         f"[0, {fmt.num_codes - 1}]")
    return _describe(int(code), fmt, None)


def _describe(code: int, fmt: Format, xv: float | None) -> Explanation:
    """The Explanation of ``code``; its error is measured from ``xv`` (None: the value itself)."""
    value = float(decode(code, fmt))
    if xv is None:
        xv = value
    bits = format(code, f"0{fmt.bits}b")
    split_sign = fmt.signed and not fmt.is_int  # two's complement has no separate sign field
    s = bits[0] if split_sign else ""
    body = bits[1:] if split_sign else bits
    e, m = body[: fmt.ebits], body[fmt.ebits:]
    if fmt.is_int:
        kind, unb = "integer", None
    elif value != value:
        kind, unb = "nan", None
    elif value in (float("inf"), float("-inf")):
        kind, unb = "inf", None
    elif value == 0:
        kind, unb = "zero", None
    else:
        biased = int(e, 2) if e else 0
        if biased == 0 and fmt.zero:
            kind, unb = "subnormal", fmt.emin
        else:
            kind, unb = "normal", biased - fmt.bias
    if value == value and xv == xv and abs(value) != float("inf") and abs(xv) != float("inf"):
        error = float(Fraction(value) - Fraction(xv))
    else:
        error = float("nan") if value != xv else 0.0
    return Explanation(xv, fmt, code, s, e, m, unb, kind, value, error)
