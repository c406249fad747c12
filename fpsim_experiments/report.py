"""Writing experiment outputs: strict JSON, Markdown tables, figures and number formatting.

Every experiment writes ``results.json`` (every number), PNG figures and a ``REPORT.md`` built
from that JSON.  JSON has no inf/NaN, so non-finite floats are written as the strings
``"inf"``, ``"-inf"`` and ``"nan"`` and read back as floats by ``load_json``.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .gpt2.model import site_order

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

_SPECIAL = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}

#: How the reports name E4M3: range-vs-precision's splits are IEEE-style, fpsim's ``e4m3`` is
#: OCP's; one name, two formats (e5m2 and e3m4 are the same format in both).
IEEE_NAMES = ("Format names: every eXmY here is IEEE-style (inf/NaN in the all-ones exponent, "
              "subnormals; `fpsim.get_format('e4m3_ieee')`), so its e4m3 is IEEE-style E4M3 "
              "(max 240; ml_dtypes' float8_e4m3, fpsim's `fp8_e4m3`), NOT fpsim's `e4m3`, which "
              "is OCP E4M3FN (max 448, no inf) as in the fp8, practice and training experiments; "
              "e5m2 and e3m4 name the same formats in both.")
OCP_NAMES = ("E4M3 here is fpsim's `e4m3`, OCP E4M3FN (max 448, NaN, no inf), not "
             "range-vs-precision's IEEE-style e4m3 (max 240).")


def _strict(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {str(k): _strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_strict(v) for v in obj]
    return obj


def _loose(obj: Any) -> Any:
    if isinstance(obj, str) and obj in _SPECIAL:
        return _SPECIAL[obj]
    if isinstance(obj, dict):
        return {k: _loose(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_loose(v) for v in obj]
    return obj


def write_json(path: Path, data: dict) -> None:
    """Write ``data`` as strict JSON (non-finite floats as strings)."""
    path.write_text(json.dumps(_strict(data), indent=1, allow_nan=False) + "\n")


def load_json(path: Path) -> dict:
    """Read ``write_json`` output, turning ``"inf"``/``"-inf"``/``"nan"`` back into floats."""
    return _loose(json.loads(Path(path).read_text()))


def versions() -> dict[str, str]:
    """What produced the numbers: Python, torch and fpsim versions, the machine, the CPU
    kernels torch runs (``cpu_kernels``: its float64 log-softmax and sums, which the metrics
    use, round differently in the last bits under AVX2 and AVX-512) and MKL's summation order
    (``blas_order``: ``MKL_CBWR``, which this package pins, see ``fpsim_experiments``)."""
    import platform
    import sys

    import torch

    import fpsim
    return {"python": sys.version.split()[0], "torch": torch.__version__,
            "fpsim": fpsim.__version__, "machine": platform.machine(),
            "cpu_kernels": torch.backends.cpu.get_cpu_capability(),
            "blas_order": os.environ.get("MKL_CBWR", "unpinned"),
            "host_dependent": HOST_DEPENDENT}


#: What a rerun on another host may change (recorded in every results file's meta, beside the
#: CPU kernels that cause it; docs/results.md, "What a rerun on another host reproduces").
HOST_DEPENDENT = ("float64 metrics (KL, loss, SNR) in their last bits, and small KLs (below "
                  "about 1e-6) in their 2nd-3rd significant digit through the FP32 "
                  "reference's exp/tanh, which follow torch's CPU kernels (cpu_kernels) and "
                  "the CPU; counts (top-1, finite positions, overflowed, saturated and flushed "
                  "elements) and verdicts do not depend on the host")


def finish(name: str, out: Path, data: dict | None, render: Any) -> None:
    """Write ``data`` (None: keep the existing JSON) to ``out/results.json``, then
    ``out/REPORT.md`` from that JSON with ``render(data, out)``, and print where it is."""
    if data is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "results.json", data)
    (out / "REPORT.md").write_text(render(load_json(out / "results.json"), out))
    print(f"{name}: {out / 'REPORT.md'}")


def in_forward_order(sites: Sequence[str]) -> list[str]:
    """Site names sorted as the forward pass meets them: the first is where trouble starts."""
    return sorted(sites, key=site_order)


def kl_or_inf(run: dict) -> float:
    """End-to-end KL with non-finite (NaN logits) read as infinitely bad, for ranking."""
    kl = run["e2e"]["kl"]
    return kl if math.isfinite(kl) else math.inf


def median_finite(run: dict, key: str) -> float:
    """Median of a per-site statistic over the sites where it is a number."""
    vals = [s[key] for s in run["sites"].values() if not math.isnan(s[key])]
    return statistics.median(vals) if vals else math.nan


def num(v: float | None, digits: int = 3) -> str:
    """A compact number for tables: 3 significant digits, ``-`` for None, ``NaN``/``inf`` spelled
    out."""
    if v is None:
        return "-"
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == 0:
        return "0"
    return f"{v:.{digits}g}"


def pct(v: float, digits: int = 3) -> str:
    """A share as a percentage with ``digits`` significant digits (``0`` stays ``0``)."""
    return "0" if v == 0 else f"{100 * v:.{digits}g}%"


def ratio(a: float, b: float) -> str:
    """``a / b`` as ``N×`` for conclusion sentences; NaN/inf values (diverged runs) are spelled
    out."""
    if not math.isfinite(a):
        return "non-finite (from finite)" if math.isfinite(b) else "non-finite"
    if not math.isfinite(b):
        return "finite (from non-finite)"
    if b == 0:
        return "∞×" if a > 0 else "1×"
    return f"{a / b:.3g}×"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def figure(
    rows: int = 1, cols: int = 1, width: float = 6.0, height: float = 4.0
) -> tuple[Any, Any]:
    """A matplotlib figure and its axes (an array when more than one)."""
    return plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)


def save(fig: Any, path: Path) -> str:
    """Save and close ``fig``; returns the file name for the report."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def quick_note(meta: dict, skipped: str = "", size: str | None = None) -> list[str]:
    """What a ``--quick`` report cannot tell (nothing when the run was not quick); ``skipped``:
    what this experiment's quick run leaves out; ``size``: how much it ran (default: its
    held-out tokens and windows, sites subsampled).

    >>> quick_note({"quick": True, "tokens": 512, "window": 256})[0][:60]
    '**Quick run (`--quick`): a first try, not a result.** 512 he'
    """
    if not meta.get("quick"):
        return []
    if size is None and "tokens" not in meta:
        size = "a few units of input"
    if size is None:
        windows = max(1, meta["tokens"] // meta["window"]) if meta.get("window") else None
        size = f"{meta['tokens']} held-out tokens" + (
            f" ({windows} window{'s' if windows > 1 else ''})" if windows else "") \
            + ", sites subsampled"
    return [f"**Quick run (`--quick`): a first try, not a result.** {size}"
            + (f"; {skipped}" if skipped else "")
            + ". Its intervals resample those few windows or seeds only, so they say nothing "
            "beyond them (a topic interval appears only where the windows span two topics); "
            "quote none of its verdicts. Run without `--quick` for the study.", ""]


def page(
    title: str,
    meta: dict,
    intro: str,
    conclusions: Sequence[str],
    body: Sequence[str],
    lead: Sequence[str] = (),
    skipped: str = "",
) -> str:
    """A report page as every experiment writes it: title naming the model, a line saying so
    when the model is synthetic (``meta["synthetic"]``), what a quick run cannot tell
    (``quick_note``, ``skipped``: what it leaves out), intro paragraph, ``lead`` (e.g. a
    headline figure and table), the conclusions as bullets, then ``body`` (figures, tables),
    one line per item."""
    lines = [f"# {title} ({meta['model']})", ""]
    if meta.get("synthetic"):
        lines += [f"**Synthetic model:** {meta['synthetic']}.", ""]
    lines += quick_note(meta, skipped)
    lines += [intro, ""]
    lines += [*lead, ""] if lead else []
    lines += ["## Conclusions", ""]
    lines += [f"- {c}" for c in conclusions] + [""] + list(body)
    return "\n".join(lines) + "\n"


def snr_per_site(
    ax: Any, runs: Sequence[dict], styles: Sequence[dict] | None = None, fontsize: int = 7
) -> list[str]:
    """Each run's per-site SNR (dB) against the site index, non-finite SNR as gaps.

    ``styles``: matplotlib keyword arguments per run (default: ``o-`` markers).  Returns the
    site names, which label the x axis.
    """
    names: list[str] = list(runs[0]["sites"]) if runs else []
    for i, run in enumerate(runs):
        kw = dict(styles[i]) if styles else {"marker": "o", "ms": 4}
        snr = [run["sites"][n]["snr_db"] for n in names]
        ax.plot(
            range(len(names)),
            [v if math.isfinite(v) else math.nan for v in snr],
            label=run["recipe"]["name"],
            **kw,
        )
    ax.set_xticks(range(len(names)), names, rotation=90, fontsize=fontsize)
    ax.grid(alpha=0.3)
    return names
