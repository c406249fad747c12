"""Experiment ``range-vs-precision``: at a fixed bit budget, is losing range worse than losing precision?

For each budget B in {8, 12, 16} every split of the B-1 non-sign bits into an IEEE-style
eXmY (X exponent bits, Y = B-1-X mantissa bits, inf/NaN in the all-ones exponent, subnormals)
is applied to both operands of every site, with no scaling and with per-tensor amax scaling;
accumulation stays FP32.  A third variant, end to end only, applies the unscaled format to every
site except the LayerNorms (``*.ln_1``, ``*.ln_2``, ``ln_f``), whose inputs (the residual
stream) stay FP32.  Splits that are not valid formats are listed with the reason.

Per-tensor scales are FP32 (amax / format max, at least 2^-126): for a format whose largest value
times 2^-126 exceeds FP32's largest value (9 or more exponent bits) every scale is 2^-126, a power
of two that changes no rounding, so per-tensor scaling there is no scaling; the reports say so.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from tqdm import tqdm

from fpsim import Format

from .context import Context
from .recipes import Recipe, rounding_limit
from .report import figure, in_forward_order, kl_or_inf, num, pct, ratio, save, table

NAME = "range-vs-precision"
BUDGETS = (8, 12, 16)
SCALINGS = ("none", "tensor")
LN_FP32 = "none-ln-fp32"  # no scaling, LayerNorm inputs in FP32 (end to end only)
VARIANTS = ("none", LN_FP32, "tensor")
SCALING_LABEL = {"none": "no scaling", "tensor": "per-tensor scaling",
                 LN_FP32: "no scaling, LayerNorm in FP32"}
FP32_MAX = 3.4028234663852886e38
CLAMPED = "= none (scale clamped at 2^-126)"


def split_format(ebits: int, mbits: int) -> Format:
    """The IEEE-style format eXmY (raises ValueError when it is not a valid format)."""
    if ebits == 0:
        raise ValueError("no exponent bits: an integer, not a float (INT8 is in the fp8 experiment)")
    return Format(f"e{ebits}m{mbits}", ebits, mbits)


def splits(budget: int) -> tuple[list[Format], dict[str, str]]:
    """Valid formats of a budget, by exponent width, and the skipped splits with the reason."""
    valid, skipped = [], {}
    for e in range(budget):
        try:
            valid.append(split_format(e, budget - 1 - e))
        except ValueError as exc:
            skipped[f"e{e}m{budget - 1 - e}"] = str(exc).split(": ", 1)[-1]
    return valid, skipped


def scale_clamped(run: dict) -> bool:
    """Whether every FP32 per-tensor scale of the run's format is the clamp 2^-126 (= no scaling)."""
    return run["max"] * 2.0**-126 > FP32_MAX


def run(ctx: Context) -> dict[str, Any]:
    """End-to-end and per-site results of every split, budget and scaling, and the LayerNorm-in-FP32 variant."""
    plan = {b: splits(b) for b in BUDGETS}
    jobs = [(b, f, s) for b, (formats, _) in plan.items() for f in formats for s in SCALINGS]
    jobs += [(b, f, LN_FP32) for b, (formats, _) in plan.items() for f in formats]
    runs, ln_runs = [], []
    for budget, fmt, scaling in tqdm(jobs, desc=NAME, unit="recipe"):
        head = {"budget": budget, "format": fmt.name, "ebits": fmt.ebits, "mbits": fmt.mbits,
                "max": fmt.max, "min_subnormal": fmt.min_subnormal, "scaling": scaling}
        if scaling == LN_FP32:
            recipe = Recipe(f"{fmt.name}/none, LayerNorm FP32", fmt)
            per_site = {n: recipe for n, s in ctx.sites.items() if s.kind != "layernorm"}
            ln_runs.append({**head, "recipe": recipe.to_json(), "fp32_sites": sorted(set(ctx.sites) - set(per_site)),
                            "e2e": ctx.end_to_end(per_site)})
            continue
        result = ctx.run(Recipe(f"{fmt.name}/{scaling}", fmt, scaling=scaling))
        runs.append({**head, **result})
    return {"budgets": {str(b): {"formats": [f.name for f in fs], "skipped": sk} for b, (fs, sk) in plan.items()},
            "scalings": list(SCALINGS), "baseline": ctx.baseline, "runs": runs, "ln_fp32_runs": ln_runs}


