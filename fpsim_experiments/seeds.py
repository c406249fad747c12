"""Experiment ``model-seeds``: do range-vs-precision's comparisons hold on tiny models from
other training seeds, trained alike?

The bootstrap of the other experiments covers the choice of held-out windows, not the choice of
model.  This one trains tiny models from seeds 0-5 exactly alike (same data, config and
``STEPS`` steps on the step schedule; one thread, cached under ``$FPSIM_CACHE``) and runs the
comparisons range-vs-precision claims end to end on every held-out window of each: at 8, 12 and
16 bits, without scaling e3 and e5 against e4 and e3 against e5 (the last also with the
LayerNorms in FP32), with per-tensor scaling e2 and e4 against e3 and e2 against e4; at 8 bits
also the subnormal ablation of e3m4 and BF16 against FP16.  The shipped model (seed 0, trained on a
wall-clock schedule) is run too and reported apart: beside seed 0 on the step schedule it
tells whether its overflow comes from its schedule or its seed.

Each comparison gets each model's paired window interval, and across the step-schedule seeds
the geometric mean of their ratios with a two-level bootstrap interval (``hierarchical``:
seeds drawn with replacement, then each drawn seed's windows).  A comparison holds across
seeds when every seed's interval excludes 1 on the same side (a format whose logits turn
inf/NaN counts as the worse side, without a ratio).

Usage: ``fpsim experiment model-seeds [--quick] [--seeds 0,1,...] [--out results] [--render]``;
the first run trains the missing models (about 22 minutes each on one core), later runs reuse
them; each model's 28 end-to-end runs on all 125 windows take about 6 CPU-minutes.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import bootstrap, context, likewise
from .bootstrap import fmt_ci
from .gpt2.model import site_kind
from .recipes import split_format
from .recipes import Recipe
from .report import (
    IEEE_NAMES,
    figure,
    finish,
    in_forward_order,
    num,
    pct,
    quick_note,
    save,
    table,
    versions,
)
from .sweep import runs as e2e_runs

NAME = "model-seeds"
SEEDS, QUICK_SEEDS = (0, 1, 2, 3, 4, 5), (0, 1)    # trained on the step schedule
SHIPPED = "shipped"        # the embedded model: seed 0 on the wall-clock schedule
BUDGETS, QUICK_BUDGETS = (8, 12, 16), (8,)
STEPS, QUICK_STEPS = 900, 20
CACHE = Path(os.environ.get("FPSIM_CACHE", Path.home() / ".cache" / "fpsim"))
NONE, LN, TENSOR = "none", "none, LN FP32", "tensor"
E3M4 = split_format(3, 4)


def fmt(budget: int, ebits: int) -> str:
    """The IEEE-style split of ``budget`` bits with ``ebits`` exponent bits, by name.

    >>> fmt(12, 3)
    'e3m8'
    """
    return split_format(ebits, budget - 1 - ebits).name


def run_name(budget: int, ebits: int, variant: str) -> str:
    """The name of a split's run: format and variant (``NONE``, ``LN``, ``TENSOR``).

    >>> run_name(8, 3, LN)
    'e3m4/none, LN FP32'
    """
    return f"{fmt(budget, ebits)}/{variant}"


#: exponent widths run per variant: the best split without scaling (4) with one exponent bit
#: fewer and one mantissa bit fewer; with per-tensor scaling the best split (3) likewise
EBITS = {NONE: (3, 4, 5), LN: (3, 5), TENSOR: (2, 3, 4)}


def recipes(budgets: Sequence[int] = BUDGETS) -> dict[str, tuple[Recipe, bool]]:
    """Run name -> (recipe, LayerNorm inputs kept in FP32)."""
    out: dict[str, tuple[Recipe, bool]] = {}
    for b in budgets:
        for variant, widths in EBITS.items():
            for e in widths:
                f = split_format(e, b - 1 - e)
                scaling = "tensor" if variant == TENSOR else "none"
                out[run_name(b, e, variant)] = (
                    Recipe(f, scaling=scaling, name=run_name(b, e, variant)), variant == LN)
    if 8 in budgets:
        out["e3m4 nf"] = (Recipe(E3M4, flush=False, name="e3m4 LN FP32, no flush"), True)
        out["e3m4 nf full"] = (Recipe(E3M4, flush=False, full_subnormals=True,
                                      name="e3m4 LN FP32, no flush, full subnormals"), True)
        out["fp16"] = (Recipe("fp16", output="fp16", name="fp16"), False)
        out["bf16"] = (Recipe("bf16", output="bf16", name="bf16"), False)
    return out


@dataclasses.dataclass(frozen=True)
class Comparison:
    """KL of run ``num`` over run ``den``: the two differ in ``factor`` only (``ratios``
    checks); ``what``: what the ratio isolates."""

    name: str
    num: str
    den: str
    what: str
    factor: str = "format"


STEEPER = "the steeper side: above 1 range, below 1 precision"
#: (variant, exponent bits of the numerator, of the denominator, what the ratio isolates)
PAIRS = (
    (NONE, 3, 4, "one exponent bit fewer than the best split"),
    (NONE, 5, 4, "one mantissa bit fewer than the best split"),
    (NONE, 3, 5, STEEPER),
    (LN, 3, 5, "the steeper side with no operand overflowing"),
    (TENSOR, 2, 3, "one exponent bit fewer than the best split"),
    (TENSOR, 4, 3, "one mantissa bit fewer than the best split"),
    (TENSOR, 2, 4, STEEPER),
)
VARIANT = {NONE: "no scaling", LN: "no scaling, LN FP32", TENSOR: "per tensor"}


def comparisons(budgets: Sequence[int] = BUDGETS) -> list[Comparison]:
    """The comparisons of range-vs-precision's claims at ``budgets``, each like with like."""
    out = [Comparison(f"B={b}, {VARIANT[v]}: {fmt(b, n)} / {fmt(b, d)}", run_name(b, n, v),
                      run_name(b, d, v), what)
           for b in budgets for v, n, d, what in PAIRS]
    if 8 in budgets:
        out += [
            Comparison("B=8, subnormal bits: e3m4 LN FP32 no flush / + full subnormals",
                       "e3m4 nf", "e3m4 nf full",
                       "the precision values below the smallest normal lose", "full_subnormals"),
            Comparison("bf16 / fp16", "bf16", "fp16",
                       "3 mantissa bits against FP32's exponent range"),
        ]
    return out


