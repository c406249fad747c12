"""Experiment ``range-vs-precision``: at a fixed bit budget, is losing range worse than losing
precision?

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

from fpsim import Format, get_format
from fpsim.emulation.casts import SCALINGS as CAST_SCALINGS

from .context import Context
from .endtoend import compact
from .gpt2.model import site_kind
from .recipes import Recipe, rounding_limit, split_format
from . import bootstrap, replay
from .bootstrap import fmt_ci
from .likewise import Ratios
from .range_findings import budgets, cases_table, extra, operand_shares, ratios_for, scope
from .report import (IEEE_NAMES, figure, in_forward_order, load_json, num, page, pct,
                     save, table)
from .sweep import runs as e2e_runs

NAME = "range-vs-precision"
BUDGETS = (8, 12, 16)
#: ``--quick`` runs B=8 only, without the bias sweep and P3109 (25 end-to-end runs, not 108)
QUICK_BUDGETS = (8,)
QUICK_SKIPS = ("B=8 only (no 12- or 16-bit splits), without the exponent-bias sweep and "
               "IEEE P3109's formats (25 end-to-end runs, not 108)")
#: The study's scalings: a format's range against its precision, with one scale per tensor or
#: none (the Recipe scalings of the one table, ``fpsim.emulation.casts.SCALINGS``, whose
#: values do not depend on the axis and that need no calibration): "none" and "tensor", the
#: names in its results.
SCALINGS = tuple(n for n, s in CAST_SCALINGS.items()
                 if s.recipe and s.axis_free and not s.calibrated)
LN_FP32 = "none-ln-fp32"  # no scaling, LayerNorm inputs in FP32 (end to end only)
VARIANTS = ("none", LN_FP32, "tensor")
SCALING_LABEL = {
    "none": "no scaling",
    "tensor": "per-tensor scaling",
    LN_FP32: "no scaling, LayerNorm in FP32",
}
FP32_MAX = 3.4028234663852886e38
CLAMPED = "= none (scale clamped at 2^-126)"


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
    """Whether every FP32 per-tensor scale of the run's format is the clamp 2^-126 (= no
    scaling)."""
    return run["max"] * 2.0**-126 > FP32_MAX


def fn_format(ebits: int, mbits: int) -> Format:
    """eXmY with OCP-style ``fn`` encoding: no inf, one NaN code, the rest of the top binade
    finite."""
    return Format(f"e{ebits}m{mbits}fn", ebits, mbits, inf=False, nan="fn")


def ablations(budget: int, sweep: bool = True) -> list[tuple[str, Recipe, bool]]:
    """Attribution runs of the 3-exponent-bit split of ``budget`` (end to end only).

    (name, recipe, LayerNorm inputs in FP32): saturate instead of overflowing, keep values
    below the smallest subnormal (no flush), both, the OCP-style ``fn`` encoding, LayerNorm in
    FP32 without flush, with subnormals at full mantissa width, and both (which leaves only
    overflow and the mantissa width); at B=8 also a bias sweep of e3m4 (IEEE-style, default
    bias 3; ``sweep`` False leaves it out).
    """
    m = budget - 4
    f = split_format(3, m)
    out = [
        ("saturate", Recipe(f, saturate=True, name=f"{f.name} saturating"), False),
        ("no flush", Recipe(f, flush=False, name=f"{f.name} no flush"), False),
        (
            "saturate, no flush",
            Recipe(f, saturate=True, flush=False, name=f"{f.name} sat, no flush"),
            False,
        ),
        ("fn encoding", Recipe(fn_format(3, m), name=f"{f.name}fn"), False),
        ("LN FP32, no flush", Recipe(f, flush=False, name=f"{f.name} LN FP32, no flush"), True),
        (
            "LN FP32, full subnormals",
            Recipe(f, full_subnormals=True, name=f"{f.name} LN FP32, full subnormals"),
            True,
        ),
        (
            "LN FP32, no flush, full subnormals",
            Recipe(f, flush=False,
                   full_subnormals=True, name=f"{f.name} LN FP32, no flush, full subnormals"),
            True,
        ),
    ]
    if budget == 8 and sweep:
        for bias in BIASES:
            g = Format(f"e3m{m}b{bias}", 3, m, bias=bias)
            out.append((f"bias {bias}", Recipe(g, name=g.name), False))
    return out


BIASES = (1, 2, 4, 5)
P3109_SPLITS = (2, 3, 4, 5, 6)   # exponent bits of the B=8 P3109 formats run beside eXmY


def p3109_formats(ebits: int) -> tuple[Format, Format]:
    """The IEEE P3109 8-bit formats with ``ebits`` exponent bits (precision 8 - ebits): the
    extended one (+-inf on the top codes, as eXmY has) and the finite one (no inf); both have
    a single NaN at 0x80 and no -0, so they keep the top binade that eXmY gives to inf/NaN."""
    p = 8 - ebits
    return get_format(f"p3109_k8p{p}se"), get_format(f"p3109_k8p{p}sf")


def p3109_bias_ablation() -> Format:
    """e4m3 in the IEEE-style encoding with P3109 k8p4's bias, 8 instead of 7: the whole range
    moves down one binade (smallest subnormal 2^-10, max 120) and the encoding stays eXmY's.
    Beside P3109 k8p4 and e4m3 it separates what the bias does from what the encoding does."""
    return Format("e4m3b8", 4, 3, bias=8)


def _p3109_run(fmt: Format) -> dict:
    return {"budget": 8, "format": fmt.name, "ebits": fmt.ebits, "max": fmt.max, "scaling": "none",
            "min_subnormal": fmt.min_subnormal}


def _ablation_run(budget: int, name: str, recipe: Recipe, ln_fp32: bool) -> dict:
    fmt = recipe.inputs
    return {
        "budget": budget,
        "ablation": name,
        "format": fmt.name,
        "max": fmt.max,
        "min_subnormal": fmt.min_subnormal,
        "recipe": recipe.to_json(),
        "ln_fp32": ln_fp32,
    }


def _but_layernorm(ctx: Context, recipe: Recipe) -> dict[str, Recipe]:
    """``recipe`` at every site but the LayerNorms (those stay FP32)."""
    return {n: recipe for n in ctx.site_names if site_kind(n) != "layernorm"}


def _head(budget: int, fmt: Format, scaling: str) -> dict[str, Any]:
    """What a run of the split ``fmt`` of ``budget`` under ``scaling`` is."""
    return {"budget": budget, "format": fmt.name, "ebits": fmt.ebits, "mbits": fmt.mbits,
            "max": fmt.max, "min_subnormal": fmt.min_subnormal, "scaling": scaling}


def run(ctx: Context) -> dict[str, Any]:
    """End-to-end and per-site results of every split, budget and scaling, the LayerNorm-in-FP32
    variant and the attribution ablations of the 3-exponent-bit splits."""
    plan = {b: splits(b) for b in (QUICK_BUDGETS if ctx.quick else BUDGETS)}
    scaled = [(b, f, s) for b, (formats, _) in plan.items() for f in formats for s in SCALINGS]
    # a per-tensor run whose every FP32 scale is the clamp 2^-126 (9+ exponent bits) is the
    # unscaled run: that power of two lies far inside the format's range and changes no rounding
    # (tests/test_practice.py computes both and compares), so it is not recomputed
    clamped = {job for job in scaled if job[2] == "tensor" and scale_clamped({"max": job[1].max})}
    todo = [job for job in scaled if job not in clamped]
    recipes = [Recipe(f, scaling=s, name=f"{f.name}/{s}") for _, f, s in todo]
    # one capture pass replays every split under both scalings
    stats = ctx.replay(recipes, desc=f"{NAME} replay")
    ln = [(b, f, Recipe(f, name=f"{f.name}/none, LayerNorm FP32"))
          for b, (formats, _) in plan.items() for f in formats]
    abl = [(b, *a) for b in plan for a in ablations(b, sweep=not ctx.quick)]
    p3109 = [] if ctx.quick else (
        [f for x in P3109_SPLITS for f in p3109_formats(x)] + [p3109_bias_ablation()])
    # every end-to-end run at once: the executor may run them side by side
    e2e = iter(r["e2e"] for r in ctx.end_to_end_runs(
        [e2e_runs.recipe_run(r.name, r) for r in recipes]
        + [e2e_runs.recipe_run(r.name, _but_layernorm(ctx, r)) for _, _, r in ln]
        + [e2e_runs.recipe_run(f"ablation {b} {name}", _but_layernorm(ctx, r) if fp32 else r)
           for b, name, r, fp32 in abl]
        + [e2e_runs.recipe_run(f"p3109 {f.name}", Recipe(f, name=f.name)) for f in p3109],
        "runs", desc=NAME))
    done = {job: {"recipe": r.to_json(), "summary": replay.summary(sites), "sites": sites,
                  "e2e": next(e2e)} for job, r, sites in zip(todo, recipes, stats, strict=True)}
    runs = []
    for b, f, s in scaled:
        result = done[(b, f, "none" if (b, f, s) in clamped else s)]
        runs.append({**_head(b, f, s), **result,
                     "recipe": Recipe(f, scaling=s, name=f"{f.name}/{s}").to_json()})
    ln_runs = [{**_head(b, f, LN_FP32), "recipe": r.to_json(),
                "fp32_sites": sorted(set(ctx.site_names) - set(_but_layernorm(ctx, r))),
                "e2e": next(e2e)} for b, f, r in ln]
    ablation_runs = [{**_ablation_run(*a), "e2e": next(e2e)} for a in abl]
    p3109_runs = [{**_p3109_run(f), "e2e": next(e2e)} for f in p3109]
    return {
        "ablation_runs": ablation_runs,
        "p3109_runs": p3109_runs[:-1],
        **({"p3109_bias_ablation": p3109_runs[-1]} if p3109_runs else {}),
        "budgets": {
            str(b): {"formats": [f.name for f in fs], "skipped": sk} for b, (fs, sk) in plan.items()
        },
        "scalings": list(SCALINGS),
        "baseline": ctx.baseline,
        "runs": runs,
        "ln_fp32_runs": ln_runs,
    }


def load_cases(out: Path) -> dict[str, Any]:
    """What ``range-cases`` wrote beside ``results.json`` in ``out``: its runs by name
    (``cases``) and the weight statistics (``weights``), each empty when absent."""
    found: dict[str, Any] = {"cases": {}, "weights": {}}
    for p in sorted((out / "cases").glob("*.json")):
        d = load_json(p)
        found["cases"].update({r["name"]: r for r in d.get("runs", [])})
        found["weights"].update(d.get("weights", {}))
    return found


def load(out: Path) -> dict[str, Any]:
    """``out/results.json`` with the cases of ``load_cases`` and, when ``model-seeds`` ran
    beside it, its results (``model_seeds``)."""
    data = {**load_json(out / "results.json"), **load_cases(out)}
    seeds = out.parent / "model-seeds" / "results.json"
    if seeds.exists():
        data["model_seeds"] = load_json(seeds)
    return data


def _variants(data: dict) -> tuple[str, ...]:
    return VARIANTS if data.get("ln_fp32_runs") else SCALINGS


def _series(data: dict, budget: int, scaling: str) -> list[dict]:
    runs = data.get("ln_fp32_runs", []) if scaling == LN_FP32 else data["runs"]
    return sorted(
        (
            r
            for r in runs
            if r["budget"] == budget
            and r["scaling"] == scaling
            and not (scaling == "tensor" and scale_clamped(r))
        ),
        key=lambda r: r["ebits"],
    )


def _best(series: list[dict]) -> dict | None:
    finite = [r for r in series if math.isfinite(r["e2e"]["kl"])]
    return min(finite, key=lambda r: r["e2e"]["kl"]) if finite else None


def _captured_overflows(data: dict, captured: int) -> str:
    """Which recorded end-to-end overflows (range-cases) fall in the captured windows."""
    parts = []
    for r in data.get("cases", {}).values():
        if r["describe"]["attention"] == "eager" and r["name"].endswith(" eager"):
            where = compact(r["overflows"])["windows"]
            inside = [w for w in where if w < captured]
            parts.append(f"{r['format']} overflows in {len(where)} windows, "
                         f"{len(inside)} of them captured")
    return f" (recorded end to end: {'; '.join(parts)})" if parts else ""


def _overflowed(run: dict) -> bool:
    """Whether any site overflowed in the replay (when replayed) or produced inf/NaN end to end."""
    return bool(run.get("summary", {}).get("overflow_sites") or run["e2e"]["nonfinite_sites"])


def kl_cell(run: dict) -> str:
    """KL for a table cell: NaN runs with their share of finite positions, clamped per-tensor runs
    marked."""
    if run["scaling"] == "tensor" and scale_clamped(run):
        return CLAMPED
    kl = run["e2e"]["kl"]
    if not math.isfinite(kl):
        e = run["e2e"]
        there = f", KL there {num(e['kl_finite'])}" if e["finite"] else ""
        return f"NaN ({pct(e['finite'])} finite{there})"
    return num(kl)


def _versus(run: dict, best: dict, ratios: Ratios) -> str:
    e = run["e2e"]
    if not math.isfinite(e["kl"]):
        return f"gives inf/NaN logits ({_nonfinite(run)})"
    r = ratios.ratio(run, best, "format", decides=False)
    return f"gives KL {num(e['kl'])}, {r.text()} the best"


def _nonfinite(run: dict) -> str:
    """Where inf/NaN first appeared, the finite share and the KL over finite positions."""
    e = run["e2e"]
    first = in_forward_order(e["nonfinite_sites"])
    return (
        f"first at {first[0] if first else '?'}, {pct(e['finite'])} of positions finite, "
        f"KL over those {num(e['kl_finite'])}"
    )


def _steeper(less: dict, more: dict, ratios: Ratios) -> str:
    """Which side costs more, said only when the paired ratio's interval excludes 1 and it
    survives Holm's correction (else marked exploratory)."""
    a, b = less["e2e"], more["e2e"]
    if not math.isfinite(a["kl"]) and math.isfinite(b["kl"]):
        return "The steeper side is range: one exponent bit fewer gives inf/NaN (mechanism below)"
    if math.isfinite(a["kl"]) and not math.isfinite(b["kl"]):
        return "The steeper side is precision: one mantissa bit fewer gives inf/NaN"
    if not math.isfinite(a["kl"]):
        return "Both neighbours give inf/NaN"
    r = ratios.ratio(less, more, "format")
    side = r.side(
        "the steeper side is range (fewer exponent bits)",
        "the steeper side is precision (fewer mantissa bits)",
        "no measurable difference between one exponent bit and one mantissa bit fewer",
    )
    topics = "" if not r.per_topic else (
        f", on each topic's windows alone {num(min(r.per_topic))}–{num(max(r.per_topic))}")
    return f"KL ratio exponent-bit-fewer / mantissa-bit-fewer {r.text()}{topics}: {side}"


