"""The ``fpsim`` command line: look at formats, at the bits of values, and quantize files."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import re
import sys
from importlib import resources
from typing import Any, Sequence

from .cliparse import CliError, OneLineParser
from .formats import FORMATS, Format, get_format
from .rounding import MODES

# --------------------------------------------------------------------------------------------
# fpsim formats [--gpu NAME]
# --------------------------------------------------------------------------------------------
def _fmt_num(v: float) -> str:
    return f"{v:.6g}"


def load_gpu_peaks() -> dict[str, Any]:
    """The datasheet figures of ``fpsim/data/gpu_peaks.json``."""
    text = resources.files("fpsim").joinpath("data/gpu_peaks.json").read_text(encoding="utf-8")
    return json.loads(text)


def gpu_peak(fmt: Format, gpu: str, table: dict[str, Any]) -> float | None:
    """Dense peak TFLOPS of ``fmt`` on ``gpu``, or None where it has no tensor-core path."""
    kind = table["formats"].get(fmt.name)
    return table["gpus"][gpu]["tflops"].get(kind) if kind else None


def _print_table(header: Sequence[str], rows: list[Sequence[str]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))


def cmd_formats(args: argparse.Namespace) -> int:
    header = ["name", "bits", "e", "m", "bias", "max", "min normal", "min subnormal", "eps",
              "range (binades)", "inf/NaN"]
    table = load_gpu_peaks() if args.gpu else None
    if table:
        header += [f"{args.gpu.upper()} TFLOPS", "vs FP32"]
        base = table["gpus"][args.gpu]["tflops"]["fp32"]
    rows = []
    for f in FORMATS.values():
        conv = "int" if f.is_int else (f"{'inf, ' if f.inf else ''}{f.nan}")
        row = [f.name, str(f.bits), str(f.ebits), str(f.mbits), "-" if f.is_int else str(f.bias),
               _fmt_num(f.max), _fmt_num(f.min_normal), _fmt_num(f.min_subnormal),
               _fmt_num(f.eps), f"{f.dynamic_range:.2f}", conv]
        if table:
            peak = gpu_peak(f, args.gpu, table)
            row += ["-", "-"] if peak is None else [f"{peak:,.1f}", f"{peak / base:.2f}x"]
        rows.append(row)
    _print_table(header, rows)
    if table:
        _print_gpu_notes(table, args.gpu)
    return 0


def _print_gpu_notes(table: dict[str, Any], gpu: str) -> None:
    g = table["gpus"][gpu]
    base, bw = g["tflops"]["fp32"], g["memory_bandwidth_tb_s"]
    print(f"\n{g['name']}: dense (no sparsity) tensor-core peaks; 'vs FP32' is the theoretical "
          f"speedup over FP32 without tensor cores ({base} TFLOPS). '-': no tensor-core path.")
    print(f"Memory bandwidth ({bw} TB/s), not peak math, usually bounds real speed: a kernel "
          "reaches a peak only if it does more than peak/bandwidth FLOPs per byte it moves "
          f"(BF16: {g['tflops']['bf16'] / bw:.0f} FLOPs/byte).")
    for s in g["sources"]:
        print(f"source: {s}")
    for u in g["unverified"]:
        print(f"unverified: {u}")


# --------------------------------------------------------------------------------------------
# fpsim explain VALUE... --format FMT...
# --------------------------------------------------------------------------------------------
_HEX = re.compile(r"^\s*[+-]?0x([0-9a-f._]*)", re.IGNORECASE)
_INF = re.compile(r"^\s*[+-]?inf(inity)?\s*$", re.IGNORECASE)


def _value(text: str) -> float:
    """A float from decimal (``0.1``, ``-inf``) or C99 hex (``0x1.8p-3``) text; refused when
    float64 would read it as inf or 0 (``1e400``, ``1e-400``): explain would describe another
    number, and under directed rounding round it differently."""
    hex_digits = _HEX.match(text)
    try:
        value = float.fromhex(text) if hex_digits else float(text)
    except OverflowError:
        value = math.inf
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number: give a decimal (0.1, -3e-5, inf, nan) or a hex float "
            "(0x1.8p-3)") from None
    digits = hex_digits[1] if hex_digits else re.match(r"^\s*[+-]?([0-9._]*)", text)[1]
    if (math.isinf(value) and not _INF.match(text)) or (
            value == 0 and re.search("[1-9a-f]" if hex_digits else "[1-9]", digits, re.I)):
        raise argparse.ArgumentTypeError(
            f"{text!r} lies beyond float64's range (it would read as {value!r}): explain rounds "
            "float64 values; give one between 4.9e-324 and 1.8e308 in magnitude")
    return value


def use_color(mode: str, stream: Any = None) -> bool:
    """Colour for ``--color auto``: a terminal, and NO_COLOR unset or empty."""
    if mode != "auto":
        return mode == "always"
    stream = stream or sys.stdout
    return bool(stream.isatty()) and not os.environ.get("NO_COLOR")


def cmd_explain(args: argparse.Namespace) -> int:
    from .explain import explain

    fmts = [get_format(name) for name in args.format or ["fp32"]]
    color = use_color(args.color)
    label_w = max(len(f.name) for f in fmts)
    value_w = max(len(repr(v)) for v in args.values)
    for value in args.values:
        for i, f in enumerate(fmts):
            e = explain(value, f, rounding=args.rounding, saturate=args.saturate)
            lead = repr(value) if i == 0 else ""
            print(f"{lead:>{value_w}}  {f.name:<{label_w}}  {e.render(color)}")
    return 0


# --------------------------------------------------------------------------------------------
# fpsim values FMT
# --------------------------------------------------------------------------------------------
def cmd_values(args: argparse.Namespace) -> int:
    from .explain import _show, explain_code

    fmt = get_format(args.format)
    if fmt.bits > 8:
        raise CliError(f"{fmt.name} has {fmt.num_codes} codes; 'values' lists formats of at most "
                       f"8 bits (in Python: fpsim.values({fmt.name!r}) gives every finite value)")
    color = use_color(args.color)
    digits = (fmt.bits + 3) // 4
    plain_w = len(explain_code(0, fmt).layout())       # every code's fields have the same width
    bits_w = max(plain_w, len("bits"))
    print(f"{'code':<{digits + 2}}  {'bits':<{bits_w}}  {'value':>24}  class")
    for code in range(fmt.num_codes):
        e = explain_code(code, fmt)
        bits = e.layout(color) + " " * (bits_w - plain_w)   # pad outside the colour codes
        print(f"0x{code:0{digits}X}  {bits}  {_show(e.value):>24}  {e.kind}")
    return 0


# --------------------------------------------------------------------------------------------
# fpsim quantize IN.npy OUT.npy --format FMT
# --------------------------------------------------------------------------------------------
def _load_npy(path: str) -> Any:
    """The array in a .npy file; a clear CliError for anything else."""
    import numpy as np

    try:
        with open(path, "rb") as fh:
            if fh.read(6) != b"\x93NUMPY":
                raise CliError(f"{path} is not a .npy file: save one array with numpy.save")
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot read {path}: {exc}") from None


def _output_path(path: str) -> str:
    """The file ``np.save(path)`` would write (``.npy`` appended when missing); not a folder."""
    target = path if path.endswith(".npy") else path + ".npy"
    for p in dict.fromkeys((path, target)):
        if os.path.isdir(p):
            raise CliError(f"{p} is a directory: give OUT as a file name, e.g. {p}/out.npy")
    return target


def save_atomically(path: str, write: Any) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, then rename it to ``path``.

    A write that fails midway (disk full, file-size limit, Ctrl-C) leaves ``path`` as it was
    (the input too, when it is the same file) and removes the temporary file.
    """
    import tempfile

    folder = os.path.dirname(os.path.abspath(path))
    try:
        mode = os.stat(path).st_mode & 0o777            # keep an existing file's permissions
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc}") from None
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise CliError(f"cannot write {path}: {exc}; it was left unchanged") from None
        raise


