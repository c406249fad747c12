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
import warnings
from importlib import resources
from typing import Any, Sequence

from .cliparse import CliError, OneLineParser
from .emulation.casts import SCALINGS as CAST_SCALINGS
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


def _print_table(header: Sequence[str], rows: list[Sequence[str]], text: int = 1) -> None:
    """Columns padded to their widths: the first ``text`` left-aligned, numbers right."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(c.rjust(w) if i >= text else c.ljust(w)
                        for i, (c, w) in enumerate(zip(r, widths))).rstrip())


def cmd_formats(args: argparse.Namespace) -> int:
    header = ["name", "bits", "e", "m", "bias", "max", "min normal", "min subnormal", "eps",
              "range (binades)", "inf/NaN"]
    table = load_gpu_peaks() if args.gpu else None
    if table:
        header += [f"{args.gpu.upper()} TFLOPS", "vs FP32"]
        base = table["gpus"][args.gpu]["tflops"]["fp32"]
    rows = []
    formats = list(FORMATS.values())
    if args.p3109:
        from .formats import P3109_FORMATS

        formats += list(P3109_FORMATS.values())
    for f in formats:
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
    print()
    _print_names(formats)
    return 0


#: What ``fpsim formats`` says about names: the grammar and which formats the experiments mean.
NAME_NOTES = (
    "Grammar: a name or alias above wins; otherwise eXmY is X exponent and Y mantissa bits, "
    "IEEE-style (inf and NaN in the all-ones exponent; also eXmY_ieee), eXmYfn has no inf and "
    "one NaN (OCP-style), eXmYfnuz its NaN at -0.",
    "So e4m3 is OCP E4M3FN (max 448) and e4m3_ieee = fp8_e4m3 is IEEE-style (max 240); e2m1, "
    "e2m3 and e3m2 are the OCP MX elements (no inf, no NaN).",
    "Experiments: range-vs-precision and seeds split bits into IEEE-style eXmY (their e4m3 is "
    "e4m3_ieee, max 240); the other experiments' e4m3 is OCP E4M3FN (max 448).",
    "P3109: p3109_kKpP + s|u (signed, unsigned) + e|f (extended: with inf, finite), e.g. "
    "p3109_k8p3se (alias binary8p3se); --p3109 lists them.",
)


def _print_names(formats: list[Format]) -> None:
    """The family and aliases of each format, the naming rules and the block formats."""
    from .blockrules import AMBIGUOUS, BLOCK_ALIASES, BLOCK_FORMATS
    from .formats import aliases_of, family

    _print_table(["name", "family", "aliases"],
                 [[f.name, family(f), ", ".join(aliases_of(f.name)) or "-"] for f in formats],
                 text=3)
    print()
    for note in NAME_NOTES:
        print(note)
    blocks = ", ".join(f"{b.name} ({b.elem.name} x {b.scale.name} per {b.block_size})"
                       for b in BLOCK_FORMATS.values())
    aliases = "; ".join([f"{a} is {b}" for a, b in BLOCK_ALIASES.items()]
                        + [f"{a} is {' or '.join(c)} (name one)" for a, c in AMBIGUOUS.items()])
    print(f"Block formats (explain -f, quantize -f, fpsim.mx): {blocks}; {aliases}.")


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

    fmts = [_any_format(name) for name in args.format or ["fp32"]]
    scalars = [f for f in fmts if isinstance(f, Format)]
    color = use_color(args.color)
    if scalars:
        label_w = max(len(f.name) for f in scalars)
        value_w = max(len(repr(v)) for v in args.values)
        for value in args.values:
            for i, f in enumerate(scalars):
                e = explain(value, f, rounding=args.rounding, saturate=args.saturate)
                lead = repr(value) if i == 0 else ""
                print(f"{lead:>{value_w}}  {f.name:<{label_w}}  {e.render(color, cli=True)}")
    for f in fmts:
        if not isinstance(f, Format):        # a block format: every VALUE in one row of blocks
            if args.saturate:
                raise CliError(f"{f.name}'s elements always saturate to their largest value: "
                               "leave out --saturate")
            print(explain(args.values, f, rounding=args.rounding).render(color))
    return 0


def _any_format(name: str) -> Any:
    """A Format, or a BlockFormat for a block-format name (mxfp4, nvfp4...)."""
    from .blockrules import get_block_format, is_block_format_name

    return get_block_format(name) if is_block_format_name(name) else get_format(name)


# --------------------------------------------------------------------------------------------
# fpsim values FMT
# --------------------------------------------------------------------------------------------
def cmd_values(args: argparse.Namespace) -> int:
    from .blockrules import get_block_format, is_block_format_name
    from .explain import _show, explain_code

    if is_block_format_name(args.format):
        b = get_block_format(args.format)
        raise CliError(f"{b.name} is a block format (element x scale): 'values' lists one "
                       f"element format's codes; its elements: fpsim values {b.elem.name}; its "
                       f"scales: fpsim values {b.scale.name}; blocks of values: fpsim explain "
                       f"VALUE... -f {b.name}")
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
    save_all_atomically([(path, write)])


def save_all_atomically(files: list[tuple[str, Any]]) -> None:
    """``save_atomically`` for several files: every ``write(file)`` goes to a temporary file
    first, and only when all of them succeeded are they renamed into place, so a failure leaves
    every target as it was."""
    import tempfile

    done: list[tuple[str, str, int]] = []
    try:
        for path, write in files:
            mode = _mode_for(path)
            folder = os.path.dirname(os.path.abspath(path))
            try:
                fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.",
                                           suffix=".tmp")
            except OSError as exc:
                raise CliError(f"cannot write {path}: {_folder_problem(folder, exc)}") from None
            done.append((path, tmp, mode))
            try:
                with os.fdopen(fd, "wb") as fh:
                    write(fh)
                    fh.flush()
                    os.fsync(fh.fileno())
            except OSError as exc:
                raise CliError(f"cannot write {path}: {exc}; it was left unchanged") from None
        for path, tmp, mode in done:
            os.chmod(tmp, mode)
            os.replace(tmp, path)
    except BaseException:
        for _, tmp, _ in done:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise


def _folder_problem(folder: str, exc: OSError) -> str:
    """Why no file can be made in ``folder``, in its terms (not the temporary file's name)."""
    if not os.path.exists(folder):
        return f"the folder {folder} does not exist (create it first, e.g. mkdir -p {folder})"
    if not os.path.isdir(folder):
        return f"{folder} is not a folder"
    return f"{exc.strerror or exc} in the folder {folder}"


def _mode_for(path: str) -> int:
    """The permissions ``path`` keeps (an existing file's), or a new file's under the umask."""
    try:
        return os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
    except NotADirectoryError as exc:
        folder = os.path.dirname(os.path.abspath(path))
        raise CliError(f"cannot write {path}: {_folder_problem(folder, exc)}") from None
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc}") from None


