"""Run the whole model with a recipe at every site and compare it with the FP32 reference.

Metrics over held-out windows: loss (nats/token) and perplexity against the true next token,
KL divergence KL(P_fp32 || P_recipe) of the next-token distribution (nats/token) and top-1
agreement with the FP32 model.  A recipe that produces NaN/inf logits anywhere gives NaN loss
and KL; ``finite`` says at which share of positions the logits were all finite, ``kl_finite``
is the KL over those positions only, and ``RecipeRun`` records at which sites inf/NaN
appeared and how many operand elements overflowed, saturated or flushed to zero at each site.
Every metric is also kept per window (``windows``) for the bootstrap of ``.bootstrap``.

The reference is the FP32 recipe (``fpsim_experiments.recipes``: dot products, LayerNorm and
softmax computed in FP64 and rounded once to FP32), so it gives the same bits on any thread
count and machine.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

import fpsim
from fpsim import Rule, Rules, get_format
from fpsim.emulation.sites import finite_below

from . import recipes
from .gpt2.model import GPT2, implementation, site_name, site_path
from .recipes import FP32, Recipe

EVENTS = ("elements", "overflow", "saturated", "flushed")
ATTENTION = ("eager", "causal")
OVERFLOWS_KEPT = 2000      # overflow locations kept per run (the events count every one)
OVERFLOWS_WHOLE = 40       # of those, stored whole by compact(); the rest counted by channel


def rules(recipe: Recipe | Mapping[str, Recipe], weights: Recipe | None = None) -> Rules:
    """The ``fpsim.Rules`` of a recipe at every site (LayerNorm statistics included), or of a
    recipe per site name (``fpsim_experiments.gpt2.model.site_names``; the others FP32).  The
    ``qk`` and ``av`` of one block are one module's matmuls: they take one recipe.
    ``weights``: the weight operand of every linear site not left FP32 cast as this recipe
    casts its inputs (``split``)."""
    if not isinstance(recipe, Mapping):
        linear = [] if weights is None or recipe is FP32 else \
            [Rule(split(recipe, weights), kind="linear")]
        return Rules([Rule(recipe, kind="norm"), *linear], default=recipe)
    by: dict[tuple[str, str], Recipe] = {}
    for name, r in recipe.items():
        where = site_path(name)
        if weights is not None and where[1] == "linear" and r is not FP32:
            r = split(r, weights)
        if by.setdefault(where, r) != r:
            raise ValueError(f"{name}: the qk and av sites of a block are one module's matmuls "
                             "and take the same recipe; give both the same one")
        if where[1] == "matmul":                  # the same products in a causal kernel
            by[where[0], "attention"] = r
    return Rules([Rule(r, path, kind) for (path, kind), r in by.items()]
                 + [Rule(FP32, kind="norm")], default=FP32)


def split(recipe: Recipe, weights: Recipe) -> Recipe:
    """``recipe`` with its weight operand cast as ``weights`` casts its inputs (each operand a
    ``fpsim.emulation.casts.Cast``: per-channel weights beside unscaled activations...)."""
    if not (recipe.flush and weights.flush) or recipe.accum != "fp32" or recipe.output:
        raise ValueError(f"{recipe.name} with weights {weights.name}: a weights recipe takes "
                         "flushing operands, FP32 sums and no output format")
    return Recipe(recipe.cast(recipe.inputs, -1), weights.cast(weights.inputs, -2),
                  name=recipe.name)


class RecipeRun:
    """GPT-2 forward passes under ``fpsim.emulate`` with a recipe at every site (one for all,
    or per site name: ``rules``), recording what the sites did through its ``watch``.  A
    recipe with delayed scaling keeps each site's amax history from batch to batch.

    ``nonfinite`` counts, per site, the outputs that were inf/NaN; ``events`` sums, per site,
    the operand elements (both operands, every call) and those that overflowed, saturated or
    flushed to zero; ``overflows`` lists, for every unscaled operand element that overflowed,
    its site, operand, window, index and value (at most ``OVERFLOWS_KEPT``; ``overflow`` in
    ``events`` counts all).  ``window0``: the index of the first window of the batch being run.
    """

    def __init__(self, recipe: Recipe | Mapping[str, Recipe],
                 weights: Recipe | None = None, attention: str = "eager") -> None:
        if attention not in ATTENTION:
            raise ValueError(f"attention {attention!r}: one of {ATTENTION}")
        self.recipe, self.weights, self.attention = recipe, weights, attention
        self.rules = rules(recipe, weights)
        self.nonfinite: dict[str, int] = {}
        self.events: dict[str, dict[str, int]] = {}
        self.overflows: list[dict] = []
        self.window0 = 0
        #: one context for every batch: delayed scaling's amax histories go on between them
        self.emulation = fpsim.emulate(self.rules, watch=self.watch)

    def __call__(self, model: GPT2, idx: Tensor) -> Tensor:
        """``model(idx)`` under the recipe."""
        kernel = "sdpa" if self.attention == "causal" else "eager"
        with implementation(model, kernel), self.emulation:
            return model(idx)

    def watch(self, site: str, kind: str, recipe: Recipe, operands: tuple, events: dict,
              y: Tensor) -> None:
        """Record one call of ``site`` (``fpsim.emulate``'s ``watch``)."""
        name = site_name(site)
        recipe = self.recipe_for(name)
        w = self.weights if kind == "linear" and self.weights is not None \
            and recipe is not FP32 else None
        self.record(name, y, events, ((operands[0], recipe, recipe.inputs),
                                      *[(b, recipe, recipe.weight_format) if w is None
                                        else (b, w, w.inputs) for b in operands[1:2]]))

    def recipe_for(self, name: str) -> Recipe:
        """The recipe of site ``name``."""
        return self.recipe.get(name, FP32) if isinstance(self.recipe, Mapping) else self.recipe

    def record(self, name: str, y: Tensor, events: dict, operands: tuple) -> Tensor:
        """Record one call of site ``name``: its result ``y``, its operands' ``events`` and,
        where they overflowed, the elements (``operands``: (tensor, recipe, format) each)."""
        bad = 0
        if y.numel() and not finite_below(y, math.inf):
            nonfinite = ~torch.isfinite(y)
            if name.endswith(".qk"):                 # the causal mask discards the upper triangle
                T = y.shape[-1]
                nonfinite = nonfinite & torch.ones(T, T, dtype=torch.bool, device=y.device).tril()
            bad = int(nonfinite.sum())
        if bad:
            self.nonfinite[name] = self.nonfinite.get(name, 0) + bad
        total = self.events.setdefault(name, dict.fromkeys(EVENTS, 0))
        for role in ("a", "b"):
            for key in EVENTS:
                total[key] += events.get(role, {}).get(key, 0)
        for role, (x, recipe, fmt) in zip(("a", "b"), operands):
            if events.get(role, {}).get("overflow"):
                self._where(name, role, x, recipe, fmt)
        return y

    def _where(self, name: str, role: str, x: Tensor, recipe: Recipe, fmt: Any) -> None:
        """Record the elements of operand ``x`` that overflowed (unscaled, not saturating)."""
        if fmt is None or recipe.scaling != "none" or recipe.saturate:
            return
        over = torch.isfinite(x) & (x.abs() >= recipes.rounding_limit(get_format(fmt)))
        for idx in over.nonzero().tolist()[: max(0, OVERFLOWS_KEPT - len(self.overflows))]:
            self.overflows.append({"site": name, "operand": role, "window": self.window0 + idx[0],
                                   "index": idx[1:], "value": float(x[tuple(idx)])})


@torch.no_grad()
def logits(model: GPT2, wins: Tensor, run: RecipeRun | None = None, batch_size: int = 8) -> list[Tensor]:
    """Logits of ``model`` on the inputs of windows ``[N, T+1]``, one tensor per batch.

    ``run`` defaults to the deterministic FP32 reference (``RecipeRun`` of FP32).
    """
    run = RecipeRun(FP32) if run is None else run
    return [run(model, chunk[:, :-1]) for chunk in wins.split(batch_size)]


def _per_window(z: Tensor, r: Tensor, target: Tensor) -> dict[str, Tensor]:
    """Sums per window ``[B]`` of loss, KL, top-1 agreement, finite positions and finite KL."""
    z, r = z.double(), r.double()
    loss = F.cross_entropy(z.flatten(0, 1), target.flatten(), reduction="none").view(target.shape)
    logp, logq = F.log_softmax(r, -1), F.log_softmax(z, -1)
    kl = (logp.exp() * (logp - logq)).sum(-1)
    finite = torch.isfinite(z).all(-1)
    return {"loss": loss.sum(-1), "kl": kl.sum(-1), "top1": (z.argmax(-1) == r.argmax(-1)).sum(-1),
            "finite": finite.sum(-1), "kl_finite": torch.where(finite, kl, 0.0).sum(-1)}


@torch.no_grad()
def compare(model: GPT2, wins: Tensor, ref: list[Tensor], run: RecipeRun | None = None,
            batch_size: int = 8) -> dict:
    """Loss, perplexity, KL from the reference logits ``ref`` and top-1 agreement under ``run``
    (default: plain torch; ``compare_logits`` of ``model``'s logits on each batch)."""
    def outputs() -> Iterable[Tensor]:
        for i, chunk in enumerate(wins.split(batch_size)):
            if run is None:
                yield model(chunk[:, :-1])
                continue
            run.window0 = i * batch_size
            yield run(model, chunk[:, :-1])

    return compare_logits(wins, ref, outputs(), batch_size)


@torch.no_grad()
def compare_logits(wins: Tensor, ref: list[Tensor], outputs: Iterable[Tensor],
                   batch_size: int = 8) -> dict:
    """Loss, perplexity, KL from the reference logits ``ref`` and top-1 agreement of the logits
    ``outputs`` (one tensor per batch of ``batch_size`` windows of ``wins``, any model).

    Means over all positions, plus ``windows``: each metric's per-window sum (``positions``
    per window) for the bootstrap.  ``kl_finite`` is KL over the positions whose logits are
    all finite (NaN when there is none).
    """
    parts: dict[str, list[float]] = {}
    for chunk, r, z in zip(wins.split(batch_size), ref, outputs, strict=True):
        for key, v in _per_window(z, r, chunk[:, 1:]).items():
            parts.setdefault(key, []).extend(float(x) for x in v.tolist())
    return means({"positions": wins.shape[1] - 1, **parts})


def means(windows: dict) -> dict:
    """The metrics of ``compare_logits`` from per-window sums (``positions`` per window,
    then one list per metric), summed exactly (``math.fsum``): windows split into shards and
    joined in order give the bits of one pass over all of them."""
    count = windows["positions"] * len(windows["loss"])
    total = {k: math.fsum(v) for k, v in windows.items() if k != "positions"}
    loss = total["loss"] / count
    return {"loss": loss, "ppl": math.exp(loss) if math.isfinite(loss) else math.nan,
            "kl": total["kl"] / count, "top1": total["top1"] / count,
            "finite": total["finite"] / count,
            "kl_finite": total["kl_finite"] / total["finite"] if total["finite"] else math.nan,
            "windows": windows}


def compact(overflows: list[dict] | dict) -> dict:
    """The overflow record of a run as stored: every recorded element counted by (site,
    operand, last index: the channel of a [window, position, channel] operand) and by window,
    and the first ``OVERFLOWS_WHOLE`` elements whole (a run that overflows everywhere would
    otherwise store thousands)."""
    if isinstance(overflows, dict):
        return overflows
    by: dict[str, int] = {}
    for o in overflows:
        key = f"{o['site']}|{o['operand']}|{o['index'][-1]}"
        by[key] = by.get(key, 0) + 1
    return {"recorded": len(overflows), "by_channel": by,
            "windows": sorted({o["window"] for o in overflows}),
            "first": overflows[:OVERFLOWS_WHOLE]}
