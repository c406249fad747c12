"""Experiment ``training``: does FP16 training fail where BF16 does not, and is it range?

One initialisation of a small byte-level GPT-2 is trained on the pydoc text for a fixed number
of steps under each recipe, with several seeds (a seed draws the batches; the same seed gives
the same batches under every recipe, so recipes are compared seed by seed).  Mixed precision is
emulated with :mod:`fpsim.nn`: at every matrix product (the linear layers, Q·Kᵀ, P·V and the
tied LM head) the inputs (activations and weights) are rounded to the forward format, the
product is exact-then-FP32, and in the backward pass the gradient arriving at the product's
output, the gradients it sends to its inputs (activation gradients) and the weight gradients
are rounded to the gradient format.  LayerNorm, softmax, GELU, residual adds, the loss, the
FP32 master weights and AdamW's state stay FP32.  FP8 recipes scale each tensor by a power of
two chosen from its absolute maximum (now: ``current``; the largest of the previous 16 steps:
``delayed``, scale 1 before any history, as Transformer Engine) and saturate, as Transformer
Engine's casts do.  Loss scaling follows :class:`fpsim.nn.LossScaler` (torch.amp.GradScaler's
rules).  At a few steps every gradient about to be rounded is counted against each format's
range: the share that rounds to zero (lost), that lands in the subnormal range, or exceeds the
largest finite value.

Usage: ``fpsim experiment training [--quick] [--device cpu|cuda] [--out results] [--render]``.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

import fpsim
from fpsim.formats import get_format
from fpsim.nn import LossScaler, round_through

from .gpt2.data import heldout_bytes, random_windows, train_bytes, windows
from .gpt2.model import GPT2, GPT2Config
from .gpt2.ops import TorchOps, forward
from .gpt2.train_tiny import learning_rate, make_optimizer
from .report import figure, finish, num, pct, save, table, versions

NAME = "training"
MODEL = GPT2Config(n_layer=2, n_head=2, n_embd=64, n_positions=64, vocab_size=256)
INIT_SEED = 1234
FORMATS = ("fp16", "bf16", "e4m3", "e5m2")     # the windows drawn and counted against
CLASSES = ("activation", "weight")              # gradient tensor classes
HISTORY = 16                                    # delayed scaling: steps of amax history
BINS = np.arange(-80, 33)                       # log2 |g| histogram edges
BOOTSTRAP = 10_000
TOLERANCE = 0.01                                # nats/byte: a gap below this is "as FP32"


@dataclass(frozen=True)
class Plan:
    """How long and how much: steps, seeds, batch and the steps whose gradients are counted."""

    steps: int
    seeds: int
    batch: int
    lr: float = 3e-3
    warmup: int = 20
    heldout_windows: int = 64

    @property
    def record_steps(self) -> list[int]:
        return sorted({0, self.steps // 2, self.steps - 1})


FULL = Plan(steps=150, seeds=3, batch=8)
QUICK = Plan(steps=20, seeds=3, batch=8, heldout_windows=16)


@dataclass(frozen=True)
class Recipe:
    """Formats of the forward inputs and of the gradients, per-tensor scaling and loss scaling."""

    name: str
    forward: str | None = None
    grad: str | None = None
    scaling: str | None = None      # None, "current" or "delayed" (per tensor, power of two)
    loss_scale: str | None = None   # None, "static" or "dynamic"
    saturate: bool = False
    accumulate: int = 1             # micro-batches per step the loss is divided by (see MICRO)


STATIC_SCALE = 2.0 ** 10
#: GPT-2 trained on 512 x 1024 = 2^19 tokens per step; with our 2^9-token micro-batches that is
#: 2^10 micro-batches, and gradient accumulation divides each one's loss by their number.  The
#: "GPT-2 batch" recipes do that to one micro-batch and multiply the FP32 gradients back (exact:
#: a power of two), so the optimizer sees the same update and only the rounded magnitudes change.
MICRO = 2 ** 10
DYNAMIC = {"init_scale": 2.0 ** 16, "growth_factor": 2.0, "backoff_factor": 0.5,
           "growth_interval": 50}
RECIPES = (
    Recipe("fp32"),
    Recipe("bf16", "bf16", "bf16"),
    Recipe("fp16", "fp16", "fp16"),
    Recipe("fp16 static loss scale", "fp16", "fp16", loss_scale="static"),
    Recipe("fp16 dynamic loss scale", "fp16", "fp16", loss_scale="dynamic"),
    Recipe("fp8 current scaling", "e4m3", "e5m2", "current", saturate=True),
    Recipe("fp8 delayed scaling", "e4m3", "e5m2", "delayed", saturate=True),
    Recipe("fp8 e4m3 gradients", "e4m3", "e4m3", "current", saturate=True),
    Recipe("bf16, GPT-2 batch", "bf16", "bf16", accumulate=MICRO),
    Recipe("fp16, GPT-2 batch", "fp16", "fp16", accumulate=MICRO),
    Recipe("fp16 dynamic loss scale, GPT-2 batch", "fp16", "fp16", loss_scale="dynamic",
           accumulate=MICRO),
)


class Recorder:
    """Per gradient class: log2 histogram of |g| and, per format, the lost/subnormal/overflow
    counts of the values about to be rounded (in the units they are rounded in)."""

    def __init__(self) -> None:
        self.on = False
        self.stats: dict[str, dict[str, Any]] = {}

    def add(self, cls: str, t: Tensor) -> None:
        if not self.on:
            return
        a = t.detach().abs().double().flatten()
        s = self.stats.setdefault(cls, {"count": 0, "zero": 0, "nonfinite": 0,
                                        "hist": np.zeros(len(BINS) - 1, dtype=np.int64),
                                        **{f: {"lost": 0, "subnormal": 0, "over": 0}
                                           for f in FORMATS}})
        finite = a[torch.isfinite(a)]
        nz = finite[finite > 0]
        s["count"] += a.numel()
        s["zero"] += int((finite == 0).sum())
        s["nonfinite"] += a.numel() - finite.numel()
        s["hist"] += np.histogram(np.log2(nz.cpu().numpy()), BINS)[0]
        for name in FORMATS:
            f = get_format(name)
            c = s[name]
            c["lost"] += int((nz <= f.min_subnormal / 2).sum())
            c["subnormal"] += int(((nz > f.min_subnormal / 2) & (nz < f.min_normal)).sum())
            c["over"] += int((nz > f.max).sum()) + a.numel() - finite.numel()

    def take(self) -> dict[str, Any]:
        out = {k: {**v, "hist": v["hist"].tolist()} for k, v in self.stats.items()}
        self.stats = {}
        return out


class Cast:
    """One tensor's rounding under a recipe: optional power-of-two per-tensor scaling."""

    def __init__(self, fmt: str | None, recipe: Recipe, cls: str | None, rec: Recorder,
                 backend: str = "auto") -> None:
        self.fmt = None if fmt is None else get_format(fmt)
        self.recipe, self.cls, self.rec, self.backend = recipe, cls, rec, backend
        self.history: list[float] = []

    def _scale(self, t: Tensor) -> float:
        amax = float(t.detach().abs().max()) if t.numel() else 0.0
        if self.recipe.scaling == "current":
            ref = amax
        else:
            ref = max(self.history, default=0.0)
            self.history = (self.history + [amax])[-HISTORY:]
        if not (math.isfinite(ref) and ref > 0):
            return 1.0
        e = math.floor(math.log2(self.fmt.max / ref))
        e -= ref * 2.0 ** e > self.fmt.max
        return 2.0 ** max(-126, min(126, e))

    def __call__(self, t: Tensor) -> Tensor:
        s = 1.0 if self.fmt is None or self.recipe.scaling is None else self._scale(t)
        v = t * s if s != 1.0 else t
        if self.cls is not None:
            self.rec.add(self.cls, v)
        if self.fmt is None:
            return v
        out = fpsim.quantize(v, self.fmt, saturate=self.recipe.saturate, backend=self.backend)
        return out / s if s != 1.0 else out