def _variants(data: dict) -> tuple[str, ...]:
    return VARIANTS if data.get("ln_fp32_runs") else SCALINGS


def _series(data: dict, budget: int, scaling: str) -> list[dict]:
    runs = data.get("ln_fp32_runs", []) if scaling == LN_FP32 else data["runs"]
    return sorted((r for r in runs if r["budget"] == budget and r["scaling"] == scaling
                   and not (scaling == "tensor" and scale_clamped(r))), key=lambda r: r["ebits"])


def _best(series: list[dict]) -> dict | None:
    finite = [r for r in series if math.isfinite(r["e2e"]["kl"])]
    return min(finite, key=lambda r: r["e2e"]["kl"]) if finite else None


def _same_mantissa(data: dict) -> list[str]:
    """For each mantissa width, the narrowest and widest exponent whose KLs agree within 5% (no scaling)."""
    out = []
    runs = [r for r in data["runs"] if r["scaling"] == "none" and math.isfinite(r["e2e"]["kl"])]
    for m in sorted({r["mbits"] for r in runs}):
        group = sorted((r for r in runs if r["mbits"] == m), key=lambda r: r["ebits"])
        for i, r in enumerate(group):
            agree = [g for g in group[i + 1:] if abs(math.log(g["e2e"]["kl"] / r["e2e"]["kl"])) < math.log(1.05)]
            if agree and r["e2e"]["kl"] > 0:
                w = agree[-1]
                out.append(f"{r['format']} (B={r['budget']}, KL {num(r['e2e']['kl'])}) and {w['format']} "
                           f"(B={w['budget']}, KL {num(w['e2e']['kl'])})")
                break
    return out


def _overflowed(run: dict) -> bool:
    """Whether any site overflowed in the replay (when replayed) or produced inf/NaN end to end."""
    return bool(run.get("summary", {}).get("overflow_sites") or run["e2e"]["nonfinite_sites"])


def kl_cell(run: dict) -> str:
    """KL for a table cell: NaN runs with their share of finite positions, clamped per-tensor runs marked."""
    if run["scaling"] == "tensor" and scale_clamped(run):
        return CLAMPED
    kl = run["e2e"]["kl"]
    if not math.isfinite(kl):
        return f"NaN ({pct(run['e2e']['finite'])} finite)"
    return num(kl)


def _versus(run: dict, best_kl: float) -> str:
    kl = run["e2e"]["kl"]
    if not math.isfinite(kl):
        return "gives NaN/inf logits"
    return f"gives KL {num(kl)}, {ratio(kl, best_kl)} the best"


def _plot_metric(ax: Any, data: dict, scaling: str, metric: str, log: bool) -> None:
    top = max((r["e2e"][metric] for r in data["runs"] if math.isfinite(r["e2e"][metric])), default=1.0)
    for k, budget in enumerate(BUDGETS):
        s = _series(data, budget, scaling)
        x = [r["ebits"] for r in s]
        y = [r["e2e"][metric] for r in s]
        line, = ax.plot([a for a, b in zip(x, y) if math.isfinite(b)], [b for b in y if math.isfinite(b)],
                        "o-", label=f"B = {budget}")
        bad = [a + 0.12 * (k - 1) for a, b in zip(x, y) if not math.isfinite(b)]  # side by side
        if bad:
            ax.plot(bad, [top * (3 if log else 1.05)] * len(bad), "x", ms=10, mew=2, color=line.get_color())
        best = _best(s)
        if best is not None:
            ax.plot(best["ebits"], best["e2e"][metric], "*", ms=16, color=line.get_color())
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("exponent bits X (mantissa bits = B - 1 - X)")
    ax.set_title(f"{SCALING_LABEL[scaling]} (× = NaN/inf, ★ = lowest KL)"
                 + ("\n(9+ exponent bits left out: scale clamped, = no scaling)" if scaling == "tensor" else ""),
                 fontsize=10)
    ax.grid(alpha=0.3)


