"""Fake quantization for PyTorch models: round in the forward pass, pass gradients straight through.

``fake_quantize`` is the autograd-aware :func:`fpsim.quantize` (any device fpsim supports).
``quantize_linear_layers`` runs a model's matrix-multiply layers under a format with one call and
gives it back unchanged on ``restore()``.  torch is imported only when these are called.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable

from .convert import quantize
from .formats import Format, get_format


def fake_quantize(x: Any, fmt: str | Format, *, rounding: str = "rne", saturate: bool = False,
                  subnormals: bool = True, seed: Any = None, grad_fmt: str | Format | None = None,
                  grad_rounding: str = "rne", grad_saturate: bool = False) -> Any:
    """``fpsim.quantize(x, fmt, ...)`` with a straight-through gradient.

    The backward pass hands the incoming gradient through unchanged, or rounded to ``grad_fmt``
    (with ``grad_rounding`` / ``grad_saturate``) when given.
    """
    opts = {"rounding": rounding, "saturate": saturate, "subnormals": subnormals, "seed": seed}
    grad = None
    if grad_fmt is not None:
        grad = (get_format(grad_fmt), {"rounding": grad_rounding, "saturate": grad_saturate})
    return _straight_through().apply(x, get_format(fmt), opts, grad)


@functools.lru_cache(maxsize=None)
def _straight_through() -> Any:
    """The autograd Function, defined on first use so that torch is imported lazily."""
    import torch

    class StraightThrough(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, fmt: Format, opts: dict, grad: tuple | None) -> Any:
            ctx.grad = grad
            return quantize(x, fmt, **opts)

        @staticmethod
        def backward(ctx: Any, g: Any) -> tuple:
            if ctx.grad is not None:
                fmt, opts = ctx.grad
                g = quantize(g, fmt, **opts)
            return g, None, None, None

    return StraightThrough


def is_matmul_layer(module: Any) -> bool:
    """``nn.Linear`` or a Hugging Face style ``Conv1D`` (by class name) with a 2-D weight."""
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
                           saturate: bool = False, grad_fmt: str | Format | None = None,
                           include: Callable[[str, Any], bool] | None = None) -> QuantizedLayers:
    """Fake-quantize the weights and/or input activations of every ``nn.Linear`` and ``Conv1D``.

    Weights are rounded on every access through a ``torch.nn.utils.parametrize`` parametrization
    (training still updates the original full-precision Parameter, gradients straight through);
    activations are rounded by a forward pre-hook on the layer's first input, so layers that only
    hold parameters for someone else's matmul get their weights quantized but not their inputs.
    ``include(name, module)`` selects layers (default: all).  Returns a handle whose
    ``restore()`` undoes everything; it is also a context manager.
    """
    import torch
    from torch.nn.utils import parametrize

    if weights is None and activations is None:
        raise ValueError("nothing to quantize: pass weights=FMT and/or activations=FMT")
    kw = {"rounding": rounding, "saturate": saturate, "grad_fmt": grad_fmt}
    wfmt = get_format(weights) if weights is not None else None
    afmt = get_format(activations) if activations is not None else None
    chosen = {name: m for name, m in model.named_modules()
              if is_matmul_layer(m) and (include is None or include(name, m))}
    if not chosen:
        raise ValueError(f"no nn.Linear or Conv1D layers with a 2-D weight found in "
                         f"{type(model).__name__} (or none passed include=)")
    clash = [n for n, m in chosen.items() if parametrize.is_parametrized(m, "weight")]
    if clash and wfmt is not None:
        raise ValueError(f"layers {clash} already have a weight parametrization; restore or "
                         "remove it first")
    hooks = []
    if afmt is not None:
        idle = [n for n, m in chosen.items() if type(m).forward is torch.nn.Module.forward]
        if idle:
            warnings.warn(f"{len(idle)} layers have no forward() of their own ({idle[0]}, ...): "
                          "their inputs are not quantized, only their weights", stacklevel=2)

        def round_input(module: Any, args: tuple) -> tuple:
            return (fake_quantize(args[0], afmt, **kw), *args[1:]) if args else args

        hooks = [m.register_forward_pre_hook(round_input) for m in chosen.values()]
    if wfmt is not None:
        for m in chosen.values():
            parametrize.register_parametrization(m, "weight", _round_weight()(wfmt, kw))
    return QuantizedLayers(chosen, hooks, wfmt is not None)


@functools.lru_cache(maxsize=None)
def _round_weight() -> Any:
    """The parametrization module class (weight -> fake-quantized weight), defined lazily."""
    import torch

    class RoundWeight(torch.nn.Module):
        def __init__(self, fmt: Format, kw: dict) -> None:
            super().__init__()
            self.fmt, self.kw = fmt, kw

        def forward(self, w: Any) -> Any:
            return fake_quantize(w, self.fmt, **self.kw)

        def extra_repr(self) -> str:
            return f"{self.fmt.name}, rounding={self.kw['rounding']}"

    return RoundWeight
