"""The format model: one frozen dataclass describes every scalar number format.

A format is data: sign / exponent / mantissa widths, exponent bias, and the inf/NaN convention.
Every derived property (largest finite value, smallest subnormal, NaN code, ...) is computed from
those fields, so there is no second table to drift out of sync.  Integer formats are formats with
``ebits == 0``: ``mbits`` magnitude bits, two's complement when signed.
"""

from __future__ import annotations

import math
import operator
import os
import re
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any

from .inputs import check_flag
from .names import normalize, register, resolve, unknown_name_error  # noqa: F401 (old home)

NAN_CONVENTIONS = ("ieee", "fn", "fnuz", "none")


@dataclass(frozen=True)
class Format:
    """A binary number format.

    ``nan`` is one of ``"ieee"`` (all-ones exponent with non-zero mantissa is NaN, zero mantissa
    is inf), ``"fn"`` (only the all-ones code S.1..1.1..1 is NaN, no inf: OCP E4M3), ``"fnuz"``
    (the code of negative zero is the single NaN; no -0, no inf) or ``"none"``.
    ``zero=False`` marks formats without a zero whose exponent field 0 is an ordinary binade
    (OCP E8M0).  ``inf=True`` with ``nan="fn"`` or ``"fnuz"`` puts +-inf at the top magnitude
    code below the NaN (IEEE P3109's extended formats).  ``p3109=True`` takes the P3109 draft's
    rounding rules: ties-to-even and round-to-odd look at the last bit of the *code* (not of the
    significand: they differ only without fraction bits, P=1), and round-to-odd overflows like
    the nearest modes; unsigned formats with a zero treat negative results as an overflow
    below 0.  See [``p3109``][fpsim.formats.p3109] (the function).
    """

    name: str = field(compare=False)
    ebits: int
    mbits: int
    bias: int | None = None
    inf: bool = True
    nan: str = "ieee"
    subnormals: bool = True
    signed: bool = True
    zero: bool = field(default=True)
    p3109: bool = False

    def __post_init__(self) -> None:
        for key in ("ebits", "mbits", "bias"):        # NumPy integers become ints; 4.5 is refused
            value = getattr(self, key)
            if value is not None:
                object.__setattr__(self, key, _whole(value, key, self.name))
        for key in ("inf", "subnormals", "signed", "zero", "p3109"):    # "no" would be True
            object.__setattr__(self, key, check_flag(getattr(self, key),
                                                     f"Format {self.name!r}: {key}"))
        if self.bias is None:
            default = (1 - self.mbits) if self.ebits == 0 else 2 ** (self.ebits - 1) - 1
            object.__setattr__(self, "bias", default)
        _validate(self)

    # -- bit layout --------------------------------------------------------------------------
    @property
    def is_int(self) -> bool:
        """Integer format (``ebits == 0``): values are whole numbers, two's complement codes."""
        return self.ebits == 0

    @property
    def bits(self) -> int:
        return int(self.signed) + self.ebits + self.mbits

    @property
    def num_codes(self) -> int:
        return 2**self.bits

    @property
    def sign_mask(self) -> int:
        return (1 << (self.bits - 1)) if self.signed else 0

    @property
    def min_biased_exp(self) -> int:
        """Smallest biased exponent of a normal number: 1, or 0 for formats without zero."""
        return 1 if self.zero else 0

    @property
    def max_code(self) -> int:
        """Code magnitude (sign bit clear) of the largest finite value."""
        all_ones = 2 ** (self.ebits + self.mbits) - 1
        if self.nan == "ieee":
            return all_ones - 2**self.mbits  # the all-ones exponent holds inf and NaN
        if self.nan == "fn":
            return all_ones - 1 - self.inf  # S.1..1.1..1 is NaN (and inf just below: P3109)
        return all_ones - self.inf  # fnuz/none: every magnitude, or inf on top (P3109)

    @property
    def max_biased_exp(self) -> int:
        """Largest biased exponent field that still holds finite numbers."""
        return self.max_code >> self.mbits

    @property
    def inf_code(self) -> int | None:
        """Code magnitude of +inf: the one just above the largest finite value."""
        return self.max_code + 1 if self.inf else None

    @property
    def nan_code(self) -> int | None:
        """The canonical (quiet, positive) NaN code, or None for formats without NaN."""
        if self.nan == "ieee":
            if self.mbits == 0:
                return None
            return ((2**self.ebits - 1) << self.mbits) | (1 << (self.mbits - 1))
        if self.nan == "fn":
            return (2**self.ebits - 1) << self.mbits | (2**self.mbits - 1)
        if self.nan == "fnuz":
            return self.sign_mask
        return None

    @property
    def has_nan(self) -> bool:
        return self.nan_code is not None

    # -- values ------------------------------------------------------------------------------
    @property
    def emin(self) -> int:
        """Unbiased exponent of the smallest normal number (0 for integers)."""
        return 0 if self.is_int else self.min_biased_exp - self.bias

    @property
    def emax(self) -> int:
        """Unbiased exponent of the largest finite number."""
        if self.is_int:
            return self.mbits - 1
        return self.max_biased_exp - self.bias

    @property
    def max(self) -> float:
        """Largest finite value."""
        if self.is_int:
            return float(2**self.mbits - 1)
        frac = (self.max_code & (2**self.mbits - 1)) / 2**self.mbits
        return math.ldexp(1.0 + frac, self.emax)

    @property
    def min(self) -> float:
        """Most negative finite value (0 for unsigned formats)."""
        if not self.signed:
            return 0.0 if self.zero else self.min_normal
        return -float(2**self.mbits) if self.is_int else -self.max

    @property
    def min_normal(self) -> float:
        return 1.0 if self.is_int else math.ldexp(1.0, self.emin)

    @property
    def min_subnormal(self) -> float:
        """Smallest positive value (equal to ``min_normal`` without subnormals)."""
        if self.is_int or not self.subnormals or self.mbits == 0 or not self.zero:
            return self.min_normal
        return math.ldexp(1.0, self.emin - self.mbits)

    @property
    def eps(self) -> float:
        """Distance from 1 to the next larger value, 2^-mbits (1 for integers)."""
        return 1.0 if self.is_int else math.ldexp(1.0, -self.mbits)

    @property
    def dynamic_range(self) -> float:
        """Binades between the smallest and the largest positive finite value."""
        return math.log2(self.max) - math.log2(self.min_subnormal)

    def __str__(self) -> str:
        return self.name