def figures(data: dict, out: Path) -> list[str]:
    """The headline figure (KL and loss vs exponent bits) and the overflow/flush figure."""
    fig, axes = figure(2, len(_variants(data)))
    for j, scaling in enumerate(_variants(data)):
        _plot_metric(axes[0, j], data, scaling, "kl", log=True)
        axes[0, j].set_ylabel("KL(FP32 ‖ format), nats/token")
        _plot_metric(axes[1, j], data, scaling, "loss", log=False)
        axes[1, j].set_ylabel("held-out loss, nats/token")
        axes[1, j].axhline(data["baseline"]["fp32"]["loss"], ls="--", color="gray", label="FP32")
        for ax in axes[:, j]:
            ax.legend()
    names = [save(fig, out / "range_vs_precision.png")]
    fig, axes = figure(1, 2)
    for budget in BUDGETS:
        for scaling, ls in zip(SCALINGS, ("-", "--")):
            s = _series(data, budget, scaling)
            x = [r["ebits"] for r in s]
            axes[0, 0].plot(x, [max(r["summary"]["operand_overflow"], 1e-7) for r in s], "o" + ls,
                            label=f"B = {budget}, {SCALING_LABEL[scaling]}")
            axes[0, 1].plot(x, [max(r["summary"]["operand_flushed"], 1e-7) for r in s], "o" + ls,
                            label=f"B = {budget}, {SCALING_LABEL[scaling]}")
    for ax, what in zip(axes[0], ("largest share of an operand's elements overflowing to inf/NaN",
                                  "mean share of operand elements flushed to zero")):
        ax.set_yscale("log")
        ax.set_xlabel("exponent bits X")
        ax.set_ylabel("share of elements (1e-7 = none)")
        ax.set_title(what, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0, 1].legend(fontsize=7)
    names.append(save(fig, out / "overflow_flush_vs_exponent.png"))
    return names