class TrainOps(TorchOps):
    """The model's matrix products with the recipe's forward and backward rounding."""

    def __init__(self, recipe: Recipe, rec: Recorder, backend: str = "auto") -> None:
        self.recipe, self.rec, self.backend = recipe, rec, backend
        self.casts: dict[tuple[str, str], Cast] = {}

    def cast(self, name: str, role: str) -> Cast:
        key = (name, role)
        if key not in self.casts:
            fwd = role in ("x", "w", "a", "b")
            cls = None if fwd else ("weight" if role == "dw" else "activation")
            fmt = self.recipe.forward if fwd else self.recipe.grad
            self.casts[key] = Cast(fmt, self.recipe, cls, self.rec, self.backend)
        return self.casts[key]

    def _operand(self, name: str, t: Tensor, role: str) -> Tensor:
        fwd = self.cast(name, role)
        return round_through(t, fwd if fwd.fmt else None, self.cast(name, f"d{role}"))

    def linear(self, name: str, x: Tensor, W: Tensor, b: Tensor | None) -> Tensor:
        y = super().linear(name, self._operand(name, x, "x"), self._operand(name, W, "w"), b)
        return round_through(y, None, self.cast(name, "dy"))

    def matmul(self, name: str, a: Tensor, b: Tensor) -> Tensor:
        y = super().matmul(name, self._operand(name, a, "a"), self._operand(name, b, "b"))
        return round_through(y, None, self.cast(name, "dy"))


