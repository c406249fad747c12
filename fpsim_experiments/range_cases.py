"""Experiment ``range-cases``: the runs that let range-vs-precision compare like with like, end
to end on the same windows as its other runs.

Four groups, each written to ``OUT/range-vs-precision/cases/GROUP.json`` (a case already
there is kept and not run again, so ``--only`` adds runs; the runs in flight are task files of
the experiments' executor, so an interrupted run continues with ``--resume``):

- ``attention``: the unscaled 3-exponent-bit splits (and P3109 k8p5, e3m4 with bias 4, e3m4
  without flush) with attention's ``probs @ v`` over every key (eager) and over the unmasked
  keys only (a causal kernel), recording every operand element that overflows;
- ``like``: e4mY with the LayerNorms in FP32 and the same flush / subnormal ablations as the
  e3 runs, so that every attribution ratio divides runs that differ in one thing;
- ``finite``: e4mY and e5mY saturating, saturating without flush, and in the ``fn`` encoding
  (the baselines of the finite-encoding comparisons), and e3 saturating with its bias moved
  up by one (bias 4, P3109 k8p5's);
- ``deployed``: weights scaled per output channel with activations unscaled, and activations
  scaled per tensor with weights unscaled, every split whose FP32 scales are not all clamped;
- ``mantissa``: e3mY and e4mY with their exponent range unbounded below
  (``unbounded_below``), LayerNorms in FP32: every operand rounded at the format's mantissa
  width, none flushed or kept exact, so the pair differs in the mantissa bit (and the largest
  value, which nothing reaches there) only.

Usage: ``fpsim experiment range-cases [--only GROUP ...] [--tokens N] [--out results]``;
``--render`` re-renders ``range-vs-precision/REPORT.md`` from the JSON; ``--quick`` without
``--only`` or ``--cases`` runs the first case of each group.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fpsim import Format

from . import context
from .gpt2.model import site_kind
from .range_vs_precision import (BUDGETS, NAME as RVP, fn_format, p3109_formats, scale_clamped,
                                 split_format, splits)
from .recipes import Recipe
from .report import load_json, write_json
from .sweep import runs as e2e_runs

NAME = "range-cases"
GROUPS = ("attention", "like", "finite", "deployed", "mantissa")


@dataclass(frozen=True)
class Case:
    """One end-to-end run: the format, how activations and weights are treated, and where.

    ``act``: activation scaling (``none``/``tensor``); ``weights``: scaling of the linear
    sites' weights, None: the same recipe as the activations.
    """

    group: str
    name: str
    budget: int
    fmt: Format
    act: str = "none"
    weights: str | None = None
    saturate: bool = False
    flush: bool = True
    full_subnormals: bool = False
    ln_fp32: bool = False
    attention: str = "eager"

    def recipe(self) -> Recipe:
        return Recipe(name=self.name, inputs=self.fmt, scaling=self.act, saturate=self.saturate,
                      flush=self.flush, full_subnormals=self.full_subnormals)

    def weight_recipe(self) -> Recipe | None:
        if self.weights is None:
            return None
        return Recipe(name=f"{self.name} weights", inputs=self.fmt, scaling=self.weights)

    def describe(self) -> dict[str, Any]:
        """What the run is, factor by factor (see ``fpsim_experiments.likewise``)."""
        return {"format": self.fmt.name, "activations": self.act,
                "weights": self.act if self.weights is None else self.weights,
                "saturate": self.saturate, "flush": self.flush,
                "full_subnormals": self.full_subnormals, "ln_fp32": self.ln_fp32,
                "attention": self.attention}


def _e(budget: int, ebits: int) -> Format:
    return split_format(ebits, budget - 1 - ebits)


def unbounded_below(f: Format) -> Format:
    """``f`` with 8 exponent bits and the same largest value: its range goes on downwards past
    FP32's smallest subnormal, so every FP32 operand rounds at ``f``'s mantissa width and none
    is subnormal or flushes (IEEE-style, as the splits).

    >>> from fpsim_experiments.range_vs_precision import split_format
    >>> g = unbounded_below(split_format(3, 4))
    >>> g.name, g.max, g.min_normal < 2.0 ** -149
    ('e3m4_unbounded_below', 15.5, True)
    """
    emax = 2 ** f.ebits - 2 - f.bias
    return Format(f"{f.name}_unbounded_below", 8, f.mbits, bias=254 - emax)


def cases() -> Iterator[Case]:
    """Every case, in the order they run (most needed first)."""
    for b in BUDGETS:
        for attention in ("eager", "causal"):
            yield Case("attention", f"{_e(b, 3).name} {attention}", b, _e(b, 3),
                       attention=attention)
    yield Case("attention", "e3m4 no flush causal", 8, _e(8, 3), flush=False, attention="causal")
    e3b4 = Format("e3m4b4", 3, 4, bias=4)
    yield Case("attention", "e3m4b4 causal", 8, e3b4, attention="causal")
    for f in p3109_formats(3):
        yield Case("attention", f"{f.name} causal", 8, f, attention="causal")
    for b in BUDGETS:
        f = _e(b, 4)
        yield Case("like", f"{f.name} LN FP32, no flush", b, f, flush=False, ln_fp32=True)
        yield Case("like", f"{f.name} LN FP32, full subnormals", b, f, full_subnormals=True,
                   ln_fp32=True)
        yield Case("like", f"{f.name} LN FP32, no flush, full subnormals", b, f, flush=False,
                   full_subnormals=True, ln_fp32=True)
    for b in BUDGETS:
        for x in (4, 5):
            f = _e(b, x)
            yield Case("finite", f"{f.name} saturating", b, f, saturate=True)
            yield Case("finite", f"{f.name} sat, no flush", b, f, saturate=True, flush=False)
            yield Case("finite", f"{f.name}fn", b, fn_format(x, b - 1 - x))
        m = b - 4
        g = Format(f"e3m{m}b4", 3, m, bias=4)
        yield Case("finite", f"{g.name} saturating", b, g, saturate=True)
    for b in BUDGETS:
        for f in splits(b)[0]:
            if scale_clamped({"max": f.max}):
                continue
            yield Case("deployed", f"{f.name} W/channel", b, f, weights="channel")
            yield Case("deployed", f"{f.name} A/tensor", b, f, act="tensor", weights="none")
    for b in BUDGETS:
        for x in (3, 4):
            f = _e(b, x)
            yield Case("mantissa", f"{f.name} LN FP32, unbounded below", b, unbounded_below(f),
                       ln_fp32=True)


def case_run(ctx: context.Context, case: Case) -> e2e_runs.Run:
    """``case``'s end-to-end run."""
    recipe = case.recipe()
    per_site = (
        {n: recipe for n in ctx.site_names if site_kind(n) != "layernorm"} if case.ln_fp32
        else recipe
    )
    return e2e_runs.recipe_run(case.name, per_site, weights=case.weight_recipe(),
                               attention=case.attention)


