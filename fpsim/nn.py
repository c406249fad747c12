"""Fake quantization for PyTorch models, forward and backward.

``fake_quantize`` is the autograd-aware [``fpsim.quantize``][] (any device fpsim supports), its
gradient straight through or rounded; ``round_through`` is the same with any rounding function
on either side.  ``quantize_linear_layers`` puts a model's matrix-multiply layers under a format
with one call: a thin wrapper over [``fpsim.emulate``][] (one recipe, its backward GEMMs from
[``GradFormats``][]), the model given back untouched on ``restore()``.  ``LossScaler`` is
loss scaling with torch.amp.GradScaler's rules, static or dynamic.  torch is imported only when
these are used.
"""

from __future__ import annotations

import functools
import glob
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .convert import quantize
from .emulation.casts import Backward, Cast
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
    [``fpsim.quantize``][] takes them.

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
    """The gradient format of [``quantize_linear_layers``][]: what
    [``backward``][] turns into an [``fpsim.emulation.casts.Backward``][].

    ``activation`` and ``weight`` name the format of the output gradient ``dy`` as an operand of the
    layer's two backward GEMMs (``dx = dy @ W^T``, ``dW = x^T @ dy``, ``W`` as ``[in, out]``),
    rounded with ``rounding`` / ``saturate`` (clamp overflow to the largest value instead of inf,
    what loss scaling detects) / ``srbits`` (random bits of a stochastic ``rounding``, e.g.
    ``GradFormats("e5m2", "e5m2", "stochastic", srbits=8)``).  ``fpsim.emulate`` rounds ``dy`` once
    for both GEMMs (as the hardware casts one FP8 gradient), so the two must name the same format,
    or both be None (gradients in the working precision); the GEMM results ``dx`` and ``dW`` are
    FP32 sums, not rounded again.  Per-operand casts of the backward GEMMs (``x`` and ``W``
    re-quantized, scaled casts): a [``fpsim.emulation.Recipe``][] with ``backward=Backward(...)``
    under [``fpsim.emulate``][] (docs/training.md).

    >>> GradFormats("e5m2", "e5m2", saturate=True).backward().grad.describe()
    'e5m2 sat'
    """

    activation: str | Format | None = None
    weight: str | Format | None = None
    rounding: str = "rne"
    saturate: bool = False
    srbits: int | None = None

    def __post_init__(self) -> None:
        check_srbits(self.srbits, check_mode(self.rounding))
        names = [None if f is None else get_format(f).name for f in (self.activation, self.weight)]
        if names[0] != names[1]:
            raise ValueError(
                f"GradFormats(activation={self.activation!r}, weight={self.weight!r}): "
                "fpsim.emulate rounds the output gradient once, as an operand of both backward "
                "GEMMs, so one format serves both (grad='e5m2' or GradFormats(fmt, fmt)); the "
                "other operands of the backward GEMMs take casts of their own through "
                "fpsim.emulate and Recipe(backward=Backward(grad=, inputs=, weights=)) "
                "(fpsim.emulation.casts, docs/training.md)")

    def backward(self) -> Backward | None:
        """The backward GEMMs' settings: ``dy`` cast to the format (None: nothing rounded)."""
        if self.activation is None:
            return None
        return Backward(grad=Cast(self.activation, rounding=self.rounding,
                                  saturate=self.saturate, srbits=self.srbits))

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
    """What ``quantize_linear_layers`` put under a format: the layers (``modules``), the
    ``fpsim.emulation.Emulation`` that computes them (``emulation``: ``missed``,
    ``report()``), entered around every forward call of the model.  ``restore()`` (or leaving
    a ``with`` block) removes its forward hooks: the model's parameters were never touched."""

    def __init__(self, modules: dict[str, Any], emulation: Any, attached: Any) -> None:
        self.modules = modules
        self.emulation = emulation
        self._attached = attached

    @property
    def names(self) -> list[str]:
        """Qualified names of the layers under the format."""
        return list(self.modules)

    def restore(self) -> None:
        """Take the model out of the emulation (a second call does nothing)."""
        self._attached.remove()
        self.modules = {}

    def __enter__(self) -> "QuantizedLayers":
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()