def cmd_quantize(args: argparse.Namespace) -> int:
    import numpy as np

    from .inputs import check_input
    from .summary import summarize

    fmt = _any_format(args.format)
    scaling = _scaling(args, fmt)
    target = _output_path(args.output)
    codes_path = _codes_path(args.codes) if args.codes else None
    x = check_input(_load_npy(args.input), args.input)
    if x.dtype.kind in "iub":                       # integers give float64, as fpsim.quantize
        x = x.astype(np.float64)
    if isinstance(fmt, Format):
        _check_width(args.format, fmt, x, args.allow_wider)
    print(f"format: {describe_format(args.format, fmt)}")
    values, record = _quantize(x, fmt, scaling, args)
    files = [(target, lambda fh: np.save(fh, values, allow_pickle=False))]
    if codes_path:
        files.append((codes_path, lambda fh: np.savez(fh, **record)))
    save_all_atomically(files)
    how = "" if scaling == "none" else f", {scaling} scaling"
    print(f"{x.size} values ({x.dtype}) -> {fmt.name}{how}, rounding {args.rounding}"
          f"{', saturating' if args.saturate else ''}"
          f"{' (inf too)' if args.saturate == 'finite' else ''}: wrote {target}"
          f"{f' and {codes_path}' if codes_path else ''}")
    # scaled formats cannot overflow (the scale brings every finite value within range): the
    # summary measures against float64's range, so only real overflow (to inf) counts
    for line in summarize(x, values, fmt if scaling == "none" else "fp64").lines():
        print(f"  {line}")
    return 0


#: ``--scaling`` values: how ``fpsim quantize`` groups values under one scale (the entries of
#: the one table of scalings, ``fpsim.emulation.casts.SCALINGS``, marked ``cli``).
SCALINGS = tuple(name for name, s in CAST_SCALINGS.items() if s.cli)