def _whole(value: Any, key: str, name: str) -> int:
    """An integer field of a Format as an int, or a TypeError naming it."""
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise TypeError(f"invalid format {name!r}: {key}={value!r}: pass an integer") from None


def _validate(f: Format) -> None:
    why = None
    if f.nan not in NAN_CONVENTIONS:
        why = f"nan={f.nan!r} is not one of {NAN_CONVENTIONS}"
    elif f.ebits < 0 or f.mbits < 0:
        why = "ebits and mbits must be non-negative"
    elif f.bits > 64:
        why = f"{f.bits} bits: formats wider than 64 bits are not supported"
    elif f.bits < 1:
        why = "a format needs at least one bit"
    elif f.is_int:
        if f.inf or f.nan != "none":
            why = "integer formats (ebits=0) have no inf or NaN: pass inf=False, nan='none'"
        elif f.mbits < 1:
            why = "integer formats need at least one magnitude bit"
        elif f.mbits > 62:
            why = "integer formats wider than 63 bits are not supported"
    elif f.inf and f.nan == "none":
        why = "inf needs a NaN convention: nan='ieee', or 'fn'/'fnuz' (inf on the top code)"
    elif f.nan == "ieee" and f.ebits < 2:
        why = f"an IEEE-style format needs ebits >= 2 (e{f.ebits} leaves no normal binade)"
    elif f.nan == "fnuz" and not f.signed:
        why = "nan='fnuz' uses the negative-zero code, so the format must be signed"
    elif not f.zero and (f.signed or f.mbits or f.subnormals):
        why = "zero=False is for unsigned, mantissa-less scale formats (E8M0): set subnormals=False"
    if why is None and not f.is_int:
        # every value must be exactly representable in float64, the reference type
        if f.emax > 1023 or f.emin - (f.mbits if f.subnormals else 0) < -1074 or f.mbits > 52:
            why = (f"its range (2^{f.emin}..2^{f.emax}, {f.mbits} mantissa bits) exceeds float64's;"
                   " choose a smaller exponent, mantissa or bias")
        elif f.emax < f.emin:
            why = f"bias {f.bias} leaves no finite normal numbers"
    if why:
        raise ValueError(f"invalid format {f.name!r}: {why}")