def conclusions(data: dict) -> list[str]:
    """Sentences that compare the numbers: best split, cost of one exponent vs one mantissa bit."""
    out = []
    for budget in BUDGETS:
        for scaling in _variants(data):
            s = _series(data, budget, scaling)
            best = _best(s)
            if best is None:
                out.append(f"B={budget}, {SCALING_LABEL[scaling]}: every split gives non-finite logits.")
                continue
            kl = best["e2e"]["kl"]
            by_e = {r["ebits"]: r for r in s}
            text = f"B={budget}, {SCALING_LABEL[scaling]}: the best split is {best['format']} (KL {num(kl)})"
            less, more = by_e.get(best["ebits"] - 1), by_e.get(best["ebits"] + 1)
            if less:
                text += f"; one exponent bit fewer ({less['format']}) {_versus(less, kl)}"
            if more:
                text += f"; one mantissa bit fewer ({more['format']}) {_versus(more, kl)}"
            if less and more:
                a, b = (kl_or_inf(r) for r in (less, more))
                side = "range (fewer exponent bits)" if a > b else "precision (fewer mantissa bits)"
                text += f". The steeper side is {side}"
            clean = [r["format"] for r in s if not _overflowed(r)]
            where = "end to end" if scaling == LN_FP32 else "replay or end to end"
            text += f". Narrowest split with no inf/NaN anywhere ({where}): {clean[0] if clean else 'none'}."
            out.append(text)
    hidden = [r for r in data["runs"] if r["scaling"] == "none" and r["e2e"]["nonfinite_sites"]
              and not r["summary"]["overflow_sites"]]
    if hidden:
        meta = data["meta"]
        out.append(", ".join(f"{r['format']} (rounding limit {num(rounding_limit(split_format(r['ebits'], r['mbits'])), 4)}, "
                             f"first inf/NaN at {in_forward_order(r['e2e']['nonfinite_sites'])[0]}, "
                             f"{pct(r['e2e']['finite'])} of positions finite)" for r in hidden)
                   + f" without scaling give inf/NaN end to end but overflow nowhere in the per-site replay: the "
                   f"replay covers the {meta['capture_tokens']} captured tokens, the end-to-end run all "
                   f"{meta['tokens']}, and the values past the rounding limit are only in the other windows "
                   "(see the activations experiment).")
    same = _same_mantissa(data)
    if same:
        out.append("Without scaling, splits with the same mantissa width and different exponent widths give KL "
                   "within 5% of each other: " + "; ".join(same) + ": beyond the narrower exponent, more exponent bits change nothing.")
    for budget in BUDGETS:
        if LN_FP32 not in _variants(data):
            break
        none = {r["ebits"]: r for r in _series(data, budget, "none")}
        ln = {r["ebits"]: r for r in _series(data, budget, LN_FP32)}
        parts = []
        for x in sorted(ln):
            a, b = none[x]["e2e"], ln[x]["e2e"]
            if not math.isfinite(a["kl"]) or not math.isfinite(b["kl"]):
                first = in_forward_order(b["nonfinite_sites"])
                parts.append(f"{ln[x]['format']} {'NaN' if not math.isfinite(a['kl']) else num(a['kl'])} "
                             f"({pct(a['finite'])} finite) -> "
                             + (num(b["kl"]) if math.isfinite(b["kl"]) else
                                f"NaN ({pct(b['finite'])} finite, first inf/NaN at {first[0] if first else '?'})"))
        if parts:
            out.append(f"B={budget}, no scaling, LayerNorm inputs quantized -> kept in FP32 (every other site "
                       "quantized): " + "; ".join(parts) + ".")
    for budget in BUDGETS:
        none, tensor = _best(_series(data, budget, "none")), _best(_series(data, budget, "tensor"))
        if none and tensor:
            out.append(f"B={budget}: per-tensor scaling moves the best split from {none['format']} "
                       f"(KL {num(none['e2e']['kl'])}) to {tensor['format']} (KL {num(tensor['e2e']['kl'])}).")
    return out


HEADER = {"none": "KL no scaling", LN_FP32: "KL no scaling, LN FP32", "tensor": "KL per-tensor"}


def headline(data: dict) -> str:
    """KL of every split by exponent width: one row per X, a format and a KL per variant and budget."""
    variants = _variants(data)
    runs = {(r["budget"], r["ebits"], r["scaling"]): r for r in data["runs"] + data.get("ln_fp32_runs", [])}
    widths = sorted({r["ebits"] for r in data["runs"]})
    rows = []
    for x in widths:
        row: list[Any] = [x]
        for b in BUDGETS:
            if (b, x, "none") in runs:
                row += [runs[b, x, "none"]["format"]] + [kl_cell(runs[b, x, s]) for s in variants]
            else:
                row += ["-"] * (1 + len(variants))
        rows.append(row)
    header = ["X"] + [h for b in BUDGETS for h in (f"B={b}", *(HEADER[v] for v in variants))]
    notes = ["", "NaN: some positions have inf/NaN logits (the share of positions whose logits are all finite "
             "in brackets); KL and top-1 are over all positions, so one such position makes KL NaN. "
             f"{CLAMPED}: with 9 or more exponent bits every FP32 per-tensor scale is clamped at 2^-126, a power "
             "of two, so the result is the no-scaling one (with 8, tensors whose amax is below max·2^-126, "
             f"{num(runs[12, 8, 'none']['max'] * 2.0**-126) if (12, 8, 'none') in runs else '-'} for e8m3, "
             "keep the clamped scale too)."]
    if LN_FP32 in variants:
        notes[-1] += (" LN FP32: every site quantized without scaling except the LayerNorms (ln_1, ln_2, ln_f), "
                      "whose inputs, the residual stream, stay FP32.")
    return table(header, rows) + "\n" + "\n".join(notes)


