"""The machinery behind :func:`fpsim.emulate`: a ``TorchFunctionMode`` that routes each
matrix-multiply-like op to :mod:`fpsim.emulation.sites`, and global module hooks that say in which module
it runs.  Imports torch (``fpsim.emulate`` imports this module when a context is entered).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.modules import module as nn_module
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakTensorKeyDictionary

from . import backward, sites
from .recipe import FP64, Recipe
from .sitestats import SiteStats

Native = Callable[[], Tensor]


#: torch function -> name of the Interceptor method that handles it.  Names, not bound methods:
#: a dict of bound methods on the instance would be a reference cycle, and every interceptor
#: (with its cache of quantized weights) would then live until the cyclic garbage collector ran.
HANDLERS: dict[Any, str] = {
    F.linear: "linear",
    torch.addmm: "addmm", Tensor.addmm: "addmm",
    torch.matmul: "matmul", Tensor.matmul: "matmul",
    Tensor.__matmul__: "matmul", Tensor.__rmatmul__: "rmatmul",
    torch.mm: "matmul", Tensor.mm: "matmul",
    torch.bmm: "matmul", Tensor.bmm: "matmul",
    torch.baddbmm: "baddbmm", Tensor.baddbmm: "baddbmm",
    torch.einsum: "einsum",
    F.scaled_dot_product_attention: "attention",
    torch.softmax: "softmax", Tensor.softmax: "softmax", F.softmax: "softmax",
    F.layer_norm: "layer_norm",
    F.rms_norm: "rms_norm",
    Tensor.pow: "pow", torch.pow: "pow", Tensor.__pow__: "pow",
    Tensor.mean: "mean", torch.mean: "mean",
}


class Interceptor(TorchFunctionMode):
    """Computes the sites of whatever runs while it is active under ``em.rules`` (``em``: the
    :class:`fpsim.emulation.Emulation`, whose ``sites`` it fills when ``em.capture``)."""

    active = False                                # an interceptor is running (they do not nest)

    def __init__(self, em: Any) -> None:
        super().__init__()
        self.em = em
        self.cache: dict = {}                     # quantized parameters (sites.linear's cache)
        self.stack: list[str] = []                # module paths of the forward calls under way
        self.names: dict[int, str] = {}           # id(module) -> path from the outermost module
        self.counts: dict[str, int] = {}          # calls per site name in this forward pass
        self.squares = WeakTensorKeyDictionary()  # x.pow(2) results -> x (RMSNorm's statistic)
        self.hooks: list[Any] = []

    # ---------------------------------------------------------------------------------------
    # Activation and module paths
    # ---------------------------------------------------------------------------------------
    def start(self) -> None:
        """Register the module hooks and enter the mode (one interceptor at a time: a nested
        one would see the outer one's own arithmetic as the model's)."""
        if Interceptor.active:
            raise RuntimeError("an fpsim.emulate context is already active; they do not nest: "
                               "leave it first, or give one context Rules for every site")
        Interceptor.active = True
        self.hooks = [nn_module.register_module_forward_pre_hook(self.enter_module),
                      nn_module.register_module_forward_hook(self.leave_module, always_call=True)]
        self.__enter__()

    def stop(self) -> None:
        self.__exit__(None, None, None)
        for h in self.hooks:
            h.remove()
        Interceptor.active = False

    def enter_module(self, module: torch.nn.Module, args: Any) -> None:
        if not self.stack:                        # an outermost call: a new forward pass
            if id(module) not in self.names or self.names[id(module)] != "":
                self.names = {id(m): n for n, m in module.named_modules(remove_duplicate=False)}
            self.counts.clear()
        path = self.names.get(id(module))
        if path is None:                          # a module outside the outermost one's tree
            parent = self.stack[-1]
            path = f"{parent}.<{type(module).__name__}>" if parent else type(module).__name__
        self.stack.append(path)

    def leave_module(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self.stack.pop()

    def site(self, kind: str, op: str) -> tuple[str, Recipe | None]:
        """This call's site name and the recipe the rules give it."""
        path = self.stack[-1] if self.stack else ""
        base = f"{path}:{op}"
        n = self.counts.get(base, 0) + 1
        self.counts[base] = n
        return (base if n == 1 else f"{base}#{n}"), self.em.rules.select(path, kind)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = HANDLERS.get(func)
        if name is not None:
            out = getattr(self, name)(lambda: func(*args, **kwargs), *args, **kwargs)
            if out is not NotImplemented:
                return out
        return func(*args, **kwargs)

    # ---------------------------------------------------------------------------------------
    # Products
    # ---------------------------------------------------------------------------------------
    def product(self, kind: str, op: str, a: Tensor, b: Tensor, bias: Tensor | None,
                native: Native) -> Tensor:
        """``a @ b (+ bias)`` of site ``op`` under its recipe (``native``: torch's own, for
        sites the rules leave to torch)."""
        name, recipe = self.site(kind, op)
        if recipe is None and not self.em.capture:
            return native()
        dt = torch.promote_types(a.dtype, b.dtype)
        a, b = a.to(dt), b.to(dt)
        bias = None if bias is None else bias.to(dt)
        events: dict | None = {} if self.em.capture else None
        cache = self.cache if _parameter(b) else None  # only parameters live long enough
        if recipe is None:
            y = native()
        elif backward.handles(recipe, a, b, bias):      # gradients, training casts
            y = backward.product(self, name, recipe, a, b, bias, events, cache)
        elif bias is None and kind != "linear":
            y = sites.matmul(recipe, a, b, events)
        else:
            y = sites.linear(recipe, a, b, bias, events, cache)
        if events is not None:
            with torch.no_grad():
                ref = sites.linear(FP64, a.double(), b.double(),
                                   None if bias is None else bias.double())
            self.record(name, kind, recipe, (a, b), events, y, ref)
        return y

    def linear(self, native: Native, input: Tensor, weight: Tensor,
               bias: Tensor | None = None) -> Any:
        if not _floating(input, weight):
            return NotImplemented
        return self.product("linear", "linear", input, weight.t(), bias, native)

    def addmm(self, native: Native, input: Tensor, mat1: Tensor, mat2: Tensor, *,
              beta: float = 1, alpha: float = 1, out: Any = None) -> Any:
        if beta != 1 or alpha != 1 or out is not None or not _floating(mat1, mat2):
            return NotImplemented
        return self.product("linear", "addmm", mat1, mat2, input, native)

    def matmul(self, native: Native, a: Tensor, b: Tensor, *, out: Any = None) -> Any:
        if out is not None or not _floating(a, b):
            return NotImplemented
        if a.dim() > 1 and b.dim() > 1:
            return self.product("matmul", "matmul", a, b, None, native)
        va, vb = a.dim() == 1, b.dim() == 1
        a2, b2 = a[None] if va else a, b[:, None] if vb else b
        y = self.product("matmul", "matmul", a2, b2, None, lambda: a2 @ b2)
        if va and vb:
            return y[..., 0, 0]
        return y[..., 0, :] if va else y[..., 0]

    def rmatmul(self, native: Native, b: Tensor, a: Tensor) -> Any:
        return self.matmul(native, a, b) if isinstance(a, Tensor) else NotImplemented

    def baddbmm(self, native: Native, input: Tensor, b1: Tensor, b2: Tensor, *,
                beta: float = 1, alpha: float = 1, out: Any = None) -> Any:
        if out is not None or not _floating(b1, b2) or self.left_to_torch("matmul"):
            return NotImplemented
        y = self.product("matmul", "baddbmm", b1, b2, None, lambda: b1 @ b2)
        y = y if alpha == 1 else y * alpha
        return y if beta == 0 else y + beta * input

    def left_to_torch(self, kind: str) -> bool:
        """True when the rules leave ops of ``kind`` in the current module to torch and
        nothing is captured: the handler lets torch compute the whole op."""
        path = self.stack[-1] if self.stack else ""
        return self.em.rules.select(path, kind) is None and not self.em.capture

    def einsum(self, native: Native, equation: str, *operands: Any) -> Any:
        """A two-operand einsum that is a batched matrix product, as that product."""
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
            operands = tuple(operands[0])
        if len(operands) != 2 or not _floating(*operands) or self.left_to_torch("matmul"):
            return NotImplemented
        a, b = operands
        plan = einsum_plan(equation, a, b)
        if plan is None:
            return NotImplemented
        batch, m, k, n, out = plan
        ia, ib = _einsum_inputs(equation)
        size = {**dict(zip(ia, a.shape)), **dict(zip(ib, b.shape))}
        lead = [size[c] for c in batch]
        A = a.permute([ia.index(c) for c in batch + m + k]).reshape(
            *lead, math.prod(size[c] for c in m), math.prod(size[c] for c in k))
        B = b.permute([ib.index(c) for c in batch + k + n]).reshape(
            *lead, math.prod(size[c] for c in k), math.prod(size[c] for c in n))
        y = self.product("matmul", "einsum", A, B, None, lambda: A @ B)
        order = batch + m + n
        y = y.reshape(*lead, *(size[c] for c in m + n))
        return y.permute([order.index(c) for c in out])

    def attention(self, native: Native, query: Tensor, key: Tensor, value: Tensor,
                  attn_mask: Tensor | None = None, dropout_p: float = 0.0,
                  is_causal: bool = False, scale: float | None = None,
                  enable_gqa: bool = False) -> Any:
        """scaled_dot_product_attention as its two products (sites ``qk`` and ``pv``), the
        mask and a softmax computed in FP64 (:func:`fpsim.emulation.sites.softmax`)."""
        if self.left_to_torch("attention"):
            return NotImplemented
        if enable_gqa:
            rep = query.shape[-3] // key.shape[-3]
            key, value = key.repeat_interleave(rep, -3), value.repeat_interleave(rep, -3)
        L, S = query.shape[-2], key.shape[-2]
        scale = 1 / math.sqrt(query.shape[-1]) if scale is None else scale
        kt = key.transpose(-2, -1)
        scores = self.product("attention", "qk", query, kt, None, lambda: query @ kt) * scale
        if is_causal:
            keep = torch.ones(L, S, dtype=torch.bool, device=scores.device).tril()
            scores = scores.masked_fill(~keep, -math.inf)
        if attn_mask is not None:
            scores = (scores.masked_fill(~attn_mask, -math.inf) if attn_mask.dtype == torch.bool
                      else scores + attn_mask)
        probs = sites.softmax(scores)
        if dropout_p > 0:
            probs = F.dropout(probs, dropout_p)
        return self.product("attention", "pv", probs, value, None, lambda: probs @ value)

    def softmax(self, native: Native, input: Tensor, dim: int | None = None, *args: Any,
                **kwargs: Any) -> Any:
        """A softmax over the last axis where attention is emulated: in FP64, rounded once
        (:func:`fpsim.emulation.sites.softmax`, the same on any machine)."""
        if dim not in (-1, input.dim() - 1) or args or kwargs.get("dtype") is not None \
                or not _floating(input) or self.left_to_torch("attention"):
            return NotImplemented
        return sites.softmax(input)

    # ---------------------------------------------------------------------------------------
    # Norm statistics
    # ---------------------------------------------------------------------------------------
    def layer_norm(self, native: Native, input: Tensor, normalized_shape: Any,
                   weight: Tensor | None = None, bias: Tensor | None = None,
                   eps: float = 1e-5) -> Any:
        if len(tuple(normalized_shape)) != 1 or not _floating(input):
            return NotImplemented
        name, recipe = self.site("norm", "layer_norm")
        if recipe is None and not self.em.capture:
            return native()
        if recipe is not None:
            backward.check_norm(name, recipe, input, weight, bias)
        y = native() if recipe is None else sites.layernorm(recipe, input, weight, bias, eps)
        if self.em.capture:
            self.norm_stats(name, recipe, input, sites.layernorm_stats)
        return y

    def rms_norm(self, native: Native, input: Tensor, normalized_shape: Any,
                 weight: Tensor | None = None, eps: float | None = None) -> Any:
        if len(tuple(normalized_shape)) != 1 or not _floating(input):
            return NotImplemented
        name, recipe = self.site("norm", "rms_norm")
        if recipe is None and not self.em.capture:
            return native()
        eps = torch.finfo(input.dtype).eps if eps is None else eps
        if recipe is not None:
            backward.check_norm(name, recipe, input, weight)
        y = native() if recipe is None else sites.rmsnorm(recipe, input, weight, eps)
        if self.em.capture:
            self.norm_stats(name, recipe, input, sites.sum_squares)
        return y

    def pow(self, native: Native, base: Any, exponent: Any) -> Any:
        y = native()
        if isinstance(exponent, (int, float)) and exponent == 2 and _floating(base):
            self.squares[y] = base
        return y

    def mean(self, native: Native, input: Any, dim: Any = None, keepdim: bool = False, *,
             dtype: Any = None, out: Any = None) -> Any:
        """``x.pow(2).mean(-1)`` (RMSNorm as Hugging Face writes it) as the dot product
        ``x . x / n`` under the recipe of a ``rms_norm`` site."""
        base = self.squares.get(input) if isinstance(input, Tensor) else None
        dims = dim if isinstance(dim, (list, tuple)) else (dim,)
        if base is None or dtype is not None or out is not None or len(dims) != 1 \
                or dims[0] not in (-1, input.dim() - 1):
            return NotImplemented
        name, recipe = self.site("norm", "rms_norm")
        if recipe is None and not self.em.capture:
            return native()
        if recipe is None:
            y = native()
        else:
            y = sites.sum_squares(recipe, base) / base.shape[-1]
            y = y[..., None] if keepdim else y
        if self.em.capture:
            self.norm_stats(name, recipe, base, sites.sum_squares)
        return y

    def norm_stats(self, name: str, recipe: Recipe | None, x: Tensor,
                   stat: Callable[..., Any]) -> None:
        """Capture a norm site: its statistic (a sum of squares) under ``recipe`` against
        FP64 (a site torch computes records its operand only)."""
        events: dict = {}
        if recipe is None:
            self.record(name, "norm", None, (x,), events, None, None)
            return
        y = stat(recipe, x, events)
        y = y[1] if isinstance(y, tuple) else y
        self.record(name, "norm", recipe, (x,), events, y, stat(FP64, x.double()))

    # ---------------------------------------------------------------------------------------
    # Capture
    # ---------------------------------------------------------------------------------------
    def record(self, name: str, kind: str, recipe: Recipe | None, operands: tuple,
               events: dict, y: Tensor | None, ref: Any) -> None:
        """Add one call of site ``name`` to its :class:`SiteStats`."""
        ref = ref[1] if isinstance(ref, tuple) else ref
        st = self.em.sites.get(name)
        if st is None:
            st = self.em.sites[name] = SiteStats(name, kind, None if recipe is None
                                                 else recipe.name)
        st.calls += 1
        for x in operands:
            x = x.detach()
            fin = x[torch.isfinite(x)]
            st.elements += x.numel()
            st.amax = max(st.amax, float(fin.abs().max()) if fin.numel() else 0.0)
        for role in ("a", "b"):
            ev = events.get(role)
            if ev is not None:
                st.overflow += ev["overflow"]
                st.saturated += ev["saturated"]
                st.flushed += ev["flushed"]
        if "accum" in events:
            st.swamped = (st.swamped or 0) + events["accum"]["swamped"]
        if y is None:
            return
        yd, rd = y.detach().double().reshape(-1), ref.detach().reshape(-1)
        fin_r, fin_y = torch.isfinite(rd), torch.isfinite(yd)
        both = fin_r & fin_y
        st.outputs += yd.numel()
        st.nonfinite += int((fin_r & ~fin_y).sum())
        st.signal += float((rd[both] ** 2).sum())
        st.noise += float(((yd[both] - rd[both]) ** 2).sum())


