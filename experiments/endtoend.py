"""Run the whole model with a recipe at every site and compare it with the FP32 model.

Metrics over held-out windows: loss (nats/token) and perplexity against the true next token,
KL divergence KL(P_fp32 || P_recipe) of the next-token distribution (nats/token) and top-1
agreement with the FP32 model.  A recipe that produces NaN/inf logits anywhere gives NaN loss
and KL; ``finite`` says at which share of positions the logits were all finite, and
:class:`RecipeOps` records at which sites inf/NaN appeared.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from . import recipes
from .gpt2.model import GPT2
from .recipes import FP32, Recipe


class RecipeOps:
    """GPT-2 ``ops`` computing every site under a recipe (one for all, or per site name; default FP32).

    ``cache`` holds quantized weights; share one between ops of the same model only.
    ``nonfinite`` counts, per site, the outputs that were inf/NaN.
    """

    def __init__(self, recipe: Recipe | Mapping[str, Recipe], cache: dict | None = None) -> None:
        self.recipe = recipe
        self.cache = {} if cache is None else cache
        self.nonfinite: dict[str, int] = {}

    def _watch(self, name: str, y: Tensor) -> Tensor:
        bad = ~torch.isfinite(y)
        if name.endswith(".qk"):                     # the causal mask discards the upper triangle
            T = y.shape[-1]
            bad = bad & torch.ones(T, T, dtype=torch.bool, device=y.device).tril()
        bad = int(bad.sum())
        if bad:
            self.nonfinite[name] = self.nonfinite.get(name, 0) + bad
        return y

    def recipe_for(self, name: str) -> Recipe:
        return self.recipe.get(name, FP32) if isinstance(self.recipe, Mapping) else self.recipe

    def linear(self, name: str, x: Tensor, W: Tensor, b: Tensor | None) -> Tensor:
        return self._watch(name, recipes.linear(self.recipe_for(name), x, W, b, cache=self.cache))

    def matmul(self, name: str, a: Tensor, b: Tensor) -> Tensor:
        return self._watch(name, recipes.matmul(self.recipe_for(name), a, b))

    def layernorm(self, name: str, x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
        return self._watch(name, recipes.layernorm(self.recipe_for(name), x, weight, bias, eps))


@torch.no_grad()
def logits(model: GPT2, wins: Tensor, ops: object = None, batch_size: int = 8) -> list[Tensor]:
    """Logits of ``model`` on the inputs of windows ``[N, T+1]``, one tensor per batch."""
    return [model(chunk[:, :-1], ops=ops) for chunk in wins.split(batch_size)]


@torch.no_grad()
def compare(model: GPT2, wins: Tensor, ref: list[Tensor], ops: object = None,
            batch_size: int = 8) -> dict[str, float]:
    """Loss, perplexity, KL from the reference logits ``ref`` and top-1 agreement under ``ops``."""
    loss = kl = agree = finite = 0.0
    count = 0
    for chunk, r in zip(wins.split(batch_size), ref, strict=True):
        z = model(chunk[:, :-1], ops=ops).double().flatten(0, 1)
        r = r.double().flatten(0, 1)
        target = chunk[:, 1:].flatten()
        loss += F.cross_entropy(z, target, reduction="sum").item()
        logp, logq = F.log_softmax(r, -1), F.log_softmax(z, -1)
        kl += (logp.exp() * (logp - logq)).sum().item()
        agree += (z.argmax(-1) == r.argmax(-1)).sum().item()
        finite += torch.isfinite(z).all(-1).sum().item()
        count += target.numel()
    loss /= count
    return {"loss": loss, "ppl": math.exp(loss) if math.isfinite(loss) else math.nan,
            "kl": kl / count, "top1": agree / count, "finite": finite / count}
