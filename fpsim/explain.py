"""Explain a value: its bit fields, class, exact decoded value and rounding error in a format.

Blocks too: a block format stores one scale code per block (E8M0 for MX, E4M3 for NVFP4, which
also has a float32 tensor scale) and one small code per element; a value is element x scale (x
tensor scale).  ``explain_block`` quantizes values as ``fpsim.mx.quantize`` does (one
row, zero-padded to whole blocks) and describes each block's scale code and each element's code
with ``explain_code``, so the bits shown are the ones ``mx.quantize`` stores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from .backend import is_torch
from .blockrules import BlockFormat, get_block_format, is_block_format_name
from .convert import decode, encode
from .formats import Format, get_format
from .inputs import check_input


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

    @property
    def overflow(self) -> bool:
        """A finite input that became inf or NaN: beyond the format's range (not saturated)."""
        return math.isfinite(self.x) and not math.isfinite(self.value)

    @property
    def underflow(self) -> bool:
        """A non-zero input that became zero in a float format."""
        return math.isfinite(self.x) and self.x != 0 and self.value == 0 and not self.fmt.is_int

    def render(self, color: bool = False, cli: bool = False) -> str:
        """The one-line picture: fields, significand, value and error (see ``str()``), and a
        word on overflow, underflow to zero and NaN into a format without NaN, whose fix is
        spelled for Python or, with ``cli``, for the command line."""
        parts = [self.layout(color)]
        sig = self.significand()
        if sig:
            parts.append(f"  = {sig}")
        parts.append(f" = {_show(self.value)}" if sig else f"  = {_show(self.value)}")
        if self.underflow:
            parts.append(f"  (error {self.error:+.3g}: underflow to 0, the smallest non-zero "
                         f"value is {_show(self.fmt.min_subnormal)})")
        elif self.kind not in ("nan",) and self.error == self.error:
            parts.append(f"  (error {self.error:+.3g})" if self.error else "  (exact)")
        elif self.overflow:
            top = _show(math.copysign(self.fmt.max, self.x))
            parts.append(f"  (overflow: the largest finite value is {_show(self.fmt.max)}; "
                         f"{'--saturate' if cli else 'saturate=True'} gives {top})")
        elif self.x != self.x and self.kind != "nan":
            fix = "as fpsim quantize --nan-to-zero stores it" if cli else \
                "as encode(on_nan='zero') does"
            parts.append(f"  (NaN input: {self.fmt.name} has no NaN code; shown as 0, {fix})")
        return "".join(parts)


#: ANSI colours of the sign, exponent and mantissa fields (magenta, green, cyan).
_FIELD_COLORS = ("35", "32", "36")


def _show(v: float, float32: bool = False) -> str:
    """``v`` in short: a whole number without ``.0``, else the shortest decimal that reads back
    as the same float64 (``float32``: the same float32, for a value that is one)."""
    if v != v:
        return "nan"
    if v in (float("inf"), float("-inf")):
        return "+inf" if v > 0 else "-inf"
    if v == 0:
        return "-0" if math.copysign(1.0, v) < 0 else "0"
    if v == int(v) and abs(v) < 2**53:
        return str(int(v))
    return str(np.float32(v)) if float32 else repr(v)


class Explanations(tuple):
    """The ``Explanation`` of each of several values in one format (what ``explain``
    gives for more than one number); ``str()`` draws one line each, led by the value."""

    narrow = False      # inputs of float32 or narrower, shown by their shortest float32 decimal

    def lines(self, color: bool = False, cli: bool = False) -> list[str]:
        """One line per value (``color``, ``cli``: as ``Explanation.render``)."""
        shown = [_show(e.x, self.narrow) for e in self]
        width = max(map(len, shown))
        return [f"{x:>{width}}  {e.render(color, cli)}" for x, e in zip(shown, self)]

    def render(self, color: bool = False, cli: bool = False) -> str:
        return "\n".join(self.lines(color, cli))

    def __str__(self) -> str:
        return self.render()