def cmd_quantize(args: argparse.Namespace) -> int:
    import numpy as np

    from .convert import quantize
    from .inputs import check_input
    from .summary import summarize

    fmt = get_format(args.format)
    target = _output_path(args.output)
    x = check_input(_load_npy(args.input), args.input)
    q = quantize(x, fmt, rounding=args.rounding, saturate=args.saturate, seed=args.seed,
                 srbits=args.srbits)
    save_atomically(target, lambda fh: np.save(fh, q, allow_pickle=False))
    print(f"{x.size} values ({x.dtype}) -> {fmt.name}, rounding {args.rounding}"
          f"{', saturating' if args.saturate else ''}"
          f"{' (inf too)' if args.saturate == 'finite' else ''}: wrote {target}")
    for line in summarize(x, q, fmt).lines():
        print(f"  {line}")
    return 0


# --------------------------------------------------------------------------------------------
# fpsim experiment NAME [ARGS...]
# --------------------------------------------------------------------------------------------
# fpsim tensor-cores [NAME]
# --------------------------------------------------------------------------------------------
def cmd_tensor_cores(args: argparse.Namespace) -> int:
    from dataclasses import fields

    from .arith.tc_models import TENSOR_CORES, get_model

    if args.name:
        m = get_model(args.name)
        for field in fields(m):
            value = getattr(m, field.name)
            print(f"{field.name:17} {value.name if isinstance(value, Format) else value}")
        print(f"{'c_format':17} {m.c_format.name}")
        return 0
    header = ["preset", "group", "frac bits", "result", "rounding", "structure", "source",
              "instruction"]
    rows = []
    for m in TENSOR_CORES.values():
        source = re.search(r"simulator/(\w+\.py)", m.source)
        rows.append([m.name, str(m.group), str(m.frac_bits), m.accum_format.name, m.rounding,
                     m.structure, source.group(1) if source else "-", m.instruction])
    _print_table(header, rows)
    print("\nfused: one fused dot-add of `group` exact products and C, aligned to the largest "
          "exponent,\neach cut to `frac bits` (NVIDIA: toward zero). fma_tree: products rounded "
          "and added\npairwise (AMD CDNA1/2). fma: a chain of correctly rounded fused "
          "multiply-adds (FP64,\nAMD FP32). source: the file of MMA-Sim (arXiv 2511.10909) each "
          "preset follows;\nfpsim tensor-cores NAME shows one preset in full.")
    return 0