def render(data: dict, out: Path) -> str:
    """Figures and the Markdown report of the results."""
    names = figures(data, out)
    lines = [f"# Range vs precision at a fixed bit budget ({data['meta']['model']})", "",
             f"Model `{data['meta']['model']}`, {data['meta']['tokens']} held-out tokens end to end; "
             f"per-site replay on {data['meta']['replay_rows']} rows per site. Operands of every site "
             "(both sides of every matmul, LayerNorm inputs) in IEEE-style eXmY (inf/NaN, subnormals; "
             "note e4m3 here has max 240, unlike OCP E4M3FN), FP32 accumulation, FP32 outputs. "
             "LayerNorm inputs are the residual stream, so without scaling they are quantized too; the "
             "\"LN FP32\" variant (end to end only) keeps them in FP32. "
             "KL is KL(P_FP32 ‖ P_format) of the next-token distribution, nats/token, over all positions "
             "(including any with inf/NaN logits); loss in nats/token "
             f"(FP32 loss {num(data['baseline']['fp32']['loss'], 4)}, FP64 vs FP32 KL "
             f"{num(data['baseline']['fp64']['kl'])}).", "",
             f"![KL and loss vs exponent bits]({names[0]})", "", headline(data), "", "## Conclusions", ""]
    lines += [f"- {c}" for c in conclusions(data)]
    for budget in BUDGETS:
        b = data["budgets"][str(budget)]
        lines += ["", f"## B = {budget} bits", ""]
        if b["skipped"]:
            lines += ["Skipped splits: " + "; ".join(f"{k} ({v})" for k, v in b["skipped"].items()), ""]
        rows = []
        runs = {(r["format"], r["scaling"]): r for r in data["runs"] + data.get("ln_fp32_runs", [])
                if r["budget"] == budget}
        for none in _series(data, budget, "none"):
            tensor, ln = runs[none["format"], "tensor"], runs.get((none["format"], LN_FP32))
            rows.append([none["format"], num(none["max"]), num(none["min_subnormal"]),
                         kl_cell(none), "-" if ln is None else kl_cell(ln), kl_cell(tensor),
                         num(none["e2e"]["loss"], 4), num(tensor["e2e"]["loss"], 4),
                         pct(none["e2e"]["top1"]), pct(none["e2e"]["finite"]),
                         "-" if ln is None else pct(ln["e2e"]["finite"]),
                         len(none["summary"]["overflow_sites"]),
                         (in_forward_order(none["e2e"]["nonfinite_sites"]) or ["-"])[0],
                         "-" if ln is None else (in_forward_order(ln["e2e"]["nonfinite_sites"]) or ["-"])[0],
                         pct(none["summary"]["operand_overflow"]), pct(none["summary"]["operand_flushed"]),
                         pct(tensor["summary"]["operand_flushed"])])
        lines.append(table(["format", "max", "min subnormal", "KL none", "KL none, LN FP32", "KL tensor",
                            "loss none", "loss tensor", "top-1 none", "finite positions (none)",
                            "finite positions (none, LN FP32)", "sites overflowing in replay (none)",
                            "first inf/NaN site end to end (none)", "first inf/NaN site (none, LN FP32)",
                            "worst operand overflow (none)", "mean operand flush (none)",
                            "mean operand flush (tensor)"], rows))
    lines += ["", f"![overflow and flush shares]({names[1]})", "",
              "Per-site numbers (overflow, saturation and flush shares of outputs and operands, relative "
              "error median/p99/max, SNR) are in `results.json` under `runs[].sites`."]
    return "\n".join(lines) + "\n"