def p3109_lines(data: dict, ratios: Ratios) -> list[str]:
    """The encoding's cost measured: each B=8 P3109 format against the IEEE-style eXmY split of
    the same widths, end to end without scaling, each ratio with its paired CI."""
    runs = data.get("p3109_runs", [])
    ieee = {r["ebits"]: r for r in _series(data, 8, "none")}
    parts = []
    for r in runs:
        base = ieee.get(r["ebits"])
        e = r["e2e"]
        if base is None:
            continue
        if not (math.isfinite(e["kl"]) and math.isfinite(base["e2e"]["kl"])):
            parts.append(f"{r['format']} (max {num(r['max'])}): {kl_cell(r)} vs "
                         f"{base['format']} {kl_cell(base)}")
            continue
        q = ratios.ratio(r, base, "format")
        parts.append(f"{r['format']} (max {num(r['max'])}) KL {num(e['kl'])} "
                     f"{fmt_ci(e['ci']['kl'])}, {q.text()} {base['format']} "
                     f"({q.side('worse', 'better')})")
    if not parts:
        return []
    return ["IEEE P3109 at B=8, no scaling (one NaN code at 0x80 and no -0, so the top binade "
            "holds finite values; 'se' keeps +-inf on the top codes, 'sf' has none), against the "
            "IEEE-style split of the same widths: " + "; ".join(parts) + "."
            ] + p3109_bias_lines(data, runs, ieee, ratios)


