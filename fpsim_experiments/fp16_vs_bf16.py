"""Experiment ``fp16-vs-bf16``: 16-bit operands and accumulators, FP16 against BF16, site by site.

Operands and outputs in FP16 or BF16 (no scaling), summed either in FP32 (torch, also run end
to end) or in an accumulator of the operand format (emulated by ``fpsim.matmul``, left to
right, on subsampled sites; too slow to run end to end).  FP16 has 3 more mantissa bits, BF16
FP32's exponent range.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any


from . import bootstrap
from .bootstrap import fmt_ci
from .context import Context
from .recipes import Recipe
from .report import (figure, in_forward_order, median_finite, num, page, pct, save,
                     snr_per_site, table)

NAME = "fp16-vs-bf16"
FORMATS = ("fp16", "bf16")
NO_FLUSH = "fp16 in/out, fp32 acc, no flush"


def recipes() -> list[Recipe]:
    """Per 16-bit format: FP32 accumulation (torch; and emulated left to right, to compare on the
    same subsample) and accumulation in the format itself."""
    out = []
    for f in FORMATS:
        out.append(Recipe(f, output=f, name=f"{f} in/out, fp32 acc"))
        out.append(Recipe(f, accum="fp32", order="sequential", output=f,
                          name=f"{f} in/out, fp32 acc (sequential)"))
        out.append(Recipe(f, accum=f, order="sequential", output=f,
                          name=f"{f} in/out, {f} acc (sequential)"))
    # what FP16's flushed operands cost: the same run with them kept at their FP32 value
    out.append(Recipe("fp16", output="fp16", flush=False, name=NO_FLUSH))
    return out


def run(ctx: Context) -> dict[str, Any]:
    """Per-site statistics of every recipe; end-to-end metrics of the FP32-accumulating ones."""
    runs = ctx.run(recipes(), e2e=lambda r: not r.emulated, desc=NAME)
    return {"runs": runs, "baseline": ctx.baseline}


def _by_name(data: dict) -> dict[str, dict]:
    return {r["recipe"]["name"]: r for r in data["runs"]}


def headline(data: dict) -> str:
    """FP16 against BF16 end to end, with the paired bootstrap CI of the KL ratio."""
    r = _by_name(data)
    h, b = r["fp16 in/out, fp32 acc"]["e2e"], r["bf16 in/out, fp32 acc"]["e2e"]
    q, ci = bootstrap.ratio(b, h)
    side = bootstrap.verdict(ci, "BF16 is worse", "FP16 is worse")
    return (
        f"With FP32 accumulation, end-to-end KL is {num(h['kl'])} {fmt_ci(h['ci']['kl'])} for "
        f"FP16 and {num(b['kl'])} {fmt_ci(b['ci']['kl'])} for BF16: BF16/FP16 = {num(q)}× "
        f"{fmt_ci(ci)}, {side}; top-1 agreement {pct(h['top1'])} vs {pct(b['top1'])}."
        + (
            " Neither gives inf/NaN anywhere end to end, and FP16's 3 extra mantissa bits win "
            f"overall; its narrower range still shows at the bottom: FP16 flushes "
            f"{flushed(h)} of the operand elements end to end, BF16 {flushed(b)}. "
            + flush_price(r)
            if bootstrap.excludes_one(ci)
            and ci[0] > 1
            and not h["nonfinite_sites"]
            and not b["nonfinite_sites"]
            else ""
        )
    )


def flush_price(runs: dict[str, dict]) -> str:
    """What FP16's flushed operands cost: its KL over the same run without flush (paired)."""
    if NO_FLUSH not in runs or "e2e" not in runs[NO_FLUSH]:
        return ("No ablation in this run prices those flushes (how much of FP16's KL they cause "
                f"is not measured; a rerun adds '{NO_FLUSH}').")
    q, ci = bootstrap.ratio(runs["fp16 in/out, fp32 acc"]["e2e"], runs[NO_FLUSH]["e2e"])
    return (f"Keeping them at their FP32 value, FP16's KL / its KL without flush = {num(q)}× "
            f"{fmt_ci(ci)}: "
            + bootstrap.verdict(ci, "the flushes cost", "the flushes help",
                                "no measurable cost of the flushes") + ".")


def flushed(e2e: dict) -> str:
    """Operand elements flushed to zero end to end: share and count (``-`` when not counted)."""
    ev = e2e.get("events")
    if not ev:
        return "-"
    n = sum(e["flushed"] for e in ev.values())
    return f"{pct(n / sum(e['elements'] for e in ev.values()))} ({n:,})" if n else "none"