def explain(x: Any, fmt: str | Format | BlockFormat, rounding: str = "rne",
            **options: Any) -> Any:
    """Round the scalar ``x`` (a number, or an array or tensor of one element) to ``fmt`` and
    describe the result field by field: an ``Explanation``, whose ``str()`` is one line.
    Several numbers (a 1-D sequence) give an ``Explanations``, one line each.

    With a block format (``"mxfp4"``, ``"nvfp4"``...: ``fpsim.mx.BLOCK_FORMATS``), ``x``
    may hold several values, quantized together in blocks: a
    ``BlockExplanation`` shows each block's scale bits and each
    element's bits and value (``options`` then go to [``fpsim.mx.quantize``][]).

    >>> import fpsim
    >>> print(fpsim.explain(0.1, "bf16"))
    0 | 01111011 | 1001101  = +1.1001101b × 2^-4 = 0.10009765625  (error +9.77e-05)
    >>> fpsim.explain(500.0, "e4m3", saturate=True).value      # OCP E4M3's largest: 448
    448.0
    >>> print(fpsim.explain([0.5, -3.0], "mxfp4").lines()[1])
      block scale  01111110  = 0.5
    >>> print(fpsim.explain([1000, 0.1, 1e-9], "e4m3"))
     1000  0 | 1111 | 111  = nan  (overflow: the largest finite value is 448; saturate=True gives 448)
      0.1  0 | 0011 | 101  = +1.101b × 2^-4 = 0.1015625  (error +0.00156)
    1e-09  0 | 0000 | 000  = 0  (error -1e-09: underflow to 0, the smallest non-zero value is 0.001953125)
    """
    if isinstance(fmt, BlockFormat) or is_block_format_name(fmt):
        return explain_block(x, fmt, rounding=rounding, **options)
    fmt = get_format(fmt)
    v = check_input(x)
    v = v.detach() if is_torch(v) else np.asarray(v)
    if math.prod(v.shape) != 1:
        if v.ndim != 1 or not v.shape[0]:
            raise ValueError(f"explain describes one number or a 1-D sequence of them; x has "
                             f"shape {tuple(v.shape)}: pass one element or a row, e.g. x[0]")
        many = Explanations(explain(item, fmt, rounding, **options) for item in v)
        many.narrow = _narrow(v)
        return many
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


@dataclass(frozen=True)
class BlockElement:
    """One element of a block: its input, its element code's explanation, its value."""

    x: float
    element: Explanation     # the code in the element format (MXINT8: before its 2^-6)
    value: float             # element x scale, exact (NVFP4: x tensor scale, the float32
                             # value dequantize() gives, as torchao computes it)
    error: float             # value - x, exact then rounded to float64 (nan where undefined)


@dataclass(frozen=True)
class BlockExplanation:
    """The blocks of some values in a block format; ``str()`` draws them, one line each."""

    fmt: BlockFormat
    scales: tuple[Explanation, ...]            # one per block
    elements: tuple[tuple[BlockElement, ...], ...]   # per block, the given values only
    padding: int                               # zero elements added to fill the last block
    block_size: int
    tensor_scale: float | None = None          # NVFP4's float32 scale of the whole tensor
    narrow: bool = False                       # inputs of float32 or narrower: shown as such

    def lines(self, color: bool = False) -> list[str]:
        """The picture, line by line (``color``: ANSI-coloured bit fields).  NVFP4's tensor
        scale and values are float32, shown by the shortest decimal that reads back as the
        same float32."""
        f = self.fmt
        ts = self.tensor_scale
        head = (f"{f.name}: {f.elem.name} elements, {f.scale.name} scale per {self.block_size}; "
                f"value = element x scale{'' if ts is None else ' x tensor scale (float32)'}")
        if self.padding:
            head += f" (last block padded with {self.padding} zero{'s' * (self.padding > 1)})"
        out = [head]
        wide = ts is None                        # MX: exact float64 values; NVFP4: float32

        def show(v: float) -> str:
            return _show(v, float32=not wide)

        if ts is not None:
            out.append(f"  tensor scale (float32)  {show(ts)}")
        xw = max((len(_show(e.x, self.narrow)) for b in self.elements for e in b), default=1)
        for i, (scale, elems) in enumerate(zip(self.scales, self.elements)):
            label = f"block {i}" if len(self.scales) > 1 else "block"
            out.append(f"  {label} scale  {scale.layout(color)}  = {_show(scale.value)}")
            bw = max(len(e.element.layout()) for e in elems)
            for e in elems:
                pad = " " * (bw - len(e.element.layout()))
                err = "" if e.error != e.error else \
                    ("  (exact)" if e.error == 0 else f"  (error {e.error:+.3g})")
                out.append(f"    {_show(e.x, self.narrow):>{xw}}  {e.element.layout(color)}{pad}  "
                           f"= {_show(_element_value(f, e.element))} x {_show(scale.value)}"
                           f"{'' if ts is None else ' x ' + show(ts)} = {show(e.value)}{err}")
        return out

    def render(self, color: bool = False) -> str:
        return "\n".join(self.lines(color))

    def __str__(self) -> str:
        return self.render()