def describe(name: str) -> dict[str, Any]:
    """Run ``name`` of ``recipes``, factor by factor (``.likewise``)."""
    recipe, ln = recipes()[name]
    f = recipe.inputs if isinstance(recipe.inputs, str) else recipe.inputs.name
    return {"describe": {"format": f, "activations": recipe.scaling,
                         "weights": recipe.scaling, "saturate": recipe.saturate,
                         "flush": recipe.flush, "full_subnormals": recipe.full_subnormals,
                         "ln_fp32": ln, "attention": "eager"}}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seeds", type=_seed_list, metavar="S,S,...",
                   help=f"{NAME}: the step-schedule seeds to run, beside the shipped model "
                        f"(default {','.join(map(str, SEEDS))}; --quick "
                        f"{','.join(map(str, QUICK_SEEDS))}); a missing one is trained first")


def _seed_list(text: str) -> tuple[int, ...]:
    """argparse type of ``--seeds``: distinct non-negative integers, comma-separated."""
    try:
        out = tuple(int(s) for s in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give seeds as integers, e.g. 0,1,2") from None
    if len(set(out)) != len(out) or min(out) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give distinct non-negative seeds, e.g. 0,1,2")
    return out


def models(quick: bool, seeds: Sequence[int] | None = None) -> list[str | int]:
    """The models run: the shipped one, then the step-schedule ``seeds`` (default ``SEEDS``,
    ``QUICK_SEEDS`` when ``quick``).

    >>> models(True)
    ['shipped', 0, 1]
    """
    return [SHIPPED, *(seeds if seeds is not None else QUICK_SEEDS if quick else SEEDS)]


def label(model: str | int) -> str:
    """How reports name a model: the shipped one apart from seed 0 on the step schedule.

    >>> label(SHIPPED), label(0)
    ('shipped (seed 0, wall-clock schedule)', 'seed 0')
    """
    return "shipped (seed 0, wall-clock schedule)" if model == SHIPPED else f"seed {model}"


def checkpoint(model: str | int, quick: bool, cache: Path = CACHE) -> Path:
    """The tiny model ``model``: the embedded one for ``SHIPPED``, else seed ``model`` trained
    once into ``cache`` with ``fpsim_experiments.gpt2.train_tiny`` (``STEPS`` steps, the step
    schedule)."""
    if model == SHIPPED:
        return context.DEFAULT_MODEL
    steps = QUICK_STEPS if quick else STEPS
    out = cache / f"tiny-seed{model}-{steps}steps"
    if not (out / "model.safetensors").exists():
        from .gpt2 import train_tiny
        threads = torch.get_num_threads()
        train_tiny.train(train_tiny.parse_args(
            ["--seed", str(model), "--max-steps", str(steps), "--minutes", "1e9", "--out",
             str(out), "--eval-every", str(steps)]))
        torch.set_num_threads(threads)
    return out


def run_model(model: str | int, sizes: context.Sizes, quick: bool, device: str = "cpu",
              execution: e2e_runs.Execution = e2e_runs.Execution()) -> dict[str, Any]:
    """End-to-end metrics of every recipe on ``model`` (``models``), run on ``device`` and
    ``execution`` (task files in its folder's ``shipped`` or ``seed<N>``)."""
    ctx = context.build(checkpoint(model, quick), sizes, quick, device=device)
    ctx.execution = execution
    todo = [e2e_runs.recipe_run(name, {n: recipe for n in ctx.site_names
                                       if site_kind(n) != "layernorm"} if ln_fp32 else recipe)
            for name, (recipe, ln_fp32) in recipes(QUICK_BUDGETS if quick else BUDGETS).items()]
    tag = SHIPPED if model == SHIPPED else f"seed{model}"
    runs = {}
    for run, result in zip(todo, ctx.end_to_end_runs(todo, tag, desc=label(model))):
        e2e = result["e2e"]
        e2e.pop("events")
        runs[run.name] = e2e
    return {"model": model, "seed": 0 if model == SHIPPED else model,
            "schedule": "wall-clock" if model == SHIPPED else "steps",
            "checkpoint": ctx.model_name if model == SHIPPED
            else f"$FPSIM_CACHE/{Path(ctx.model_name).name}",
            "tokens": ctx.tokens, "runs": runs}


# --------------------------------------------------------------------------------------------
# Ratios per model and across seeds
# --------------------------------------------------------------------------------------------
#: the window draws of ``hierarchical``, the same for every comparison of one set of models
_window_weights = functools.lru_cache(maxsize=32)(bootstrap.window_weights)


def hierarchical(pairs: Sequence[tuple[dict, dict]], resamples: int = bootstrap.RESAMPLES,
                 seed: int = bootstrap.SEED) -> tuple[float, list[float]]:
    """Across models: the geometric mean of the KL ratios ``a / b`` of ``pairs`` (one pair of
    ``e2e`` dicts per model) and its 95% interval from a two-level bootstrap.  Each resample
    draws the models with replacement, then for every draw the model's windows with
    replacement (paired: the same windows for ``a`` and ``b``), independently for every draw;
    so the interval covers the choice of seed as well as of windows.

    >>> w = {"positions": 10, "loss": [1.0] * 4, "kl": [2.0, 1.0, 3.0, 2.0]}
    >>> a, b = {"kl": 0.2, "windows": w}, {"kl": 0.05, "windows": {**w, "kl": [0.5, 0.25, 0.75, 0.5]}}
    >>> hierarchical([(a, b), (a, b)])
    (4.0, [4.0, 4.0])
    """
    n = len(pairs)
    if n == 0:
        raise ValueError("the hierarchical bootstrap needs at least one model")
    logs = np.empty((n, resamples, n))
    for m, (a, b) in enumerate(pairs):
        wa, wb = a["windows"], b["windows"]
        if len(wa["loss"]) != len(wb["loss"]):
            raise ValueError("paired bootstrap needs both runs on the same windows")
        weights = _window_weights(len(wa["loss"]), resamples * n, seed + 1 + m)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = bootstrap.weighted(wa, "kl", weights) / bootstrap.weighted(wb, "kl", weights)
            logs[m] = np.log(ratio).reshape(resamples, n)
    pick = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    draws = logs[pick, np.arange(resamples)[:, None], np.arange(n)[None, :]]
    with np.errstate(invalid="ignore", divide="ignore"):
        point = math.exp(float(np.mean([math.log(a["kl"] / b["kl"]) for a, b in pairs])))
    return point, bootstrap.percentile_interval(np.exp(draws.mean(axis=1)))


def _per_model(m: dict, c: Comparison) -> dict[str, Any]:
    """One model's ratio of comparison ``c`` with its paired window interval and verdict."""
    a, b = m["runs"][c.num], m["runs"][c.den]
    if math.isfinite(a["kl"]) and math.isfinite(b["kl"]):
        q, ci = bootstrap.ratio(a, b)
        verdict = bootstrap.verdict(ci, "above 1", "below 1")
    else:   # a side with inf/NaN logits is the worse one; no ratio to bootstrap
        q, ci = math.nan, [math.nan, math.nan]
        verdict = "below 1" if math.isfinite(a["kl"]) else (
            "above 1" if math.isfinite(b["kl"]) else "both inf/NaN")
    return {"model": m["model"], "ratio": q, "ci": ci, "verdict": verdict,
            "nonfinite": [n for n, r in ((c.num, a), (c.den, b)) if not math.isfinite(r["kl"])]}


def ratios(data: dict) -> list[dict[str, Any]]:
    """Every comparison: the shipped model's ratio (``shipped``), each step-schedule seed's
    (``seeds``), their verdicts, whether every seed agrees (``holds``) and the geometric mean
    across seeds with its two-level interval (``pooled``; None when a seed has inf/NaN
    logits)."""
    budgets = data["meta"]["budgets"]
    out = []
    for c in comparisons(budgets):
        likewise.check(describe(c.num), describe(c.den), c.factor)
        shipped = [_per_model(m, c) for m in data["models"] if m["model"] == SHIPPED]
        stepped = [m for m in data["models"] if m["model"] != SHIPPED]
        per_seed = [_per_model(m, c) for m in stepped]
        verdicts = {p["verdict"] for p in per_seed}
        pooled = None
        if not any(p["nonfinite"] for p in per_seed):
            q, ci = hierarchical([(m["runs"][c.num], m["runs"][c.den]) for m in stepped])
            pooled = {"ratio": q, "ci": ci,
                      "verdict": bootstrap.verdict(ci, "above 1", "below 1")}
        out.append({"comparison": c.name, "isolates": c.what,
                    "shipped": shipped[0] if shipped else None, "seeds": per_seed,
                    "holds": verdicts.pop() if len(verdicts) == 1 else "differs between seeds",
                    "pooled": pooled})
    return out


def _value(p: dict) -> str:
    """One model's ratio with its interval, or which side has inf/NaN logits."""
    if p["nonfinite"]:
        return f"{' and '.join(p['nonfinite'])} inf/NaN logits"
    return f"{num(p['ratio'])}× {fmt_ci(p['ci'])}"


#: a verdict every seed shares, as the report says it
EVERY = {"above 1": "above 1 on every seed", "below 1": "below 1 on every seed",
         "no measurable difference": "no measurable difference on any seed",
         "both inf/NaN": "inf/NaN logits on both sides on every seed"}


def conclusion(r: dict) -> str:
    """One comparison's line: the shipped model, every seed, the pooled ratio and the verdict."""
    seeds = "; ".join(f"{label(p['model'])} {_value(p)}" for p in r["seeds"])
    if r["holds"] == "differs between seeds":
        count = Counter(p["verdict"] for p in r["seeds"])
        verdict = "the seeds disagree (" + ", ".join(
            f"{n} {v}" for v, n in sorted(count.items())) + ")"
    else:
        verdict = EVERY[r["holds"]]
    ship = r["shipped"]
    if ship is not None:
        same = ship["verdict"] == r["holds"]
        verdict += (", as on the shipped model" if same
                    else f"; on the shipped model {ship['verdict']}")
    pooled = ("across seeds (seeds and windows resampled) " + (
        f"{num(r['pooled']['ratio'])}× {fmt_ci(r['pooled']['ci'])}" if r["pooled"]
        else "undefined (inf/NaN logits on a seed)"))
    head = f"shipped {_value(ship)}; " if ship is not None else ""
    return (f"KL {r['comparison']} ({r['isolates']}): {head}{seeds}; {pooled}: {verdict}.")


def overflow(data: dict) -> dict[int, dict[str, Any]]:
    """Per budget, the unscaled e3 split's models with inf/NaN logits, each with its share of
    finite positions and its first non-finite site."""
    out = {}
    for b in data["meta"]["budgets"]:
        name = run_name(b, 3, NONE)
        bad = [(m["model"], m["runs"][name]) for m in data["models"]
               if not math.isfinite(m["runs"][name]["kl"])]
        out[b] = {"run": name, "models": [
            {"model": model, "finite": e["finite"],
             "first": (in_forward_order(e["nonfinite_sites"]) or ["-"])[0]} for model, e in bad]}
    return out


def overflow_lines(data: dict) -> list[str]:
    """Which models' unscaled e3 splits give inf/NaN logits, and whether the shipped model's
    overflow comes with its schedule or its seed (seed 0 on the step schedule beside it)."""
    lines = []
    stepped = [m["model"] for m in data["models"] if m["model"] != SHIPPED]
    for b, o in overflow(data).items():
        bad = {x["model"]: x for x in o["models"]}
        seeds_bad = [s for s in stepped if s in bad]
        parts = [f"{label(x['model'])} ({pct(x['finite'])} of positions finite, first at "
                 f"{x['first']})" for x in o["models"]]
        line = (f"B={b}, {o['run'].split('/')[0]} without scaling: inf/NaN logits on "
                f"{len(seeds_bad)} of {len(stepped)} step-schedule seeds"
                + (f"; {', '.join(parts)}" if parts else "") + ".")
        others = [s for s in seeds_bad if s != 0]
        if SHIPPED in bad and 0 in stepped:
            if 0 in bad:
                line += (" Seed 0 on the step schedule overflows too: the overflow goes with "
                         "the seed, not the wall-clock schedule.")
            elif others:
                line += (f" Seed 0 stays finite on the step schedule, but {len(others)} of the "
                         f"other {len(stepped) - 1} step-schedule seeds overflow: the overflow "
                         "does not need the wall-clock schedule; whether that schedule made "
                         "seed 0 overflow, one pair of models cannot tell.")
            else:
                line += (" Seed 0 on the step schedule stays finite: the same seed overflows "
                         "on the wall-clock schedule only, so the overflow goes with the "
                         "schedule, not the seed (one pair of models: one seed, two "
                         "schedules).")
        lines.append(line)
    return lines


def readme_clause(data: dict) -> str:
    """Where the README's headline says the 8-bit e3 split overflows.

    >>> readme_clause({"meta": {"budgets": [8]}, "models": [
    ...     {"model": m, "runs": {"e3m4/none": {"kl": k, "finite": 0.9, "nonfinite_sites": []}}}
    ...     for m, k in ((SHIPPED, math.nan), (0, 1.0), (1, math.nan))]})
    'on the shipped model and on 1 of 2 seeds trained alike'
    """
    bad = {x["model"] for x in overflow(data)[8]["models"]}
    stepped = [m["model"] for m in data["models"] if m["model"] != SHIPPED]
    k = f"{len(bad & set(stepped))} of {len(stepped)} seeds trained alike"
    return f"on the shipped model and on {k}" if SHIPPED in bad else \
        f"on {k}, not on the shipped model"


def summary(data: dict) -> str:
    """The seeds' findings in one paragraph (the one README/docs quote): what holds on every
    step-schedule seed, what differs, and the overflow."""
    rs = ratios(data)
    n = len([m for m in data["models"] if m["model"] != SHIPPED])

    def spread(r: dict) -> str:
        vals = [p["ratio"] for p in r["seeds"] if not p["nonfinite"]]
        if not vals:
            return "inf/NaN on every seed"
        inf = len(r["seeds"]) - len(vals)
        return (f"{num(min(vals))}–{num(max(vals))}×"
                + (f" (inf/NaN on {inf})" if inf else ""))

    held = [r for r in rs if r["holds"] in ("above 1", "below 1")]
    text = (f"On {n} seeds trained alike, {len(held)} of {len(rs)} comparisons keep their side "
            f"on every seed: " + "; ".join(
                f"{r['comparison']} {spread(r)} ({r['holds']})" for r in held) + ".")
    for holds, what in (("no measurable difference", "show no measurable difference on any seed"),
                        ("both inf/NaN", "give inf/NaN on both sides on every seed"),
                        ("differs between seeds", "differ between seeds")):
        rest = [r for r in rs if r["holds"] == holds]
        if rest:
            text += f" {len(rest)} {what}: " + "; ".join(
                f"{r['comparison']} {spread(r)}" for r in rest) + "."
    return text + " " + " ".join(overflow_lines(data))


# --------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------
def render(data: dict, out: Path) -> str:
    """REPORT.md: the conclusions, a figure of every ratio per model and the KL table."""
    if "models" not in data:
        raise ValueError(f"{out / 'results.json'} is of the older layout (seeds 0-2 on the first "
                         f"32 windows): run `fpsim experiment {NAME}` without --render")
    rs = ratios(data)
    names = [m["model"] for m in data["models"]]
    fig, axes = figure(1, 1, 14.0, 1.2 + 0.45 * len(rs) * max(1.0, len(names) / 4))
    ax = axes[0, 0]
    colors = dict(zip(names, ("black", *(f"C{i}" for i in range(10)))))
    step = 0.7 / max(1, len(names))
    for model in names:                              # every model in the legend, plotted or not
        ax.plot([], [], "o", color=colors[model], label=label(model))
    edge = ax.get_yaxis_transform()            # x in axes fractions, y in data: the right edge
    for i, r in enumerate(rs):
        points = ([r["shipped"]] if r["shipped"] else []) + r["seeds"]
        for p in points:
            y = i - 0.35 + step * (names.index(p["model"]) + 0.5)
            if p["nonfinite"]:              # no ratio: marked at the right edge in its colour
                ax.plot([0.98], [y], "x", color=colors[p["model"]], ms=6, mew=2,
                        transform=edge)
                continue
            lo, hi = p["ci"]
            ax.errorbar([p["ratio"]], [y], xerr=[[p["ratio"] - lo], [hi - p["ratio"]]],
                        fmt="o", ms=3, color=colors[p["model"]])
        if r["pooled"]:
            q, (lo, hi) = r["pooled"]["ratio"], r["pooled"]["ci"]
            ax.errorbar([q], [i + 0.42], xerr=[[q - lo], [hi - q]], fmt="D", ms=5,
                        color="tab:purple", mfc="white")
    ax.errorbar([], [], xerr=[], fmt="D", ms=5, color="tab:purple", mfc="white",
                label="across seeds: geometric mean (seeds and windows resampled)")
    if any(p["nonfinite"] for r in rs for p in
           ([r["shipped"]] if r["shipped"] else []) + r["seeds"]):
        ax.plot([], [], "x", color="grey", ms=6, mew=2,
                label="inf/NaN logits (x at the right edge, the model's colour): no ratio")
    ax.axvline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_yticks(range(len(rs)), [r["comparison"] for r in rs], fontsize=8)
    ax.set_ylim(len(rs) - 0.4, -0.6)
    ax.set_xlabel("end-to-end KL ratio (95% bootstrap CI over windows; across seeds: over "
                  "seeds and windows)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig_name = save(fig, out / "ratios_per_seed.png")
    meta = data["meta"]
    runs = list(recipes(meta["budgets"]))
    rows = [[r, *(num(m["runs"][r]["kl"]) for m in data["models"])] for r in runs]
    seeds_run = [m["model"] for m in data["models"] if m["model"] != SHIPPED]
    windows = len(data["models"][0]["runs"][runs[0]]["windows"]["loss"])
    missing = [] if meta.get("quick") else [s for s in SEEDS if s not in seeds_run]
    skipped = (f"seeds {seeds_run} only (not {list(SEEDS)}), trained {meta['steps']} steps; "
               f"B={list(meta['budgets'])} only (not {list(BUDGETS)})")
    return "\n".join([
        f"# {NAME}", "",
        *quick_note(meta, skipped=skipped),
        (f"Tiny byte-level GPT-2 (4 layers, width 256) trained from seeds {seeds_run} alike: the "
        f"same data, config and {meta['steps']} steps on the step schedule (learning rate by "
        "step). The shipped model (seed 0 on a wall-clock schedule: a higher learning rate late "
        "in training) is reported apart; beside seed 0 on the step schedule it tells whether "
        f"its overflow comes with its schedule or its seed. {meta['seconds']} s. Every model "
        f"runs on the same {windows} held-out windows ({meta['tokens']} tokens), its own FP32 "
        "model as the reference. Per model, the CIs are paired 95% percentile bootstrap "
        "intervals over windows; across the step-schedule seeds, the ratio is the geometric "
        "mean of the seeds' ratios and its interval a two-level bootstrap (seeds drawn with "
        "replacement, then each drawn seed's windows), so it covers the choice of seed as well "
        f"as of text, though with {len(seeds_run)} seeds its percentiles are coarse. Each ratio "
        "divides two runs that differ in the one factor it names (checked by the generator). "
        f"{len(seeds_run)} seeds of one tiny model say nothing about GPT-2 124M."
         + (f" Seeds {missing} of the planned {list(SEEDS)} are not in this run (`--seeds`)."
            if missing else "")), "",
        f"**{IEEE_NAMES}**", "",
        "## Conclusions", "",
        f"- {summary(data)}",
        *[f"- {conclusion(r)}" for r in rs], "",
        f"![ratios per model]({fig_name})", "",
        "End-to-end KL (nats/token) per run and model:", "",
        table(["run", *(label(m) for m in names)], rows), "",
    ])


def main(args: argparse.Namespace) -> int:
    """``fpsim experiment model-seeds``: run (or ``--render``) and write ``OUT/model-seeds/``."""
    data = None
    if not args.render:
        torch.set_num_threads(args.threads)
        sizes = context.QUICK if args.quick else context.FULL
        if args.tokens:
            sizes = dataclasses.replace(sizes, tokens=args.tokens)
        start = time.perf_counter()
        execution = e2e_runs.execution(args, NAME)
        todo = models(args.quick, args.seeds)
        data = {"models": [run_model(m, sizes, args.quick, args.device, execution)
                           for m in todo]}
        data["meta"] = {"quick": args.quick, "steps": QUICK_STEPS if args.quick else STEPS,
                        "budgets": list(QUICK_BUDGETS if args.quick else BUDGETS),
                        "device": args.device, "tokens": data["models"][0]["tokens"],
                        "model": f"tiny, shipped and seeds {todo[1:]}",
                        **versions(), "seconds": round(time.perf_counter() - start, 1)}
    finish(NAME, args.out / NAME, data, render)
    if data is not None:
        execution.finish()
    return 0
