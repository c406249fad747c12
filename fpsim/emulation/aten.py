"""The aten level of ``fpsim.emulate``: a ``TorchDispatchMode`` that sees every op after torch
decomposed it, so that no spelling of a product escapes.

An op of ``fpsim.emulation.ops.ATEN`` that reaches it (no Python-level handler computed it:
``torch.tensordot``, ``linalg.multi_dot``, an ``einsum`` of three operands, the linear layers
and attention inside ``nn.MultiheadAttention``, every convolution) is emulated as a site by the
method its entry names, under the recipe the rules give its module, or, when the table names
no method, counted as not emulated (``Interceptor.missed``).  A product whose operand is a
parameter of the current module or one below it is named after that module
(``self_attn.out_proj:linear``), with kind ``linear``.
"""

from __future__ import annotations

import weakref
from typing import Any, ClassVar
from collections.abc import Callable

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from . import conv as convolution
from .ops import ATEN, ATTENTION_KERNELS, AtenOp


def bind(func: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The op's arguments by schema name, defaults filled in."""
    out: dict[str, Any] = {}
    for i, a in enumerate(func._schema.arguments):
        if i < len(args):
            out[a.name] = args[i]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
    return out


def emulates(*ops: str) -> Callable[[Callable], Callable]:
    """Register the decorated ``AtenMode`` method as what emulates the aten ops ``ops``
    (schema names of ``fpsim.emulation.ops.ATEN``), where it is written."""
    def mark(method: Callable) -> Callable:
        method.aten_ops = ops                        # type: ignore[attr-defined]
        return method
    return mark


class AtenMode(TorchDispatchMode):
    """Emulates or names the aten ops of ``ATEN`` for the ``Interceptor`` ``ic``."""

    #: schema name -> the method that emulates it (``emulates``)
    handlers: ClassVar[dict[str, Callable]] = {}

    def __init__(self, ic: Any) -> None:
        super().__init__()
        self._ic = weakref.ref(ic)    # not a cycle: the interceptor frees by reference counting
        self.busy = 0                 # > 0: a Python-level handler is computing (fpsim's ops)

    @property
    def ic(self) -> Any:
        return self._ic()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        entry = ATEN.get(func._schema.name)
        # a backward pass's ops are autograd's gradients, not the model's forward products
        # (emulated product sites compute theirs in fpsim.emulation.backward)
        if entry is None or self.busy or torch._C._current_autograd_node() is not None:
            return func(*args, **kwargs)
        a = bind(func, args, kwargs)
        if entry.training is not None and not a.get(entry.training):
            return func(*args, **kwargs)             # running statistics: elementwise
        out = NotImplemented
        handler = self.handlers.get(func._schema.name)
        if handler is not None and func._overloadname == "default":
            out = handler(self, func, entry, a)
        if out is NotImplemented:
            self.ic.missed(entry, func._schema.name, *args)
            return func(*args, **kwargs)
        return out

    # ---------------------------------------------------------------------------------------
    def _product(self, entry: AtenOp, func: Any, args: dict, a: Tensor, b: Tensor,
                 native: Any, after: Any = None) -> Tensor:
        """``a @ b`` as a site, ``after`` applied to its result (the rest of the op: ``alpha``
        and ``beta``, a vector's shape): named after the module owning ``b`` (or ``a``) as a
        parameter when there is one below the current module (kind ``linear``).  A site the
        rules leave to torch is the whole op, ``func(**args)``, untouched."""
        owner = self.ic.owner(b, a)
        kind, op = ("linear", "linear") if owner is not None else (entry.kind, entry.site)
        if self.ic.left_to_torch(kind, owner):
            return self.ic.untouched(kind, lambda: func(**args), (op, (a, b)), path=owner)
        y = self.ic.product(kind, op, a, b, None, native, owner)
        return y if after is None else after(y)

    @emulates("aten::mm", "aten::bmm")
    def mm(self, func: Any, entry: AtenOp, a: dict) -> Any:
        x, y = a["self"], a["mat2"]
        if not _floating(x, y):
            return NotImplemented
        return self._product(entry, func, a, x, y, lambda: func(x, y))

    @emulates("aten::addmm", "aten::baddbmm")
    def addmm(self, func: Any, entry: AtenOp, a: dict) -> Any:
        """``beta * input + alpha * (m1 @ m2)`` (addmm, baddbmm)."""
        m1 = a["mat1"] if "mat1" in a else a["batch1"]
        m2 = a["mat2"] if "mat2" in a else a["batch2"]
        if not _floating(m1, m2):
            return NotImplemented
        return self._product(entry, func, a, m1, m2, lambda: m1 @ m2, lambda y: _scaled(a, y))

    @emulates("aten::addbmm")
    def addbmm(self, func: Any, entry: AtenOp, a: dict) -> Any:
        """``beta * input + alpha * sum_b (b1[b] @ b2[b])``: one product whose reduction runs
        over the batch and the inner axis together."""
        b1, b2 = a["batch1"], a["batch2"]
        if not _floating(b1, b2):
            return NotImplemented
        n, k = b1.shape[1], b1.shape[0] * b1.shape[2]
        x, y = b1.permute(1, 0, 2).reshape(n, k), b2.reshape(k, b2.shape[2])
        return self._product(entry, func, a, x, y, lambda: x @ y, lambda y: _scaled(a, y))

    @emulates("aten::dot", "aten::vdot")
    def dot(self, func: Any, entry: AtenOp, a: dict) -> Any:
        x, y = list(a.values())[:2]                  # dot(self, tensor), vdot(self, other)
        if not _floating(x, y) or x.is_complex():
            return NotImplemented
        u, v = x[None], y[:, None]
        return self._product(entry, func, a, u, v, lambda: u @ v, lambda y: y[0, 0])

    @emulates("aten::mv")
    def mv(self, func: Any, entry: AtenOp, a: dict) -> Any:
        m, v = a["self"], a["vec"][:, None]
        if not _floating(m, v):
            return NotImplemented
        return self._product(entry, func, a, m, v, lambda: m @ v, lambda y: y[:, 0])

    @emulates("aten::addmv")
    def addmv(self, func: Any, entry: AtenOp, a: dict) -> Any:
        m, v = a["mat"], a["vec"][:, None]
        if not _floating(m, v):
            return NotImplemented
        return self._product(entry, func, a, m, v, lambda: m @ v,
                             lambda y: _scaled(a, y[:, 0]))

    @emulates("aten::convolution")
    def convolution(self, func: Any, entry: AtenOp, a: dict) -> Any:
        """``aten.convolution`` (every conv and transposed conv, any dimension) as an implicit
        GEMM (``fpsim.emulation.conv``)."""
        x, w, bias = a["input"], a["weight"], a["bias"]
        if not _floating(x, w) or x.is_complex():
            return NotImplemented
        ic = self.ic
        path = ic.owner(w)
        if ic.left_to_torch(entry.kind, path):
            return ic.untouched(entry.kind, lambda: func(**a), (entry.site, (x, w)), path=path)
        name, recipe = ic.site(entry.kind, entry.site, path)
        events: dict | None = {} if ic.em.capture or ic.em.watch else None
        geometry = (a["stride"], a["padding"], a["dilation"], a["transposed"],
                    a["output_padding"], a["groups"])
        qw = None
        if events is None and isinstance(w, torch.nn.Parameter):
            key = ("conv", w.data_ptr(), w._version, tuple(w.shape), geometry[3],
                   geometry[5], recipe.cast(recipe.weight_format, -2))
            qw = ic.cache.get(key)
            if qw is None:
                wd = convolution.direct_weight(w, geometry[3], geometry[5])
                qw = ic.cache[key] = convolution.quantize_weights(recipe, wd,
                                                                  geometry[5], None)
        y = convolution.conv(recipe, x, w, bias, *geometry, events=events, qw=qw)
        if recipe is not None and ic.em.watch is not None:    # as a product site's
            ic.em.watch(name, entry.kind, recipe, (x, w) if bias is None else (x, w, bias),
                        events, y)
        if events is not None and ic.em.capture:
            d = {k: v for k, v in a.items()}
            d.update(input=x.double(), weight=w.double(),
                     bias=None if bias is None else bias.double())
            ic.record(name, entry.kind, recipe, (x, w), events, y, ic.reference(lambda: func(**d)))
        return y

    @emulates(*(f"aten::{n}" for n in ATTENTION_KERNELS))
    def attention(self, func: Any, entry: AtenOp, a: dict) -> Any:
        """A fused scaled-dot-product-attention kernel: its output as the Python-level
        decomposition computes it (products ``qk`` and ``pv``); its other outputs (statistics
        for a backward pass) torch's."""
        q, k, v = a["query"], a["key"], a["value"]
        if self.ic.left_to_torch("attention"):
            return self.ic.untouched("attention", lambda: func(**a), ("qk", (q, k)),
                                     ("pv", (v,)))
        mask = a.get("attn_mask", a.get("attn_bias"))
        y = self.ic.attention(None, q, k, v, attn_mask=mask, dropout_p=a.get("dropout_p", 0.0),
                              is_causal=a.get("is_causal", False), scale=a.get("scale"))
        out = func(**a)
        return (y.to(out[0].dtype), *out[1:])


def _scaled(a: dict, y: Tensor) -> Tensor:
    """``beta * input + alpha * y`` as torch defines it (beta 0: input ignored, even NaN)."""
    beta, alpha = a.get("beta", 1), a.get("alpha", 1)
    y = y if alpha == 1 else y * alpha
    if beta == 0:
        return y
    inp = a["self"]
    return y + (inp if beta == 1 else beta * inp)


def _floating(*ts: Any) -> bool:
    return all(isinstance(t, Tensor) and t.is_floating_point() for t in ts)


AtenMode.handlers = {op: fn for fn in vars(AtenMode).values()
                     for op in getattr(fn, "aten_ops", ())}