# --------------------------------------------------------------------------------------------
EXPERIMENTS_MODULE = "experiments.cli"
SWEEP_MODULE = "experiments.sweep.cli"


@contextlib.contextmanager
def _experiments_available() -> Any:
    """Turn a missing experiments package, or a missing dependency of it, into one line."""
    try:
        yield
    except ModuleNotFoundError as exc:
        ours = ("experiments", EXPERIMENTS_MODULE, SWEEP_MODULE, SWEEP_MODULE.rpartition(".")[0])
        if exc.name in ours:
            raise CliError(f"the experiments are not available (no module {exc.name}): "
                           "run from a source checkout installed with pip install -e "
                           "'.[experiments]'") from None
        raise CliError(f"the experiments need {exc.name!r}, which is not installed: "
                       "pip install -e '.[experiments]'") from None


def cmd_experiment(args: argparse.Namespace) -> int:
    with _experiments_available():
        module = importlib.import_module(EXPERIMENTS_MODULE)
    argv = ["--help"] if args.name in ("-h", "--help") else [args.name, *args.args]
    return int(module.main(argv) or 0)


def cmd_sweep(args: argparse.Namespace) -> int:
    with _experiments_available():
        module = importlib.import_module(SWEEP_MODULE)
    return int(module.main(args.args) or 0)