def _scaling(args: argparse.Namespace, fmt: Any) -> str:
    """The scaling of ``fpsim quantize``, its options checked together (one-line errors)."""
    block_format = not isinstance(fmt, Format)
    scaling = args.scaling or ("block" if block_format else "none")
    if block_format and scaling != "block":
        raise CliError(f"{fmt.name} is a block format: one scale per {fmt.block_size} values "
                       "(leave out --scaling, or pass --scaling block)")
    if scaling == "block" and not block_format and args.block_size is None:
        raise CliError(f"--scaling block with the element format {fmt.name} needs "
                       "--block-size N (or name a block format, e.g. -f mxfp8_e4m3)")
    if args.block_size is not None and scaling != "block":
        raise CliError(f"--block-size applies to --scaling block, not {scaling}")
    if args.axis is not None and scaling in ("none", "tensor"):
        raise CliError(f"--axis applies to --scaling channel or block, not {scaling}")
    if args.scale_dtype is not None and (scaling == "none" or block_format):
        raise CliError("--scale-dtype applies to --scaling tensor, channel or block with an "
                       "element format" + (f" ({fmt.name} fixes its scale format)"
                                           if block_format else ""))
    if args.nan_to_zero and (scaling != "none" or not args.codes):
        raise CliError("--nan-to-zero applies to --codes without scaling (scaling and block "
                       "formats give a NaN its group's NaN scale): leave it out")
    if args.saturate and scaling != "none":
        raise CliError("scaled quantization always saturates to the format's largest value: "
                       "leave out --saturate")
    return scaling


def _quantize(x: Any, fmt: Any, scaling: str, args: argparse.Namespace) -> tuple[Any, dict]:
    """(values shaped and typed like ``x``, the arrays of ``--codes``' .npz: see QUANTIZE_HELP)."""
    import numpy as np

    from .convert import encode, quantize
    from .scaling import scaled_quantize

    meta = {"format": fmt.name, "scaling": scaling}
    if scaling == "none":
        opts = dict(rounding=args.rounding, saturate=args.saturate, seed=args.seed,
                    srbits=args.srbits)
        values = quantize(x, fmt, **opts)
        record = {**meta, "element_format": fmt.name}
        if args.codes:
            nans = 0 if fmt.has_nan or args.nan_to_zero else int(np.isnan(x).sum())
            if nans:
                raise CliError(f"{args.input} holds {nans} NaN value(s) and {fmt.name} has no "
                               "NaN code, so --codes cannot store them: pass --nan-to-zero to "
                               "store code 0 for them (as ml_dtypes does; OUT keeps NaN), or "
                               "choose a format with NaN (e.g. e4m3)")
            record["codes"] = encode(x, fmt, on_nan="zero" if args.nan_to_zero else "raise",
                                     **opts)
        return values, record
    if isinstance(fmt, Format):
        axis = args.axis
        gran = ("block", args.block_size) if scaling == "block" else scaling
        st = scaled_quantize(x, fmt, granularity=gran, axis=axis, rounding=args.rounding,
                             seed=args.seed, srbits=args.srbits,
                             scale_dtype=args.scale_dtype or "fp32")
        return st.values, {**meta, "element_format": fmt.name, "codes": st.codes,
                           "scales": st.scales, "scale_format": args.scale_dtype or "fp32",
                           "axis": -1 if st.axis is None else st.axis,
                           "block_size": args.block_size or 0}
    from . import mx

    axis = -1 if args.axis is None else args.axis
    q = mx.quantize(x, fmt, axis=axis, block_size=args.block_size, rounding=args.rounding,
                    seed=args.seed, srbits=args.srbits)
    wide = x.dtype == np.float64
    values = q.dequantize(np.float64 if wide else np.float32)
    with np.errstate(over="ignore"):
        values = values.astype(x.dtype)
    scales = q.scale_values(np.float32)
    record = {**meta, "element_format": fmt.elem.name, "codes": q.codes, "scales": scales,
              "scale_codes": q.scales, "scale_format": fmt.scale.name, "axis": q.axis,
              "block_size": q.block_size, "element_exponent": fmt.elem_exp}
    if q.tensor_scale is not None:
        record["tensor_scale"] = np.float32(q.tensor_scale)
    return values, record


def describe_format(name: str, fmt: Any) -> str:
    """One line: what ``name`` resolved to (canonical name, family, bits, largest value)."""
    from .formats import family

    said = "" if name.strip().lower() == fmt.name else f"{name} -> "
    if isinstance(fmt, Format):
        layout = ("two's complement" if fmt.signed else "unsigned") if fmt.is_int else \
            f"{fmt.ebits} exponent, {fmt.mbits} mantissa"
        return (f"{said}{fmt.name} ({family(fmt)}): {fmt.bits} bits ({layout}), max "
                f"{_fmt_num(fmt.max)}")
    return (f"{said}{fmt.name}: {fmt.elem.name} elements ({fmt.elem.bits} bits, max "
            f"{_fmt_num(fmt.max)}) x one {fmt.scale.name} scale per {fmt.block_size}"
            f"{'' if fmt.is_mx else ' x a float32 tensor scale'}")


