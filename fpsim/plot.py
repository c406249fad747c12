"""Pictures of formats and of what they do to data; each function returns a matplotlib Figure.

matplotlib is imported inside the functions (``import fpsim`` stays NumPy-only; without it they
raise an ImportError naming the extra to install, ``pip install "fpsim[plot]"``).  The figures are
built without pyplot, so they never open windows: save them with ``fig.savefig("name.png")``.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .convert import quantize, values
from .formats import FORMATS, Format, get_format
from .summary import out_of_range, summarize

Formats = Sequence["str | Format"]
VIEW = 24  # value_coverage shows at most this many binades either side of the data


def _figure(height: float = 4.0, width: float = 8.0) -> Any:
    try:
        from matplotlib.figure import Figure
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("matplotlib"):
            raise
        raise ImportError('fpsim.plot draws with matplotlib, which is not installed: pip install '
                          '"fpsim[plot]" (or pip install matplotlib)') from exc

    return Figure(figsize=(width, height), layout="constrained")


def _formats(formats: Formats | str | Format) -> list[Format]:
    if isinstance(formats, (str, Format)):
        formats = [formats]
    fmts = [get_format(f) for f in formats]
    if not fmts:
        raise ValueError("no formats given: pass one or more format names, e.g. ['bf16', 'e4m3']")
    return fmts


def _finite_array(x: Any) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiu" or arr.size == 0:
        raise ValueError(f"expected a non-empty array of real numbers, got {arr.dtype} with "
                         f"{arr.size} elements")
    return arr.reshape(-1)


def error_histogram(x: Any, formats: Formats | str | Format, *, relative: bool = True,
                    rounding: str = "rne", saturate: bool = False, bins: int = 60) -> Any:
    """Histograms of the rounding error of ``x`` quantized to each format, on a log error axis.

    Only inexact, in-range results are binned; the legend counts the exact ones and the
    overflows (finite inputs beyond the format's largest value) and underflows (non-zero inputs
    that became zero) of each format.
    """
    arr = _finite_array(x)
    x64 = arr.astype(np.float64)
    curves = []
    for fmt in _formats(formats):
        q = quantize(arr, fmt, rounding=rounding, saturate=saturate).astype(np.float64)
        stats = summarize(x64, q, fmt)
        ok = np.isfinite(x64) & np.isfinite(q) & ~out_of_range(x64, fmt)
        err = np.abs(q[ok] - x64[ok])
        if relative:
            nz = x64[ok] != 0
            err = err[nz] / np.abs(x64[ok][nz])
        label = (f"{fmt.name}: {int((err == 0).sum())} exact, {stats.overflow} overflow, "
                 f"{stats.underflow} underflow")
        curves.append((err[err > 0], label))
    nonzero = [e for e, _ in curves if e.size]
    fig = _figure()
    ax = fig.add_subplot()
    if nonzero:
        lo = min(float(e.min()) for e in nonzero)
        hi = max(float(e.max()) for e in nonzero)
        edges = np.geomspace(lo, hi * (1 + 1e-9) if hi > lo else lo * 2, bins + 1)
    else:
        edges = np.array([0.5, 1.0])
    for err, label in curves:
        counts, _ = np.histogram(err, edges)
        ax.stairs(counts, edges, label=label, linewidth=1.5)
    ax.set_xscale("log")
    kind = "relative error |q - x| / |x|" if relative else "absolute error |q - x|"
    ax.set_xlabel(f"{kind} (log scale)")
    ax.set_ylabel("values per bin")
    ax.set_title(f"Rounding error of {arr.size:,} values ({rounding}"
                 f"{', saturating' if saturate else ''})")
    ax.legend(fontsize="small")
    return fig


def number_line(fmt: str | Format) -> Any:
    """Every positive finite value of ``fmt`` (at most 16 bits) as a tick on a log axis.

    The subnormal and normal ranges are shaded; negative values mirror the positive ones.
    """
    fmt = get_format(fmt)
    if fmt.bits > 16:
        raise ValueError(f"{fmt.name} has 2^{fmt.bits} codes; number_line draws formats of at "
                         "most 16 bits")
    v = values(fmt)
    v = v[v > 0]
    sub = v < fmt.min_normal if (fmt.zero and not fmt.is_int) else np.zeros(v.shape, bool)
    fig = _figure(height=2.6)
    ax = fig.add_subplot()
    if sub.any():
        ax.axvspan(v[sub][0], fmt.min_normal, color="tab:orange", alpha=0.12)
        ax.vlines(v[sub], 0, 1, color="tab:orange", linewidth=0.8,
                  label=f"subnormal: {int(sub.sum())}")
    ax.axvspan(fmt.min_normal, fmt.max, color="tab:blue", alpha=0.08)
    kind = "integer" if fmt.is_int else "normal"
    ax.vlines(v[~sub], 0, 1, color="tab:blue", linewidth=0.8, label=f"{kind}: {int((~sub).sum())}")
    ax.set_xscale("log", base=2)
    ax.set_xlim(v[0] / 1.5, v[-1] * 1.5)
    ax.set_ylim(0, 1.6)
    ax.set_yticks([])
    ax.set_xlabel(f"value (log2 scale); min {v[0]:.4g}, min normal {fmt.min_normal:.4g}, "
                  f"max {fmt.max:.6g}")
    ax.set_title(f"{fmt.name}: the {v.size} positive finite values (negatives mirror them)")
    ax.legend(loc="upper left", ncols=2, fontsize="small")
    return fig


def range_precision(formats: Formats | str | Format | None = None) -> Any:
    """Each format as a point: dynamic range in binades against epsilon (up = finer).

    The default is every named floating-point format but fp64.  Formats that would sit on top of
    each other (same epsilon, ranges within 1.5 binades) share one label.
    """
    fmts = _formats(formats) if formats is not None else \
        [f for f in FORMATS.values() if not f.is_int and f.name != "fp64"]
    fig = _figure(height=5.0)
    ax = fig.add_subplot()
    ax.scatter([f.dynamic_range for f in fmts], [f.eps for f in fmts], color="tab:blue", zorder=3)
    groups: list[list[Format]] = []
    for f in sorted(fmts, key=lambda f: (f.eps, f.dynamic_range)):
        last = groups[-1][-1] if groups else None
        if last and last.eps == f.eps and f.dynamic_range - last.dynamic_range < 1.5:
            groups[-1].append(f)
        else:
            groups.append([f])
    for g in groups:
        ax.annotate("\n".join(f.name for f in g), (g[0].dynamic_range, g[0].eps),
                    textcoords="offset points", xytext=(6, -4), va="top", fontsize="small")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.invert_yaxis()
    ax.margins(x=0.12, y=0.12)
    ax.grid(True, which="major", alpha=0.3)
    ax.set_xlabel("dynamic range: binades from smallest to largest positive value (log2 scale)")
    ax.set_ylabel("epsilon: gap above 1 (log2 scale, finer is up)")
    ax.set_title("Range against precision")
    return fig


def value_coverage(x: Any, formats: Formats | str | Format, *, rounding: str = "rne",
                   saturate: bool = False) -> Any:
    """The histogram of |x| per binade above each format's representable range.

    Each format is a bar from its smallest positive value to its largest (subnormals lighter);
    its label counts the values of ``x`` that overflow or flush to zero when quantized.
    """
    arr = _finite_array(x)
    x64 = arr.astype(np.float64)
    fmts = _formats(formats)
    mag = np.abs(x64[np.isfinite(x64) & (x64 != 0)])
    fig = _figure(height=2.6 + 0.45 * len(fmts))
    top, bottom = fig.subplots(2, 1, sharex=True,
                               gridspec_kw={"height_ratios": [3, 0.45 * len(fmts) + 0.4]})
    if mag.size:
        b = np.log2(mag)
        edges = np.arange(np.floor(b.min()), np.floor(b.max()) + 2)
        counts, _ = np.histogram(b, edges)
        top.stairs(counts, edges, fill=True, color="tab:gray", alpha=0.6,
                   label=f"|x|: {mag.size:,} non-zero finite values")
        top.legend(fontsize="small", loc="upper left")
    top.set_ylabel("values per binade")
    top.set_title("Where the data lies against each format's range")
    labels = []
    for i, fmt in enumerate(fmts):
        q = quantize(arr, fmt, rounding=rounding, saturate=saturate).astype(np.float64)
        s = summarize(x64, q, fmt)
        lo, mid, hi = np.log2(fmt.min_subnormal), np.log2(fmt.min_normal), np.log2(fmt.max)
        bottom.broken_barh([(lo, mid - lo)], (i - 0.35, 0.7), color="tab:orange", alpha=0.5)
        bottom.broken_barh([(mid, hi - mid)], (i - 0.35, 0.7), color="tab:blue", alpha=0.7)
        labels.append(f"{fmt.name}: {s.overflow} overflow, {s.underflow} flush to 0")
    bottom.set_yticks(range(len(fmts)), labels, fontsize="small")
    bottom.set_ylim(len(fmts) - 0.5, -0.5)
    bottom.set_xlabel("log2 |x| (binade); bars: subnormal (orange) and normal (blue) ranges")
    if mag.size:   # show every format's ends, but no more than VIEW binades beyond the data
        lo = min(edges[0], *(np.log2(f.min_subnormal) for f in fmts)) - 1
        hi = max(edges[-1], *(np.log2(f.max) for f in fmts)) + 1
        bottom.set_xlim(max(lo, edges[0] - VIEW), min(hi, edges[-1] + VIEW))
    return fig