def _scaler(recipe: Recipe) -> LossScaler | None:
    if recipe.loss_scale == "static":
        return LossScaler(init_scale=STATIC_SCALE, dynamic=False)
    if recipe.loss_scale == "dynamic":
        return LossScaler(**DYNAMIC)
    return None


def train_one(recipe: Recipe, seed: int, plan: Plan, init: dict, data: Tensor, held: Tensor,
              backend: str = "auto", config: GPT2Config = MODEL) -> dict[str, Any]:
    """Train from ``init`` under ``recipe`` with batches drawn by ``seed``; the run's record.

    Runs on ``held``'s device; ``backend`` is :func:`fpsim.quantize`'s (``auto``: NumPy tables
    for CPU tensors, the Triton kernels for CUDA tensors; bit-identical).
    """
    device = held.device
    model = GPT2(config).to(device)
    model.load_state_dict(init)
    args = argparse.Namespace(lr=plan.lr, min_lr=plan.lr / 10, warmup_steps=plan.warmup,
                              weight_decay=0.1)
    opt, scaler = make_optimizer(model, args), _scaler(recipe)
    rec = Recorder()
    ops = TrainOps(recipe, rec, backend)
    gen = torch.Generator().manual_seed(seed)
    losses, scales, grads, nonfinite = [], [], {}, 0
    for step in range(plan.steps):
        for g in opt.param_groups:
            g["lr"] = learning_rate(args, step, step / plan.steps)
        batch = random_windows(data, config.n_positions, plan.batch, gen).to(device)
        rec.on = step in plan.record_steps
        logits = forward(model, batch[:, :-1], ops)
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        part = loss / recipe.accumulate
        (part if scaler is None else scaler.scale(part)).backward()
        if rec.on:
            grads[step] = rec.take()
            rec.on = False
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
    return {"seed": seed, "loss": losses, "heldout_loss": final, "nonfinite_steps": nonfinite,
            "skipped": scaler.skipped if scaler else 0, "scale": scales, "grads": grads}


def run(plan: Plan, device: str = "cpu") -> dict[str, Any]:
    """Every recipe, every seed, from one initialisation, on ``device``."""
    torch.manual_seed(INIT_SEED)
    init = GPT2(MODEL).state_dict()
    data = train_bytes()
    held = windows(heldout_bytes(), MODEL.n_positions, plan.heldout_windows).to(device)
    with torch.no_grad():
        m = GPT2(MODEL).to(device)
        m.load_state_dict(init)
        init_loss = F.cross_entropy(m(held[:, :-1]).flatten(0, 1), held[:, 1:].flatten()).item()
    runs = []
    for r in RECIPES:
        start = time.perf_counter()
        seeds = [train_one(r, s, plan, init, data, held) for s in range(plan.seeds)]
        runs.append({"recipe": asdict(r), "seeds": seeds,
                     "seconds": round(time.perf_counter() - start, 1)})
        print(f"{NAME}: {r.name}: held-out "
              f"{[num(s['heldout_loss'], 4) for s in seeds]} ({runs[-1]['seconds']} s)", flush=True)
    return {"plan": {**asdict(plan), "record_steps": plan.record_steps}, "runs": runs,
            "initial_heldout_loss": init_loss, "static_scale": STATIC_SCALE, "dynamic": DYNAMIC,
            "formats": {f: {"max": get_format(f).max, "min_subnormal": get_format(f).min_subnormal,
                            "min_normal": get_format(f).min_normal} for f in FORMATS},
            "bins": BINS.tolist()}


