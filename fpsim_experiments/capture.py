"""Capture the operands of every dot-product site of one GPT-2 forward pass.

The forward pass runs under ``fpsim.emulate`` with the deterministic FP32 (or FP64) reference
recipe at every site (``fpsim_experiments.endtoend.rules``: dot products, LayerNorm and softmax
in FP64, rounded once), and the context's ``watch`` records each site's operands and result
under the experiments' site names (``fpsim_experiments.gpt2.model.site_name``), so the captured
operands are what the reference network feeds that site, bit for bit on any machine.
LayerNorm sites record their input; their dot products are the row sum and the sum of squares
(``fpsim_experiments.recipes.layernorm_stats``).

``stream`` hands each site to a callback the moment the forward pass has computed it and
keeps none, so a consumer that uses a site and drops it holds one site's operands at a time
(plus the forward pass's own activations of the current block): memory does not grow with the
number of layers.  ``capture`` keeps them all (tests and small models).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

import fpsim

from .endtoend import rules
from .gpt2.model import GPT2, site_kind, site_name
from .recipes import FP32, FP64, Recipe, layernorm_stats

NATIVE: dict[torch.dtype, Recipe] = {torch.float32: FP32, torch.float64: FP64}


@dataclass(frozen=True)
class Site:
    """One site's captured operands and result.

    ``linear``: ``a @ b + bias`` with ``b`` the ``[in, out]`` weight.  ``matmul``: batched
    ``a @ b``.  ``layernorm``: ``a`` is the input, ``output`` its per-row sum of squares about
    the mean.  ``mask`` (broadcasting against ``output``) marks the outputs the model uses:
    the causal part of ``Q.K^T``; None means all.
    """

    name: str
    kind: str
    a: Tensor
    output: Tensor
    b: Tensor | None = None
    bias: Tensor | None = None
    mask: Tensor | None = None

    @property
    def reduction(self) -> int:
        """Length of the dot products (K)."""
        return self.a.shape[-1]

    def to(self, dtype: torch.dtype) -> "Site":
        """The same site with floating-point tensors in ``dtype`` (the mask stays boolean)."""

        def cast(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(dtype)

        return dataclasses.replace(
            self, a=cast(self.a), output=cast(self.output), b=cast(self.b), bias=cast(self.bias)
        )

    def subsample(self, rows: int, cols: int, gen: torch.Generator) -> "Site":
        """A smaller site: at most ``rows`` rows of ``a`` and ``cols`` columns of ``b``.

        Batched products keep at most two batch entries.  Picks are random and sorted, so a
        causal mask stays causal.  For cheap emulation of slow accumulators.  ``gen`` is a CPU
        generator: the picks are the same whatever device the site lives on.
        """

        def pick(n: int, k: int) -> Tensor:
            return torch.randperm(n, generator=gen)[:k].sort().values.to(self.a.device)

        if self.kind == "layernorm":
            a = self.a.reshape(-1, self.reduction)
            r = pick(a.shape[0], rows)
            return dataclasses.replace(self, a=a[r], output=self.output.reshape(-1)[r])
        if self.kind == "linear":
            a = self.a.reshape(-1, self.reduction)
            r, c = pick(a.shape[0], rows), pick(self.b.shape[1], cols)
            out = self.output.reshape(-1, self.b.shape[1])
            bias = None if self.bias is None else self.bias[c]
            return dataclasses.replace(self, a=a[r], b=self.b[:, c], bias=bias, output=out[r][:, c])
        M, N = self.a.shape[-2], self.b.shape[-1]
        a = self.a.reshape(-1, M, self.reduction)
        b = self.b.reshape(-1, self.reduction, N)
        out = self.output.reshape(-1, M, N)
        g = pick(a.shape[0], 2)
        r, c = pick(M, max(1, rows // len(g))), pick(N, cols)
        mask = None if self.mask is None else self.mask[r][:, c]
        return dataclasses.replace(
            self, a=a[g][:, r], b=b[g][:, :, c], output=out[g][:, r][:, :, c], mask=mask
        )


class _Recorder:
    """``fpsim.emulate``'s ``watch`` that hands each site of one forward pass to ``sink`` as a
    ``Site`` (in forward order) and keeps none.

    ``sink`` runs inside the forward pass's interception handler, where torch's function-mode
    stack is suspended: its own torch calls are plain torch, not model sites.
    """

    def __init__(self, sink: Callable[[Site], None]) -> None:
        self.sink = sink
        self.seen: set[str] = set()

    def __call__(self, site: str, kind: str, recipe: Recipe, operands: tuple, events: dict,
                 y: Tensor) -> None:
        name = site_name(site)
        if name in self.seen:
            raise ValueError(f"site {name!r} ({site}) seen twice: a capture keeps one call of "
                             "each site, of one forward pass")
        self.seen.add(name)
        a, *rest = (t.detach() for t in operands)
        kind = site_kind(name)
        if kind == "layernorm":
            self.sink(Site(name, kind, a, layernorm_stats(recipe, a)[1]))
            return
        mask = None
        if name.endswith(".qk"):
            mask = torch.ones(y.shape[-2], y.shape[-1], dtype=torch.bool, device=y.device).tril()
        b, bias = rest if len(rest) == 2 else (rest[0], None)
        self.sink(Site(name, kind, a, y.detach(), b, bias, mask))


@torch.no_grad()
def stream(model: GPT2, idx: Tensor, sink: Callable[[Site], None]) -> Tensor:
    """Run ``model(idx)`` (in the model's dtype), calling ``sink`` on each site as soon as it is
    computed, in forward order; returns the logits.  Nothing here keeps a site: what ``sink``
    drops is freed before the next one."""
    native = NATIVE[model.transformer.wte.weight.dtype]
    with fpsim.emulate(rules(native), watch=_Recorder(sink)):
        return model(idx)


def capture(model: GPT2, idx: Tensor) -> tuple[dict[str, Site], Tensor]:
    """Every site of ``model(idx)`` (in the model's dtype), all held at once, and the logits."""
    sites: dict[str, Site] = {}
    logits = stream(model, idx, lambda site: sites.__setitem__(site.name, site))
    return sites, logits