def p3109_bias_lines(data: dict, runs: list[dict], ieee: dict[int, dict],
                     ratios: Ratios) -> list[str]:
    """The bias ablation: e4m3 with P3109's bias 8 against e4m3 (what moving the range down one
    binade does, with both runs' overflow and flush shares) and each 4-exponent-bit P3109
    format against it (what the encoding does once the bias is the same)."""
    abl = data.get("p3109_bias_ablation")
    base = ieee.get(4)
    if abl is None or base is None or not all(
            math.isfinite(r["e2e"]["kl"]) for r in (abl, base)):
        return []

    def shares(run: dict) -> str:
        over, flush, *_ = operand_shares(run)
        return f"{pct(flush)} flushed, {pct(over)} overflowed"

    q = ratios.ratio(abl, base, "format")
    text = (f"Bias ablation: {abl['format']} (e4m3 with P3109's bias 8, IEEE-style encoding, "
            f"max {num(abl['max'])}, smallest subnormal 2^{math.log2(abl['min_subnormal']):.0f}) KL "
            f"{num(abl['e2e']['kl'])} {fmt_ci(abl['e2e']['ci']['kl'])}, {q.text()} "
            f"{base['format']} ({q.side('worse', 'better')}); operand "
            f"elements end to end: {abl['format']} {shares(abl)}, {base['format']} "
            f"{shares(base)}")
    same = [r for r in runs if r["ebits"] == 4 and math.isfinite(r["e2e"]["kl"])]
    for r in same:
        q = ratios.ratio(r, abl, "format")
        text += (f"; {r['format']} ({shares(r)}) {q.text()} {abl['format']} "
                 f"({q.side('worse', 'better')})")
    return [text + "."]


