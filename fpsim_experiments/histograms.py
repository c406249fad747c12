"""Experiment ``histograms``: distributions of the relative error of every site's outputs, per
format.

Each recipe's outputs are compared with FP64 on the same operands; |error| / |reference| over
outputs that stay finite with a non-zero reference, binned in log10 (exact results and outputs
that overflowed are counted apart).  Figures pool the layers by site kind.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .context import Captured, Context
from .progress import bar as progress_bar
from .recipes import Recipe
from .replay import site_output, used
from .report import figure, num, page, save, table

NAME = "histograms"
EDGES = np.arange(-10.0, 2.01, 0.25)  # log10 relative error
RECIPES = (
    Recipe("fp16"),
    Recipe("bf16"),
    Recipe("e4m3", scaling="tensor", name="e4m3/tensor"),
    Recipe("e5m2", scaling="tensor", name="e5m2/tensor"),
    Recipe("int8", scaling="channel", name="int8/channel"),
    Recipe("mxfp8_e4m3", scaling="block", name="mxfp8_e4m3"),
    Recipe("mxfp4", scaling="block", name="mxfp4"),
    Recipe("nvfp4", scaling="block", name="nvfp4"),
)


def kind(site: str) -> str:
    """Site name without its layer index (``h3.attn.qk`` -> ``attn.qk``; LayerNorms ->
    ``layernorm``)."""
    if site.startswith("ln") or site.endswith((".ln_1", ".ln_2")):
        return "layernorm"
    return re.sub(r"^h\d+\.", "", site)


def histogram(y: torch.Tensor, ref: torch.Tensor) -> dict[str, Any]:
    """Counts of log10 relative error in ``EDGES`` bins, plus exact, below-range and non-finite
    counts."""
    y, ref = y.double(), ref.double()
    fin = torch.isfinite(y) & torch.isfinite(ref) & (ref != 0)
    rel = ((y[fin] - ref[fin]).abs() / ref[fin].abs()).cpu().numpy()  # the reporting edge
    exact = int((rel == 0).sum())
    logs = np.log10(rel[rel > 0])
    counts, _ = np.histogram(np.clip(logs, EDGES[0], EDGES[-1]), EDGES)
    return {
        "counts": counts.tolist(),
        "exact": exact,
        "nonfinite": int((torch.isfinite(ref) & ~torch.isfinite(y)).sum()),
        "median": float(np.median(rel)) if rel.size else float("nan"),
    }


def run(ctx: Context) -> dict[str, Any]:
    """Histograms of every recipe at every site."""
    out: dict[str, dict] = {recipe.name: {} for recipe in RECIPES}
    bar = progress_bar(len(ctx.site_names), NAME, "site")

    def each(c: Captured) -> None:
        for recipe in RECIPES:
            out[recipe.name][c.name] = histogram(used(site_output(c.sites, recipe), c.sites), c.ref)
        bar.update()

    ctx.stream(each)
    bar.close()
    return {"edges": EDGES.tolist(), "histograms": out}


def _pooled(data: dict, fmt: str, k: str) -> np.ndarray:
    return np.sum([h["counts"] for n, h in data["histograms"][fmt].items() if kind(n) == k], axis=0)


def _quantile(counts: np.ndarray, edges: list[float], q: float) -> float:
    """Upper edge (as a relative error) of the bin holding the ``q`` quantile of a histogram."""
    c = np.cumsum(counts)
    return 10 ** edges[int(np.searchsorted(c, q * c[-1])) + 1] if c[-1] else float("nan")


def conclusions(data: dict) -> list[str]:
    """Formats ordered by median error, and where each format's tail is widest."""
    kinds = sorted({kind(n) for n in next(iter(data["histograms"].values()))})
    med = {
        f: float(np.median([h["median"] for h in hs.values()]))
        for f, hs in data["histograms"].items()
    }
    out = [
        "Median over sites of the median relative error: "
        + " < ".join(f"{f} ({num(v)})" for f, v in sorted(med.items(), key=lambda kv: kv[1]))
        + "."
    ]
    for f in data["histograms"]:
        spread = {
            k: _quantile(_pooled(data, f, k), data["edges"], 0.99)
            / _quantile(_pooled(data, f, k), data["edges"], 0.5)
            for k in kinds
        }
        k = max(spread, key=spread.get)
        out.append(
            f"{f}: the widest tail (p99 / median, to the bin) is at {k} ({num(spread[k])}×)."
        )
    return out


def figures(data: dict, out: Path) -> list[str]:
    """One panel per site kind, one line per format: share of outputs per log10 relative-error
    bin."""
    kinds = sorted({kind(n) for n in next(iter(data["histograms"].values()))})
    cols = 4
    fig, axes = figure((len(kinds) + cols - 1) // cols, cols, width=4.2, height=3.2)
    centers = [(a + b) / 2 for a, b in zip(data["edges"][:-1], data["edges"][1:])]
    for ax, k in zip(axes.flat, kinds):
        for f in data["histograms"]:
            counts = _pooled(data, f, k)
            ax.plot([10**c for c in centers], counts / max(counts.sum(), 1), label=f)
        ax.set_xscale("log")
        ax.set_xlabel("relative error |y - ref| / |ref|")
        ax.set_ylabel("share of outputs per bin")
        ax.set_title(k)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(kinds) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    return [save(fig, out / "histograms.png")]


def render(data: dict, out: Path) -> str:
    """Figure and Markdown report."""
    meta = data["meta"]
    names = figures(data, out)
    fmts = list(data["histograms"])
    rows = []
    for site in data["histograms"][fmts[0]]:
        rows.append([site] + [num(data["histograms"][f][site]["median"]) for f in fmts])
    intro = (
        f"Per-site replay on {meta['replay_rows']} rows per site, FP32 accumulation, against FP64 "
        f"on the "
        "same operands. Operands are quantized (e4m3 is OCP E4M3FN, max 448), outputs stay FP32 "
        "(unlike the fp16-vs-bf16 experiment, which rounds outputs too). Bins of 0.25 in log10; "
        "errors below 1e-10 or above 100 are counted in the end bins."
    )
    body = [
        f"![histograms]({names[0]})",
        "",
        "Median relative error per site:",
        "",
        table(["site"] + fmts, rows),
    ]
    return page("Relative-error histograms", meta, intro, conclusions(data), body)
