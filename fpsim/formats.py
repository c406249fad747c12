"""The format model: one frozen dataclass describes every scalar number format.

A format is data: sign / exponent / mantissa widths, exponent bias, and the inf/NaN convention.
Every derived property (largest finite value, smallest subnormal, NaN code, ...) is computed from
those fields, so there is no second table to drift out of sync.  Integer formats are formats with
``ebits == 0``: ``mbits`` magnitude bits, two's complement when signed.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field

NAN_CONVENTIONS = ("ieee", "fn", "fnuz", "none")


@dataclass(frozen=True)
class Format:
    """A binary number format.

    ``nan`` is one of ``"ieee"`` (all-ones exponent with non-zero mantissa is NaN, zero mantissa
    is inf), ``"fn"`` (only the all-ones code S.1..1.1..1 is NaN, no inf: OCP E4M3), ``"fnuz"``
    (the code of negative zero is the single NaN; no -0, no inf) or ``"none"``.
    ``zero=False`` marks formats without a zero whose exponent field 0 is an ordinary binade
    (OCP E8M0).
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

    def __post_init__(self) -> None:
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
            return all_ones - 1  # S.1..1.1..1 is NaN
        return all_ones

    @property
    def max_biased_exp(self) -> int:
        """Largest biased exponent field that still holds finite numbers."""
        return self.max_code >> self.mbits

    @property
    def inf_code(self) -> int | None:
        return (2**self.ebits - 1) << self.mbits if self.inf else None

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
    elif f.inf and f.nan != "ieee":
        why = "only nan='ieee' formats can have inf (inf is the all-ones exponent)"
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

ALIASES: dict[str, str] = {
    "float64": "fp64", "double": "fp64",
    "float32": "fp32", "float": "fp32", "single": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16", "half": "fp16",
    "e4m3": "fp8_e4m3fn", "e4m3fn": "fp8_e4m3fn", "float8_e4m3fn": "fp8_e4m3fn",
    "e5m2": "fp8_e5m2", "float8_e5m2": "fp8_e5m2",
    "e4m3fnuz": "fp8_e4m3fnuz", "float8_e4m3fnuz": "fp8_e4m3fnuz",
    "e5m2fnuz": "fp8_e5m2fnuz", "float8_e5m2fnuz": "fp8_e5m2fnuz",
    "e4m3b11fnuz": "fp8_e4m3b11fnuz", "float8_e4m3b11fnuz": "fp8_e4m3b11fnuz",
    "float8_e4m3": "fp8_e4m3", "e3m4": "fp8_e3m4", "float8_e3m4": "fp8_e3m4",
    "fp8_e8m0fnu": "e8m0", "float8_e8m0fnu": "e8m0", "e8m0fnu": "e8m0",
    "e2m3": "fp6_e2m3", "float6_e2m3fn": "fp6_e2m3",
    "e3m2": "fp6_e3m2", "float6_e3m2fn": "fp6_e3m2",
    "e2m1": "fp4_e2m1", "fp4": "fp4_e2m1", "float4_e2m1fn": "fp4_e2m1",
}

_SPEC = re.compile(r"^e(\d+)m(\d+)(fn|fnuz)?$")


def _from_spec(name: str) -> Format | None:
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


def unknown_name_error(kind: str, name: str, known: list[str], extra: str = "") -> ValueError:
    """The error for an unknown name: the closest known one and the full list."""
    key = name.strip().lower() if isinstance(name, str) else str(name)
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.0)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ValueError(f"unknown {kind} {name!r}.{hint} Known names: {', '.join(known)}{extra}")


def known_names() -> list[str]:
    """Canonical names and aliases, sorted."""
    return sorted(set(FORMATS) | set(ALIASES))


def get_format(fmt: str | Format) -> Format:
    """Resolve a name, alias or ``eXmY`` / ``eXmYfn`` / ``eXmYfnuz`` spec string to a Format."""
    if isinstance(fmt, Format):
        return fmt
    if not isinstance(fmt, str):
        raise TypeError(f"format must be a name or an fpsim.Format, not {type(fmt).__name__}")
    key = fmt.strip().lower().replace("-", "_")
    key = ALIASES.get(key, key)
    if key in FORMATS:
        return FORMATS[key]
    spec = _from_spec(key)
    if spec is not None:
        return spec
    raise unknown_name_error("format", fmt, known_names(),
                             "; or a spec string 'eXmY' (IEEE-style), 'eXmYfn' (no inf) or "
                             "'eXmYfnuz'.")