def _element_value(fmt: BlockFormat, e: Explanation) -> float:
    """The element code's value in the block's units (MXINT8: k x 2^-6)."""
    return e.value * 2.0**fmt.elem_exp


def explain_block(x: Any, fmt: str | BlockFormat, **options: Any) -> BlockExplanation:
    """Quantize the values ``x`` (a number or a 1-D sequence) to the block format ``fmt`` as
    one row, blocks of ``fmt.block_size`` in order, and describe the scale and element bits.

    ``options`` go to ``fpsim.mx.quantize`` (``rounding``, ``scale_rounding``,
    ``block_size``, ``tensor_scale``).

    >>> print(explain_block([1.0, 0.3, -2.0, 5.0], "mxfp4"))   # doctest: +NORMALIZE_WHITESPACE
    mxfp4: fp4_e2m1 elements, e8m0 scale per 32; value = element x scale (last block padded with 28 zeros)
      block scale  01111111  = 1
          1  0 | 01 | 0  = 1 x 1 = 1  (exact)
        0.3  0 | 00 | 1  = 0.5 x 1 = 0.5  (error +0.2)
         -2  1 | 10 | 0  = -2 x 1 = -2  (exact)
          5  0 | 11 | 0  = 4 x 1 = 4  (error -1)
    """
    from . import mx

    spec = get_block_format(fmt)
    v = check_input(x)
    narrow = _narrow(v)
    v = v.detach().cpu().double().numpy() if is_torch(v) else np.asarray(v, dtype=np.float64)
    if v.ndim > 1:
        raise ValueError(f"explain shows one row of blocks; x has shape {v.shape}: pass a 1-D "
                         "slice, e.g. x[0]")
    v = v.reshape(-1)
    if not v.size:
        raise ValueError("explain needs at least one value")
    q = mx.quantize(v, spec, **options)
    values = np.asarray(q.dequantize(np.float64 if spec.is_mx else np.float32), np.float64)
    size = q.block_size
    scales = tuple(explain_code(int(c), spec.scale) for c in np.asarray(q.scales).reshape(-1))
    elements = tuple(
        tuple(_element(float(v[i]), int(q.codes[i]), float(values[i]), spec)
              for i in range(b * size, min((b + 1) * size, v.size)))
        for b in range(len(scales)))
    return BlockExplanation(spec, scales, elements, -v.size % size, size, q.tensor_scale,
                            narrow)


def _narrow(v: Any) -> bool:
    """Whether the array or tensor ``v`` holds floats of float32 or fewer bits, whose values
    are shown by their shortest float32 decimal (0.1, not 0.10000000149011612)."""
    if is_torch(v):
        return v.is_floating_point() and v.element_size() <= 4
    dtype = np.asarray(v).dtype
    return dtype.kind in "fV" and dtype.itemsize <= 4


def _element(x: float, code: int, value: float, spec: BlockFormat) -> BlockElement:
    if all(np.isfinite((x, value))):
        error = float(Fraction(value) - Fraction(x))
    else:
        error = float("nan") if value != x else 0.0
    return BlockElement(x, explain_code(code, spec.elem), value, error)
