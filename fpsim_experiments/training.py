"""Experiment ``training``: which low-precision training recipes train a small GPT-2 like FP32,
and is a failure range or precision?

One initialisation of a small byte-level GPT-2 is trained on the pydoc text for a fixed number
of steps under each recipe, with several seeds (a seed draws the batches; the same seed gives
the same batches under every recipe, so recipes are compared seed by seed).  Every recipe runs
through ``fpsim.emulate`` and its backward pass (``fpsim.emulation.backward``): at each
emulated product site the forward GEMM's operands are quantized as the recipe says, and both
backward GEMMs (input gradient, weight gradient) take the output gradient in the recipe's
gradient format (its cast: none, per-tensor, MX / NVFP4 blocks), the forward operands
re-quantized along their own reduction axis; sums are FP32 (FP64 rounded once).  BF16 / FP16
recipes cover every product (the linear layers, Q·Kᵀ, P·V and the tied LM head); FP8 / MXFP8 /
NVFP4 recipes the linear layers, as Transformer Engine and torchao do.  LayerNorm, softmax,
GELU, residual adds, the loss, the FP32 master weights and AdamW's state stay FP32.  Loss
scaling follows ``fpsim.nn.LossScaler`` (torch.amp.GradScaler's rules).  At a few steps
the run is captured (``capture=True``): per backward GEMM, the share of the gradient operand's
nonzero elements flushed to zero (underflow) or overflowing, as the recipe cast them.

Usage: ``fpsim experiment training [--quick] [--device cpu|cuda] [--out results] [--render]``
(``FPSIM_TRAINING_PLAN=shared`` runs ``SHARED``, the smaller plan of the committed results).
"""

from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

import fpsim
from fpsim.emulation import Recipe as SiteRecipe, Rule, Rules
from fpsim.emulation.casts import Backward, Cast
from fpsim.emulation.presets import PRESETS
from fpsim.nn import LossScaler

from .gpt2.data import heldout_bytes, random_windows, train_bytes, windows
from .gpt2.model import GPT2, GPT2Config
from .gpt2.train_tiny import learning_rate, make_optimizer
from .report import OCP_NAMES, figure, finish, num, pct, quick_note, save, table, versions

NAME = "training"
MODEL = GPT2Config(n_layer=2, n_head=2, n_embd=64, n_positions=64, vocab_size=256)
INIT_SEED = 1234


