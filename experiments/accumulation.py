"""Experiment ``accumulation``: the same sites summed in FP32, BF16 and FP16, in different orders.

Every site's operands are rounded to BF16 (as a mixed-precision GEMM reads them) and summed by
:func:`fpsim.matmul` with exact products: left to right (``sequential``), in blocks of 128
promoted to an FP32 outer sum (``chunked``, DeepSeek-V3's fix) or as a balanced tree
(``pairwise``), plus the Hopper BF16 tensor-core model (groups of 16 products aligned and
truncated to 25 fraction bits).  The FP64 row is BF16 rounding of the operands alone.  Sites
are subsampled: the accumulator is emulated one addition at a time.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from tqdm import tqdm

from .context import Context
from .recipes import Recipe
from .report import figure, num, save, table

NAME = "accumulation"
INPUTS = "bf16"
ACCUMULATORS = ("fp32", "bf16", "fp16")
ORDERS = ("sequential", "chunked", "pairwise")
CHUNK = 128
TENSOR_CORE = "hopper_bf16"
REFERENCE = "fp64 sequential"


def recipes() -> list[Recipe]:
    """FP64 (input rounding only), every accumulator in every order, and the tensor-core model."""
    out = [Recipe(REFERENCE, INPUTS, accum="fp64", order="sequential")]
    out += [Recipe(f"{a} {o}", INPUTS, accum=a, order=o, chunk=CHUNK if o == "chunked" else None)
            for a in ACCUMULATORS for o in ORDERS]
    return out + [Recipe(f"tensor core ({TENSOR_CORE})", INPUTS, order="tensor_core", tensor_core=TENSOR_CORE)]


def run(ctx: Context) -> dict[str, Any]:
    """Per-site statistics of every accumulator and order on the emulation subsample."""
    return {"runs": [ctx.run(r, e2e=False) for r in tqdm(recipes(), desc=NAME, unit="recipe")],
            "inputs": INPUTS, "chunk": CHUNK}


def _median(run: dict, key: str) -> float:
    vals = [s[key] for s in run["sites"].values() if not math.isnan(s[key])]
    return statistics.median(vals) if vals else math.nan


def _stats(run: dict) -> dict[str, Any]:
    sites = run["sites"]
    return {"snr_median": _median(run, "snr_db"), "snr_min": run["summary"]["snr_db_min"],
            "rel_p99_median": _median(run, "rel_p99"),
            "overflow_sites": [n for n, s in sites.items() if s["accum_overflow"] > 0],
            "swamped": statistics.mean(s["accum_swamped"] for s in sites.values()),
            "max_partial": max(s["accum_max_partial"] for s in sites.values())}


def conclusions(data: dict) -> list[str]:
    """Each accumulator and order against the FP64 row, overflow of FP16 sums, the tensor-core model."""
    st = {r["recipe"]["name"]: _stats(r) for r in data["runs"]}
    ref = st[REFERENCE]["snr_median"]
    out = [f"BF16 operands summed in FP64 give a median site SNR of {num(ref)} dB: the floor set by the inputs."]
    for a in ACCUMULATORS:
        parts = [f"{o} {num(st[f'{a} {o}']['snr_median'])} dB" for o in ORDERS]
        out.append(f"{a.upper()} accumulator, median site SNR: " + ", ".join(parts)
                   + f"; on average {num(st[f'{a} sequential']['swamped'])} additions per output were swamped "
                     "left to right.")
    f16 = st["fp16 sequential"]
    out.append(f"FP16 sums overflowed (left to right) at {len(f16['overflow_sites'])} sites"
               + (f" ({', '.join(f16['overflow_sites'])})" if f16["overflow_sites"] else "")
               + f"; the largest partial sum in FP32 was {num(st['fp32 sequential']['max_partial'])}"
               " (FP16 max 65504).")
    tc = st[f"tensor core ({TENSOR_CORE})"]
    out.append(f"The {TENSOR_CORE} tensor-core model gives {num(tc['snr_median'])} dB, "
               f"{num(tc['snr_median'] - st['fp32 sequential']['snr_median'])} dB from FP32 left to right.")
    return out


def figures(data: dict, out: Path) -> list[str]:
    """SNR per site for each configuration, and the median over sites."""
    fig, axes = figure(1, 2, width=8, height=4.5)
    ax = axes[0, 0]
    color = {"fp64": "black", "fp32": "tab:blue", "bf16": "tab:red", "fp16": "tab:green"}
    style = {"sequential": "-", "chunked": "--", "pairwise": ":", "tensor_core": "-."}
    for run in data["runs"]:
        rec = run["recipe"]
        names = list(run["sites"])
        snr = [run["sites"][n]["snr_db"] for n in names]
        ax.plot(range(len(names)), [v if math.isfinite(v) else math.nan for v in snr], style[rec["order"]],
                color="tab:purple" if rec["tensor_core"] else color[rec["accum"]], lw=1.2, label=rec["name"])
    ax.set_xticks(range(len(names)), names, rotation=90, fontsize=6)
    ax.set_ylabel("SNR against FP64 on FP32 operands, dB")
    ax.set_title(f"{INPUTS.upper()} operands: SNR per site (colour: accumulator, line: order)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    ax = axes[0, 1]
    labels = [r["recipe"]["name"] for r in data["runs"]]
    ax.barh(range(len(labels)), [_stats(r)["snr_median"] for r in data["runs"]])
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_xlabel("median SNR over sites, dB")
    ax.set_title("accumulator and order")
    ax.grid(alpha=0.3, axis="x")
    return [save(fig, out / "accumulation.png")]


def render(data: dict, out: Path) -> str:
    """Figure and Markdown report."""
    meta = data["meta"]
    names = figures(data, out)
    rows = []
    for r in data["runs"]:
        s = _stats(r)
        rows.append([r["recipe"]["name"], num(s["snr_median"]), num(s["snr_min"]), num(s["rel_p99_median"]),
                     len(s["overflow_sites"]), num(s["swamped"]), num(s["max_partial"])])
    lines = [f"# Accumulation ({meta['model']})", "",
             f"{meta['emulation_rows']} rows per site (at most 2 batch entries for attention), BF16 operands, "
             f"exact products; SNR and relative error against FP64 on the FP32 operands. Chunked: blocks of "
             f"{data['chunk']} summed in the accumulator, each added to an FP32 sum.", "", "## Conclusions", ""]
    lines += [f"- {c}" for c in conclusions(data)]
    lines += ["", f"![accumulation]({names[0]})", "",
              table(["configuration", "median SNR dB", "worst site SNR dB", "median of per-site p99 rel. error",
                     "sites whose sums overflowed", "swamped additions per output", "largest partial sum"], rows)]
    return "\n".join(lines) + "\n"