def _plot_metric(ax: Any, data: dict, scaling: str, metric: str, log: bool) -> None:
    """``metric`` vs exponent bits with bootstrap error bars; inf/NaN runs as markers in a band
    above the axes' data (labelled with their finite share), never at a made-up value."""
    band = ax.get_xaxis_transform()  # x in data, y in axes coordinates
    for k, budget in enumerate(budgets(data)):
        s = _series(data, budget, scaling)
        ok = [r for r in s if math.isfinite(r["e2e"][metric])]
        y = [r["e2e"][metric] for r in ok]
        ci = [r["e2e"]["ci"][metric] for r in ok]
        err = [[v - c[0] for v, c in zip(y, ci)], [c[1] - v for v, c in zip(y, ci)]]
        line = ax.errorbar(
            [r["ebits"] for r in ok], y, yerr=err, fmt="o-", capsize=3, label=f"B = {budget}"
        )[0]
        for r in s:
            if not math.isfinite(r["e2e"][metric]):
                x = r["ebits"] + 0.15 * (k - 1)
                ax.plot(
                    x, 1.04, "x", ms=9, mew=2, color=line.get_color(), transform=band, clip_on=False
                )
                ax.text(
                    x,
                    1.08,
                    pct(r["e2e"]["finite"]),
                    transform=band,
                    fontsize=6,
                    ha="center",
                    color=line.get_color(),
                    rotation=90,
                )
        best = _best(s)
        if best is not None:
            ax.plot(best["ebits"], best["e2e"][metric], "*", ms=16, color=line.get_color())
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("exponent bits X (mantissa bits = B - 1 - X)")
    ax.set_title(
        f"{SCALING_LABEL[scaling]}\n(× above the plot = inf/NaN logits, % = finite "
        "positions; ★ = lowest KL; bars = 95% bootstrap CI)"
        + (
            "\n(9+ exponent bits left out: scale clamped, = no scaling)"
            if scaling == "tensor"
            else ""
        ),
        fontsize=8,
        pad=34,
    )
    ax.grid(alpha=0.3)