# ----------------------------------------------------------------------------------------------
# Analysis
# ----------------------------------------------------------------------------------------------
def bootstrap_ci(values: list[float], seed: int = 0) -> tuple[float, float, float]:
    """Mean and 95% percentile-bootstrap interval of the mean (resampling seeds, seeded)."""
    v = np.asarray(values, dtype=float)
    if not np.isfinite(v).all():
        return math.nan, math.nan, math.nan
    idx = np.random.default_rng(seed).integers(0, len(v), (BOOTSTRAP, len(v)))
    means = v[idx].mean(axis=1)
    return float(v.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def shares(run: dict, fmt: str, cls: str) -> dict[str, float]:
    """Share of the nonzero gradients of class ``cls`` (all seeds, all counted steps) that are
    lost / subnormal / over the maximum of ``fmt``, as the recipe was about to round them."""
    tot = {"lost": 0, "subnormal": 0, "over": 0, "nonzero": 0}
    for s in run["seeds"]:
        for step in s["grads"].values():
            c = step[cls]
            tot["nonzero"] += c["count"] - c["zero"]
            for k in ("lost", "subnormal", "over"):
                tot[k] += c[fmt][k]
    n = max(tot["nonzero"], 1)
    return {k: tot[k] / n for k in ("lost", "subnormal", "over")}


def verdict(data: dict, run: dict) -> dict[str, Any]:
    """Held-out loss gap to FP32 (paired by seed) with its CI, what happened, the likely cause."""
    ref = {s["seed"]: s["heldout_loss"] for s in data["runs"][0]["seeds"]}
    gaps = [s["heldout_loss"] - ref[s["seed"]] for s in run["seeds"]]
    mean, lo, hi = bootstrap_ci(gaps)
    drop = data["initial_heldout_loss"] - float(np.mean(list(ref.values())))
    rec = run["recipe"]
    bad = sum(s["nonfinite_steps"] for s in run["seeds"])
    skipped = sum(s["skipped"] for s in run["seeds"])
    diverged = not all(math.isfinite(s["heldout_loss"]) for s in run["seeds"])
    if diverged or mean > 0.5 * drop:
        state = "diverged" if diverged else "stalled"
    elif lo > 0 and mean > TOLERANCE:
        state = "worse than FP32"
    else:
        state = "as FP32"
    cause = "-"
    if rec["grad"] and state != "as FP32":
        act = shares(run, _fmt_name(rec["grad"]), "activation")
        wgt = shares(run, _fmt_name(rec["grad"]), "weight")
        if bad or skipped or max(act["over"], wgt["over"]) > 1e-4:
            cause = "overflow"
        elif max(act["lost"], wgt["lost"]) > 0.01:
            cause = "underflow"
        else:
            cause = "rounding"
    return {"gap": mean, "lo": lo, "hi": hi, "state": state, "cause": cause,
            "nonfinite_steps": bad, "skipped": skipped, "drop": drop}


def _fmt_name(fmt: str) -> str:
    return next(f for f in FORMATS if get_format(f) == get_format(fmt))


def headline(data: dict) -> str | None:
    """Does FP16 fail where BF16 does not, and is it range?  (None without the recipes to tell.)"""
    runs = {r["recipe"]["name"]: r for r in data["runs"]}
    names = ("fp16, GPT-2 batch", "bf16, GPT-2 batch", "fp16 dynamic loss scale, GPT-2 batch",
             "fp16")
    if not all(n in runs for n in names):
        return None
    v = {n: verdict(data, runs[n]) for n in names}

    def gap(n: str) -> str:
        return f"{num(v[n]['gap'])} [{num(v[n]['lo'])}, {num(v[n]['hi'])}]"

    lost = shares(runs[names[0]], "fp16", "activation")["lost"]
    range_fails = (v[names[0]]["state"] != "as FP32" and v[names[0]]["cause"] == "underflow"
                   and v[names[1]]["state"] == v[names[2]]["state"] == "as FP32")
    return (f"With GPT-2's 2^19-token batch (each 2^9-token micro-batch's loss divided by 2^10), "
            f"FP16 without loss scaling ends {gap(names[0])} nats/byte above FP32 on held-out "
            f"text (mean [95% CI] over seeds; {v[names[0]]['state']}, cause: "
            f"{v[names[0]]['cause']}: {pct(lost)} of its activation gradients rounded to zero). "
            f"BF16, with 3 fewer mantissa bits, ends {gap(names[1])} ({v[names[1]]['state']}) and "
            f"FP16 with dynamic loss scaling {gap(names[2])} ({v[names[2]]['state']}): "
            + ("FP16 fails for range (underflow), not precision. " if range_fails else
               "these runs do not show FP16 failing for range alone. ")
            + f"At this model's own 2^9-token batch FP16 without scaling ends {gap(names[3])} "
            f"({v[names[3]]['state']}).")


def conclusions(data: dict) -> list[str]:
    """Which recipes stall or diverge, and why, with CIs over seeds."""
    n = data["plan"]["seeds"]
    out = [h for h in (headline(data),) if h]
    for run in data["runs"][1:]:
        v = verdict(data, run)
        r = run["recipe"]
        line = (f"{r['name']}: held-out loss {num(v['gap'])} nats/byte from FP32 (95% bootstrap CI "
                f"{num(v['lo'])} to {num(v['hi'])} over {n} seeds): {v['state']}")
        if r["grad"]:
            g = _fmt_name(r["grad"])
            act, wgt = shares(run, g, "activation"), shares(run, g, "weight")
            line += (f"; of the activation gradients as rounded, {pct(act['lost'])} were lost to "
                     f"underflow in {g.upper()}, {pct(act['subnormal'])} subnormal, "
                     f"{pct(act['over'])} over its maximum (weight gradients {pct(wgt['lost'])}, "
                     f"{pct(wgt['subnormal'])}, {pct(wgt['over'])})")
        if v["nonfinite_steps"] or v["skipped"]:
            line += (f"; {v['nonfinite_steps']} steps had inf/NaN gradients, "
                     f"{v['skipped']} were skipped")
        if v["cause"] != "-":
            line += f". Cause: {v['cause']}"
        out.append(line + ".")
    ref = {s["seed"]: s["heldout_loss"] for s in data["runs"][0]["seeds"]}
    same = [abs(s["heldout_loss"] - ref[s["seed"]]) for run in data["runs"][1:]
            if verdict(data, run)["state"] == "as FP32" for s in run["seeds"]]
    if same:
        out.append(f"Runs judged as FP32 still differ from it by up to {num(max(same))} nats/byte "
                   f"for one seed, in both directions: once rounding differs the trajectories "
                   f"drift apart, so {n} seeds resolve only gaps well above that.")
    fp32 = shares(data["runs"][0], "fp16", "activation")
    out.append(f"In FP32 training, {pct(fp32['lost'])} of the nonzero activation gradients lie "
               f"below half of FP16's smallest subnormal (they would round to zero in FP16 without "
               f"loss scaling) and {pct(fp32['subnormal'])} in FP16's subnormal range; in BF16 "
               f"{pct(shares(data['runs'][0], 'bf16', 'activation')['lost'])} would be lost.")
    return out


# ----------------------------------------------------------------------------------------------
# Figures and report
# ----------------------------------------------------------------------------------------------
def _style(name: str) -> str:
    return "--" if name.startswith("fp8") else (":" if "GPT-2" in name else "-")


def _curves(data: dict, out: Path) -> str:
    fig, axes = figure(1, 3, width=5.5, height=4.5)
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
    ax.set_ylabel("training loss, nats/byte (mean, band: min-max over seeds)")
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


def _windows(data: dict, out: Path) -> str:
    fp32 = data["runs"][0]
    steps = data["plan"]["record_steps"]
    fig, axes = figure(1, 2, width=6.5, height=4.5)
    edges = np.array(data["bins"])
    colors = {"fp16": "tab:red", "bf16": "tab:blue", "e4m3": "tab:green", "e5m2": "tab:purple"}
    for ax, cls in zip(axes[0], CLASSES):
        for step, ls in zip((steps[0], steps[-1]), ("-", "--")):
            h = np.sum([s["grads"][str(step)][cls]["hist"] if str(step) in s["grads"]
                        else s["grads"][step][cls]["hist"] for s in fp32["seeds"]], axis=0)
            ax.stairs(h / max(h.sum(), 1), edges, ls=ls, color="black", label=f"step {step}")
        shift = math.log2(MICRO)                    # the GPT-2 batch divides every gradient
        ax.stairs(h / max(h.sum(), 1), edges - shift, ls=":", color="gray",
                  label=f"step {step} ÷ 2^{shift:.0f} (GPT-2 batch)")
        top = ax.get_ylim()[1]
        for i, (name, f) in enumerate(data["formats"].items()):
            y = top * (1.02 + 0.05 * i)
            lo, mid, hi = (math.log2(f[k]) for k in ("min_subnormal", "min_normal", "max"))
            ax.plot([lo, mid], [y, y], color=colors[name], lw=2, alpha=0.4)
            ax.plot([mid, hi], [y, y], color=colors[name], lw=4, label=f"{name.upper()} range")
        ax.set_xlim(-55, 20)
        ax.set_xlabel("log2 |gradient| (FP32 training)")
        ax.set_ylabel("share of nonzero values")
        ax.set_title(f"{cls} gradients; bars: normal (thin: subnormal) range", fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    return save(fig, out / "gradient_windows.png")


def render(data: dict, out: Path) -> str:
    """Figures and the Markdown report from ``results.json``."""
    meta, plan = data["meta"], data["plan"]
    curves, wins = _curves(data, out), _windows(data, out)
    rows = []
    for run in data["runs"]:
        r, v = run["recipe"], verdict(data, run)
        finals = [s["heldout_loss"] for s in run["seeds"]]
        g = _fmt_name(r["grad"]) if r["grad"] else None
        act = shares(run, g, "activation") if g else None
        rows.append([r["name"], r["forward"] or "fp32", r["grad"] or "fp32",
                     r["scaling"] or r["loss_scale"] or "-", num(float(np.mean(finals)), 4),
                     f"{num(v['gap'])} [{num(v['lo'])}, {num(v['hi'])}]", v["state"], v["cause"],
                     v["skipped"], v["nonfinite_steps"],
                     pct(act["lost"]) if act else "-", pct(act["over"]) if act else "-"])
    fmt_rows = [[f.upper(), *(pct(shares(data["runs"][0], f, c)[k]) for c in CLASSES
                              for k in ("lost", "subnormal", "over"))] for f in FORMATS]
    lines = [f"# Training under emulated formats ({meta['model']})", "",
             f"{plan['steps']} AdamW steps of {plan['batch']}×{MODEL.n_positions} bytes (lr "
             f"{plan['lr']}, {plan['warmup']} warm-up steps, cosine decay, gradient clipping at "
             "1), "
             f"{plan['seeds']} seeds per recipe from one initialisation (held-out loss at "
             f"initialisation {num(data['initial_heldout_loss'], 4)} nats/byte). Held-out loss: "
             f"{plan['heldout_windows']} windows of unseen text, evaluated in FP32 with the master "
             f"weights. Gap: paired by seed against FP32, mean and 95% percentile bootstrap CI "
             f"({BOOTSTRAP} resamples of the seeds, rng seed 0; with {plan['seeds']} seeds the "
             "interval is coarse). Static loss scale "
             f"{num(data['static_scale'])}; dynamic: {data['dynamic']}. "
             f"Gradients counted at steps {plan['record_steps']}. {meta['seconds']} s.", "",
             "Verdicts: diverged (non-finite held-out loss), stalled (gap over half of FP32's loss "
             "decrease), worse than FP32 (CI above 0 and mean gap over "
             f"{TOLERANCE} nats/byte), else as FP32. Cause (for the others): "
             "overflow if any step had inf/NaN gradients or more than 0.01% of gradients exceeded "
             "the format's maximum, underflow if more than 1% rounded to zero, else rounding.", "",
             "## Conclusions", ""]
    lines += [f"- {c}" for c in conclusions(data)]
    lines += ["", f"![loss curves]({curves})", "", f"![gradient windows]({wins})", "",
              table(["recipe", "forward", "gradients", "scaling", "held-out loss",
                     "gap to FP32 [95% CI]", "verdict", "cause", "skipped steps",
                     "inf/NaN gradient steps", "activation grads lost",
                     "activation grads over max"],
                    rows), "",
              "FP32 training's gradients against each format (all counted steps and seeds; shares "
              "of nonzero values):", "",
              table(["format", "activation: lost", "activation: subnormal", "activation: over max",
                     "weight: lost", "weight: subnormal", "weight: over max"], fmt_rows)]
    return "\n".join(lines) + "\n"


def main(args: argparse.Namespace) -> int:
    """``fpsim experiment training``: run (or ``--render``) and write ``OUT/training/``."""
    data = None
    if not args.render:
        torch.set_num_threads(args.threads)
        plan = QUICK if args.quick else FULL
        start = time.perf_counter()
        data = run(plan, args.device)
        data["meta"] = {"device": args.device,
                        "model": f"GPT-2 {MODEL.n_layer} layers, width {MODEL.n_embd}, "
                                 f"byte-level, {MODEL.n_positions} positions",
                        "config": MODEL.to_hf_dict(), "quick": args.quick,
                        "tokens": plan.steps * plan.batch * MODEL.n_positions,
                        **versions(), "seconds": round(time.perf_counter() - start, 1)}
    finish(NAME, args.out / NAME, data, render)
    return 0
