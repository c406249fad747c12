"""The ``fpsim`` command line: look at formats and at the bits of values."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .formats import FORMATS, get_format


class _Parser(argparse.ArgumentParser):
    """Bad arguments: one line on stderr and exit status 2, no traceback."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"fpsim: error: {message}\n")


def _fmt_num(v: float) -> str:
    return f"{v:.6g}"


def cmd_formats(args: argparse.Namespace) -> int:
    header = ("name", "bits", "e", "m", "bias", "max", "min normal", "min subnormal", "eps",
              "range (binades)", "inf/NaN")
    rows = []
    for f in FORMATS.values():
        conv = "int" if f.is_int else (f"{'inf, ' if f.inf else ''}{f.nan}")
        rows.append((f.name, str(f.bits), str(f.ebits), str(f.mbits), str(f.bias),
                     _fmt_num(f.max), _fmt_num(f.min_normal), _fmt_num(f.min_subnormal),
                     _fmt_num(f.eps), f"{f.dynamic_range:.2f}", conv))
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    for r in [header] + rows:
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from .explain import explain

    for value in args.values:
        for fmt in args.format or ["fp32"]:
            print(f"{fmt:>12}: {explain(float(value), fmt, rounding=args.rounding)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="fpsim", description="Bit-exact number-format emulation.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    s = sub.add_parser("formats", help="table of every named format")
    s.set_defaults(func=cmd_formats)
    s = sub.add_parser("explain", help="bit layout of values in a format")
    s.add_argument("values", nargs="+", type=float, metavar="VALUE")
    s.add_argument("--format", "-f", action="append", help="format name (repeatable)")
    s.add_argument("--rounding", "-r", default="rne")
    s.set_defaults(func=cmd_explain)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        for name in getattr(args, "format", None) or []:
            get_format(name)
        return args.func(args)
    except (ValueError, TypeError) as exc:
        print(f"fpsim: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
