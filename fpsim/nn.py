"""Fake quantization for PyTorch models, forward and backward.

``fake_quantize`` is the autograd-aware :func:`fpsim.quantize` (any device fpsim supports), its
gradient straight through or rounded; ``round_through`` is the same with any rounding function
on either side.  ``quantize_linear_layers`` runs a model's matrix-multiply layers under a format
with one call, gradients per tensor class (:class:`GradFormats`) included, and gives the model
back unchanged on ``restore()``.  ``LossScaler`` is loss scaling with torch.amp.GradScaler's
rules, static or dynamic.  torch is imported only when these are used.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .convert import quantize
from .formats import Format, get_format
from .rounding import check_mode
from .stochastic import check_srbits


Rounder = Callable[[Any], Any]


def rounder(fmt: str | Format, *, rounding: str = "rne", saturate: bool = False,
            subnormals: bool = True, seed: Any = None, srbits: int | None = None) -> Rounder:
    """``fpsim.quantize`` with these options as a one-argument function (format and random bits
    checked now; ``srbits``: stochastic rounding's random bits, docs/stochastic.md).

    >>> rounder("e4m3", saturate=True)(500.0)
    448.0
    """
    f = get_format(fmt)
    check_srbits(srbits, check_mode(rounding))
    return functools.partial(quantize, fmt=f, rounding=rounding, saturate=saturate,
                             subnormals=subnormals, seed=seed, srbits=srbits)


def round_through(x: Any, forward: Rounder | None, backward: Rounder | None) -> Any:
    """``forward(x)`` whose gradient is the incoming gradient passed through ``backward``.

    ``None`` on either side is the identity: ``round_through(y, None, r)`` leaves a layer's
    output alone and rounds the gradient arriving at it.  The building block of every
    rounding in this module.

    >>> import torch
    >>> x = torch.tensor([0.1], requires_grad=True)
    >>> round_through(x, None, rounder("e5m2")).backward(torch.tensor([0.3]))
    >>> x.grad.tolist()                         # the gradient, rounded to E5M2
    [0.3125]
    """
    return _straight_through().apply(x, forward, backward)


def fake_quantize(x: Any, fmt: str | Format, *, rounding: str = "rne", saturate: bool = False,
                  subnormals: bool = True, seed: Any = None, grad_fmt: str | Format | None = None,
                  grad_rounding: str = "rne", grad_saturate: bool = False,
                  srbits: int | None = None, random_bits: Any = None,
                  grad_srbits: int | None = None) -> Any:
    """``fpsim.quantize(x, fmt, ...)`` with a straight-through gradient.

    The backward pass hands the incoming gradient through unchanged, or rounded to ``grad_fmt``
    (with ``grad_rounding`` / ``grad_saturate`` / ``grad_srbits``) when given.  ``srbits`` and
    ``random_bits``: stochastic rounding's random bits in the forward pass, as
    :func:`fpsim.quantize` takes them.

    >>> import torch
    >>> x = torch.tensor([0.1, 500.0], requires_grad=True)
    >>> y = fake_quantize(x, "e4m3", saturate=True)
    >>> y.tolist()
    [0.1015625, 448.0]
    >>> y.sum().backward(); x.grad.tolist()      # straight through
    [1.0, 1.0]
    """
    fwd = functools.partial(rounder(fmt, rounding=rounding, saturate=saturate,
                                    subnormals=subnormals, seed=seed, srbits=srbits),
                            random_bits=random_bits)
    bwd = None if grad_fmt is None else rounder(grad_fmt, rounding=grad_rounding,
                                                saturate=grad_saturate, srbits=grad_srbits)
    return round_through(x, fwd, bwd)


@functools.lru_cache(maxsize=None)
def _straight_through() -> Any:
    """The autograd Function, defined on first use so that torch is imported lazily."""
    import torch

    class StraightThrough(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, fwd: Rounder | None, bwd: Rounder | None) -> Any:
            ctx.bwd = bwd
            return x.clone() if fwd is None else fwd(x)

        @staticmethod
        def backward(ctx: Any, g: Any) -> tuple:
            return (g if ctx.bwd is None else ctx.bwd(g)), None, None

    return StraightThrough


@dataclass(frozen=True)
class GradFormats:
    """Formats of the backward pass, per tensor class.

    ``activation``: gradients flowing between layers (the gradient arriving at a layer's output
    and the one it sends back to its input); ``weight``: gradients of the weights.  ``None``
    leaves that class in the working precision.  ``saturate`` clamps overflow to the largest
    value instead of giving inf (what loss scaling detects).  ``srbits``: random bits of a
    stochastic ``rounding`` (e.g. ``GradFormats("e5m2", "e5m2", "stochastic", srbits=8)``).
    """

    activation: str | Format | None = None
    weight: str | Format | None = None
    rounding: str = "rne"
    saturate: bool = False
    srbits: int | None = None

    def __post_init__(self) -> None:
        check_srbits(self.srbits, check_mode(self.rounding))

    def rounders(self) -> tuple[Rounder | None, Rounder | None]:
        """(activation-gradient rounder, weight-gradient rounder); None where not rounded."""
        kw = {"rounding": self.rounding, "saturate": self.saturate, "srbits": self.srbits}
        return tuple(None if f is None else rounder(f, **kw)        # type: ignore[return-value]
                     for f in (self.activation, self.weight))

    @classmethod
    def of(cls, grad: "str | Format | GradFormats | None") -> "GradFormats":
        """A format for every gradient, or a ``GradFormats`` as given (None: nothing rounded)."""
        return grad if isinstance(grad, GradFormats) else cls(grad, grad)


def is_matmul_layer(module: Any) -> bool:
    """``nn.Linear`` or a Hugging Face style ``Conv1D`` (by class name) with a 2-D weight.

    >>> import torch
    >>> is_matmul_layer(torch.nn.Linear(2, 2)), is_matmul_layer(torch.nn.ReLU())
    (True, False)
    """
    import torch

    weight = getattr(module, "weight", None)
    is_2d = isinstance(weight, torch.Tensor) and weight.dim() == 2
    return is_2d and (isinstance(module, torch.nn.Linear) or type(module).__name__ == "Conv1D")


class QuantizedLayers:
    """What :func:`quantize_linear_layers` changed; ``restore()`` (or leaving a ``with`` block)
    gives the model back exactly as it was: same classes, same Parameter objects."""

    def __init__(self, modules: dict[str, Any], hooks: list[Any], weights: bool) -> None:
        self.modules = modules
        self._hooks = hooks
        self._weights = weights     # whether this call added the weight parametrizations
        self._order = {name: list(m._parameters) for name, m in modules.items()}

    @property
    def names(self) -> list[str]:
        """Qualified names of the wrapped layers."""
        return list(self.modules)

    def restore(self) -> None:
        """Remove the weight quantizers and activation hooks this call added (a second call
        does nothing; parametrizations registered by anyone else stay)."""
        from torch.nn.utils import parametrize

        for hook in self._hooks:
            hook.remove()
        for name, module in self.modules.items():
            if self._weights and parametrize.is_parametrized(module, "weight"):
                parametrize.remove_parametrizations(module, "weight", leave_parametrized=False)
                params = module._parameters      # put "weight" back in its original place
                moved = [(k, params.pop(k)) for k in self._order[name] if k in params]
                params.update(moved)
        self._hooks, self.modules = [], {}

    def __enter__(self) -> "QuantizedLayers":
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()


def quantize_linear_layers(model: Any, weights: str | Format | None = None,
                           activations: str | Format | None = None, *, rounding: str = "rne",
                           saturate: bool = False, grad: str | Format | GradFormats | None = None,
                           include: Callable[[str, Any], bool] | None = None,
                           srbits: int | None = None) -> QuantizedLayers:
    """Fake-quantize the weights, input activations and gradients of every ``nn.Linear`` and
    ``Conv1D``.

    Weights are rounded on every access through a ``torch.nn.utils.parametrize`` parametrization
    (training still updates the original full-precision Parameter); activations are rounded by a
    forward pre-hook on the layer's first input, so layers that only hold parameters for someone
    else's matmul get their weights quantized but not their inputs.  ``grad`` (a format, or a
    :class:`GradFormats` per tensor class) rounds the backward pass: the gradient arriving at the
    layer's output (before the layer's backward matmuls use it), the input gradient the layer
    sends back, and the weight gradient; bias gradients stay in the working precision.
    ``include(name, module)`` selects layers (default: all).  ``srbits``: random bits of a
    stochastic ``rounding`` of weights and activations (gradients: ``GradFormats.srbits``,
    e.g. ``grad=GradFormats("e5m2", "e5m2", "stochastic", srbits=8)``).  Returns a handle whose
    ``restore()`` undoes everything; it is also a context manager.

    >>> import torch
    >>> layer = torch.nn.Linear(2, 1, bias=False)
    >>> with torch.no_grad():
    ...     _ = layer.weight.copy_(torch.tensor([[0.1, 500.0]]))
    >>> with quantize_linear_layers(layer, weights="e4m3", saturate=True):
    ...     layer.weight.tolist()                # rounded on every access
    [[0.1015625, 448.0]]
    >>> layer.weight.tolist()                    # restored
    [[0.10000000149011612, 500.0]]
    """
    import torch
    from torch.nn.utils import parametrize

    gfmts = GradFormats.of(grad)
    if weights is None and activations is None and grad is None:
        raise ValueError("nothing to quantize: pass weights=FMT, activations=FMT and/or grad=FMT")
    fwd = {"rounding": rounding, "saturate": saturate, "srbits": srbits}
    wfwd = rounder(weights, **fwd) if weights is not None else None
    afwd = rounder(activations, **fwd) if activations is not None else None
    agrad, wgrad = gfmts.rounders()
    chosen = {name: m for name, m in model.named_modules()
              if is_matmul_layer(m) and (include is None or include(name, m))}
    if not chosen:
        raise ValueError(f"no nn.Linear or Conv1D layers with a 2-D weight found in "
                         f"{type(model).__name__} (or none passed include=)")
    round_weights = wfwd is not None or wgrad is not None
    clash = [n for n, m in chosen.items() if parametrize.is_parametrized(m, "weight")]
    if clash and round_weights:
        raise ValueError(f"layers {clash} already have a weight parametrization; restore or "
                         "remove it first")
    hooks = []
    if afwd is not None or agrad is not None:
        idle = [n for n, m in chosen.items() if type(m).forward is torch.nn.Module.forward]
        if idle:
            warnings.warn(f"{len(idle)} layers have no forward() of their own ({idle[0]}, ...): "
                          "their inputs are not quantized (nor their activation gradients), only "
                          "their weights", stacklevel=2)

        def round_input(module: Any, args: tuple) -> tuple:
            return (round_through(args[0], afwd, agrad), *args[1:]) if args else args

        def round_output_grad(module: Any, args: tuple, out: Any) -> Any:
            return round_through(out, None, agrad)

        for m in chosen.values():
            hooks.append(m.register_forward_pre_hook(round_input))
            if agrad is not None:
                hooks.append(m.register_forward_hook(round_output_grad))
    if round_weights:
        for m in chosen.values():
            parametrize.register_parametrization(m, "weight", _round_weight()(wfwd, wgrad, weights))
    return QuantizedLayers(chosen, hooks, round_weights)


@functools.lru_cache(maxsize=None)
def _round_weight() -> Any:
    """The parametrization module class (weight -> fake-quantized weight), defined lazily."""
    import torch

    class RoundWeight(torch.nn.Module):
        def __init__(self, fwd: Rounder | None, bwd: Rounder | None, name: Any) -> None:
            super().__init__()
            self.fwd, self.bwd, self.name = fwd, bwd, name

        def forward(self, w: Any) -> Any:
            return round_through(w, self.fwd, self.bwd)

        def extra_repr(self) -> str:
            name = getattr(self.name, "name", self.name)
            return f"{name}, gradient rounded: {self.bwd is not None}"

    return RoundWeight


class LossScaler:
    """Loss scaling with ``torch.amp.GradScaler``'s rules, on any device, static or dynamic.

    Use as GradScaler: ``scaler.scale(loss).backward()``, ``scaler.unscale_(opt)`` (optional,
    e.g. before clipping), ``scaler.step(opt)``, ``scaler.update()``.  The scale is a float32
    number; unscaling multiplies every gradient by the float32 reciprocal of the scale, and a
    step whose gradients hold inf or NaN is skipped.  Dynamic (GradScaler): a skipped step
    multiplies the scale by ``backoff_factor`` and restarts the count; ``growth_interval``
    steps in a row without inf/NaN multiply it by ``growth_factor`` (kept if finite).
    Static (``dynamic=False``): the scale never changes, overflowing steps are still skipped.

    The first scale: GradScaler's 2^16 = 65,536 by default.  That is above E5M2's largest
    value (57,344) and FP16's (65,504), so when gradients are rounded to one of those formats
    the first step's scaled gradients can overflow to inf: that step is skipped and the scale
    halved, as GradScaler does (correct, though alarming in a log).  ``grad_format`` chooses
    the first scale from the gradient format instead: 2^16, lowered to the largest power of
    two that format holds (E5M2 and FP16: 2^15), so that a gradient of 1 times the scale is
    finite.  An explicit ``init_scale`` wins.

    >>> LossScaler().get_scale(), LossScaler(grad_format="e5m2").get_scale()
    (65536.0, 32768.0)
    """

    def __init__(self, init_scale: float | None = None, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 dynamic: bool = True, grad_format: str | Format | None = None) -> None:
        if init_scale is None:
            init_scale = 2.0 ** 16
            if grad_format is not None:
                top = math.floor(math.log2(get_format(grad_format).max))
                init_scale = 2.0 ** min(16, top)
        if not (init_scale > 0 and growth_factor > 1 and 0 < backoff_factor < 1
                and growth_interval >= 1):
            raise ValueError("loss scaling needs init_scale > 0, growth_factor > 1, "
                             "0 < backoff_factor < 1 and growth_interval >= 1")
        self.scale_value = _f32(init_scale)
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval, self.dynamic = growth_interval, dynamic
        self.growth_tracker = 0
        self.skipped = 0                # steps skipped so far
        self._found_inf: bool | None = None   # None: this step's gradients not unscaled yet

    def get_scale(self) -> float:
        """The current scale."""
        return self.scale_value

    def scale(self, loss: Any) -> Any:
        """``loss`` times the scale (in float32, as GradScaler)."""
        import torch

        return loss * torch.tensor(self.scale_value, dtype=torch.float32, device=loss.device)

    def unscale_(self, optimizer: Any) -> bool:
        """Divide the optimizer's gradients by the scale in place; True if any is inf or NaN."""
        import torch

        if self._found_inf is not None:
            raise RuntimeError("unscale_() was already called since the last update()")
        inv = torch.tensor(self.scale_value, dtype=torch.float64).reciprocal().float()
        found = False
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    found |= not bool(torch.isfinite(p.grad).all())
                    p.grad.mul_(inv.to(p.grad.device))
        self._found_inf = found
        return found

    def step(self, optimizer: Any) -> bool:
        """``optimizer.step()`` unless the gradients hold inf/NaN; returns whether it stepped."""
        if self._found_inf is None:
            self.unscale_(optimizer)
        if self._found_inf:
            self.skipped += 1
            return False
        optimizer.step()
        return True

    def update(self) -> None:
        """Adjust the scale after a step (dynamic only), as ``torch._amp_update_scale_``."""
        if self._found_inf is None:
            raise RuntimeError("update() needs a step() (or unscale_()) since the last update()")
        found, self._found_inf = self._found_inf, None
        if not self.dynamic:
            return
        if found:
            self.scale_value = _f32(self.scale_value * self.backoff_factor)
            self.growth_tracker = 0
        elif self.growth_tracker + 1 == self.growth_interval:
            grown = _f32(self.scale_value * self.growth_factor)
            self.scale_value = grown if math.isfinite(grown) else self.scale_value
            self.growth_tracker = 0
        else:
            self.growth_tracker += 1


def _f32(v: float) -> float:
    """``v`` rounded to float32 (inf beyond its range), as a Python float."""
    with np.errstate(over="ignore"):
        return float(np.float32(v))