@dataclass(frozen=True)
class Plan:
    """How long and how much: steps, seeds, batch, the recipes run (None: all) and the steps
    captured."""

    steps: int
    seeds: int
    batch: int
    lr: float = 3e-3
    warmup: int = 20
    heldout_windows: int = 64
    recipes: tuple[str, ...] | None = None

    @property
    def record_steps(self) -> list[int]:
        return sorted({0, self.steps // 2, self.steps - 1})


FULL = Plan(steps=150, seeds=10, batch=8)
#: ``--quick``: a first try, not a result: 6 steps, 2 seeds (a t-interval on 1 degree of
#: freedom), the 5 recipes of the FP16/BF16 headline.
QUICK = Plan(steps=6, seeds=2, batch=4, warmup=2, heldout_windows=8, recipes=(
    "fp32", "bf16", "fp16", "fp16, GPT-2 batch", "fp16 dynamic loss scale, GPT-2 batch"))
#: What one session could run on a shared 2-core machine (load average about 20; a step of
#: an emulated recipe costs about 1 s there): 10 seeds of 16 steps of 4 sequences, eleven
#: recipes.  Too short for loss differences of a few hundredths; enough for underflow.
SHARED = Plan(steps=16, seeds=10, batch=4, warmup=4, heldout_windows=16, recipes=(
    "fp32", "bf16", "fp16", "fp16, GPT-2 batch", "fp16 dynamic loss scale, GPT-2 batch",
    "fp8 e5m2 gradients", "fp8 e4m3 gradients", "fp8 e5m2 gradients unscaled",
    "fp8 e4m3 gradients unscaled", "te-mxfp8", "nvfp4"))
PLANS = {"full": FULL, "shared": SHARED}   # FPSIM_TRAINING_PLAN=shared picks the smaller run


@dataclass(frozen=True)
class Recipe:
    """A training recipe of the experiment: the forward cast and gradient cast of every site
    it covers (``kinds``), or a named fpsim preset; loss scaling; micro-batch division."""

    name: str
    forward: str | None = None      # format of the forward operands
    grad: str | None = None         # format of the output gradient in both backward GEMMs
    scaling: str = "none"           # Cast scaling of both ("none", "tensorwise")
    kinds: tuple[str, ...] = ("linear", "matmul")
    preset: str | None = None       # an fpsim training preset instead of the casts above
    loss_scale: str | None = None   # None, "static" or "dynamic"
    accumulate: int = 1             # micro-batches per step the loss is divided by (see MICRO)

    def rules(self) -> Rules | None:
        """The ``fpsim.emulation.Rules`` of this recipe (None: plain torch FP32)."""
        if self.preset is not None:
            return Rules([Rule(PRESETS[self.preset].recipe, kind="linear")], default=None)
        if self.forward is None and self.grad is None:
            return None
        sat = self.scaling != "none"
        fwd = None if self.forward is None else Cast(self.forward, self.scaling, saturate=sat)
        grad = None if self.grad is None else Cast(self.grad, self.scaling, saturate=sat)
        site = SiteRecipe(name=self.name, inputs=fwd, backward=Backward(grad=grad))
        return Rules([Rule(site, kind=k) for k in self.kinds], default=None)

    @property
    def grad_format(self) -> str | None:
        if self.preset is not None:
            g = PRESETS[self.preset].recipe.backward.grad
            return None if g is None else g.name
        return self.grad


STATIC_SCALE = 2.0 ** 10
#: GPT-2 trained on 512 x 1024 = 2^19 tokens per step; with our 2^9-token micro-batches that is
#: 2^10 micro-batches, and gradient accumulation divides each one's loss by their number.  The
#: "GPT-2 batch" recipes do that to one micro-batch and multiply the FP32 gradients back (exact:
#: a power of two), so the optimizer sees the same update and only the magnitudes the backward
#: pass rounds change: it emulates the gradient *range* of a 2^19-token step (each micro-batch's
#: gradients 2^10 times smaller), not its averaging over 2^10 micro-batches (less noise).
MICRO = 2 ** 10
DYNAMIC = {"init_scale": 2.0 ** 16, "growth_factor": 2.0, "backoff_factor": 0.5,
           "growth_interval": 50}
_FP8 = {"forward": "e4m3", "scaling": "tensorwise", "kinds": ("linear",)}
RECIPES = (
    Recipe("fp32"),
    Recipe("bf16", "bf16", "bf16"),
    Recipe("fp16", "fp16", "fp16"),
    Recipe("fp16 static loss scale", "fp16", "fp16", loss_scale="static"),
    Recipe("fp16 dynamic loss scale", "fp16", "fp16", loss_scale="dynamic"),
    Recipe("fp16, GPT-2 batch", "fp16", "fp16", accumulate=MICRO),
    Recipe("fp16 dynamic loss scale, GPT-2 batch", "fp16", "fp16", loss_scale="dynamic",
           accumulate=MICRO),
    # gradients: range vs precision, 8 bits split three ways, with and without scaling
    Recipe("fp8 e5m2 gradients", grad="e5m2", **_FP8),
    Recipe("fp8 e4m3 gradients", grad="e4m3", **_FP8),
    Recipe("fp8 e3m4 gradients", grad="e3m4", **_FP8),
    Recipe("fp8 e5m2 gradients unscaled", "e4m3", "e5m2", kinds=("linear",)),
    Recipe("fp8 e4m3 gradients unscaled", "e4m3", "e4m3", kinds=("linear",)),
    Recipe("fp8 e3m4 gradients unscaled", "e4m3", "e3m4", kinds=("linear",)),
    # published recipes (fpsim presets)
    Recipe("te-delayed", preset="te-delayed"),
    Recipe("te-mxfp8", preset="te-mxfp8"),
    Recipe("nvfp4", preset="nvfp4"),
)


def _scaler(recipe: Recipe) -> LossScaler | None:
    if recipe.loss_scale == "static":
        return LossScaler(init_scale=STATIC_SCALE, dynamic=False)
    if recipe.loss_scale == "dynamic":
        return LossScaler(**DYNAMIC)
    return None


COUNTS = ("elements", "nonzero", "flushed", "overflow")


def gradient_counts(em: fpsim.emulate) -> dict[str, Any]:
    """Elements, nonzero elements, flushed and overflowed of the gradient operand over the
    captured dgrad GEMMs (the wgrad GEMMs reuse or re-cast the same gradient), in all and per
    GEMM (``gemms``, by site)."""
    rows = {n: st for n, st in em.sites.items() if st.kind == "dgrad"}
    gemms = {n.removesuffix("/dgrad"): {k: int(getattr(st, k)) for k in COUNTS}
             for n, st in rows.items()}
    return {**{k: sum(g[k] for g in gemms.values()) for k in COUNTS}, "gemms": gemms}


def train_one(recipe: Recipe, seed: int, plan: Plan, init: dict, data: Tensor, held: Tensor,
              config: GPT2Config = MODEL) -> dict[str, Any]:
    """Train from ``init`` under ``recipe`` with batches drawn by ``seed``; the run's record
    (runs on ``held``'s device; stochastic rounding's bits from ``torch.manual_seed(seed)``)."""
    device = held.device
    model = GPT2(config).to(device)
    model.load_state_dict(init)
    args = argparse.Namespace(lr=plan.lr, min_lr=plan.lr / 10, warmup_steps=plan.warmup,
                              weight_decay=0.1)
    opt, scaler = make_optimizer(model, args), _scaler(recipe)
    rules = recipe.rules()
    em = None if rules is None else fpsim.emulate(rules)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    losses, scales, grads, nonfinite = [], [], {}, 0
    for step in range(plan.steps):
        for g in opt.param_groups:
            g["lr"] = learning_rate(args, step, step / plan.steps)
        batch = random_windows(data, config.n_positions, plan.batch, gen).to(device)
        ctx = em
        if rules is not None and step in plan.record_steps:
            ctx = fpsim.emulate(rules, capture=True)
            ctx.histories = em.histories              # delayed scaling state carries on
        if ctx is not None:
            ctx.__enter__()
        try:
            logits = model(batch[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
            opt.zero_grad(set_to_none=True)
            part = loss / recipe.accumulate
            (part if scaler is None else scaler.scale(part)).backward()
        finally:
            if ctx is not None:
                ctx.__exit__(None, None, None)
        if ctx is not None and ctx is not em:
            grads[str(step)] = gradient_counts(ctx)     # as JSON keys it
        if scaler is not None:
            scaler.unscale_(opt)
        if recipe.accumulate != 1:
            for p in model.parameters():
                p.grad.mul_(recipe.accumulate)
        finite = all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        nonfinite += not finite
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if scaler is None:
            opt.step()
        else:
            scales.append(scaler.get_scale())
            scaler.step(opt)
            scaler.update()
        losses.append(loss.item())
    with torch.no_grad():
        logits = model(held[:, :-1])
        final = F.cross_entropy(logits.flatten(0, 1), held[:, 1:].flatten()).item()
    return {"seed": seed, "loss": [round(v, 5) for v in losses], "heldout_loss": final,
            "nonfinite_steps": nonfinite, "skipped": scaler.skipped if scaler else 0,
            "scale": scales, "grads": grads}


def run(plan: Plan, device: str = "cpu") -> dict[str, Any]:
    """Every recipe of the plan, every seed, from one initialisation, on ``device``."""
    torch.manual_seed(INIT_SEED)
    init = GPT2(MODEL).state_dict()
    data = train_bytes()
    held = windows(heldout_bytes(), MODEL.n_positions, plan.heldout_windows).to(device)
    with torch.no_grad():
        m = GPT2(MODEL).to(device)
        m.load_state_dict(init)
        init_loss = F.cross_entropy(m(held[:, :-1]).flatten(0, 1), held[:, 1:].flatten()).item()
    chosen = [r for r in RECIPES if plan.recipes is None or r.name in plan.recipes]
    runs = []
    for r in chosen:
        start = time.perf_counter()
        seeds = [train_one(r, s, plan, init, data, held) for s in range(plan.seeds)]
        runs.append({"recipe": asdict(r), "seeds": seeds,
                     "seconds": round(time.perf_counter() - start, 1)})
        print(f"{NAME}: {r.name}: held-out "
              f"{[num(s['heldout_loss'], 4) for s in seeds]} ({runs[-1]['seconds']} s)", flush=True)
    return {"plan": {**asdict(plan), "record_steps": plan.record_steps}, "runs": runs,
            "initial_heldout_loss": init_loss, "static_scale": STATIC_SCALE, "dynamic": DYNAMIC}


# ----------------------------------------------------------------------------------------------
# Analysis
# ----------------------------------------------------------------------------------------------
#: Two-sided 95% Student-t critical values t_{0.975, df}, df = 1 ... 30 (standard tables).
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and 95% Student-t interval of the mean over seeds (NaN if a value is not finite;
    beyond 31 seeds df = 30's critical value, slightly wide)."""
    v = np.asarray(values, dtype=float)
    if not np.isfinite(v).all() or len(v) < 2:
        return math.nan, math.nan, math.nan
    half = T975[min(len(v) - 1, len(T975)) - 1] * v.std(ddof=1) / math.sqrt(len(v))
    return float(v.mean()), float(v.mean() - half), float(v.mean() + half)


def shares(run: dict) -> dict[str, float]:
    """Share of the gradient operand's elements (captured steps, all seeds) flushed to zero
    or overflowing in the recipe's gradient cast."""
    tot = {"elements": 0, "flushed": 0, "overflow": 0}
    for s in run["seeds"]:
        for c in s["grads"].values():
            for k in tot:
                tot[k] += c[k]
    n = max(tot["elements"], 1)
    return {"flushed": tot["flushed"] / n, "overflow": tot["overflow"] / n,
            "elements": tot["elements"]}


def step_shares(run: dict) -> list[tuple[int, float]]:
    """Per captured step, the share of the gradient operand's elements (zeros included, all
    seeds) flushed to zero: a share pooled over steps hides that one step holds them all."""
    steps = sorted({int(k) for s in run["seeds"] for k in s["grads"]})
    out = []
    for step in steps:
        cs = [s["grads"][str(step)] for s in run["seeds"] if str(step) in s["grads"]]
        out.append((step, sum(c["flushed"] for c in cs) / max(sum(c["elements"] for c in cs), 1)))
    return out


def gemm_shares(run: dict) -> dict[str, float | None] | None:
    """Per backward (dgrad) GEMM, over captured steps and seeds, the share of its gradient
    operand's *nonzero* elements flushed to zero (None: the gradient was all zeros, as below a
    GEMM that flushed its whole gradient); None when the run did not record GEMMs."""
    if not all("gemms" in c for s in run["seeds"] for c in s["grads"].values()):
        return None
    tot: dict[str, list[int]] = {}
    for s in run["seeds"]:
        for c in s["grads"].values():
            for site, g in c["gemms"].items():
                t = tot.setdefault(site, [0, 0])
                t[0] += g["nonzero"]
                t[1] += g["flushed"]
    return {site: (f / nz if nz else None) for site, (nz, f) in tot.items()}


def flush_text(run: dict) -> str:
    """What flushed: per captured step, and per GEMM of the nonzero elements when recorded."""
    steps = step_shares(run)
    text = ("gradient elements flushed to zero at steps "
            f"{', '.join(str(k) for k, _ in steps)}: {', '.join(pct(v) for _, v in steps)} "
            "(of all elements, zeros included)")
    per = gemm_shares(run)
    if per is None:
        return text
    live = {k: v for k, v in per.items() if v is not None}
    if not live:
        return text + f"; every one of the {len(per)} GEMMs' gradients was all zeros"
    worst = max(live, key=live.get)
    text += (f"; of the nonzero gradient elements per GEMM, at most {pct(live[worst])} "
             f"({worst}), median {pct(float(np.median(list(live.values()))))}")
    dead = len(per) - len(live)
    return text + (f"; {dead} of {len(per)} GEMMs had an all-zero gradient" if dead else "")


def stuck(run: dict) -> bool:
    """Whether every seed ends at the very same held-out loss: the seeds draw different
    batches, so a run that learns from them ends apart."""
    return len(run["seeds"]) > 1 and len({s["heldout_loss"] for s in run["seeds"]}) == 1


def verdict(data: dict, run: dict) -> dict[str, Any]:
    """Held-out loss gap to FP32 (paired by seed) with its t-interval, and what it says: an
    interval above 0 is worse, below 0 better, else no difference resolved."""
    ref = {s["seed"]: s["heldout_loss"] for s in data["runs"][0]["seeds"]}
    gaps = [s["heldout_loss"] - ref[s["seed"]] for s in run["seeds"]]
    mean, lo, hi = t_interval(gaps)
    drop = data["initial_heldout_loss"] - float(np.mean(list(ref.values())))
    bad = sum(s["nonfinite_steps"] for s in run["seeds"])
    skipped = sum(s["skipped"] for s in run["seeds"])
    diverged = not all(math.isfinite(s["heldout_loss"]) for s in run["seeds"])
    if diverged:
        state = "diverged"
    elif mean > 0.5 * drop:
        state = "stalled"
    elif lo > 0:
        state = "worse than FP32"
    elif hi < 0:
        state = "better than FP32"
    else:
        state = "no difference resolved"
    cause = "-"
    if state in ("diverged", "stalled", "worse than FP32") and run["recipe"]["grad"]:
        sh = shares(run)
        if bad or skipped or sh["overflow"] > 1e-4:
            cause = "overflow"
        elif sh["flushed"] > 0.01:
            cause = "underflow"
        else:
            cause = "rounding"
    return {"gap": mean, "lo": lo, "hi": hi, "state": state, "cause": cause,
            "nonfinite_steps": bad, "skipped": skipped, "drop": drop}


def headline(data: dict) -> str | None:
    """Does FP16 fail where BF16 does not, and is it range?  (None without the runs to tell.)"""
    runs = {r["recipe"]["name"]: r for r in data["runs"]}
    names = ("fp16, GPT-2 batch", "bf16", "fp16 dynamic loss scale, GPT-2 batch", "fp16")
    if not all(n in runs for n in names):
        return None
    v = {n: verdict(data, runs[n]) for n in names}

    def gap(n: str) -> str:
        return f"{num(v[n]['gap'])} [{num(v[n]['lo'])}, {num(v[n]['hi'])}]"

    lost = shares(runs[names[0]])["flushed"]
    range_fails = (v[names[0]]["state"] in ("worse than FP32", "stalled")
                   and v[names[0]]["cause"] == "underflow"
                   and v[names[2]]["state"] not in ("worse than FP32", "stalled", "diverged")
                   and v[names[1]]["state"] not in ("worse than FP32", "stalled", "diverged"))
    return (f"With GPT-2's 2^19-token batch emulated (each 2^9-token micro-batch's loss divided "
            f"by 2^10), FP16 without loss scaling ends {gap(names[0])} nats/byte from FP32 on "
            f"held-out text (mean [95% t-interval] over seeds; {v[names[0]]['state']}, cause: "
            f"{v[names[0]]['cause']}: {pct(lost)} of its output-gradient elements at the "
            f"captured steps flushed to zero). BF16 (whose range holds those gradients, so its GPT-2-batch run is its "
            f"plain run up to the exact power-of-two scaling) ends {gap(names[1])} "
            f"({v[names[1]]['state']}) and FP16 with dynamic loss scaling {gap(names[2])} "
            f"({v[names[2]]['state']}): "
            + ("FP16 fails for range (underflow), not precision. " if range_fails else
               "these runs do not show FP16 failing for range alone. ")
            + f"At this model's own 2^9-token batch FP16 without scaling ends {gap(names[3])} "
            f"({v[names[3]]['state']}).")


def conclusions(data: dict) -> list[str]:
    """Each recipe's gap with its interval and verdict, and what flushed or overflowed."""
    n = data["plan"]["seeds"]
    out = [h for h in (headline(data),) if h]
    for run in data["runs"][1:]:
        v = verdict(data, run)
        r = run["recipe"]
        line = (f"{r['name']}: held-out loss {num(v['gap'])} nats/byte from FP32 (95% t-interval "
                f"{num(v['lo'])} to {num(v['hi'])} over {n} seeds): {v['state']}")
        sh = shares(run)
        if sh["elements"]:
            line += f"; {flush_text(run)}; {pct(sh['overflow'])} overflowed"
        if stuck(run):
            line += (f"; held-out loss {num(run['seeds'][0]['heldout_loss'], 7)} on every seed "
                     f"(at initialisation {num(data['initial_heldout_loss'], 7)}): the batches, "
                     "which differ by seed, changed nothing, so it did not learn from them")
        if v["nonfinite_steps"] or v["skipped"]:
            line += (f"; {v['nonfinite_steps']} steps had inf/NaN gradients, "
                     f"{v['skipped']} were skipped")
        if v["cause"] != "-":
            line += f". Cause: {v['cause']}"
        elif v["state"] in ("worse than FP32", "better than FP32"):
            line += (f". No mechanism shown (a preset, not classified by flushed or overflowed "
                     f"gradients) and one of {len(data['runs']) - 1} uncorrected intervals: "
                     "exploratory")
        out.append(line + ".")
    return out


# ----------------------------------------------------------------------------------------------
# Figures and report
# ----------------------------------------------------------------------------------------------
def _style(name: str) -> str:
    return "--" if name.startswith("fp8") else (":" if "GPT-2" in name else "-")


def _curves(data: dict, out: Path) -> str:
    fig, axes = figure(1, 3, width=4.2, height=3.4)        # < 200 KB with 16 recipes
    ax, gap_ax, scale_ax = axes[0]
    ref = np.array([s["loss"] for s in data["runs"][0]["seeds"]], dtype=float)
    for run in data["runs"]:
        name = run["recipe"]["name"]
        loss = np.array([s["loss"] for s in run["seeds"]], dtype=float)
        x = np.arange(loss.shape[1])
        line, = ax.plot(x, np.nanmean(loss, axis=0), _style(name), lw=1.2, label=name)
        ax.fill_between(x, np.nanmin(loss, axis=0), np.nanmax(loss, axis=0),
                        color=line.get_color(), alpha=0.15)
        gap = loss - ref
        gap_ax.plot(x, np.nanmean(gap, axis=0), _style(name), color=line.get_color(), lw=1)
        gap_ax.fill_between(x, np.nanmin(gap, axis=0), np.nanmax(gap, axis=0),
                            color=line.get_color(), alpha=0.15)
        if run["seeds"][0]["scale"]:
            scale_ax.plot(x, np.log2(run["seeds"][0]["scale"]), _style(name),
                          color=line.get_color(), label=f"{name} (seed 0)")
    ax.set_ylabel("training loss, nats/byte\n(mean, band: min-max over seeds)")
    ax.set_ylim(top=data["initial_heldout_loss"] + 0.5)
    ax.legend(fontsize=6)
    ax.set_title(f"from one initialisation, {data['plan']['seeds']} seeds", fontsize=9)
    gap_ax.set_yscale("symlog", linthresh=1e-3)
    gap_ax.set_ylabel("training loss minus FP32's on the same batches")
    gap_ax.set_title("gap to FP32, paired by seed", fontsize=9)
    scale_ax.set_ylabel("log2 loss scale")
    scale_ax.set_title("loss scale (steps with inf/NaN halve it)", fontsize=9)
    scale_ax.legend(fontsize=6)
    for a in axes[0]:
        a.set_xlabel("step")
        a.grid(alpha=0.3)
    return save(fig, out / "loss_curves.png")


def render(data: dict, out: Path) -> str:
    """Figures and the Markdown report from ``results.json``."""
    meta, plan = data["meta"], data["plan"]
    curves = _curves(data, out)
    rows = []
    for run in data["runs"]:
        r, v = run["recipe"], verdict(data, run)
        finals = [s["heldout_loss"] for s in run["seeds"]]
        sh = shares(run)
        what = r["preset"] or f"{r['forward'] or 'fp32'} / {r['grad'] or 'fp32'}"
        rows.append([r["name"], what, r["scaling"] if not r["preset"] else "preset",
                     r["loss_scale"] or "-", num(float(np.mean(finals)), 4),
                     f"{num(v['gap'])} [{num(v['lo'])}, {num(v['hi'])}]", v["state"], v["cause"],
                     v["skipped"], v["nonfinite_steps"],
                     " / ".join(pct(v) for _, v in step_shares(run)) if sh["elements"] else "-",
                     pct(sh["overflow"]) if sh["elements"] else "-", run["seconds"]])
    ran = [r["recipe"]["name"] for r in data["runs"]]
    missing = [r.name for r in RECIPES if r.name not in ran]
    lines = [f"# Training under emulated formats ({meta['model']})", "",
             *quick_note(meta, size=(
                 f"{plan['steps']} steps, {plan['seeds']} seeds (a t-interval on "
                 f"{plan['seeds'] - 1} degree(s) of freedom), {len(data['runs'])} of the "
                 f"{len(RECIPES)} recipes, {plan['heldout_windows']} held-out windows")),
             f"{plan['steps']} AdamW steps of {plan['batch']}×{MODEL.n_positions} bytes (lr "
             f"{plan['lr']}, {plan['warmup']} warm-up steps, cosine decay, gradient clipping at "
             f"1), {plan['seeds']} seeds per recipe from one initialisation (held-out loss at "
             f"initialisation {num(data['initial_heldout_loss'], 4)} nats/byte). Held-out loss: "
             f"{plan['heldout_windows']} windows of unseen text, evaluated in FP32 with the master "
             "weights. Every recipe runs through `fpsim.emulate` with its backward pass "
             "(forward and both backward GEMMs of every emulated site quantized; sums FP32). "
             f"{OCP_NAMES} "
             "Gap: held-out loss minus FP32's, paired by seed; mean and 95% Student-t interval "
             f"over the {plan['seeds']} seeds (what is resampled: the seed, which draws the "
             "batches and stochastic rounding's bits; the initialisation and held-out text are "
             "fixed). Static loss scale "
             f"{num(data['static_scale'])}; dynamic: {data['dynamic']}. Output gradients counted "
             f"at steps {plan['record_steps']}. Runtime {meta['seconds']} s on "
             f"{meta['cpus']} CPUs (load average {meta['load'][0]} at the start, "
             f"{meta['load'][1]} at the end)"
             + (f", torch on {meta['threads']} threads" if "threads" in meta else "")
             + ". The emulated GEMMs give the same bits on any thread count; torch's own FP32 "
             "ops (norms, softmax, the unemulated gradients' sums) can round differently in "
             "their last bits with the thread count, and the steps of training amplify that "
             "(held-out losses move in their 3rd-4th digit). A rerun reproduces these numbers "
             "on the same thread count and CPU kernels.", "",
             "Verdicts: diverged (non-finite held-out loss), stalled (gap over half of FP32's loss "
             "decrease), worse than FP32 (interval above 0), better than FP32 (interval below 0), "
             "else no difference resolved (the interval includes 0: no claim either way). "
             "Cause (for diverged, stalled or worse): overflow if any step had inf/NaN gradients "
             "or more than 0.01% of gradient elements overflowed, underflow if more than 1% "
             "flushed to zero, else rounding. Each interval is 95% on its own: with "
             f"{len(data['runs']) - 1} recipes compared and no multiple-comparison correction, "
             "one interval excluding 0 by chance alone is likely; read a verdict backed by a "
             "mechanism (flushed or overflowed gradients), not a lone small gap.", "",
             "Flushed gradients are counted at the captured steps, each step apart (a share "
             "pooled over steps would hide that one step holds them all). A share of all "
             "elements counts as unflushed the zeros that a GEMM whose gradient flushed leaves "
             "to every GEMM before it; the share of each GEMM's *nonzero* gradient elements "
             "flushed says which GEMM lost its gradient"
             + ("." if all(gemm_shares(r) is not None for r in data["runs"][1:]) else
                " (this run did not record the GEMMs; a rerun of the current code does)."),
             "",
             "The \"GPT-2 batch\" runs divide one 512-token micro-batch's loss by 2^10 and "
             "multiply the FP32 gradients back: they emulate the gradient magnitudes of a "
             "2^19-token step made of 2^10 accumulated micro-batches (what the backward pass "
             "rounds), not the averaging over those micro-batches. In BF16 that division is exact "
             "and nothing underflows, so a BF16 GPT-2-batch run would repeat the BF16 run; it "
             "is not run.", ""]
    if missing:
        lines += [f"Not run in this regeneration (the code runs them; `Plan.recipes` chose): "
                  f"{', '.join(missing)}.", ""]
    lines += ["## Conclusions", ""]
    lines += [f"- {c}" for c in conclusions(data)]
    lines += ["", f"![loss curves]({curves})", "",
              table(["recipe", "forward / gradients", "scaling", "loss scaling", "held-out loss",
                     "gap to FP32 [95% t-interval]", "verdict", "cause", "skipped steps",
                     "inf/NaN gradient steps", "gradient elements flushed (per captured step)",
                     "gradient elements overflowed", "seconds"], rows)]
    return "\n".join(lines) + "\n"


def main(args: argparse.Namespace) -> int:
    """``fpsim experiment training``: run (or ``--render``) and write ``OUT/training/``."""
    data = None
    if not args.render:
        torch.set_num_threads(args.threads)
        plan = QUICK if args.quick else PLANS[os.environ.get("FPSIM_TRAINING_PLAN", "full")]
        start, load = time.perf_counter(), os.getloadavg()[0]
        data = run(plan, args.device)
        data["meta"] = {"device": args.device, "cpus": os.cpu_count(), "threads": args.threads,
                        "load": [round(load, 1), round(os.getloadavg()[0], 1)],
                        "model": f"GPT-2 {MODEL.n_layer} layers, width {MODEL.n_embd}, "
                                 f"byte-level, {MODEL.n_positions} positions",
                        "config": MODEL.to_hf_dict(), "quick": args.quick,
                        "tokens": plan.steps * plan.batch * MODEL.n_positions,
                        **versions(), "seconds": round(time.perf_counter() - start, 1)}
    finish(NAME, args.out / NAME, data, render)
    return 0