def _legend_outside(ax: Any) -> None:
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def figures(data: dict, out: Path) -> list[str]:
    """Headline (KL and loss vs exponent bits), KL vs mantissa bits, end-to-end overflow/flush."""
    variants = _variants(data)
    fig, axes = figure(2, len(variants), width=6.5, height=4.6)
    for j, scaling in enumerate(variants):
        _plot_metric(axes[0, j], data, scaling, "kl", log=True)
        axes[0, j].set_ylabel("KL(FP32 ‖ format), nats/token")
        _plot_metric(axes[1, j], data, scaling, "loss", log=False)
        axes[1, j].set_ylabel("held-out loss, nats/token")
        axes[1, j].axhline(data["baseline"]["fp32"]["loss"], ls="--", color="gray", label="FP32")
    for ax in axes.flat:
        _legend_outside(ax)
    names = [save(fig, out / "range_vs_precision.png")]
    fig, axes = figure(1, 1, width=7.5, height=4.5)
    ax = axes[0, 0]
    for scaling, marker in zip(variants, "os^"):
        for budget, ls in zip(budgets(data), ("-", "--", ":")):
            ok = [r for r in _series(data, budget, scaling) if math.isfinite(r["e2e"]["kl"])]
            ax.plot(
                [r["mbits"] for r in ok],
                [r["e2e"]["kl"] for r in ok],
                marker + ls,
                ms=4,
                label=f"B = {budget}, {SCALING_LABEL[scaling]}",
            )
    ax.set_yscale("log")
    ax.set_xlabel("mantissa bits Y")
    ax.set_ylabel("KL(FP32 ‖ format), nats/token")
    ax.set_title(
        "KL vs mantissa bits (finite runs): the budgets collapse onto one curve "
        "where range suffices",
        fontsize=9,
    )
    ax.grid(alpha=0.3)
    _legend_outside(ax)
    names.append(save(fig, out / "kl_vs_mantissa_bits.png"))
    fig, axes = figure(1, 2, width=6.5, height=4.2)
    for budget in budgets(data):
        for scaling, ls in zip(VARIANTS, ("-", ":", "--")):
            s = [r for r in _series(data, budget, scaling) if r["e2e"].get("events")]
            if not s:
                continue
            x = [r["ebits"] for r in s]
            shares = [operand_shares(r) for r in s]
            for ax, k in zip(axes[0], (0, 1)):
                ax.plot(
                    x,
                    [max(sh[k], 1e-9) for sh in shares],
                    "o" + ls,
                    label=f"B = {budget}, {SCALING_LABEL[scaling]}",
                )
    for ax, what in zip(
        axes[0],
        (
            "operand elements overflowing to inf/NaN, end to end",
            "operand elements flushed to zero, end to end",
        ),
    ):
        ax.set_yscale("log")
        ax.set_xlabel("exponent bits X")
        ax.set_ylabel("share of all operand elements (1e-9 = none)")
        ax.set_title(what, fontsize=9)
        ax.grid(alpha=0.3)
    _legend_outside(axes[0, 1])
    names.append(save(fig, out / "overflow_flush_vs_exponent.png"))
    return names


