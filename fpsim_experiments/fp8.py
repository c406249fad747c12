"""Experiment ``fp8``: 8-bit and smaller operand formats, with and without scaling.

Scalar formats E5M2, E4M3 (OCP E4M3FN, max 448), E3M4 and INT8 with no scaling, per-tensor and
per-channel amax scaling; block formats MXFP8 (E4M3, E5M2), MXFP6 (E2M3, E3M2), MXFP4, MXINT8
(32 elements per E8M0 scale) and NVFP4 (16 E2M1 elements per E4M3 scale plus a tensor scale),
blocks along the reduction axis.  FP32 accumulation and outputs.  Every site's operands are
quantized, LayerNorm inputs (the residual stream) included.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any


from fpsim import get_format, mx

from . import bootstrap
from .bootstrap import fmt_ci
from .context import Context
from .recipes import Recipe
from .report import (OCP_NAMES, figure, in_forward_order, kl_or_inf, num, page, pct, ratio,
                     save, table)

NAME = "fp8"
SCALARS = ("e5m2", "e4m3", "e3m4", "int8")
SCALAR_SCALINGS = ("none", "tensor", "channel")
BLOCKS = ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4", "mxint8", "nvfp4")
#: ``--quick``: 9 of the 19 recipes (no INT8, no per-channel scaling, three block formats)
QUICK_RECIPES = ("e5m2/none", "e4m3/none", "e3m4/none", "e5m2/tensor", "e4m3/tensor",
                 "e3m4/tensor", "mxfp8_e4m3/block", "mxfp4/block", "nvfp4/block")
QUICK_SKIPS = ("9 of the 19 recipes: no INT8, no per-channel scaling, of the block formats "
               "MXFP8 E4M3, MXFP4 and NVFP4 only")


def recipes() -> list[Recipe]:
    """Every scalar format under every scaling, then every block format."""
    out = [Recipe(f, scaling=s, name=f"{f}/{s}") for f in SCALARS for s in SCALAR_SCALINGS]
    return out + [Recipe(f, scaling="block", name=f"{f}/block") for f in BLOCKS]


def bits_per_element(recipe: dict) -> float:
    """Storage per element, block scales included."""
    f = recipe["inputs"]
    if recipe["scaling"] == "block":
        spec = mx.get_mx_format(f)
        return spec.elem.bits + spec.scale.bits / spec.block_size
    return float(get_format(f).bits)


def run(ctx: Context) -> dict[str, Any]:
    """End-to-end and per-site results of every recipe."""
    runs = ctx.run([r for r in recipes() if not ctx.quick or r.name in QUICK_RECIPES], desc=NAME)
    for r in runs:
        r["bits"] = bits_per_element(r["recipe"])
    return {"runs": runs, "baseline": ctx.baseline}


def conclusions(data: dict) -> list[str]:
    """Best format per scaling, what scaling does to each format, and the block formats by size."""
    from .range_findings import ratios_for

    runs = {r["recipe"]["name"]: r for r in data["runs"]}
    ratios = ratios_for(data)
    out = []
    for s in SCALAR_SCALINGS:
        ran = [runs[f"{f}/{s}"] for f in SCALARS if f"{f}/{s}" in runs]
        if ran:
            out.append(f"{s} scaling: " + ranking(ran, ratios, lambda r: "")
                       + " (end-to-end KL; each × is KL over the one before, with its window "
                       "interval; ≈ where that interval holds 1).")

    def paired(a: dict, b: dict) -> str:
        """KL(a) / KL(b) with its window and topic intervals (or the non-finite side named)."""
        if not (math.isfinite(a["e2e"]["kl"]) and math.isfinite(b["e2e"]["kl"])):
            return ratio(kl_or_inf(a), kl_or_inf(b))
        r = ratios.combine([a, b], lambda x, y: x / y, "")
        return f"{r.text()} ({r.side('worse', 'better')})"

    for f in SCALARS:
        none, tensor, channel = (runs.get(f"{f}/{s}") for s in SCALAR_SCALINGS)
        if none is None or tensor is None:
            continue
        out.append(
            f"{f}: KL with per-tensor scaling / without: {paired(tensor, none)}"
            + (f"; per-channel / without: {paired(channel, none)}" if channel else "")
            + (
                f"; without scaling inf/NaN first appears at "
                f"{in_forward_order(none['e2e']['nonfinite_sites'])[0]}"
                f" end to end ({pct(none['e2e']['finite'])} of positions finite)"
                if none["e2e"]["nonfinite_sites"]
                else ""
            )
            + (
                " while the per-site replay, on fewer tokens, saw no overflow"
                if none["e2e"]["nonfinite_sites"] and not none["summary"]["overflow_sites"]
                else ""
            )
            + "."
        )
    out.append("Block formats by KL: " + ranking(
        [runs[f"{b}/block"] for b in BLOCKS if f"{b}/block" in runs], ratios,
        lambda r: f", {num(r['bits'])} bits") + ".")
    mx8, e4 = runs.get("mxfp8_e4m3/block"), runs.get("e4m3/none")
    if mx8 and e4 and kl_or_inf(mx8) > kl_or_inf(e4):
        out.append(
            f"MXFP8 E4M3 (KL {num(mx8['e2e']['kl'])}) against unscaled E4M3 "
            f"({num(e4['e2e']['kl'])}): {paired(mx8, e4)}; "
            "the OCP scale rule, 2^(floor(log2 amax) - 8) (8: E4M3's largest exponent), maps a "
            "block's "
            "largest value into [256, 512), and values above E4M3's 448 saturate to 448: up to "
            f"{pct(mx8['summary']['operand_saturated'])} of an operand's elements (worst site) "
            f"saturate, "
            f"against {pct(e4['summary']['operand_saturated'])} unscaled, a clipping error "
            f"unscaled E4M3 "
            "does not make on this model."
        )
    mx4, nv4 = runs.get("mxfp4/block"), runs.get("nvfp4/block")
    if mx4 and nv4:
        out.append(
            f"At 4 bits, NVFP4 (16-element blocks, E4M3 scales) reaches KL "
            f"{num(nv4['e2e']['kl'])} and MXFP4 (32-element blocks, power-of-two scales) "
            f"{num(mx4['e2e']['kl'])}: MXFP4/NVFP4 = {paired(mx4, nv4)}.")
    best = min(data["runs"], key=kl_or_inf)
    out.append(
        f"Lowest KL overall: {best['recipe']['name']} ({num(best['e2e']['kl'])}, top-1 "
        f"{pct(best['e2e']['top1'])})."
    )
    return out


def ranking(rs: list[dict], ratios: Any, extra: Any) -> str:
    """``rs`` by end-to-end KL, lowest first: ``<`` between neighbours whose paired window
    interval of KL(next) / KL(previous) excludes 1, ``≈`` where it holds 1 (a tie the data
    cannot order), the ratio and interval shown; ``extra(run)`` adds to each run's brackets."""
    ranked = sorted(rs, key=kl_or_inf)
    text = f"{ranked[0]['recipe']['inputs']} ({num(ranked[0]['e2e']['kl'])}{extra(ranked[0])})"
    for prev, cur in itertools.pairwise(ranked):
        head = f"{cur['recipe']['inputs']} ({num(cur['e2e']['kl'])}{extra(cur)}"
        if not (math.isfinite(prev["e2e"]["kl"]) and math.isfinite(cur["e2e"]["kl"])):
            text += f" < {head})"
            continue
        q = ratios.combine([cur, prev], lambda x, y: x / y, "")
        sign = "<" if bootstrap.excludes_one(q.windows) else "≈"
        text += f" {sign} {head}; {q.point:.3g}× {fmt_ci(q.windows)})"
    return text