def _ieee(name: str, e: int, m: int, **kw) -> Format:
    return Format(name, e, m, **kw)


def _fn(name: str, e: int, m: int, **kw) -> Format:
    return Format(name, e, m, inf=False, nan="fn", **kw)


def _int(name: str, magnitude_bits: int, signed: bool = True) -> Format:
    return Format(name, 0, magnitude_bits, inf=False, nan="none", signed=signed)


_NAMED = [
    _ieee("fp64", 11, 52),
    _ieee("fp32", 8, 23),
    _ieee("tf32", 8, 10),
    _ieee("bf16", 8, 7),
    _ieee("fp16", 5, 10),
    _fn("fp8_e4m3fn", 4, 3),
    _ieee("fp8_e5m2", 5, 2),
    Format("fp8_e4m3fnuz", 4, 3, bias=8, inf=False, nan="fnuz"),
    Format("fp8_e5m2fnuz", 5, 2, bias=16, inf=False, nan="fnuz"),
    Format("fp8_e4m3b11fnuz", 4, 3, bias=11, inf=False, nan="fnuz"),  # Graphcore's, as ml_dtypes
    _ieee("fp8_e4m3", 4, 3),
    _ieee("fp8_e3m4", 3, 4),
    Format("e8m0", 8, 0, bias=127, inf=False, nan="fn", subnormals=False, signed=False,
           zero=False),
    Format("fp6_e2m3", 2, 3, inf=False, nan="none"),
    Format("fp6_e3m2", 3, 2, inf=False, nan="none"),
    Format("fp4_e2m1", 2, 1, inf=False, nan="none"),
    _int("int8", 7),
    _int("int4", 3),
    _int("uint8", 8, signed=False),
]

#: Every named format, by canonical name.
FORMATS: dict[str, Format] = {f.name: f for f in _NAMED}

#: The family of each named format: who defines it, and how it encodes inf/NaN.
#: "IEEE-style": inf and NaN in the all-ones exponent, as IEEE 754 (the eXmY grammar's
#: default); "OCP": the Open Compute Project's FP8 (E4M3FN: no inf, one NaN) and MX formats;
#: "fnuz": NaN at the code of -0, no inf (AMD MI300, Graphcore); P3109: see ``p3109``.
FAMILIES: dict[str, str] = {
    "fp64": "IEEE 754", "fp32": "IEEE 754", "fp16": "IEEE 754",
    "tf32": "IEEE-style (NVIDIA)", "bf16": "IEEE-style (Google)",
    "fp8_e4m3fn": "OCP FP8", "fp8_e5m2": "OCP FP8 (IEEE-style)",
    "fp8_e4m3fnuz": "fnuz (AMD)", "fp8_e5m2fnuz": "fnuz (AMD)",
    "fp8_e4m3b11fnuz": "fnuz (Graphcore)",
    "fp8_e4m3": "IEEE-style", "fp8_e3m4": "IEEE-style",
    "e8m0": "OCP MX scale", "fp6_e2m3": "OCP MX", "fp6_e3m2": "OCP MX", "fp4_e2m1": "OCP MX",
    "int8": "integer", "int4": "integer", "uint8": "integer",
}

