"""Experiment ``accumulation``: the same sites summed in FP32, BF16 and FP16, in different orders.

Every site's operands are rounded to BF16 (as a mixed-precision GEMM reads them) and summed by
``fpsim.matmul`` with exact products: left to right (``sequential``), in blocks of 128
promoted to an FP32 outer sum (``chunked``, DeepSeek-V3's fix) or as a balanced tree
(``pairwise``), plus the Hopper BF16 tensor-core model (groups of 16 products aligned and
truncated to 25 fraction bits).  Errors are measured against the FP64 sum of the same BF16
operands, so they are the accumulator's alone (the FP64 row then shows only the final rounding
of the result to FP32).  The error of rounding the operands to BF16 is measured separately: the
FP64 sum of the BF16 operands against FP64 on the FP32 operands (``input_floor``).  Sites are
subsampled: the accumulator is emulated one addition at a time.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from . import replay
from .capture import Site
from .context import Captured, Context
from .progress import bar as progress_bar
from .recipes import Recipe
from .report import figure, median_finite, num, page, save, snr_per_site, table

NAME = "accumulation"
INPUTS = "bf16"
ACCUMULATORS = ("fp32", "bf16", "fp16")
ORDERS = ("sequential", "chunked", "pairwise")
CHUNK = 128
TENSOR_CORE = "hopper_bf16"
REFERENCE = "fp64 sequential"


def recipes() -> list[Recipe]:
    """FP64 (input rounding only), every accumulator in every order, and the tensor-core model."""
    out = [Recipe(INPUTS, accum="fp64", order="sequential", name=REFERENCE)]
    out += [Recipe(INPUTS, accum=a, order=o, chunk=CHUNK if o == "chunked" else None,
                   name=f"{a} {o}")
            for a in ACCUMULATORS for o in ORDERS]
    return out + [
        Recipe(INPUTS, order="tensor_core", tensor_core=TENSOR_CORE,
               name=f"tensor core ({TENSOR_CORE})")
    ]


QUANTIZED_REFERENCE = Recipe(INPUTS, accum="fp64", name="fp64 native, bf16 operands")


def quantized_reference(site: Site) -> Tensor:
    """FP64 result of a site on its operands rounded to BF16: what an exact accumulator would
    give."""
    return replay.used(replay.site_output(site.to(torch.float64), QUANTIZED_REFERENCE), site)


def run(ctx: Context) -> dict[str, Any]:
    """Per-site statistics of every accumulator and order on the emulation subsample.

    ``runs``: against the FP64 sum of the same BF16 operands (accumulator error only);
    ``input_floor``: the FP64 sum of the BF16 operands against FP64 on the FP32 operands.
    """
    rs = recipes()
    stats: list[dict[str, dict]] = [{} for _ in rs]
    floor: dict[str, dict] = {}
    bar = progress_bar(len(ctx.site_names), NAME, "site")

    def each(c: Captured) -> None:
        ref = quantized_reference(c.emulation)
        for r, st in zip(rs, stats):
            st[c.name] = replay.replay_site(c.emulation, r, ref)
        floor[c.name] = replay.replay_site(c.emulation, rs[0], c.emulation_ref)
        bar.update()

    ctx.stream(each)
    bar.close()
    runs = [{"recipe": r.to_json(), "summary": replay.summary(st), "sites": st}
            for r, st in zip(rs, stats)]
    return {
        "runs": runs,
        "input_floor": {"recipe": rs[0].to_json(), "summary": replay.summary(floor),
                        "sites": floor},
        "inputs": INPUTS,
        "chunk": CHUNK,
        "reference": "fp64 sum of the same bf16 operands",
    }


def _stats(run: dict) -> dict[str, Any]:
    sites = run["sites"]
    return {
        "snr_median": median_finite(run, "snr_db"),
        "snr_min": run["summary"]["snr_db_min"],
        "rel_p99_median": median_finite(run, "rel_p99"),
        "overflow_sites": [n for n, s in sites.items() if s["accum_overflow"] > 0],
        "swamped": statistics.mean(s["accum_swamped"] for s in sites.values()),
        "max_partial": max(s["accum_max_partial"] for s in sites.values()),
    }


def conclusions(data: dict) -> list[str]:
    """Each accumulator and order against the FP64 row, overflow of FP16 sums, the tensor-core
    model."""
    st = {r["recipe"]["name"]: _stats(r) for r in data["runs"]}
    if "input_floor" in data:
        floor = _stats(data["input_floor"])
        out = [
            f"Rounding the operands to BF16 alone (summed exactly) gives a median site SNR of "
            f"{num(floor['snr_median'])} dB against FP64 on the FP32 operands (worst site "
            f"{num(floor['snr_min'])} dB): the input-rounding floor, reported apart from the "
            f"accumulator "
            "numbers below, which are against the FP64 sum of the same BF16 operands.",
            f"The FP64 accumulator gives {num(st[REFERENCE]['snr_median'])} dB against that "
            f"reference: only "
            "the final rounding of the result to FP32, which every configuration's numbers "
            "include.",
        ]
    else:
        out = [
            f"BF16 operands summed in FP64 give a median site SNR of "
            f"{num(st[REFERENCE]['snr_median'])} dB: "
            "the floor set by the inputs."
        ]
    for a in ACCUMULATORS:
        parts = [f"{o} {num(st[f'{a} {o}']['snr_median'])} dB" for o in ORDERS]
        out.append(
            f"{a.upper()} accumulator, median site SNR: "
            + ", ".join(parts)
            + f"; on average {num(st[f'{a} sequential']['swamped'])} additions per output were "
              f"swamped "
            "left to right."
        )
    f16 = st["fp16 sequential"]
    out.append(
        f"FP16 sums overflowed (left to right) at {len(f16['overflow_sites'])} sites"
        + (f" ({', '.join(f16['overflow_sites'])})" if f16["overflow_sites"] else "")
        + f"; the largest partial sum in FP32 was {num(st['fp32 sequential']['max_partial'])}"
        " (FP16 max 65504)."
    )
    tc = st[f"tensor core ({TENSOR_CORE})"]
    out.append(
        f"The {TENSOR_CORE} tensor-core model gives {num(tc['snr_median'])} dB, "
        f"{num(tc['snr_median'] - st['fp32 sequential']['snr_median'])} dB from FP32 left to right."
    )
    if "input_floor" in data:
        floor = _stats(data["input_floor"])["snr_median"]
        below = [n for n, v in st.items() if v["snr_median"] < floor + 10]
        out.append(
            f"Accumulators within 10 dB of the input-rounding floor ({num(floor)} dB) or below "
            f"it, whose "
            "error is comparable with or larger than BF16 operand rounding: "
            + (", ".join(below) if below else "none")
            + "."
        )
    return out


def figures(data: dict, out: Path) -> list[str]:
    """SNR per site for each configuration, and the median over sites."""
    fig, axes = figure(1, 2, width=8, height=4.5)
    ax = axes[0, 0]
    color = {"fp64": "black", "fp32": "tab:blue", "bf16": "tab:red", "fp16": "tab:green"}
    style = {"sequential": "-", "chunked": "--", "pairwise": ":", "tensor_core": "-."}
    styles = [
        {
            "ls": style[r["recipe"]["order"]],
            "lw": 1.2,
            "color": "tab:purple" if r["recipe"]["tensor_core"] else color[r["recipe"]["accum"]],
        }
        for r in data["runs"]
    ]
    names = snr_per_site(ax, data["runs"], styles, fontsize=6)
    ax.set_ylabel(
        "SNR against FP64 sum of the same BF16 operands, dB"
        if "input_floor" in data
        else "SNR against FP64 on FP32 operands, dB",
        fontsize=8,
    )
    if "input_floor" in data:
        floor = data["input_floor"]["sites"]
        ax.plot(
            range(len(names)),
            [floor[n]["snr_db"] for n in names],
            "k",
            lw=3,
            alpha=0.3,
            label="input rounding floor (BF16 operands vs FP32)",
        )
    ax.set_title(
        f"{INPUTS.upper()} operands: SNR per site (colour: accumulator, line: order)", fontsize=9
    )
    ax.legend(fontsize=6, ncol=2, loc="upper left", bbox_to_anchor=(0.0, -0.45))
    ax = axes[0, 1]
    labels = [r["recipe"]["name"] for r in data["runs"]]
    ax.barh(range(len(labels)), [_stats(r)["snr_median"] for r in data["runs"]])
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    if "input_floor" in data:
        ax.axvline(
            _stats(data["input_floor"])["snr_median"],
            color="gray",
            ls="--",
            label="input rounding floor",
        )
        ax.legend(fontsize=7)
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
        rows.append(
            [
                r["recipe"]["name"],
                num(s["snr_median"]),
                num(s["snr_min"]),
                num(s["rel_p99_median"]),
                len(s["overflow_sites"]),
                num(s["swamped"]),
                num(s["max_partial"]),
            ]
        )
    if "input_floor" in data:
        s = _stats(data["input_floor"])
        rows.append(
            [
                "input rounding floor: BF16 operands summed in FP64, vs FP64 on FP32 operands",
                num(s["snr_median"]),
                num(s["snr_min"]),
                num(s["rel_p99_median"]),
                "-",
                "-",
                "-",
            ]
        )
    intro = (
        f"{meta['emulation_rows']} rows per site (at most 2 batch entries for attention), BF16 "
        f"operands, "
        "exact products; SNR and relative error against "
        + (
            "the FP64 sum of the same BF16 operands (the accumulator's error alone; the "
            "input-rounding "
            "floor is the last row, against FP64 on the FP32 operands)"
            if "input_floor" in data
            else "FP64 on the FP32 operands"
        )
        + f". Chunked: blocks of "
        f"{data['chunk']} summed in the accumulator, each added to an FP32 sum."
    )
    body = [
        f"![accumulation]({names[0]})",
        "",
        table(
            [
                "configuration",
                "median SNR dB",
                "worst site SNR dB",
                "median of per-site p99 rel. error",
                "sites whose sums overflowed",
                "swamped additions per output",
                "largest partial sum",
            ],
            rows,
        ),
    ]
    return page("Accumulation", meta, intro, conclusions(data), body)