def _check_width(name: str, fmt: Format, x: Any, allow: bool) -> None:
    """Refuse a format wider than the data (quantizing would keep every value: likely a typo,
    e.g. e4m33 for e4m3) unless ``--allow-wider``."""
    import difflib

    from .blockrules import BLOCK_FORMATS
    from .formats import known_names

    width = x.dtype.itemsize * 8
    if fmt.bits <= width or allow:
        return
    key, known = name.strip().lower(), known_names()
    close = [] if key in known else \
        difflib.get_close_matches(key, known + list(BLOCK_FORMATS), n=1, cutoff=0.6)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise CliError(f"{describe_format(name, fmt)}: wider than the input's {x.dtype} "
                   f"({width} bits), so quantizing would change nothing.{hint} Pass "
                   "--allow-wider to write it anyway")


def _codes_path(path: str) -> str:
    """The file ``np.savez(path)`` writes (``.npz`` appended when missing); not a folder."""
    target = path if path.endswith(".npz") else path + ".npz"
    if os.path.isdir(path) or os.path.isdir(target):
        raise CliError(f"{path} is a directory: give --codes as a file name, e.g. {path}/c.npz")
    return target


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
EXPERIMENTS_MODULE = "fpsim_experiments.cli"
SWEEP_MODULE = "fpsim_experiments.sweep.cli"


@contextlib.contextmanager
def _experiments_available() -> Any:
    """Turn a missing experiments package, or a missing dependency of it, into one line."""
    try:
        yield
    except ModuleNotFoundError as exc:
        ours = ("fpsim_experiments", EXPERIMENTS_MODULE, SWEEP_MODULE, SWEEP_MODULE.rpartition(".")[0])
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


QUANTIZE_HELP = """\
Round every element of IN (a .npy array) to FMT, save it as OUT (same float dtype; integers
give float64) and print the format it resolved and the error summary.  FMT is an element
format (e4m3, bf16, int8, e3m2fn...; --scaling tensor|channel|block adds scales) or a block
format (mxfp8_e4m3, mxfp4, nvfp4...; one scale per block).  A format wider than the input is
refused (a typo such as e4m33 would change nothing) unless --allow-wider.  Files are written
whole or not at all.

--codes FILE.npz holds (numpy.load(FILE)):
  format, element_format, scaling   names (strings)
  codes        one element code per value, IN's shape (uint8 up to 8 bits)
  scales       float32 scale values: shape () per tensor; IN's shape with 1 except on the
               channel axis; IN's shape with the block axis holding the block count
  scale_codes  (block formats) the scales' codes in scale_format (E8M0 or E4M3), same shape
  scale_format, axis, block_size, element_exponent (MXINT8: -6), tensor_scale (NVFP4)
  value = decode(code, element_format) * 2**element_exponent * scale [* tensor_scale],
  the block's scale repeated along the axis; with --scaling none only codes are written.
"""


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
    s.add_argument("--p3109", action="store_true",
                   help="list the IEEE P3109 formats of 3 to 8 bits too")
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
                       description=QUANTIZE_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("input", metavar="IN", help="input .npy file")
    s.add_argument("output", metavar="OUT", help="output .npy file")
    _format_option(s, repeat=False)
    _rounding_options(s)
    s.add_argument("--seed", type=int, help="random seed for --rounding stochastic")
    s.add_argument("--scaling", choices=SCALINGS,
                   help="one scale per tensor, per channel along --axis, or per block (default: "
                        "none for element formats, block for block formats)")
    s.add_argument("--block-size", type=int, metavar="N",
                   help="values per scale with --scaling block (block formats: their own)")
    s.add_argument("--axis", type=int, help="the channel axis (default 0) or block axis "
                                           "(default -1)")
    s.add_argument("--scale-dtype", choices=("fp32", "e8m0"),
                   help="scales of an element format's scaling: float32 (default) or powers "
                        "of two")
    s.add_argument("--codes", metavar="FILE.npz",
                   help="also write the codes and scales (layout: see above)")
    s.add_argument("--nan-to-zero", action="store_true",
                   help="with --codes and a format without NaN (e2m1, int8...): store NaN "
                        "inputs as code 0, as ml_dtypes does (OUT keeps NaN)")
    s.add_argument("--allow-wider", action="store_true",
                   help="write a format wider than the input (it changes nothing)")
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


_SHOW_WARNING = warnings.showwarning


def _show_note(message: Any, category: type, *args: Any, **kwargs: Any) -> None:
    """A ``fpsim.formats.NameWarning`` as one line, ``fpsim: note: ...``; others as
    Python shows them."""
    from .formats import NameWarning

    if issubclass(category, NameWarning):
        print(f"fpsim: note: {message}", file=sys.stderr)
    else:
        _SHOW_WARNING(message, category, *args, **kwargs)


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
        with warnings.catch_warnings():
            warnings.showwarning = _show_note
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