ALIASES: dict[str, str] = {
    "float64": "fp64", "double": "fp64",
    "float32": "fp32", "float": "fp32", "single": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16", "half": "fp16",
    # e4m3 is the well-known OCP name (E4M3FN, max 448), an alias, not the eXmY grammar's
    # IEEE-style format (max 240): spell that one e4m3_ieee (or fp8_e4m3)
    "e4m3": "fp8_e4m3fn", "e4m3fn": "fp8_e4m3fn", "float8_e4m3fn": "fp8_e4m3fn",
    "e5m2": "fp8_e5m2", "float8_e5m2": "fp8_e5m2",
    "e4m3fnuz": "fp8_e4m3fnuz", "float8_e4m3fnuz": "fp8_e4m3fnuz",
    "e5m2fnuz": "fp8_e5m2fnuz", "float8_e5m2fnuz": "fp8_e5m2fnuz",
    "e4m3b11fnuz": "fp8_e4m3b11fnuz", "float8_e4m3b11fnuz": "fp8_e4m3b11fnuz",
    "float8_e4m3": "fp8_e4m3", "e3m4": "fp8_e3m4", "float8_e3m4": "fp8_e3m4",
    "fp8_e8m0fnu": "e8m0", "float8_e8m0fnu": "e8m0", "e8m0fnu": "e8m0",
    # ml_dtypes and torch spell OCP FP6/FP4 float6_e2m3fn / float4_e2m1fn ("fn": finite, and
    # no NaN either): the grammar's e2m1fn (a NaN code, max 4 instead of 6) would be a near miss
    "e2m3": "fp6_e2m3", "float6_e2m3fn": "fp6_e2m3", "e2m3fn": "fp6_e2m3",
    "e3m2": "fp6_e3m2", "float6_e3m2fn": "fp6_e3m2", "e3m2fn": "fp6_e3m2",
    "e2m1": "fp4_e2m1", "fp4": "fp4_e2m1", "float4_e2m1fn": "fp4_e2m1", "e2m1fn": "fp4_e2m1",
}

#: ASCII digits without leading zeros: "e04m03" or "e٤m3" would name a second, IEEE-style
#: format beside the alias e4m3 (OCP E4M3FN)
_NUMBER = r"(0|[1-9][0-9]*)"
_SPEC = re.compile(rf"^e{_NUMBER}m{_NUMBER}(fn|fnuz|_ieee)?$")


def p3109(k: int, p: int, signed: bool = True, extended: bool = True) -> Format:
    """The IEEE P3109 draft's format binary{k}p{p}: ``k`` bits, precision ``p`` (implicit bit
    included), named ``p3109_k{k}p{p}`` + ``s``/``u`` (signed/unsigned) + ``e``/``f``
    (extended: with +-inf; finite: without).

    Exponent bias 2^(w-1) for a w-bit exponent field; one NaN and no -0: signed formats keep
    NaN at the code of -0 (0x80 for k=8, as ``fnuz``), unsigned ones at the top code (as
    ``fn``); extended formats put +inf at the top finite code (-inf at its negative twin).
    """
    if not (isinstance(k, int) and isinstance(p, int) and k >= 3 and 1 <= p <= k - signed):
        raise ValueError(f"P3109 format k={k}, p={p}: needs k >= 3 and 1 <= p <= k-1 (signed) "
                         "or 1 <= p <= k (unsigned)")
    ebits = k - p + (not signed)
    name = f"p3109_k{k}p{p}{'s' if signed else 'u'}{'e' if extended else 'f'}"
    return Format(name, ebits, p - 1, bias=2 ** (ebits - 1), inf=extended,
                  nan="fnuz" if signed else "fn", signed=signed, p3109=True)


