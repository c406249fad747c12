"""Capture the operands of every dot-product site of one GPT-2 forward pass.

An ``ops`` object (see ``fpsim_experiments.gpt2.ops``) records each site's operands and result
while computing as the deterministic FP32 (or FP64) reference does (``fpsim_experiments.recipes``:
dot products and softmax in FP64, rounded once), so the captured operands are what the
reference network feeds that site, bit for bit on any machine.  LayerNorm sites record their
input; their dot products are
the row sum and the sum of squares (``fpsim_experiments.recipes.layernorm_stats``).

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

from .gpt2.model import GPT2
from .gpt2.ops import TorchOps, forward
from . import recipes
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


class CaptureOps(TorchOps):
    """The reference arithmetic, handing every site to ``sink`` as it is computed (in forward
    order) and keeping none.

    ``sink`` runs inside the forward pass's interception handler, where torch's function-mode
    stack is suspended: its own torch calls are plain torch, not model sites.
    """

    def __init__(self, sink: Callable[[Site], None]) -> None:
        self.sink = sink
        self.seen: set[str] = set()

    def _keep(self, site: Site) -> None:
        if site.name in self.seen:
            raise ValueError(
                f"site {site.name!r} seen twice: capture one forward pass per CaptureOps"
            )
        self.seen.add(site.name)
        self.sink(site)

    def linear(self, name: str, x: Tensor, W: Tensor, b: Tensor | None) -> Tensor:
        y = recipes.linear(NATIVE[x.dtype], x, W, b)
        self._keep(
            Site(
                name,
                "linear",
                x.detach(),
                y.detach(),
                W.detach(),
                None if b is None else b.detach(),
            )
        )
        return y

    def matmul(self, name: str, a: Tensor, b: Tensor) -> Tensor:
        y = recipes.matmul(NATIVE[a.dtype], a, b)
        mask = None
        if name.endswith(".qk"):
            mask = torch.ones(y.shape[-2], y.shape[-1], dtype=torch.bool, device=y.device).tril()
        self._keep(Site(name, "matmul", a.detach(), y.detach(), b.detach(), mask=mask))
        return y

    def layernorm(self, name: str, x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
        ssq = layernorm_stats(NATIVE[x.dtype], x.detach())[1]
        self._keep(Site(name, "layernorm", x.detach(), ssq))
        return recipes.layernorm(NATIVE[x.dtype], x, weight, bias, eps)

    def softmax(self, name: str, x: Tensor) -> Tensor:
        return recipes.softmax(x)


@torch.no_grad()
def stream(model: GPT2, idx: Tensor, sink: Callable[[Site], None]) -> Tensor:
    """Run ``model(idx)`` (in the model's dtype), calling ``sink`` on each site as soon as it is
    computed, in forward order; returns the logits.  Nothing here keeps a site: what ``sink``
    drops is freed before the next one."""
    return forward(model, idx, CaptureOps(sink))


def capture(model: GPT2, idx: Tensor) -> tuple[dict[str, Site], Tensor]:
    """Every site of ``model(idx)`` (in the model's dtype), all held at once, and the logits."""
    sites: dict[str, Site] = {}
    logits = stream(model, idx, lambda site: sites.__setitem__(site.name, site))
    return sites, logits
