"""Experiment ``model-seeds``: do the B=8 comparisons hold on tiny models from other seeds?

The bootstrap of the other experiments covers the choice of held-out windows, not the choice of
model.  This one trains two more tiny models exactly as the embedded one (same data, config and
900 steps; seeds 1 and 2, one thread, cached under ``--cache``) and runs the B=8 comparisons of
``range-vs-precision`` and ``fp16-vs-bf16`` end to end on all three: e3m4 and e5m2 against e4m3
without scaling, the subnormal ablation of e3m4 with LayerNorm inputs in FP32, BF16 against FP16.
A comparison holds across seeds when every seed's CI excludes 1 on the same side (a format whose
logits turn inf/NaN counts as the worse side, without a ratio).

Usage: ``fpsim experiment model-seeds [--quick] [--out results] [--render]``; the first run
trains the two models (about 22 minutes each on one core), later runs reuse them.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import time
from pathlib import Path
from typing import Any

import torch


from . import bootstrap, context, likewise
from .bootstrap import fmt_ci
from .gpt2.model import site_kind
from .range_vs_precision import split_format
from .recipes import Recipe
from .report import IEEE_NAMES, figure, finish, num, quick_note, save, table, versions
from .sweep import runs as e2e_runs

NAME = "model-seeds"
SEEDS = (0, 1, 2)           # 0: the embedded model; the others are trained on demand
STEPS, QUICK_STEPS = 900, 20
CACHE = Path(os.environ.get("FPSIM_CACHE", Path.home() / ".cache" / "fpsim"))
E3M4, E4M3, E5M2 = split_format(3, 4), split_format(4, 3), split_format(5, 2)

# (name, numerator, denominator, what it isolates, the factor in which the two runs differ):
# ratios of end-to-end KL; ``ratios`` refuses a pair that differs in anything else
COMPARISONS = (
    ("e3m4 / e4m3, no scaling", "e3m4", "e4m3",
     "range at the bottom and top (flush, subnormals, overflow) against one mantissa bit",
     "format"),
    ("e5m2 / e4m3, no scaling", "e5m2", "e4m3", "one mantissa bit against range", "format"),
    ("subnormal bits: e3m4 LN FP32 no flush / + full subnormals", "e3m4 nf", "e3m4 nf full",
     "the precision values below the smallest normal lose", "full_subnormals"),
    ("bf16 / fp16", "bf16", "fp16", "3 mantissa bits against FP32's exponent range", "format"),
)
#: Left out: "e3m4 LN FP32, no flush, full subnormals / e4m3" divided a run with the
#: LayerNorms in FP32 by one that quantizes them; the like-with-like ratio needs an e4m3 run
#: with the same ablations, which range-vs-precision has on seed 0 only.


def recipes() -> dict[str, tuple[Recipe, bool]]:
    """Run name -> (recipe, LayerNorm inputs kept in FP32)."""
    return {
        "e3m4": (Recipe(E3M4, name="e3m4"), False),
        "e4m3": (Recipe(E4M3, name="e4m3"), False),
        "e5m2": (Recipe(E5M2, name="e5m2"), False),
        "e3m4 nf": (Recipe(E3M4, flush=False, name="e3m4 LN FP32, no flush"), True),
        "e3m4 nf full": (
            Recipe(E3M4, flush=False,
                   full_subnormals=True, name="e3m4 LN FP32, no flush, full subnormals"),
            True,
        ),
        "fp16": (Recipe("fp16", output="fp16", name="fp16"), False),
        "bf16": (Recipe("bf16", output="bf16", name="bf16"), False),
    }


def describe(name: str) -> dict[str, Any]:
    """Run ``name`` of ``recipes``, factor by factor (``.likewise``)."""
    recipe, ln = recipes()[name]
    fmt = recipe.inputs if isinstance(recipe.inputs, str) else recipe.inputs.name
    return {"describe": {"format": fmt, "activations": recipe.scaling,
                         "weights": recipe.scaling, "saturate": recipe.saturate,
                         "flush": recipe.flush, "full_subnormals": recipe.full_subnormals,
                         "ln_fp32": ln, "attention": "eager"}}


def checkpoint(seed: int, quick: bool, cache: Path = CACHE) -> Path:
    """The tiny model of ``seed``: the embedded one for seed 0, else trained once into ``cache``
    with ``fpsim_experiments.gpt2.train_tiny`` (``STEPS`` steps, a step-based schedule)."""
    if seed == 0:
        return context.DEFAULT_MODEL
    steps = QUICK_STEPS if quick else STEPS
    out = cache / f"tiny-seed{seed}-{steps}steps"
    if not (out / "model.safetensors").exists():
        from .gpt2 import train_tiny
        threads = torch.get_num_threads()
        train_tiny.train(train_tiny.parse_args(
            ["--seed", str(seed), "--max-steps", str(steps), "--minutes", "1e9", "--out", str(out),
             "--eval-every", str(steps)]))
        torch.set_num_threads(threads)
    return out


def run_seed(seed: int, sizes: context.Sizes, quick: bool, device: str = "cpu",
             execution: e2e_runs.Execution = e2e_runs.Execution()) -> dict[str, Any]:
    """End-to-end metrics of every recipe on the model of ``seed``, run on ``device`` and
    ``execution`` (task files in its folder's ``seed<N>``)."""
    ctx = context.build(checkpoint(seed, quick), sizes, quick, device=device)
    ctx.execution = execution
    todo = [e2e_runs.recipe_run(name, {n: recipe for n in ctx.site_names
                                       if site_kind(n) != "layernorm"} if ln_fp32 else recipe)
            for name, (recipe, ln_fp32) in recipes().items()]
    runs = {}
    for run, result in zip(todo, ctx.end_to_end_runs(todo, f"seed{seed}", desc=f"seed {seed}")):
        e2e = result["e2e"]
        e2e.pop("events")
        runs[run.name] = e2e
    model = ctx.model_name if seed == 0 else f"$FPSIM_CACHE/{Path(ctx.model_name).name}"
    return {"seed": seed, "model": model, "tokens": ctx.tokens, "runs": runs}


def ratios(data: dict) -> list[dict[str, Any]]:
    """Every comparison on every seed: KL ratio, its paired CI and its verdict."""
    out = []
    for name, num_, den, what, factor in COMPARISONS:
        likewise.check(describe(num_), describe(den), factor)
        per_seed = []
        for s in data["seeds"]:
            a, b = s["runs"][num_], s["runs"][den]
            if math.isfinite(a["kl"]) and math.isfinite(b["kl"]):
                q, ci = bootstrap.ratio(a, b)
                verdict = bootstrap.verdict(ci, "above 1", "below 1")
            else:   # a side with inf/NaN logits is the worse one; no ratio to bootstrap
                q, ci = math.nan, [math.nan, math.nan]
                verdict = "below 1" if math.isfinite(a["kl"]) else (
                    "above 1" if math.isfinite(b["kl"]) else "both inf/NaN")
            per_seed.append({"seed": s["seed"], "ratio": q, "ci": ci, "verdict": verdict,
                             "nonfinite": [n for n, r in ((num_, a), (den, b))
                                           if not math.isfinite(r["kl"])]})
        verdicts = {p["verdict"] for p in per_seed}
        out.append({"comparison": name, "isolates": what, "seeds": per_seed,
                    "holds": verdicts.pop() if len(verdicts) == 1 else "differs between seeds"})
    return out


def conclusions(data: dict) -> list[str]:
    """One line per comparison: each seed's ratio with its CI, and whether all agree."""
    lines = []
    for r in ratios(data):
        parts = "; ".join(
            f"seed {p['seed']} " + (
                f"{' and '.join(p['nonfinite'])} inf/NaN logits" if p["nonfinite"]
                else f"{num(p['ratio'])}× {fmt_ci(p['ci'])}"
            )
            for p in r["seeds"]
        )
        verdict = {
            "above 1": "worse on every seed (CI above 1, or inf/NaN logits)",
            "below 1": "better on every seed (CI below 1)",
            "no measurable difference": "no measurable difference on any seed",
        }.get(r["holds"], "the seeds disagree")
        lines.append(f"KL {r['comparison']} ({r['isolates']}): {parts}: {verdict}.")
    return lines


def render(data: dict, out: Path) -> str:
    """REPORT.md: the conclusions, a figure of every ratio per seed and the KL table."""
    rs = ratios(data)
    fig, axes = figure(1, 1, 8.0, 0.9 + 0.55 * len(rs))
    ax = axes[0, 0]
    colors = ("tab:blue", "tab:orange", "tab:green")
    for j, s in enumerate(data["seeds"]):          # every seed in the legend, plotted or not
        ax.plot([], [], "o", color=colors[j % 3], label=f"seed {s['seed']}")
    edge = ax.get_yaxis_transform()            # x in axes fractions, y in data: the right edge
    for i, r in enumerate(rs):
        for j, p in enumerate(r["seeds"]):
            y = i + (j - 1) * 0.2
            if p["nonfinite"]:              # no ratio: marked at the right edge, side named
                ax.plot([0.97], [y], "x", color=colors[j % 3], ms=8, mew=2, transform=edge)
                ax.text(0.95, y, f"seed {p['seed']}: {' and '.join(p['nonfinite'])} inf/NaN",
                        transform=edge, ha="right", va="center", fontsize=7,
                        color=colors[j % 3])
                continue
            lo, hi = p["ci"]
            ax.errorbar([p["ratio"]], [y], xerr=[[p["ratio"] - lo], [hi - p["ratio"]]],
                        fmt="o", color=colors[j % 3])
    if any(p["nonfinite"] for r in rs for p in r["seeds"]):
        ax.plot([], [], "x", color="black", ms=8, mew=2, label="inf/NaN logits: no ratio")
    ax.axvline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_yticks(range(len(rs)), [r["comparison"] for r in rs], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("end-to-end KL ratio (95% bootstrap CI over windows)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    name = save(fig, out / "ratios_per_seed.png")
    runs = list(recipes())
    rows = [[s["seed"], s["model"], s["tokens"]]
            + [num(s["runs"][n]["kl"]) for n in runs] for s in data["seeds"]]
    meta = data["meta"]
    return "\n".join([
        f"# {NAME}", "",
        *quick_note(meta, size=f"seeds 1 and 2 trained {meta['steps']} steps only, "
                    f"{meta.get('tokens', data['seeds'][0]['tokens'])} held-out tokens per seed"),
        f"Tiny byte-level GPT-2 (4 layers, width 256) trained from seeds {list(SEEDS)}: seed 0 is "
        f"the embedded model, the others {meta['steps']} steps of the same recipe. "
        f"{meta['seconds']} s. The CIs are paired 95% percentile bootstrap intervals over "
        "held-out windows (the first 32 of range-vs-precision's 125); the three seeds show how "
        "much the model's own training seed moves each ratio. Each ratio divides two runs that "
        "differ in the one factor it names (checked by the generator); an earlier \"e3m4 LN "
        "FP32, no flush, full subnormals / e4m3\" ratio divided a run with the LayerNorms in "
        "FP32 by one that quantizes them and is no longer reported (its like-with-like form is "
        "in range-vs-precision, seed 0 only). Three seeds of one tiny model say nothing "
        "about GPT-2 124M.", "", f"**{IEEE_NAMES}**", "",
        "## Conclusions", "",
        *[f"- {c}" for c in conclusions(data)], "",
        f"![ratios per seed]({name})", "",
        "End-to-end KL (nats/token) per seed:", "",
        table(["seed", "model", "tokens", *runs], rows), "",
    ])


def main(args: argparse.Namespace) -> int:
    """``fpsim experiment model-seeds``: run (or ``--render``) and write ``OUT/model-seeds/``."""
    data = None
    if not args.render:
        torch.set_num_threads(args.threads)
        sizes = context.QUICK if args.quick else context.SUBSET
        if args.tokens:
            sizes = dataclasses.replace(sizes, tokens=args.tokens)
        start = time.perf_counter()
        execution = e2e_runs.execution(args, NAME)
        data = {"seeds": [run_seed(s, sizes, args.quick, args.device, execution)
                          for s in SEEDS]}
        data["meta"] = {"quick": args.quick, "steps": QUICK_STEPS if args.quick else STEPS,
                        "device": args.device,
                        "tokens": data["seeds"][0]["tokens"], "model": "tiny, seeds 0-2",
                        **versions(), "seconds": round(time.perf_counter() - start, 1)}
    finish(NAME, args.out / NAME, data, render)
    if data is not None:
        execution.finish()
    return 0