#: A format every float tensor holds exactly: the weights of a layer whose activations alone
#: are rounded (a Recipe's weights=None means "as the inputs").
_EXACT = "fp64"


def quantize_linear_layers(model: Any, weights: str | Format | None = None,
                           activations: str | Format | None = None, *, rounding: str = "rne",
                           saturate: bool = False, grad: str | Format | GradFormats | None = None,
                           include: Callable[[str, Any], bool] | None = None,
                           srbits: int | None = None) -> QuantizedLayers:
    """Run the products of every ``nn.Linear`` and ``Conv1D`` of ``model`` under
    [``fpsim.emulate``][], with weights, activations and gradients in the given formats.

    One [``fpsim.emulation.Recipe``][] (operands ``activations`` x ``weights`` rounded with
    ``rounding`` / ``saturate`` / ``srbits``; FP32 sums computed in FP64 and rounded once;
    ``backward`` from ``grad``, a format or [``GradFormats``][]) and one
    [``fpsim.emulation.Rules``][] entry per chosen layer (every other op left to torch) make an
    emulation entered around each forward call of ``model``, or of a module inside it called alone
    (forward hooks: ``model.forward(x)`` bypasses them, ``model(x)`` does not).  A product is the
    layer's wherever it runs: in the layer's forward, or anywhere that uses the layer's weight
    (``nn.MultiheadAttention``'s ``out_proj``).  Weights are rounded inside each GEMM, so the
    Parameter itself stays full precision (what the optimizer updates); the backward GEMMs
    (``dx = dy @ W^T``, ``dW = x^T @ dy``, ``W`` as ``[in, out]``) reuse the rounded operands
    (straight through) and round ``dy`` to the gradient format; the bias gradient is ``dy``
    summed in FP64, rounded once (docs/fake-quantization.md: what changed from the earlier
    per-tensor mechanism).  ``include(name, module)`` selects layers (default: all).  Returns
    a handle whose ``restore()`` takes the model back out; it is also a context manager.  No
    other fpsim.emulate context may be active around the model's call (they do not nest).

    >>> import torch
    >>> layer = torch.nn.Linear(2, 1, bias=False)
    >>> with torch.no_grad():
    ...     _ = layer.weight.copy_(torch.tensor([[0.1, 500.0]]))
    >>> x = torch.tensor([[1.0, 1.0]])
    >>> with quantize_linear_layers(layer, weights="e4m3", saturate=True):
    ...     layer(x).tolist()                    # 0.1015625 + 448: E4M3 weights, FP32 sum
    [[448.1015625]]
    >>> layer(x).tolist(), layer.weight.tolist() # restored; the weights never changed
    ([[500.1000061035156]], [[0.10000000149011612, 500.0]])
    """
    from .emulation import Recipe, Rule, Rules, emulate

    if weights is None and activations is None and grad is None:
        raise ValueError("nothing to quantize: pass weights=FMT, activations=FMT and/or grad=FMT")
    for f in (weights, activations):
        if f is not None:
            get_format(f)
    wfmt = _EXACT if weights is None and activations is not None else weights
    recipe = Recipe(activations, wfmt, name="quantize_linear_layers", rounding=rounding,
                    saturate=saturate, srbits=srbits, backward=GradFormats.of(grad).backward())
    chosen = {name: m for name, m in model.named_modules(remove_duplicate=False)  # every alias
              if is_matmul_layer(m) and (include is None or include(name, m))}
    if not chosen:
        raise ValueError(f"no nn.Linear or Conv1D layers with a 2-D weight found in "
                         f"{type(model).__name__} (or none passed include=)")
    rules = Rules([Rule(recipe, path=glob.escape(name), kind=kind)
                   for name in chosen for kind in ("linear", "matmul")], default=None)
    em = emulate(rules)
    return QuantizedLayers(chosen, em, em.attach(model))


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