def case_result(case: Case, result: dict[str, Any]) -> dict[str, Any]:
    """``case`` as stored: what it is, its end-to-end metrics and where its operands
    overflowed (``result``: its run's, ``fpsim_experiments.context.Context.end_to_end_runs``)."""
    return {"name": case.name, "budget": case.budget, "format": case.fmt.name,
            "ebits": case.fmt.ebits, "mbits": case.fmt.mbits, "max": case.fmt.max,
            "min_subnormal": case.fmt.min_subnormal, "describe": case.describe(),
            "recipe": case.recipe().to_json(), "e2e": result["e2e"],
            "overflows": result["overflows"], "seconds": round(result["seconds"], 1)}


def path(out: Path, group: str) -> Path:
    return out / RVP / "cases" / f"{group}.json"


def load(out: Path) -> dict[str, dict]:
    """Every case run so far, by name (empty when none)."""
    found: dict[str, dict] = {}
    for group in GROUPS:
        p = path(out, group)
        if p.exists():
            found.update({r["name"]: r for r in load_json(p)["runs"]})
    return found


def main(args: argparse.Namespace) -> int:
    """Run the missing cases of the chosen groups, saving after each; then re-render."""
    from . import range_vs_precision

    if not args.render:
        torch.set_num_threads(args.threads)
        os.environ["FPSIM_THREADS"] = str(args.threads)
        sizes = context.QUICK if args.quick else context.FULL
        if args.tokens:
            sizes = dataclasses.replace(sizes, tokens=args.tokens)
        ctx = context.build(args.model, sizes, args.quick, device=args.device)
        p = path(args.out, "weights")
        p.parent.mkdir(parents=True, exist_ok=True)
        write_json(p, {"weights": weight_stats(ctx.model), "meta": ctx.meta()})
        groups = args.only or GROUPS
        chosen = [c for c in cases() if c.group in groups]
        if args.cases:
            by_name = {c.name: c for c in cases()}
            unknown = [n for n in args.cases if n not in by_name]
            if unknown:
                raise SystemExit(f"fpsim experiment range-cases: no case {unknown[0]!r}")
            chosen = [by_name[n] for n in args.cases]
        if args.quick and not (args.only or args.cases):     # a first try: one per group
            chosen = [next(c for c in chosen if c.group == g) for g in GROUPS]
        stored = load(args.out)
        todo = [c for c in chosen if c.name not in stored]
        ctx.execution = e2e_runs.execution(args, f"{RVP}/cases")
        results = ctx.end_to_end_runs([case_run(ctx, c) for c in todo], "runs",
                                      desc="range cases")
        for case, result in zip(todo, results):
            p = path(args.out, case.group)
            data = load_json(p) if p.exists() else {"group": case.group, "runs": []}
            data["runs"].append(case_result(case, result))
            data["meta"] = {**ctx.meta(), "command": "fpsim experiment range-cases"}
            write_json(p, data)
            print(f"{case.group}: {case.name} ({data['runs'][-1]['seconds']} s)", flush=True)
        ctx.execution.finish()
    out = args.out / RVP
    if (out / "results.json").exists():
        (out / "REPORT.md").write_text(range_vs_precision.render(range_vs_precision.load(out),
                                                                 out))
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--only", nargs="+", choices=GROUPS, help="run only these groups")
    p.add_argument("--cases", nargs="+", metavar="NAME",
                   help="run only these cases, in this order (names as in the report); "
                        "range-vs-precision --model MODEL: only these arms")


def weight_stats(model: torch.nn.Module) -> dict[str, dict[str, Any]]:
    """Per linear weight (Conv1D and the tied lm_head): its largest magnitude and, for the
    4- and 3-exponent-bit splits of every budget, the share of its non-zero elements below the
    format's smallest normal (subnormal or flushed) and the share flushed to zero, unscaled."""
    from fpsim import quantize

    formats = [_e(b, x) for b in BUDGETS for x in (3, 4)]
    out = {}
    for name, p in model.named_parameters():
        if p.dim() != 2 or "wpe" in name:
            continue
        w = p.detach().double().flatten()
        nz = w[w != 0]
        site = "lm_head" if "wte" in name else name.removeprefix("transformer.").replace(
            ".weight", "").replace("h.", "h", 1)
        row: dict[str, Any] = {"amax": float(nz.abs().max()), "elements": int(nz.numel())}
        for f in formats:
            q = quantize(nz, f)
            row[f.name] = {"below_normal": float((nz.abs() < f.min_normal).double().mean()),
                           "flushed": float((q == 0).double().mean())}
        out[site] = row
    return out
