"""One resolver for every name argument: formats, block formats, rounding modes, scale rules,
backends.

The rule is the same everywhere: surrounding white space is ignored, case is ignored and ``-``
counts as ``_`` (``" RNE "``, ``"FP8-E4M3FN"`` and ``"fp8_e4m3fn"`` all resolve).  An unknown
name raises one ``ValueError`` that names the kind, suggests the closest known name only when it
is close (difflib ratio >= 0.6, or a listed hint such as ``"nearest"`` -> ``"rne"``), lists the
known names (a long list, such as the ~60 format names: the closest ``SHOWN`` of them and
where the rest are listed), and points to the other registry when the name belongs there
(``"mxfp8_e4m3"`` asked of ``fpsim.get_format``, ``"e4m3"`` of
``fpsim.mx.get_block_format``).
"""

from __future__ import annotations

import difflib
from typing import Any, Callable, Mapping, TypeVar

T = TypeVar("T")

#: Suggestion cut-off: below this difflib ratio no "did you mean" is offered.
CLOSE = 0.6
#: A list of known names longer than this is not spelled out in the error: the closest
#: ``SHOWN`` names are, with a pointer to the whole list.
LONGEST = 12
SHOWN = 3

# kind -> (names, pointer): registries that other registries point to for a foreign name
_ELSEWHERE: dict[str, tuple[Any, str]] = {}


def normalize(name: str) -> str:
    """The key every registry is looked up with: stripped, lower case, ``-`` as ``_``."""
    return name.strip().lower().replace("-", "_")


def register(kind: str, names: Any, pointer: str) -> None:
    """Let other resolvers point to ``kind`` for a name in ``names`` (a container or callable
    taking a normalised name); ``pointer`` says how to use it."""
    _ELSEWHERE[kind] = (names, pointer)


Hints = Mapping[str, str] | Callable[[str], str | None]


def unknown_name_error(kind: str, name: Any, known: list[str], extra: str = "",
                       hints: Hints | None = None, listing: str | None = None) -> ValueError:
    """The error for an unknown name: a close suggestion (if any; ``hints`` maps a normalised
    name to one, or is a function doing so), the known names (more than ``LONGEST`` with
    a ``listing``, where to find them all: the closest few only) and where a name of another
    registry belongs."""
    key = normalize(name) if isinstance(name, str) else str(name)
    for other, (names, pointer) in _ELSEWHERE.items():
        found = names(key) if callable(names) else key in names
        if other != kind and found:
            return ValueError(f"{name!r} names a {other}, not a {kind}: {pointer}")
    hint = hints(key) if callable(hints) else (hints or {}).get(key)
    # a listed hint stands alone ("fp8" means e4m3: fp4, closer in spelling, is no alternative)
    close = [] if hint else difflib.get_close_matches(key, known, n=SHOWN, cutoff=CLOSE)
    hint = hint or (close[0] if close else None)
    mean = f" Did you mean {hint!r}?" if hint else ""
    if listing is None or len(known) <= LONGEST:
        return ValueError(f"unknown {kind} {name!r}.{mean} Known names: {', '.join(known)}{extra}")
    also = f" Also close: {', '.join(close[1:])}." if close[1:] else ""
    return ValueError(f"unknown {kind} {name!r}.{mean}{also} Known names: {listing}{extra}")


def resolve(kind: str, name: Any, table: Mapping[str, T], aliases: Mapping[str, str] = {},
            hints: Hints | None = None,
            fallback: Callable[[str], T | None] | None = None, known: list[str] | None = None,
            extra: str = "", listing: str | None = None) -> T:
    """``table[normalize(name)]`` (through ``aliases``), else ``fallback(key)`` when it is not
    None (a grammar), else ``unknown_name_error`` listing ``known`` (default: the table's
    names and aliases; a long list: where ``listing`` says) and ``extra``."""
    if not isinstance(name, str):
        raise TypeError(f"{kind} must be a name (str), not {type(name).__name__}")
    key = normalize(name)
    key = aliases.get(key, key)
    if key in table:
        return table[key]
    found = fallback(key) if fallback else None
    if found is not None:
        return found
    if known is None:
        known = list(table) + [a for a in aliases if a not in table]
    raise unknown_name_error(kind, name, known, extra, hints, listing)