def _parameter(t: Tensor) -> bool:
    """True for an ``nn.Parameter`` or a view of one (``weight.t()``)."""
    return isinstance(t, torch.nn.Parameter) or isinstance(t._base, torch.nn.Parameter)


def _floating(*ts: Any) -> bool:
    return all(isinstance(t, Tensor) and t.is_floating_point() for t in ts)


def _einsum_inputs(equation: str) -> tuple[str, str]:
    ia, ib = equation.replace(" ", "").split("->")[0].split(",")
    return ia, ib


def einsum_plan(equation: str, a: Tensor, b: Tensor) -> tuple[list, list, list, list, str] | None:
    """How the einsum ``equation`` of ``a`` and ``b`` is one batched product: its batch, row,
    reduction and column indices and the output's; None when it is not (ellipsis, repeated or
    summed-out indices, broadcast batch sizes)."""
    eq = equation.replace(" ", "")
    if "." in eq or eq.count(",") != 1:
        return None
    ia, ib = _einsum_inputs(eq)
    out = eq.split("->")[1] if "->" in eq else "".join(
        sorted(c for c in set(ia + ib) if (ia + ib).count(c) == 1))
    if any(len(set(s)) != len(s) for s in (ia, ib, out)) \
            or (len(ia), len(ib)) != (a.dim(), b.dim()):
        return None
    batch = [c for c in ia if c in ib and c in out]
    k = [c for c in ia if c in ib and c not in out]
    m = [c for c in ia if c not in ib]
    n = [c for c in ib if c not in ia]
    if any(c not in out for c in m + n) or any(c not in ia + ib for c in out):
        return None
    if any(a.shape[ia.index(c)] != b.shape[ib.index(c)] for c in batch + k):
        return None
    return batch, m, k, n, out
