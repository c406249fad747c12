"""Experiment ``range-vs-precision``: at a fixed bit budget, is losing range worse than losing precision?

For each budget B in {8, 12, 16} every split of the B-1 non-sign bits into an IEEE-style
eXmY (X exponent bits, Y = B-1-X mantissa bits, inf/NaN in the all-ones exponent, subnormals)
is applied to both operands of every site, with no scaling and with per-tensor amax scaling;
accumulation stays FP32.  Splits that are not valid formats are listed with the reason.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from tqdm import tqdm

from fpsim import Format

from .context import Context
from .recipes import Recipe
from .report import figure, in_forward_order, num, pct, ratio, save, table

NAME = "range-vs-precision"
BUDGETS = (8, 12, 16)
SCALINGS = ("none", "tensor")
SCALING_LABEL = {"none": "no scaling", "tensor": "per-tensor scaling"}


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


def run(ctx: Context) -> dict[str, Any]:
    """End-to-end and per-site results of every split, budget and scaling."""
    plan = {b: splits(b) for b in BUDGETS}
    jobs = [(b, f, s) for b, (formats, _) in plan.items() for f in formats for s in SCALINGS]
    runs = []
    for budget, fmt, scaling in tqdm(jobs, desc=NAME, unit="recipe"):
        result = ctx.run(Recipe(f"{fmt.name}/{scaling}", fmt, scaling=scaling))
        runs.append({"budget": budget, "format": fmt.name, "ebits": fmt.ebits, "mbits": fmt.mbits,
                     "max": fmt.max, "min_subnormal": fmt.min_subnormal, "scaling": scaling, **result})
    return {"budgets": {str(b): {"formats": [f.name for f in fs], "skipped": sk} for b, (fs, sk) in plan.items()},
            "scalings": list(SCALINGS), "baseline": ctx.baseline, "runs": runs}


def _series(data: dict, budget: int, scaling: str) -> list[dict]:
    return sorted((r for r in data["runs"] if r["budget"] == budget and r["scaling"] == scaling),
                  key=lambda r: r["ebits"])


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
    """Whether any site overflowed in the replay or produced inf/NaN end to end."""
    return bool(run["summary"]["overflow_sites"] or run["e2e"]["nonfinite_sites"])


def _versus(run: dict, best_kl: float) -> str:
    kl = run["e2e"]["kl"]
    if not math.isfinite(kl):
        return "gives NaN/inf logits"
    return f"gives KL {num(kl)}, {ratio(kl, best_kl)} the best"


def _kl_or_inf(run: dict) -> float:
    """KL with non-finite (NaN logits) read as infinitely bad."""
    kl = run["e2e"]["kl"]
    return kl if math.isfinite(kl) else math.inf


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
    ax.set_title(f"{SCALING_LABEL[scaling]} (× = NaN/inf, ★ = lowest KL)")
    ax.grid(alpha=0.3)


def figures(data: dict, out: Path) -> list[str]:
    """The headline figure (KL and loss vs exponent bits) and the overflow/flush figure."""
    fig, axes = figure(2, len(SCALINGS))
    for j, scaling in enumerate(SCALINGS):
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
        for scaling in SCALINGS:
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
                a, b = (_kl_or_inf(r) for r in (less, more))
                side = "range (fewer exponent bits)" if a > b else "precision (fewer mantissa bits)"
                text += f". The steeper side is {side}"
            clean = [r["format"] for r in s if not _overflowed(r)]
            text += f". Narrowest split with no inf/NaN anywhere (replay or end to end): {clean[0] if clean else 'none'}."
            out.append(text)
    same = _same_mantissa(data)
    if same:
        out.append("Without scaling, splits with the same mantissa width and different exponent widths give KL "
                   "within 5% of each other: " + "; ".join(same) + ": beyond the narrower exponent, more exponent bits change nothing.")
    for budget in BUDGETS:
        none, tensor = _best(_series(data, budget, "none")), _best(_series(data, budget, "tensor"))
        if none and tensor:
            out.append(f"B={budget}: per-tensor scaling moves the best split from {none['format']} "
                       f"(KL {num(none['e2e']['kl'])}) to {tensor['format']} (KL {num(tensor['e2e']['kl'])}).")
    return out


def headline(data: dict) -> str:
    """KL of every split by exponent width: one row per X, a format and two KLs per budget."""
    runs = {(r["budget"], r["ebits"], r["scaling"]): r for r in data["runs"]}
    widths = sorted({r["ebits"] for r in data["runs"]})
    rows = []
    for x in widths:
        row: list[Any] = [x]
        for b in BUDGETS:
            if (b, x, "none") in runs:
                row += [runs[b, x, "none"]["format"]] + [num(runs[b, x, s]["e2e"]["kl"]) for s in SCALINGS]
            else:
                row += ["-", "-", "-"]
        rows.append(row)
    header = ["X"] + [h for b in BUDGETS for h in (f"B={b}", "KL no scaling", "KL per-tensor")]
    return table(header, rows)


def render(data: dict, out: Path) -> str:
    """Figures and the Markdown report of the results."""
    names = figures(data, out)
    lines = [f"# Range vs precision at a fixed bit budget ({data['meta']['model']})", "",
             f"Model `{data['meta']['model']}`, {data['meta']['tokens']} held-out tokens end to end; "
             f"per-site replay on {data['meta']['replay_rows']} rows per site. Operands of every site "
             "(both sides of every matmul, LayerNorm inputs) in IEEE-style eXmY (inf/NaN, subnormals; "
             "note e4m3 here has max 240, unlike OCP E4M3FN), FP32 accumulation, FP32 outputs. "
             "KL is KL(P_FP32 ‖ P_format) of the next-token distribution, nats/token; loss in nats/token "
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
        for none, tensor in zip(_series(data, budget, "none"), _series(data, budget, "tensor")):
            rows.append([none["format"], num(none["max"]), num(none["min_subnormal"]),
                         num(none["e2e"]["kl"]), num(tensor["e2e"]["kl"]),
                         num(none["e2e"]["loss"], 4), num(tensor["e2e"]["loss"], 4),
                         pct(none["e2e"]["top1"]), len(none["summary"]["overflow_sites"]),
                         (in_forward_order(none["e2e"]["nonfinite_sites"]) or ["-"])[0],
                         pct(none["summary"]["operand_overflow"]), pct(none["summary"]["operand_flushed"]),
                         pct(tensor["summary"]["operand_flushed"])])
        lines.append(table(["format", "max", "min subnormal", "KL none", "KL tensor", "loss none",
                            "loss tensor", "top-1 none", "sites overflowing in replay (none)",
                            "first inf/NaN site end to end (none)",
                            "worst operand overflow (none)", "mean operand flush (none)",
                            "mean operand flush (tensor)"], rows))
    lines += ["", f"![overflow and flush shares]({names[1]})", "",
              "Per-site numbers (overflow, saturation and flush shares of outputs and operands, relative "
              "error median/p99/max, SNR) are in `results.json` under `runs[].sites`."]
    return "\n".join(lines) + "\n"