def figures(data: dict, out: Path) -> list[str]:
    """End-to-end KL of every recipe (log scale; non-finite drawn at the top)."""
    runs = data["runs"]
    finite = [kl_or_inf(r) for r in runs if math.isfinite(kl_or_inf(r))]
    top = max(finite) * 10 if finite else 1.0
    fig, axes = figure(1, 1, width=11, height=4.5)
    ax = axes[0, 0]
    colors = {
        "none": "tab:red",
        "tensor": "tab:blue",
        "channel": "tab:green",
        "block": "tab:purple",
    }
    for i, r in enumerate(runs):
        kl = kl_or_inf(r)
        ax.bar(
            i,
            kl if math.isfinite(kl) else top,
            color=colors[r["recipe"]["scaling"]],
            hatch=None if math.isfinite(kl) else "xx",
            alpha=0.8,
        )
    for s, c in colors.items():
        ax.bar(0, 0, color=c, label=f"scaling: {s}")
    ax.set_yscale("log")
    ax.set_xticks(
        range(len(runs)), [r["recipe"]["name"] for r in runs], rotation=60, ha="right", fontsize=8
    )
    ax.set_ylabel("KL(FP32 ‖ recipe), nats/token")
    ax.set_title(
        "8-bit and smaller operands, FP32 accumulation (hatched at the top: NaN/inf logits)"
    )
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return [save(fig, out / "kl.png")]