#: The P3109 formats of 3 to 8 bits, every precision, signed and unsigned, extended and finite.
P3109_FORMATS: dict[str, Format] = {
    f.name: f for f in (p3109(k, p, s, e) for k in range(3, 9) for s in (True, False)
                        for p in range(1, k + (not s)) for e in (True, False))}

_P3109 = re.compile(rf"^(?:p3109_k{_NUMBER}p{_NUMBER}|binary{_NUMBER}p{_NUMBER})"
                    r"(?:([su])([ef]))?$")
#: "k8p4" (P3109's parameters without a prefix) and names difflib matches badly ("fp8" is
#: closest to "fp4"): the suggestion of an unknown format's error
_SHORT_P3109 = re.compile(rf"^k{_NUMBER}p{_NUMBER}(?:[su][ef])?$")
_HINTS = {"fp8": "e4m3", "float8": "e4m3", "fp6": "e2m3", "float6": "e2m3", "float4": "e2m1"}


def _hint(key: str) -> str | None:
    """The format an unknown (normalised) name most likely means, if a rule knows it."""
    if _SHORT_P3109.match(key):
        return f"p3109_{key}" if _is_format_name(f"p3109_{key}") else None
    return _HINTS.get(key)


def _from_p3109(name: str) -> Format | None:
    """``p3109_k8p3se`` and the draft's spelling ``binary8p3se``; without the suffix, the
    signed extended format (``binary8p3`` is ``p3109_k8p3se``)."""
    match = _P3109.match(name)
    if not match:
        return None
    k, p = int(match[1] or match[3]), int(match[2] or match[4])
    return p3109(k, p, signed=match[5] != "u", extended=match[6] != "f")


def _from_spec(name: str) -> Format | None:
    """A format from the grammar: ``eXmY`` and ``eXmY_ieee`` (inf/NaN in the all-ones exponent),
    ``eXmYfn`` (no inf, one NaN code), ``eXmYfnuz`` (NaN at negative zero).  The names of
    ``ALIASES`` come first: ``e4m3`` is OCP E4M3FN, ``e4m3_ieee`` the IEEE-style one."""
    match = _SPEC.match(name)
    if not match:
        return None
    e, m, style = int(match[1]), int(match[2]), match[3]
    if e == 0:
        raise ValueError(f"invalid format {name!r}: a float needs at least one exponent bit "
                         "(for integers use 'int8', 'int4' or 'uint8')")
    if style == "fn":
        return _fn(name, e, m)
    if style == "fnuz":
        return Format(name, e, m, bias=2 ** (e - 1), inf=False, nan="fnuz")
    return _ieee(name, e, m)


def family(fmt: str | Format) -> str:
    """The family a format belongs to (see ``FAMILIES``); for formats made by the grammars,
    what the grammar makes: ``"IEEE-style"``, ``"fn (OCP-style)"``, ``"fnuz"`` or ``"P3109"``.

    >>> family("e4m3"), family("e4m3_ieee"), family("p3109_k8p3se")
    ('OCP FP8', 'IEEE-style', 'P3109')
    """
    f = get_format(fmt)
    if f.name in FAMILIES and FORMATS.get(f.name) == f:
        return FAMILIES[f.name]
    if f.p3109:
        return "P3109"
    if f.is_int:
        return "integer"
    return {"ieee": "IEEE-style", "fn": "fn (OCP-style)"}.get(f.nan, f.nan)


def aliases_of(name: str) -> list[str]:
    """The aliases of the canonical name ``name``, in ``ALIASES``' order.

    >>> aliases_of("fp8_e4m3fn")
    ['e4m3', 'e4m3fn', 'float8_e4m3fn']
    """
    return [a for a, target in ALIASES.items() if target == name]