def conclusions(data: dict) -> list[str]:
    """Sentences that compare the numbers: best split, cost of one exponent vs one mantissa bit,
    then the like-with-like comparisons of ``.range_findings``; rendered twice, the second
    time with Holm's correction over the verdicts the first pass collected."""

    ratios = ratios_for(data)
    _conclusions(data, ratios)
    ratios.holm()
    return _conclusions(data, ratios) + [ratios.summary()]


def _conclusions(data: dict, ratios: Ratios) -> list[str]:

    out = []
    for budget in budgets(data):
        for scaling in _variants(data):
            s = _series(data, budget, scaling)
            best = _best(s)
            if best is None:
                out.append(
                    f"B={budget}, {SCALING_LABEL[scaling]}: every split gives non-finite logits."
                )
                continue
            kl = best["e2e"]["kl"]
            by_e = {r["ebits"]: r for r in s}
            text = (f"B={budget}, {SCALING_LABEL[scaling]}: the best split is {best['format']} "
                    f"(KL {num(kl)})")
            less, more = by_e.get(best["ebits"] - 1), by_e.get(best["ebits"] + 1)
            text += f" {fmt_ci(best['e2e']['ci']['kl'])}"
            if less:
                text += (f"; one exponent bit fewer ({less['format']}) "
                         f"{_versus(less, best, ratios)}")
            if more:
                text += (f"; one mantissa bit fewer ({more['format']}) "
                         f"{_versus(more, best, ratios)}")
            if less and more:
                text += ". " + _steeper(less, more, ratios)
            clean = [r["format"] for r in s if not _overflowed(r)]
            where = "end to end" if scaling == LN_FP32 else "replay or end to end"
            narrowest = clean[0] if clean else "none"
            text += f". Narrowest split with no inf/NaN anywhere ({where}): {narrowest}."
            out.append(text)
    hidden = [
        r
        for r in data["runs"]
        if r["scaling"] == "none"
        and r["e2e"]["nonfinite_sites"]
        and not r["summary"]["overflow_sites"]
    ]
    if hidden:
        meta = data["meta"]
        out.append(
            ", ".join(
                f"{r['format']} (rounding limit "
                f"{num(rounding_limit(split_format(r['ebits'], r['mbits'])), 4)}, "
                f"first inf/NaN at {in_forward_order(r['e2e']['nonfinite_sites'])[0]}, "
                f"{pct(r['e2e']['finite'])} of positions finite)"
                for r in hidden
            )
            + f" without scaling give inf/NaN end to end but overflow nowhere in the per-site "
              f"replay. The replay rounds the FP32 reference's operands of the "
            f"{meta['capture_tokens']} captured tokens (the first "
            f"{meta['capture_tokens'] // meta['window']} windows); end to end every operand "
            "also carries the rounding error of the sites before it, so the two round different "
            "values, and most overflowing windows are not captured"
            + _captured_overflows(data, meta['capture_tokens'] // meta['window']) + "."
        )
    out += p3109_lines(data, ratios)
    out += extra(data, ratios)
    for budget in budgets(data):
        if LN_FP32 not in _variants(data):
            break
        none = {r["ebits"]: r for r in _series(data, budget, "none")}
        ln = {r["ebits"]: r for r in _series(data, budget, LN_FP32)}
        parts = []
        for x in sorted(ln):
            a, b = none[x]["e2e"], ln[x]["e2e"]
            if not math.isfinite(a["kl"]) or not math.isfinite(b["kl"]):
                first = in_forward_order(b["nonfinite_sites"])
                parts.append(
                    f"{ln[x]['format']} {'NaN' if not math.isfinite(a['kl']) else num(a['kl'])} "
                    f"({pct(a['finite'])} finite) -> "
                    + (
                        num(b["kl"])
                        if math.isfinite(b["kl"])
                        else f"NaN ({pct(b['finite'])} finite, first inf/NaN at "
                             f"{first[0] if first else '?'})"
                    )
                )
        if parts:
            out.append(
                f"B={budget}, no scaling, LayerNorm inputs quantized -> kept in FP32 (every other "
                f"site "
                "quantized): " + "; ".join(parts) + "."
            )
    for budget in budgets(data):
        none, tensor = _best(_series(data, budget, "none")), _best(_series(data, budget, "tensor"))
        if none and tensor:
            out.append(
                f"B={budget}: per-tensor scaling moves the best split from {none['format']} "
                f"(KL {num(none['e2e']['kl'])} {fmt_ci(none['e2e']['ci']['kl'])}) to "
                f"{tensor['format']} (KL {num(tensor['e2e']['kl'])} "
                f"{fmt_ci(tensor['e2e']['ci']['kl'])})."
            )
    return out


HEADER = {"none": "KL no scaling", LN_FP32: "KL no scaling, LN FP32", "tensor": "KL per-tensor"}


def headline(data: dict) -> str:
    """KL of every split by exponent width: one row per X, a format and a KL per variant and
    budget."""
    variants = _variants(data)
    runs = {
        (r["budget"], r["ebits"], r["scaling"]): r
        for r in data["runs"] + data.get("ln_fp32_runs", [])
    }
    widths = sorted({r["ebits"] for r in data["runs"]})
    rows = []
    for x in widths:
        row: list[Any] = [x]
        for b in budgets(data):
            if (b, x, "none") in runs:
                row += [runs[b, x, "none"]["format"]] + [kl_cell(runs[b, x, s]) for s in variants]
            else:
                row += ["-"] * (1 + len(variants))
        rows.append(row)
    header = ["X"] + [h for b in budgets(data) for h in (f"B={b}", *(HEADER[v] for v in variants))]
    notes = [
        "",
        "NaN: some positions have inf/NaN logits (the share of positions whose logits are "
        "all finite in brackets, and the KL over those positions); KL and top-1 are over all "
        "positions, so one such position makes KL NaN. "
        f"{CLAMPED}: with 9 or more exponent bits every FP32 per-tensor scale is clamped at "
        f"2^-126, a power "
        "of two, so the result is the no-scaling one (with 8, tensors whose amax is below "
        "max·2^-126, "
        f"{num(runs[12, 8, 'none']['max'] * 2.0**-126) if (12, 8, 'none') in runs else '-'} for "
        f"e8m3, "
        "keep the clamped scale too).",
    ]
    if LN_FP32 in variants:
        notes[-1] += (
            " LN FP32: every site quantized without scaling except the LayerNorms (ln_1, ln_2, "
            "ln_f), "
            "whose inputs, the residual stream, stay FP32."
        )
    return table(header, rows) + "\n" + "\n".join(notes)


def render(data: dict, out: Path) -> str:
    """Figures and the Markdown report of the results."""
    names = figures(data, out)
    meta = data["meta"]

    intro = (
        f"Model `{meta['model']}`: {scope(data, ratios_for(data))}. "
        f"{meta['tokens']} held-out tokens end to end "
        f"({len(data['baseline']['fp32']['windows']['kl'])} windows); per-site replay on "
        f"{meta['replay_rows']} rows per site. Operands of every site (both sides of every "
        f"matmul, LayerNorm inputs) in IEEE-style eXmY, FP32 accumulation, FP32 outputs. "
        f"**{IEEE_NAMES}** LayerNorm inputs are the "
        'residual stream, so without scaling they are quantized too; the "LN FP32" variant '
        "(end to end only) keeps them in FP32. KL is KL(P_FP32 ‖ P_format) of the next-token "
        "distribution, nats/token, over all positions (including any with inf/NaN logits); loss "
        f"in nats/token (FP32 loss {num(data['baseline']['fp32']['loss'], 4)}, FP64 vs FP32 KL "
        f"{num(data['baseline']['fp64']['kl'])}). The FP32 reference computes every dot product, "
        "LayerNorm and softmax in FP64 and rounds once to FP32, so it is the same on any machine. "
        "Brackets are 95% percentile bootstrap intervals over windows "
        f"({bootstrap.RESAMPLES} resamples, seeded; ratios resampled paired: the same windows "
        "for both runs); \"topics [..]\" is the same ratio's interval when the held-out topics "
        "are resampled instead (a cluster bootstrap: each drawn topic brings all its windows; "
        "the last conclusion compares the widths). Every ratio divides two runs that "
        "differ in the factor it names only (the report generator refuses any other). A side "
        "is called worse or steeper only when the window interval excludes 1 and the ratio "
        "survives Holm's correction over the report's family of verdicts (last conclusion); "
        "the rest is marked exploratory. Runs added by `fpsim experiment range-cases` are "
        "listed in the cases table."
    )
    lead = [f"![KL and loss vs exponent bits]({names[0]})", "", headline(data)]
    lines: list[str] = []
    for budget in budgets(data):
        b = data["budgets"][str(budget)]
        lines += ["", f"## B = {budget} bits", ""]
        if b["skipped"]:
            lines += [
                "Skipped splits: " + "; ".join(f"{k} ({v})" for k, v in b["skipped"].items()),
                "",
            ]
        rows = []
        runs = {
            (r["format"], r["scaling"]): r
            for r in data["runs"] + data.get("ln_fp32_runs", [])
            if r["budget"] == budget
        }
        for none in _series(data, budget, "none"):
            tensor, ln = runs[none["format"], "tensor"], runs.get((none["format"], LN_FP32))
            rows.append(
                [
                    none["format"],
                    num(none["max"]),
                    num(none["min_subnormal"]),
                    kl_cell(none),
                    "-" if ln is None else kl_cell(ln),
                    kl_cell(tensor),
                    num(none["e2e"]["loss"], 4),
                    num(tensor["e2e"]["loss"], 4),
                    pct(none["e2e"]["top1"]),
                    pct(none["e2e"]["finite"]),
                    "-" if ln is None else pct(ln["e2e"]["finite"]),
                    len(none["summary"]["overflow_sites"]),
                    (in_forward_order(none["e2e"]["nonfinite_sites"]) or ["-"])[0],
                    "-"
                    if ln is None
                    else (in_forward_order(ln["e2e"]["nonfinite_sites"]) or ["-"])[0],
                    pct(none["summary"]["operand_overflow"]),
                    pct(none["summary"]["operand_flushed"]),
                    pct(tensor["summary"]["operand_flushed"]),
                    pct(operand_shares(none)[0]),
                    pct(operand_shares(none)[1]),
                ]
            )
        lines.append(
            table(
                [
                    "format",
                    "max",
                    "min subnormal",
                    "KL none",
                    "KL none, LN FP32",
                    "KL tensor",
                    "loss none",
                    "loss tensor",
                    "top-1 none",
                    "finite positions (none)",
                    "finite positions (none, LN FP32)",
                    "sites overflowing in replay (none)",
                    "first inf/NaN site end to end (none)",
                    "first inf/NaN site (none, LN FP32)",
                    "worst operand overflow (none)",
                    "mean operand flush (none)",
                    "mean operand flush (tensor)",
                    "overflow end to end (none)",
                    "flushed end to end (none)",
                ],
                rows,
            )
        )
    rows = []
    for r in data.get("ablation_runs", []):
        e = r["e2e"]
        over, flush, site, worst, _ = operand_shares(r)
        rows.append(
            [
                r["budget"],
                r["ablation"],
                r["format"],
                num(r["max"]),
                num(r["min_subnormal"]),
                f"{num(e['kl'])} {fmt_ci(e['ci']['kl'])}",
                pct(e["finite"]),
                num(e["kl_finite"]),
                pct(over),
                pct(flush),
                f"{site} ({pct(worst)})",
            ]
        )
    if rows:
        lines += [
            "",
            "## Attribution: the 3-exponent-bit splits with one range failure removed",
            "",
            "End to end, no scaling. saturate: overflow clamps to the largest finite value; "
            "no flush: values that would round to zero keep their FP32 value; full subnormals: "
            "values below the smallest normal keep the full mantissa width; fn: OCP-style "
            "encoding (no inf, one NaN code); bias N: IEEE-style with exponent bias N; LN FP32: "
            "LayerNorm inputs unquantized. Shares are of all operand elements over the whole "
            "run.",
            "",
            table(
                [
                    "B",
                    "ablation",
                    "format",
                    "max",
                    "min subnormal",
                    "KL [95% CI]",
                    "finite positions",
                    "KL over finite",
                    "overflow",
                    "flushed",
                    "most flushed site",
                ],
                rows,
            ),
        ]

    lines += cases_table(data)
    lines += [
        "",
        f"![KL vs mantissa bits]({names[1]})",
        "",
        f"![overflow and flush shares end to end]({names[2]})",
        "",
        "Per-site numbers (overflow, saturation and flush shares of outputs and operands, relative "
        "error median/p99/max, SNR) are in `results.json` under `runs[].sites`.",
    ]
    return page(
        "Range vs precision at a fixed bit budget", meta, intro, conclusions(data), lines[1:], lead,
        skipped=QUICK_SKIPS,
    )