def render(data: dict, out: Path) -> str:
    """Figure and Markdown report."""
    meta = data["meta"]
    names = figures(data, out)
    rows = [
        [
            r["recipe"]["inputs"],
            r["recipe"]["scaling"],
            num(r["bits"]),
            num(r["e2e"]["kl"]),
            num(r["e2e"]["loss"], 4),
            pct(r["e2e"]["top1"]),
            pct(r["e2e"]["finite"]),
            (in_forward_order(r["e2e"]["nonfinite_sites"]) or ["-"])[0],
            pct(r["summary"]["operand_overflow"]),
            pct(r["summary"]["operand_saturated"]),
            pct(r["summary"]["operand_flushed"]),
            num(r["summary"]["snr_db_min"]),
        ]
        for r in data["runs"]
    ]
    intro = (
        f"{meta['tokens']} held-out tokens end to end (FP32 loss "
        f"{num(data['baseline']['fp32']['loss'], 4)}); "
        f"per-site replay on {meta['replay_rows']} rows per site against FP64 on the same "
        f"operands. "
        f"{OCP_NAMES} E5M2 and E3M4 are IEEE-style. Per-tensor and per-channel "
        "scales are amax / format max in FP32 (fpsim.scaled_quantize); per-channel means one "
        "scale per "
        "row of the left operand (per token for activations) and per column of the right one "
        "(per output channel for weights), along the reduction axis; block formats use fpsim.mx. "
        "Every site's operands are quantized, LayerNorm inputs (the residual stream) included. "
        "Ratios of KL carry two paired 95% percentile bootstrap intervals: over windows "
        "(1000 resamples) and, marked topics, over the held-out topics (each drawn topic brings "
        "all its windows); a side is called only when the window interval excludes 1, with no "
        "correction for the several comparisons made here: read them as exploratory. "
        "KL and top-1 are over all positions, including those with inf/NaN logits (a NaN KL); "
        '"finite" is the share of positions whose logits are all finite.'
    )
    body = [
        f"![KL per recipe]({names[0]})",
        "",
        table(
            [
                "format",
                "scaling",
                "bits/element",
                "KL",
                "loss",
                "top-1",
                "finite",
                "first inf/NaN site",
                "worst operand overflow",
                "worst operand saturated",
                "mean operand flush",
                "worst site SNR dB",
            ],
            rows,
        ),
    ]
    return page("FP8, INT8 and block formats", meta, intro, conclusions(data), body,
                skipped=QUICK_SKIPS)