# --------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="fpsim", description="Bit-exact number-format emulation.")
    sub = p.add_subparsers(
        dest="command", required=True, parser_class=OneLineParser,
        metavar="{formats,explain,values,quantize,tensor-cores,experiment,sweep}")
    table = load_gpu_peaks()

    s = sub.add_parser("formats", help="table of every named format",
                       description="Every named format: widths, bias, range, precision, inf/NaN.")
    s.add_argument("--gpu", choices=sorted(table["gpus"]),
                   help="add each format's datasheet peak on this GPU and its speedup over FP32")
    s.set_defaults(func=cmd_formats)

    s = sub.add_parser("explain", help="bit layout of values in formats",
                       description="Round each VALUE to each format and show its bit fields.")
    s.add_argument("values", nargs="+", type=_value, metavar="VALUE",
                   help="a decimal (0.1, -3e-5, inf) or hex float (0x1.8p-3)")
    _format_option(s, repeat=True)
    _rounding_options(s)
    _color_option(s)
    s.set_defaults(func=cmd_explain)

    s = sub.add_parser("values", help="every code of a format of at most 8 bits",
                       description="Every code of FMT (at most 8 bits): bits, value and class.")
    s.add_argument("format", metavar="FMT", help="format name, alias or eXmY spec")
    _color_option(s)
    s.set_defaults(func=cmd_values)

    s = sub.add_parser("quantize", help="quantize a .npy file and summarise the error",
                       description="Round every element of IN (a .npy array) to FMT, save it as "
                                   "OUT (same float dtype; integers give float64) and print "
                                   "the error summary.")
    s.add_argument("input", metavar="IN", help="input .npy file")
    s.add_argument("output", metavar="OUT", help="output .npy file")
    _format_option(s, repeat=False)
    _rounding_options(s)
    s.add_argument("--seed", type=int, help="random seed for --rounding stochastic")
    s.add_argument("--srbits", type=int, metavar="N", help="random bits of a stochastic "
                   "--rounding, 1 to 28 (default: every dropped bit; docs/stochastic.md)")
    s.set_defaults(func=cmd_quantize)

    s = sub.add_parser("tensor-cores", help="the tensor-core models of matmul",
                       description="The presets of fpsim.matmul(order='tensor_core'): "
                                   "instruction, group, fraction bits, result format, source.")
    s.add_argument("name", nargs="?", metavar="NAME", help="show one preset in full")
    s.set_defaults(func=cmd_tensor_cores)

    s = sub.add_parser("experiment", help="run one of the experiments",
                       description=f"Run an experiment of {EXPERIMENTS_MODULE} by name; further "
                                   "arguments go to it.")
    s.add_argument("name", metavar="NAME", help="experiment name")
    s.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                   help="arguments for the experiment")
    s.set_defaults(func=cmd_experiment)

    s = sub.add_parser("sweep", help="recipes x models x seeds, here or on Ray",
                       description="Run a sweep config (docs/sweep.md); arguments go to "
                                   f"{SWEEP_MODULE}.", add_help=False)
    s.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                   help="CONFIG and options (fpsim sweep --help)")
    s.set_defaults(func=cmd_sweep)
    return p


def _format_option(s: argparse.ArgumentParser, repeat: bool) -> None:
    if repeat:
        s.add_argument("--format", "-f", action="append", metavar="FMT",
                       help="format name, alias or eXmY spec (repeat for several; default fp32)")
    else:
        s.add_argument("--format", "-f", required=True, metavar="FMT",
                       help="format name, alias or eXmY spec")


def _rounding_options(s: argparse.ArgumentParser) -> None:
    s.add_argument("--rounding", "-r", default="rne", choices=MODES, metavar="MODE",
                   help=f"rounding mode: {', '.join(MODES)} (default rne)")
    s.add_argument("--saturate", action="store_true",
                   help="clamp overflow to the largest finite value instead of inf/NaN")
    s.add_argument("--saturate-finite", dest="saturate", action="store_const", const="finite",
                   help="as --saturate, and infinite inputs too (P3109's SatFinite)")


def _color_option(s: argparse.ArgumentParser) -> None:
    s.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="colour the bit fields (auto: on a terminal unless NO_COLOR is set)")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (130 after Ctrl-C, without a traceback)."""
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        if argv[:1] == ["experiment"] and (len(argv) == 1 or argv[1] in ("-h", "--help")):
            # the experiments' own help, which lists them and their options
            return cmd_experiment(argparse.Namespace(name="--help", args=[]))
        if argv[:1] == ["sweep"]:         # every argument, --help included, is the sweep's
            return cmd_sweep(argparse.Namespace(args=argv[1:]))
        args = build_parser().parse_args(argv)
        return args.func(args)
    except KeyboardInterrupt:
        print("fpsim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `fpsim values e8m0 | head`: an OSError, so caught first
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        return 0
    except (CliError, ValueError, TypeError, OSError) as exc:
        message = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        print(f"fpsim: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