#: Where an unknown format's error sends the user for every name.
NAME_LISTING = "`fpsim formats` lists them (in Python: fpsim.formats.known_names())"


def known_names() -> list[str]:
    """Canonical names and aliases, sorted."""
    return sorted(set(FORMATS) | set(ALIASES))


class NameWarning(UserWarning):
    """A format name that may not mean what it seems: shown once per name and process
    (silence it with ``warnings.filterwarnings("ignore", category=NameWarning)``)."""


#: Names of the IEEE-style E4M3 (max 240, inf and NaN as IEEE 754, ml_dtypes' float8_e4m3) a
#: prefix or suffix away from the OCP E4M3 of FP8 training and torch.float8_e4m3fn (max 448:
#: "e4m3", "fp8_e4m3fn"): their first use warns (``NameWarning``); "e4m3_ieee" does not.
LOOKALIKES = ("fp8_e4m3", "float8_e4m3")
_WARNED: set[str] = set()


def get_format(fmt: str | Format) -> Format:
    """Resolve a name, alias, ``eXmY`` / ``eXmYfn`` / ``eXmYfnuz`` spec string or P3109 name
    (``p3109_k8p3se``, ``binary8p3se``: see [``p3109``][]) to a Format.

    Aliases come first: ``"e4m3"`` is OCP E4M3FN (max 448); the grammar's IEEE-style E4M3 is
    ``"e4m3_ieee"`` (max 240).  Its other names ``"fp8_e4m3"`` and ``"float8_e4m3"`` (as
    ml_dtypes spells it) warn once (``LOOKALIKES``, ``NameWarning``).

    >>> f = get_format("e4m3")
    >>> f.name, f.bits, f.max, get_format("e4m3_ieee").max
    ('fp8_e4m3fn', 8, 448.0, 240.0)
    """
    f = resolve_format(fmt)
    key = normalize(fmt) if isinstance(fmt, str) else None
    if key in LOOKALIKES and key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(f"{fmt!r} is the IEEE-style E4M3 (max {f.max:g}, with inf; ml_dtypes' "
                      "float8_e4m3), not the OCP E4M3 of FP8 training and torch.float8_e4m3fn "
                      "(max 448: 'e4m3' or 'fp8_e4m3fn'); 'e4m3_ieee' names it without this "
                      "notice, shown once", NameWarning, stacklevel=_user_level())
    return f


def _user_level() -> int:
    """The ``stacklevel`` of the first caller outside fpsim, so that a warning from
    ``get_format`` names the user's line, however deep inside fpsim the name was read."""
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def resolve_format(fmt: str | Format) -> Format:
    """``get_format`` without the notice on look-alike names: for names that come from a
    dtype (ml_dtypes' ``float8_e4m3`` is the IEEE-style one by definition)."""
    if isinstance(fmt, Format):
        return fmt
    if not isinstance(fmt, str):
        raise TypeError(f"format must be a name or an fpsim.Format, not {type(fmt).__name__}")
    return resolve("format", fmt, FORMATS, ALIASES, hints=_hint, fallback=_from_grammar,
                   known=known_names(), listing=NAME_LISTING,
                   extra="; or a spec 'eXmY' / 'eXmY_ieee' (IEEE-style), 'eXmYfn' (no inf) or "
                   "'eXmYfnuz', or a P3109 name such as 'p3109_k8p3se'.")


def _from_grammar(key: str) -> Format | None:
    """A format spelled by a grammar: ``eXmY...`` or a P3109 name (None: neither)."""
    return _from_spec(key) or _from_p3109(key)


def _is_format_name(key: str) -> bool:
    try:
        return bool(key) and (key in FORMATS or ALIASES.get(key) in FORMATS
                              or _from_grammar(key) is not None)
    except ValueError:
        return False


register("format", _is_format_name, "use fpsim.quantize / fpsim.encode (element formats: "
         "fpsim.FORMATS)")
