"""The three GEMMs of an emulated product site, forward and backward (torch autograd).

A site ``y = a @ b (+ bias)`` (``a``: ``[..., M, K]`` activations, ``b``: ``[K, N]`` weights
or ``[..., K, N]`` a second activation) under a recipe runs, when a gradient is wanted:

- forward ``y = Q(a) @ Q(b)``: ``a`` quantized along K by ``recipe.inputs``, ``b`` along K by
  ``recipe.weights`` (a format with the recipe's scaling, or a ``Cast``);
- input gradient ``da = Q(dy) @ Q(b^T)``, reducing over N: ``dy`` by ``backward.grad``,
  ``b`` by ``backward.weights`` or else the forward's setting, now along N;
- weight gradient ``db = Q(a^T) @ Q(dy)``, reducing over M (all tokens when ``b`` is 2-D):
  ``a`` by ``backward.inputs`` or the forward's setting, now along M, ``dy`` along M,
  both first through the random Hadamard transform when ``backward.hadamard`` is set;
- the bias gradient: ``dy`` summed over the tokens in FP64, rounded once.

Each GEMM sums as the accumulator says (``backward.accum``, else the forward's:
FP32 by default, computed in FP64 and rounded once).  A cast whose values do not depend on
the axis (no scaling, per-tensor, delayed) is applied once and its values reused by every
GEMM, as the hardware reuses one FP8 tensor (and its transposed copy); stochastic rounding
then draws its random bits once per tensor.  Delayed scaling keeps an
``AmaxHistory`` per site and tensor (``x``, ``w``, ``dy``)
in the ``fpsim.emulation.Emulation``; a backward GEMM reuses its forward's scale.  With
``capture=True`` each backward GEMM adds a row ``<site>/dgrad`` or ``<site>/wgrad``: the
gradient operand's amax, overflow, saturation and flush, and the GEMM's SNR against FP64 on
the unquantized operands.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..rounding import STOCHASTIC
from . import hadamard, quantizers, sites
from .casts import SCALINGS, Backward, Cast
from .recipe import Recipe

_DEFAULT = Backward()


def training_casts(recipe: Recipe) -> bool:
    """Whether ``recipe`` has casts only this module applies (TE / torchao scalings, NVFP4 2-D
    blocks, delays; not per-site scaling's, which ``sites`` applies with its caches of
    quantized weights).

    >>> training_casts(Recipe("e4m3", scaling="site").at_site({"a": 1.0, "b": 1.0}))
    False
    """
    return any(isinstance(f, Cast) and f.scaling != "site" for f in (recipe.inputs, recipe.weights))


def handles(recipe: Recipe, *tensors: Tensor | None) -> bool:
    """Whether a product site goes through this module: a gradient is wanted, or the recipe
    has ``training_casts``."""
    if training_casts(recipe):
        return True
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def product(interceptor: Any, name: str, recipe: Recipe, a: Tensor, b: Tensor,
            bias: Tensor | None, events: dict | None, cache: dict | None) -> Tensor:
    """``a @ b (+ bias)`` of site ``name`` under ``recipe``, differentiable when needed."""
    site = Site(interceptor, name, recipe)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (a, b, bias)):
        if recipe.native_sums == "host" and bias is not None and recipe.output is None:
            # torch's FP32 GEMM, then the bias with torch's own gradient (torchao's arithmetic)
            return _Gemms.apply(a, b, None, site, events) + bias
        return _Gemms.apply(a, b, bias, site, events)
    return site.forward(a, b, bias, events, cache)[0]


def reusable(cast: Cast | None) -> bool:
    """Whether a weight quantized by ``cast`` may be kept between calls: not a delayed cast
    (each call advances its amax history) nor a stochastic one (each call draws new bits)."""
    return cast is None or (cast.scaling != "delayed" and cast.rounding not in STOCHASTIC)


def axis_free(spec: Any, recipe: Recipe) -> bool:
    """True when ``spec`` (a Cast, a format under ``recipe``'s scaling, or None) gives the
    same values whichever axis a GEMM reduces."""
    if isinstance(spec, Cast):
        return SCALINGS[spec.scaling].axis_free
    return spec is None or SCALINGS[recipe.scaling].axis_free


class Site:
    """One call of a product site: its recipe, and where delayed scaling and capture live."""

    def __init__(self, interceptor: Any, name: str, recipe: Recipe) -> None:
        self.interceptor, self.name, self.recipe = interceptor, name, recipe
        self.backward_recipe = recipe.backward or _DEFAULT
        self.capture = interceptor is not None and interceptor.em.capture

    def operand(self, x: Tensor, spec: Any, role: str, axis: int, events: dict | None,
                key: str, scale: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """``x`` quantized by ``spec`` along ``axis`` (counted in ``events[key]``), and the
        scale of a TE / torchao cast (``scale``: a delayed cast's, reused)."""
        if not isinstance(spec, Cast):
            q, ev = sites._quantize_counted(x, spec, self.recipe, axis, events is not None)
            if events is not None:
                events[key] = ev
            return q, None
        history = None
        if spec.scaling == "delayed" and scale is None:
            history = self.history(role, spec)
        q, limit, used = quantizers.cast(x, spec, axis, history=history, scale=scale)
        if events is not None:
            events[key] = sites.operand_events(x, q, limit)
        return sites.unflush(x, q, spec), used

    def weight(self, b: Tensor, events: dict | None,
               cache: dict | None) -> tuple[Tensor, Tensor | None]:
        """``b`` quantized by the recipe's weight cast, as ``operand``, kept in ``cache`` when
        that is a model's parameter cache (``sites.cached``), unless the cast keeps an amax
        history or draws random bits: quantizing again is then part of the arithmetic."""
        spec = self.recipe.weight_format
        how = self.recipe.cast(spec, -2)
        if type(cache) is not dict or not reusable(how):
            return self.operand(b, spec, "w", -2, events, "b")
        count = events is not None

        def make() -> tuple[tuple, dict | None]:
            ev: dict | None = {} if count else None
            q, scale = self.operand(b, spec, "w", -2, ev, "b")
            return (q, scale), None if ev is None else ev["b"]

        (q, scale), ev = sites.cached(cache, b, ("with its scale", how), count, make)
        if count:
            events["b"] = ev
        return q, scale

    def history(self, role: str, spec: Cast) -> quantizers.AmaxHistory:
        """The site's amax history of tensor ``role`` (made on first use)."""
        if self.interceptor is None:
            raise ValueError("delayed scaling needs an fpsim.emulate context (it keeps the "
                             "amax histories)")
        store = self.interceptor.em.histories
        key = (self.name, role)
        if key not in store:
            from ..formats import get_format
            store[key] = quantizers.AmaxHistory(get_format(spec.fmt).max, spec.history,
                                                spec.margin)
        return store[key]

    # -----------------------------------------------------------------------------------
    def forward(self, a: Tensor, b: Tensor, bias: Tensor | None, events: dict | None,
                cache: dict | None = None) -> tuple[Tensor, dict]:
        """The forward GEMM; also what the backward reuses (quantized operands, scales)."""
        r = self.recipe
        if not any(isinstance(f, Cast) for f in (r.inputs, r.weights)):
            qa, qb = sites._operands(r, a, b, events, cache)
            sa = sb = None
        else:
            qa, sa = self.operand(a, r.inputs, "x", -1, events, "a")
            qb, sb = self.weight(b, events, cache)
        y = sites.round_output(sites._product(r, qa, qb, bias, events), r)
        return y, {"qa": qa, "qb": qb, "sa": sa, "sb": sb}

    def accumulator(self) -> Recipe:
        """The recipe the backward GEMMs sum with (only its accumulator fields are used)."""
        bw, r = self.backward_recipe, self.recipe
        if bw.accum is None:
            return r
        return Recipe(name=f"{r.name} backward", accum=bw.accum)

    def specs(self) -> tuple[Any, Any, Any]:
        """The casts of the backward GEMMs' operands: (``dy``, ``x`` in wgrad, ``W`` in dgrad)."""
        bw, r = self.backward_recipe, self.recipe
        return (bw.grad, r.inputs if bw.inputs is None else bw.inputs,
                r.weight_format if bw.weights is None else bw.weights)

    def backward(self, a: Tensor, b: Tensor, dy: Tensor, saved: dict,
                 wanted: tuple) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """(da, db, dbias) for the gradient ``dy`` of the output; None where not ``wanted``."""
        da = db = dbias = None
        qdy = sdy = dy_events = None
        if wanted[0]:
            da, qdy, sdy, dy_events = self.dgrad(a, b, dy, saved)
        if wanted[1]:
            db = self.wgrad(a, b, dy, saved, qdy, sdy, dy_events)
        if wanted[2]:
            dbias = bias_gradient(dy)
        return da, db, dbias

    def dgrad(self, a: Tensor, b: Tensor, dy: Tensor,
              saved: dict) -> tuple[Tensor, Tensor, Tensor | None, dict | None]:
        """``da = Q(dy) @ Q(b^T)``, and ``dy`` as quantized for it (values, scale, events)."""
        r, acc = self.recipe, self.accumulator()
        gspec, _, wspec = self.specs()
        ev = {} if self.capture else None
        qdy, sdy = self.operand(dy, gspec, "dy", -1, ev, "a")
        dy_events = None if ev is None else ev["a"]
        bT = b.transpose(-1, -2)
        if self.backward_recipe.weights is None and axis_free(wspec, r):
            qbT = saved["qb"].transpose(-1, -2)
        else:
            qbT, _ = self.operand(bT, wspec, "w", -2, None, "b", saved["sb"])
        da = _reduce(sites._product(acc, qdy, qbT, None, ev), a.shape)
        if ev is not None:
            self.record("dgrad", dy, ev, da, lambda: dy.double() @ bT.double())
        return da, qdy, sdy, dy_events

    def wgrad(self, a: Tensor, b: Tensor, dy: Tensor, saved: dict, qdy: Tensor | None,
              sdy: Tensor | None, dy_events: dict | None) -> Tensor:
        """``db = Q(a^T) @ Q(dy)`` reducing over the tokens (``qdy``: ``dy`` as the dgrad GEMM
        quantized it, reused where its cast does not depend on the axis)."""
        bw, r, acc = self.backward_recipe, self.recipe, self.accumulator()
        gspec, xspec, _ = self.specs()
        ev = {} if self.capture else None
        flat = b.dim() == 2
        aT = (a.reshape(-1, a.shape[-1]) if flat else a).transpose(-1, -2)
        d2 = dy.reshape(-1, dy.shape[-1]) if flat else dy
        if bw.hadamard:
            ta = hadamard.transform(aT, -1, bw.hadamard, bw.hadamard_seed)
            td = hadamard.transform(d2, -2, bw.hadamard, bw.hadamard_seed)
            qaT, _ = self.operand(ta, xspec, "x", -1, None, "a", saved["sa"])
            qd2, _ = self.operand(td, gspec, "dy", -2, ev, "b", sdy)
        else:
            if bw.inputs is None and axis_free(xspec, r):
                qa = saved["qa"]
                qaT = (qa.reshape(-1, qa.shape[-1]) if flat else qa).transpose(-1, -2)
            else:
                qaT, _ = self.operand(aT, xspec, "x", -1, None, "a", saved["sa"])
            if qdy is not None and axis_free(gspec, r):
                qd2 = qdy.reshape(-1, qdy.shape[-1]) if flat else qdy
                if ev is not None:                # counted once, in the dgrad GEMM
                    ev["b"] = dy_events
            else:
                qd2, _ = self.operand(d2, gspec, "dy", -2, ev, "b", sdy)
        db = _reduce(sites._product(acc, qaT, qd2, None, ev), b.shape)
        if ev is not None:
            self.record("wgrad", dy, ev, db, lambda: aT.double() @ d2.double())
        return db

    def record(self, gemm: str, dy: Tensor, events: dict, y: Tensor,
               ref: Callable[[], Tensor]) -> None:
        """A capture row for a backward GEMM: the gradient operand's events, the result's SNR
        against ``ref()`` (its FP64 result, not computed under ``capture="counts"``)."""
        r = self.interceptor.reference(lambda: _reduce(ref(), y.shape))
        self.interceptor.record(f"{self.name}/{gemm}", gemm, self.recipe, (dy,), events, y, r)


def bias_gradient(dy: Tensor) -> Tensor:
    """``dy`` summed over every token in FP64 and rounded once (the bias gradient)."""
    return dy.double().reshape(-1, dy.shape[-1]).sum(0).to(dy.dtype)


def _reduce(g: Tensor, shape: torch.Size) -> Tensor:
    """``g`` summed (in FP64, rounded once) over the axes its operand was broadcast along."""
    if g.shape == shape:
        return g
    return g.double().sum_to_size(shape).to(g.dtype)


class _Gemms(torch.autograd.Function):
    """The site's forward GEMM, with its two backward GEMMs as the gradient."""

    @staticmethod
    def forward(ctx: Any, a: Tensor, b: Tensor, bias: Tensor | None, site: Site,
                events: dict | None) -> Tensor:
        y, saved = site.forward(a, b, bias, events)
        ctx.site, ctx.saved = site, saved
        ctx.save_for_backward(a, b)
        return y

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple:
        a, b = ctx.saved_tensors
        with torch._C.DisableTorchFunction():     # our own arithmetic, not the model's
            da, db, dbias = ctx.site.backward(a, b, dy.contiguous(), ctx.saved,
                                              ctx.needs_input_grad[:3])
        return da, db, dbias, None, None