def conclusions(data: dict) -> list[str]:
    """FP16 vs BF16 end to end and per site, and what their own accumulators add."""
    r = _by_name(data)
    h, b = r["fp16 in/out, fp32 acc"], r["bf16 in/out, fp32 acc"]
    out = [headline(data)]
    out.append(
        f"Median site SNR: FP16 {num(median_finite(h, 'snr_db'))} dB, BF16 "
        f"{num(median_finite(b, 'snr_db'))} dB "
        f"({num(median_finite(h, 'snr_db') - median_finite(b, 'snr_db'))} dB apart; 3 mantissa "
        f"bits are 18.1 dB)."
    )
    for name, run in ((n, r[n]) for n in ("fp16 in/out, fp32 acc", "bf16 in/out, fp32 acc")):
        sites = run["summary"]["overflow_sites"] or run["e2e"]["nonfinite_sites"]
        out.append(
            f"{name}: inf/NaN at {', '.join(sites) if sites else 'no site'} "
            f"(replay on {data['meta']['replay_rows']} rows per site and end to end)."
        )
    for f in FORMATS:
        acc = r[f"{f} in/out, {f} acc (sequential)"]
        ov = [n for n, s in acc["sites"].items() if s.get("accum_overflow", 0) > 0]
        sw = statistics.mean(s["accum_swamped"] for s in acc["sites"].values())
        f32 = median_finite(r[f"{f} in/out, fp32 acc (sequential)"], "snr_db")
        out.append(
            f"{f.upper()} accumulation (left to right, {data['meta']['emulation_rows']} rows per "
            f"site): median "
            f"site SNR {num(median_finite(acc, 'snr_db'))} dB against {num(f32)} dB with FP32 "
            f"accumulation on the same "
            f"rows; partial sums overflowed at {len(ov)} sites"
            f"{' (' + ', '.join(ov) + ')' if ov else ''}; on average {num(sw)} additions per "
            f"output left "
            "the accumulator unchanged (swamped)."
        )
    return out


def figures(data: dict, out: Path) -> list[str]:
    """SNR per site for every recipe."""
    fig, axes = figure(1, 1, width=12, height=4.5)
    ax = axes[0, 0]
    snr_per_site(ax, data["runs"])
    ax.set_ylabel("SNR against FP64, dB (finite outputs)")
    ax.set_title("per-site SNR: 16-bit operands and outputs, FP32 or 16-bit accumulation")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return [save(fig, out / "snr_per_site.png")]


def render(data: dict, out: Path) -> str:
    """Figure and Markdown report."""
    meta = data["meta"]
    names = figures(data, out)
    r = _by_name(data)
    e2e = [
        [
            n,
            num(run["e2e"]["kl"]),
            num(run["e2e"]["loss"], 4),
            pct(run["e2e"]["top1"]),
            ", ".join(in_forward_order(run["e2e"]["nonfinite_sites"])) or "-",
        ]
        for n, run in r.items()
        if "e2e" in run
    ]
    order = list(r)
    site_rows = []
    for site in r[order[0]]["sites"]:
        row = [site]
        for n in order:
            s = r[n]["sites"][site]
            row += [num(s["snr_db"]), pct(max(s["overflow"], s.get("accum_overflow", 0.0)))]
        site_rows.append(row)
    header = ["site"] + [h for n in order for h in (f"{n}: SNR dB", "inf/NaN")]
    intro = (
        f"{meta['tokens']} held-out tokens end to end (FP32 loss "
        f"{num(data['baseline']['fp32']['loss'], 4)}); "
        f"per-site replay on {meta['replay_rows']} rows (torch FP32 accumulation) or "
        f"{meta['emulation_rows']} rows "
        "(emulated left-to-right accumulation) per site against FP64 on the same operands. "
        "Operands and outputs are "
        "rounded to the format without scaling; LayerNorm's statistics are written in it too."
    )
    body = [
        "## End to end (FP32 accumulation)",
        "",
        table(["recipe", "KL", "loss", "top-1", "sites with inf/NaN"], e2e),
        "",
        f"![SNR per site]({names[0]})",
        "",
        "## Per site",
        "",
        "inf/NaN: share of outputs that overflowed (in the output format or in the accumulator).",
        "",
        table(header, site_rows),
    ]
    return page("FP16 vs BF16", meta, intro, conclusions(data), body)
