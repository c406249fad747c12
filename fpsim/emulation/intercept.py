"""The machinery behind ``fpsim.emulate``: a ``TorchFunctionMode`` that routes each
torch function registered with ``handles`` (on the method that handles it) to
``fpsim.emulation.sites``,
a ``TorchDispatchMode`` (``fpsim.emulation.aten``) that emulates or names the aten ops of
``fpsim.emulation.ops.ATEN`` that no Python-level handler computed, and global module hooks
that say in which module each runs.  Imports torch (``fpsim.emulate`` imports this module when a
context is entered).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, ClassVar, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.modules import module as nn_module
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import (
    _get_current_dispatch_mode,
    _pop_mode_temporarily,
)
from torch.utils.weak import WeakTensorKeyDictionary

from ..arith import compiled
from . import backward, norms, sites
from . import conv as convolution
from .aten import AtenMode
from .grad import guard, wants_grad
from .ops import AtenOp
from .recipe import FP64, Recipe
from .sitestats import SiteStats

Native = Callable[[], Tensor]
#: Right operands other than parameters whose quantization is kept (``sites.Recent``): a
#: decoder step's attention keys and values, its own and the encoder's, for up to 8 layers
RECENT = 32




def handles(*funcs: Any, norm: bool = False) -> Callable[[Callable], Callable]:
    """Register the decorated ``Interceptor`` method as the handler of the torch functions
    ``funcs``, where it is written (as ``torch.utils.flop_counter`` registers each formula);
    ``norm``: it computes norm statistics, whose emulated results have no backward pass."""
    def mark(method: Callable) -> Callable:
        method.torch_functions = (funcs, norm)       # type: ignore[attr-defined]
        return method
    return mark


def handler_table(cls: type) -> dict[Any, tuple[Callable, bool]]:
    """torch function -> (``cls``'s method that handles it, ``norm``), from the registrations
    of ``cls`` and its bases (an override without ``@handles`` keeps its base's functions)."""
    found: dict[Any, tuple[str, bool]] = {}
    for klass in reversed(cls.__mro__):
        for attr, fn in vars(klass).items():
            funcs, norm = getattr(fn, "torch_functions", ((), False))
            found.update({f: (attr, norm) for f in funcs})
    return {f: (getattr(cls, attr), norm) for f, (attr, norm) in found.items()}


class Interceptor(TorchFunctionMode):
    """Computes the sites of whatever runs while it is active under ``em.rules`` (``em``: the
    ``fpsim.emulation.Emulation``, whose ``sites`` it fills when ``em.capture``)."""

    active = False                                # an interceptor is running (they do not nest)
    #: torch function -> (method, norm) (``handles``)
    handlers: ClassVar[dict[Any, tuple[Callable, bool]]] = {}

    def __init__(self, em: Any) -> None:
        super().__init__()
        self.em = em
        self.cache: dict = {}                     # quantized parameters (sites.linear's cache)
        self.recent = sites.Recent(RECENT)        # other right operands quantized lately
        self.scans: dict = {}                     # parameters' amax and non-zeros (``scanned``)
        self.stack: list[str] = []                # module paths of the forward calls under way
        self.names: dict[int, str] = {}           # id(module) -> path from the outermost module
        self.counts: dict[str, int] = {}          # calls per site name in this forward pass
        self.squares = WeakTensorKeyDictionary()  # x.pow(2) results -> x (RMSNorm's statistic)
        self.owners: dict[int, str] = {}          # id(parameter) -> path of the module owning it
        self.emulated = 0                         # sites computed under a recipe so far
        self.hooks: list[Any] = []
        self.aten = AtenMode(self)

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
        self.aten.__enter__()
        self.__enter__()

    def stop(self) -> None:
        try:
            self.__exit__(None, None, None)
            self.aten.__exit__(None, None, None)
        finally:
            for h in self.hooks:
                h.remove()
            Interceptor.active = False

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """The aten mode off while a Python-level handler computes a site (its own arithmetic
        is fpsim's, not the model's)."""
        if _get_current_dispatch_mode() is self.aten:
            with _pop_mode_temporarily():
                yield
        else:                                     # another mode above ours: it sees the ops
            self.aten.busy += 1
            try:
                yield
            finally:
                self.aten.busy -= 1

    def enter_module(self, module: torch.nn.Module, args: Any) -> None:
        if not self.stack:                        # an outermost call: a new forward pass
            if id(module) not in self.names or self.names[id(module)] != "":
                self.names = {id(m): n for n, m in module.named_modules(remove_duplicate=False)}
                self.owners = {id(p): n.rpartition(".")[0]
                               for n, p in module.named_parameters(remove_duplicate=False)}
            self.counts.clear()
        path = self.names.get(id(module))
        if path is None:                          # a module outside the outermost one's tree
            parent = self.stack[-1]
            path = f"{parent}.<{type(module).__name__}>" if parent else type(module).__name__
        self.stack.append(path)

    def leave_module(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self.stack.pop()

    @property
    def path(self) -> str:
        """Module path of the forward call under way ("" outside every module)."""
        return self.stack[-1] if self.stack else ""

    def owner(self, *ts: Any) -> str | None:
        """Path of the current module or one below it that owns one of ``ts`` (or the tensor a
        view of it was taken from) as a parameter: ``self_attn.out_proj`` when
        ``nn.MultiheadAttention`` uses its ``out_proj.weight`` without calling the module, or
        ``mixer.conv1d`` when transformers' hub-kernel wrapper (a module outside the model's
        tree, ``mixer.<Func>``) convolves with ``conv1d.weight``: such a module's path counts
        from its nearest ancestor in the tree."""
        here = self.path.split(".<", 1)[0]
        for t in ts:
            if isinstance(t, Tensor):
                p = self.owners.get(id(t))
                p = self.owners.get(id(t._base)) if p is None and t._base is not None else p
                if p is not None and (p == here or p.startswith(here + ".") or here == ""):
                    return p
        return None

    def site(self, kind: str, op: str, path: str | None = None) -> tuple[str, Recipe | None]:
        """This call's site name and the recipe the rules give it (``path``: the module path,
        by default the current module's)."""
        path = self.path if path is None else path
        base = f"{path}:{op}"
        n = self.counts.get(base, 0) + 1
        self.counts[base] = n
        name = base if n == 1 else f"{base}#{n}"
        index, recipe = self.em.rules.match(path, kind)
        self.em.matched[name] = (index, path, kind)
        if recipe is None:
            return name, None
        self.emulated += 1
        return name, self.em.at_site(name, recipe)

    def missed(self, op: AtenOp, schema: str, *ts: Any) -> None:
        """An op that sums products ran in plain torch although the rules give its kind a
        recipe: count it (``strict``: raise).  Where the rules leave that kind to torch it
        is torch's by choice, not missed."""
        path = self.owner(*ts) or self.path
        if self.left_to_torch(op.kind, path):
            return
        name = f"{path}:{op.site}"
        if self.em.strict:
            raise RuntimeError(
                f"fpsim.emulate(strict=True): {schema} in module {path or '<root>'!r} sums "
                "products and is not emulated (fpsim/emulation/ops.py lists what is); call it "
                "outside the context, or leave strict off to have it named in em.report()")
        st = self.em.missed.get(name)
        if st is None:
            st = self.em.missed[name] = SiteStats(name, op.kind, "not emulated")
        st.calls += 1

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        handler = self.handlers.get(func)
        tracked = wants_grad(args, kwargs)
        before = self.emulated
        if handler is not None:
            method, norm = handler
            calls: list[int] = []

            def native() -> Any:
                calls.append(1)
                return func(*args, **kwargs)

            # products are differentiable (fpsim.emulation.backward); norm statistics are not
            guarded = bool(tracked) and norm
            quiet = torch.no_grad() if guarded else contextlib.nullcontext()
            with self.suspended(), quiet:
                out = method(self, native, *args, **kwargs)
            if out is not NotImplemented:
                if not guarded:
                    return out
                if not calls:                      # emulated: no gradient of torch's to give
                    return guard(out, tracked, self.path or "<root>")
                with self.suspended():             # torch's under no_grad: again, with its
                    return func(*args, **kwargs)   # gradient (the rules left it to torch)
        out = func(*args, **kwargs)                # the aten mode emulates what it can
        return self.guarded(out, tracked, before)

    def guarded(self, out: Any, tracked: list[Tensor], before: int) -> Any:
        """``out``, made to raise on backward when autograd tracks it and a site was emulated
        since ``before`` (``fpsim.emulation.grad.guard``)."""
        if tracked and self.emulated != before:
            return guard(out, tracked, self.path or "<root>")
        return out

    # ---------------------------------------------------------------------------------------
    # Products
    # ---------------------------------------------------------------------------------------
    def product(self, kind: str, op: str, a: Tensor, b: Tensor, bias: Tensor | None,
                native: Native, path: str | None = None, causal: bool = False) -> Tensor:
        """``a @ b (+ bias)`` of site ``op`` under its recipe (``native``: torch's own, for
        sites the rules leave to torch; ``path``: the module path, by default that of the
        module owning ``b`` or ``a`` as a parameter, else the current one's; ``causal``: a
        causal attention's P.V, masked keys skipped, ``fpsim.emulation.sites.causal_matmul``)."""
        name, recipe = self.site(kind, op, self.owner(b, a) if path is None else path)
        if recipe is None and not self.em.capture:
            return native()
        dt = torch.promote_types(a.dtype, b.dtype)
        a, b = a.to(dt), b.to(dt)
        bias = None if bias is None else bias.to(dt)
        events: dict | None = {} if self.em.capture or self.em.watch else None
        if events is not None and not self.em.watch:        # capture alone: no largest sums
            events[sites.SWAMPED_ONLY] = True
        cache = self.cache if _parameter(b) else self.recent if _recurring(b) else None
        if recipe is None:
            y = native()
        elif backward.handles(recipe, a, b, bias):      # gradients, training casts
            y = backward.product(self, name, recipe, a, b, bias, events, cache)
        elif causal:
            y = sites.causal_matmul(recipe, a, b, events)
        elif bias is None and kind != "linear":
            y = sites.matmul(recipe, a, b, events, cache)
        else:
            y = sites.linear(recipe, a, b, bias, events, cache)
        if events is not None and self.em.capture:          # a watch alone records no row
            ref = self.reference(lambda: sites.linear(FP64, a.double(), b.double(),
                                                      None if bias is None else bias.double()))
            self.record(name, kind, recipe, (a, b), events, y, ref)
        if recipe is not None and self.em.watch is not None:
            self.em.watch(name, kind, recipe, (a, b) if bias is None else (a, b, bias), events,
                          y)
        return y

    @handles(F.linear)
    def linear(self, native: Native, input: Tensor, weight: Tensor,
               bias: Tensor | None = None) -> Any:
        if not _floating(input, weight):
            return NotImplemented
        return self.product("linear", "linear", input, weight.t(), bias, native)

    @handles(torch.addmm, Tensor.addmm)
    def addmm(self, native: Native, input: Tensor, mat1: Tensor, mat2: Tensor, *,
              beta: float = 1, alpha: float = 1, out: Any = None) -> Any:
        if beta != 1 or alpha != 1 or out is not None or not _floating(mat1, mat2):
            return NotImplemented
        return self.product("linear", "addmm", mat1, mat2, input, native)

    @handles(torch.matmul, Tensor.matmul, torch.linalg.matmul, Tensor.__matmul__, torch.mm,
             Tensor.mm, torch.bmm, Tensor.bmm)
    def matmul(self, native: Native, a: Tensor, b: Tensor, *, out: Any = None) -> Any:
        if out is not None or not _floating(a, b):
            return NotImplemented
        if a.dim() > 1 and b.dim() > 1:
            return self.product("matmul", "matmul", a, b, None, native)
        if self.left_to_torch("matmul", self.owner(b, a)):
            return self.untouched("matmul", native, ("matmul", (a, b)), path=self.owner(b, a))
        va, vb = a.dim() == 1, b.dim() == 1
        a2, b2 = a[None] if va else a, b[:, None] if vb else b
        y = self.product("matmul", "matmul", a2, b2, None, lambda: a2 @ b2)
        if va and vb:
            return y[..., 0, 0]
        return y[..., 0, :] if va else y[..., 0]

    @handles(Tensor.__rmatmul__)
    def rmatmul(self, native: Native, b: Tensor, a: Tensor) -> Any:
        return self.matmul(native, a, b) if isinstance(a, Tensor) else NotImplemented

    @handles(torch.baddbmm, Tensor.baddbmm)
    def baddbmm(self, native: Native, input: Tensor, b1: Tensor, b2: Tensor, *,
                beta: float = 1, alpha: float = 1, out: Any = None) -> Any:
        if out is not None or not _floating(b1, b2):
            return NotImplemented
        path = self.owner(b2, b1)
        if self.left_to_torch("matmul", path):
            return self.untouched("matmul", native, ("baddbmm", (b1, b2)), path=path)
        y = self.product("matmul", "baddbmm", b1, b2, None, lambda: b1 @ b2)
        y = y if alpha == 1 else y * alpha
        return y if beta == 0 else y + beta * input

    @handles(F.conv1d, F.conv2d, F.conv3d)
    def conv(self, native: Native, input: Tensor, weight: Tensor, bias: Tensor | None = None,
             stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1) -> Any:
        """``F.conv{1,2,3}d`` when a gradient is wanted (emulated backward GEMMs); otherwise
        the aten level emulates ``aten.convolution``."""
        return self._conv(native, input, weight, bias, stride, padding, dilation, False, 0,
                          groups)

    @handles(F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)
    def conv_transpose(self, native: Native, input: Tensor, weight: Tensor,
                       bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
                       output_padding: Any = 0, groups: int = 1, dilation: Any = 1) -> Any:
        """``F.conv_transpose{1,2,3}d``, as ``conv``."""
        return self._conv(native, input, weight, bias, stride, padding, dilation, True,
                          output_padding, groups)

    def _conv(self, native: Native, x: Tensor, w: Tensor, bias: Tensor | None, stride: Any,
              padding: Any, dilation: Any, transposed: bool, output_padding: Any,
              groups: int) -> Any:
        tracked = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (x, w, bias))
        if not (tracked and _floating(x, w)) or x.is_complex():
            return NotImplemented                # the aten level emulates it, forward only
        path = self.owner(w)
        if self.left_to_torch("conv", path):
            return self.untouched("conv", native, ("conv", (x, w)), path=path)
        name, recipe = self.site("conv", "conv", path)
        d = w.dim() - 2
        unbatched = x.dim() == d + 1
        x = x[None] if unbatched else x
        stride, dilation, output_padding = (_per_dim(v, d) for v in
                                            (stride, dilation, output_padding))
        if isinstance(padding, str) and any(s != 1 for s in stride):
            return native()                      # torch's own error: 'same' needs stride 1
        if isinstance(padding, str):            # 'valid' or 'same': pad x here
            total = [0 if padding == "valid" else dl * (k - 1)
                     for dl, k in zip(dilation, w.shape[2:])]
            x = F.pad(x, [p for t in reversed(total) for p in (t // 2, t - t // 2)])
            padding = 0
        padding = _per_dim(padding, d)
        events: dict | None = {} if self.em.capture else None
        y = convolution.trainable(backward.Site(self, name, recipe), x, w, bias, stride,
                                  padding, dilation, transposed, output_padding, groups, events)
        if events is not None:
            ref = self.reference(lambda: torch.ops.aten.convolution(
                x.double(), w.double(), None if bias is None else bias.double(), stride,
                padding, dilation, transposed, output_padding, groups))
            self.record(name, "conv", recipe, (x, w), events, y, ref)
        return y[0] if unbatched else y

    def left_to_torch(self, kind: str, path: str | None = None) -> bool:
        """True when the rules leave ops of ``kind`` at ``path`` (by default the current
        module's) to torch: the handler lets torch compute the whole op (``untouched``),
        captured or not."""
        path = self.path if path is None else path
        return self.em.rules.select(path, kind) is None

    def untouched(self, kind: str, native: Native, *sites: tuple[str, tuple],
                  path: str | None = None) -> Any:
        """torch's own result of a whole op the rules leave to torch (``native()``), its sites
        (``(op, operands)`` pairs) named and, under capture, their operands recorded: capture
        observes, it never reroutes torch's arithmetic."""
        for op, operands in sites:
            name, _ = self.site(kind, op, path)
            if self.em.capture:
                self.record(name, kind, None, operands, {}, None, None)
        return native()

    @handles(torch.linalg.vecdot)
    def vecdot(self, native: Native, x: Tensor, y: Tensor, *, dim: int = -1,
               out: Any = None) -> Any:
        """``linalg.vecdot``: dot products along ``dim`` (torch writes it as a multiply and a
        sum, which the aten level cannot tell from any other sum)."""
        if out is not None or not _floating(x, y) or x.is_complex() or y.is_complex():
            return NotImplemented
        if self.left_to_torch("matmul", self.owner(y, x)):
            return self.untouched("matmul", native, ("vecdot", (x, y)), path=self.owner(y, x))
        a, b = x.movedim(dim, -1)[..., None, :], y.movedim(dim, -1)[..., :, None]
        return self.product("matmul", "vecdot", a, b, None, lambda: a @ b)[..., 0, 0]

    @handles(F.bilinear)
    def bilinear(self, native: Native, input1: Tensor, input2: Tensor, weight: Tensor,
                 bias: Tensor | None = None) -> Any:
        """``F.bilinear`` (``y_o = x1 . W_o . x2 + b_o``) as two products: ``x1`` against
        ``W`` over its first input axis, then each output's row against ``x2``."""
        if not _floating(input1, input2, weight):
            return NotImplemented
        if self.left_to_torch("linear"):
            return self.untouched("linear", native, ("bilinear", (input1, input2, weight)))
        o, i, j = weight.shape
        w = weight.permute(1, 0, 2).reshape(i, o * j)
        u = self.product("linear", "bilinear", input1, w, None, lambda: input1 @ w)
        u = u.reshape(*u.shape[:-1], o, j)
        x2 = input2[..., :, None]
        y = self.product("linear", "bilinear", u, x2, None, lambda: u @ x2)[..., 0]
        return y if bias is None else y + bias

    @handles(torch.einsum)
    def einsum(self, native: Native, equation: str, *operands: Any) -> Any:
        """A two-operand einsum that is a batched matrix product, as that product."""
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
            operands = tuple(operands[0])
        if len(operands) != 2 or not _floating(*operands):
            return NotImplemented
        a, b = operands
        plan = einsum_plan(equation, a, b)
        if plan is None:
            return NotImplemented
        if self.left_to_torch("matmul", self.owner(b, a)):
            return self.untouched("matmul", native, ("einsum", (a, b)), path=self.owner(b, a))
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

    @handles(F.scaled_dot_product_attention)
    def attention(self, native: Native, query: Tensor, key: Tensor, value: Tensor,
                  attn_mask: Tensor | None = None, dropout_p: float = 0.0,
                  is_causal: bool = False, scale: float | None = None,
                  enable_gqa: bool = False) -> Any:
        """scaled_dot_product_attention as its two products (sites ``qk`` and ``pv``), the
        mask and a softmax computed in FP64 (``fpsim.emulation.sites.softmax``); with
        ``is_causal`` the P.V skips the masked keys, as a causal kernel does (an inf/NaN value
        at a later key reaches no earlier query)."""
        if self.left_to_torch("attention"):
            return self.untouched("attention", native, ("qk", (query, key)), ("pv", (value,)))
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
        return self.product("attention", "pv", probs, value, None, lambda: probs @ value,
                            causal=is_causal and dropout_p == 0 and attn_mask is None)

    @handles(torch.softmax, Tensor.softmax, F.softmax)
    def softmax(self, native: Native, input: Tensor, dim: int | None = None, *args: Any,
                **kwargs: Any) -> Any:
        """A softmax over the last axis where attention is emulated: in FP64, rounded once
        (``fpsim.emulation.sites.softmax``, the same on any machine)."""
        if dim not in (-1, input.dim() - 1) or args or kwargs.get("dtype") is not None \
                or not _floating(input) or self.left_to_torch("attention"):
            return NotImplemented
        return sites.softmax(input)

    # ---------------------------------------------------------------------------------------
    # Norm statistics
    # ---------------------------------------------------------------------------------------
    @handles(F.layer_norm, norm=True)
    def layer_norm(self, native: Native, input: Tensor, normalized_shape: Any,
                   weight: Tensor | None = None, bias: Tensor | None = None,
                   eps: float = 1e-5) -> Any:
        if len(tuple(normalized_shape)) != 1 or not _floating(input):
            return NotImplemented
        name, recipe = self.site("norm", "layer_norm")
        self.norm_stats(name, recipe, input, sites.layernorm_stats)
        if recipe is None:
            return native()
        if self.em.watch is None:
            return sites.layernorm(recipe, input, weight, bias, eps)
        events: dict = {}
        y = sites.layernorm(recipe, input, weight, bias, eps, events)
        self.em.watch(name, "norm", recipe, (input,), events, y)
        return y

    @handles(F.batch_norm, norm=True)
    def batch_norm(self, native: Native, input: Tensor, running_mean: Tensor | None,
                   running_var: Tensor | None, weight: Tensor | None = None,
                   bias: Tensor | None = None, training: bool = False, momentum: float = 0.1,
                   eps: float = 1e-5) -> Any:
        """Training-mode batch norm: its per-channel statistics (and the running-stat update)
        under the recipe of a ``norm`` site; with running statistics it sums nothing."""
        if not training or not _floating(input) or input.dim() < 2:
            return NotImplemented
        rows = lambda: input.movedim(1, -1).reshape(-1, input.shape[1]).t()  # noqa: E731
        return self.norm_site("batch_norm", native, rows, lambda r, ev: norms.batch_norm(
            r, input, running_mean, running_var, weight, bias, momentum, eps, ev))

    @handles(F.instance_norm, norm=True)
    def instance_norm(self, native: Native, input: Tensor, running_mean: Tensor | None = None,
                      running_var: Tensor | None = None, weight: Tensor | None = None,
                      bias: Tensor | None = None, use_input_stats: bool = True,
                      momentum: float = 0.1, eps: float = 1e-5) -> Any:
        if not use_input_stats or not _floating(input) or input.dim() < 3:
            return NotImplemented
        rows = lambda: input.reshape(input.shape[0] * input.shape[1], -1)  # noqa: E731
        return self.norm_site("instance_norm", native, rows, lambda r, ev: norms.instance_norm(
            r, input, running_mean, running_var, weight, bias, momentum, eps, ev))

    @handles(F.group_norm, norm=True)
    def group_norm(self, native: Native, input: Tensor, num_groups: int,
                   weight: Tensor | None = None, bias: Tensor | None = None,
                   eps: float = 1e-5) -> Any:
        if not _floating(input) or input.dim() < 2:
            return NotImplemented
        rows = lambda: input.reshape(input.shape[0] * num_groups, -1)  # noqa: E731
        return self.norm_site("group_norm", native, rows, lambda r, ev: norms.group_norm(
            r, input, num_groups, weight, bias, eps, ev))

    def norm_site(self, op: str, native: Native, rows: Callable[[], Tensor],
                  compute: Callable[[Recipe, dict | None], Tensor]) -> Tensor:
        """A norm site whose statistics are those of ``rows()`` (see ``.norms``)."""
        name, recipe = self.site("norm", op)
        if self.em.capture:
            self.norm_stats(name, recipe, rows(), sites.layernorm_stats)
        return native() if recipe is None else compute(recipe, None)

    @handles(F.rms_norm, norm=True)
    def rms_norm(self, native: Native, input: Tensor, normalized_shape: Any,
                 weight: Tensor | None = None, eps: float | None = None) -> Any:
        if len(tuple(normalized_shape)) != 1 or not _floating(input):
            return NotImplemented
        name, recipe = self.site("norm", "rms_norm")
        self.norm_stats(name, recipe, input, sites.sum_squares)
        if recipe is None:
            return native()
        eps = torch.finfo(input.dtype).eps if eps is None else eps
        return sites.rmsnorm(recipe, input, weight, eps)

    @handles(Tensor.pow, torch.pow, Tensor.__pow__)
    def pow(self, native: Native, base: Any, exponent: Any) -> Any:
        y = native()
        if isinstance(exponent, (int, float)) and exponent == 2 and _floating(base):
            self.squares[y] = base
        return y

    @handles(Tensor.mean, torch.mean, norm=True)
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
        self.norm_stats(name, recipe, base, sites.sum_squares)
        if recipe is None:
            return native()
        y = sites.sum_squares(recipe, base) / base.shape[-1]
        return y[..., None] if keepdim else y

    def norm_stats(self, name: str, recipe: Recipe | None, x: Tensor,
                   stat: Callable[..., Any]) -> None:
        """Under capture, record a norm site: its statistic (a sum of squares) under
        ``recipe`` against FP64 (a site torch computes records its operand only).  Computed
        before the site itself, from the same random state (stochastic rounding draws the
        same bits again), so capturing changes no result."""
        if not self.em.capture:
            return
        events: dict = {sites.SWAMPED_ONLY: True}
        if recipe is None:
            self.record(name, "norm", None, (x,), events, None, None)
            return
        with same_random(x.device):
            y = stat(recipe, x, events)
        y = y[1] if isinstance(y, tuple) else y
        self.record(name, "norm", recipe, (x,), events, y,
                    self.reference(lambda: stat(FP64, x.double())))

    # ---------------------------------------------------------------------------------------
    # Capture
    # ---------------------------------------------------------------------------------------
    def reference(self, compute: Callable[[], Any]) -> Any:
        """``compute()`` (a result in FP64, without gradients), or None under
        ``capture="counts"``, which measures no SNR."""
        if not self.em.reference:
            return None
        with torch.no_grad():
            return compute()

    def record(self, name: str, kind: str, recipe: Recipe | None, operands: tuple,
               events: dict, y: Tensor | None, ref: Any) -> None:
        """Add one call of site ``name`` to its ``SiteStats`` (``ref``: the FP64 result, None
        under ``capture="counts"``)."""
        ref = ref[1] if isinstance(ref, tuple) else ref
        st = self.em.sites.get(name)
        if st is None:
            index = self.em.matched[name.split("/")[0]][0]   # a dgrad/wgrad row: its site's
            st = self.em.sites[name] = SiteStats(
                name, kind, None if recipe is None else recipe.name,
                "default" if index is None else f"rule {index}", reference=self.em.reference)
        st.calls += 1
        for x in operands:
            amax, nonzero = self.scanned(x)
            st.amax = max(st.amax, amax)
            st.nonzero += nonzero
        counted = [events[r]["elements"] for r in ("a", "b") if events.get(r)]
        st.elements += sum(counted) if len(counted) == len(operands) \
            else sum(x.numel() for x in operands)        # a convolution counts its patches
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
        if ref is None:                                   # capture="counts": no SNR
            nonfinite, signal, noise = count_nonfinite(y), 0.0, 0.0
        else:
            nonfinite, signal, noise = error_energy(y, ref)
        st.outputs += y.numel()
        st.nonfinite += nonfinite
        st.signal += signal
        st.noise += noise

    def scanned(self, x: Tensor) -> tuple[float, int]:
        """``operand_scan(x)``, kept for a parameter (or a view of one) until it changes: a
        weight is scanned once, not at every call."""
        if not _parameter(x):
            return operand_scan(x)
        key = (x.data_ptr(), tuple(x.shape), x.stride(), x.dtype, x.device)
        found = self.scans.get(key)
        if found is None or found[0] != x._version:         # in-place updates bump it
            found = self.scans[key] = (x._version, *operand_scan(x))
        return found[1], found[2]


def operand_scan(x: Tensor) -> tuple[float, int]:
    """Largest finite magnitude of ``x`` (0.0 if none) and its count of non-zero elements: one
    compiled pass over its bits (``fpsim.arith._jit_kernels.operand_scan``) on the CPU with
    numba, else two passes without temporaries (the inf-norm, ``count_nonzero``) when ``x`` is
    all finite.

    >>> operand_scan(torch.tensor([0.0, -3.0, 2.0, float("inf")]))
    (3.0, 3)
    """
    x = x.detach()
    if not x.numel():
        return 0.0, 0
    bits = sites.kernel_bits(x)
    if bits is not None:
        top, nonzero = compiled.kernels().operand_scan(*bits)
        return sites.bits_value(top, x.dtype), int(nonzero)
    m = float(torch.linalg.vector_norm(x, math.inf))      # max |x|; inf or NaN propagate
    if not math.isfinite(m):                               # inf or NaN among them
        fin = x[torch.isfinite(x)]
        m = float(fin.abs().max()) if fin.numel() else 0.0
    return m, int(torch.count_nonzero(x))


def count_nonfinite(y: Tensor) -> int:
    """The count of inf and NaN in ``y``: one compiled pass over its bits
    (``fpsim.arith._jit_kernels.nonfinite``) on the CPU with numba, else ``torch.isfinite``.

    >>> count_nonfinite(torch.tensor([1.0, float("inf"), float("nan"), -0.0]))
    2
    """
    bits = sites.kernel_bits(y)
    if bits is not None:
        return int(compiled.kernels().nonfinite(*bits))
    return y.numel() - int(torch.isfinite(y).sum())


def error_energy(y: Tensor, ref: Tensor) -> tuple[int, float, float]:
    """Results ``y`` against the FP64 reference ``ref``: the count of results inf/NaN where
    ``ref`` is finite, and over the outputs finite in both the energy of ``ref`` (signal) and
    of ``y - ref`` (noise), each summed in FP64.  On the CPU with numba: one compiled pass
    (``fpsim.arith._jit_kernels.error_energy``); else one difference and two dot products,
    which are finite only when every output is (an inf or NaN in either makes a sum inf or
    NaN), and the masked sums when they are not.

    >>> error_energy(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5], dtype=torch.float64))
    (0, 7.25, 0.25)
    """
    yd, rd = y.detach().reshape(-1), ref.detach().reshape(-1).double()
    if yd.device.type == "cpu" and yd.dtype in (torch.float32, torch.float64) \
            and compiled.available():
        bad, signal, noise = compiled.kernels().error_energy(yd.numpy(), rd.numpy())   # one pass
        return int(bad), float(signal), float(noise)
    d = torch.sub(yd, rd)                                  # FP64: y converted exactly
    signal, noise = float(torch.dot(rd, rd)), float(torch.dot(d, d))
    if math.isfinite(signal) and math.isfinite(noise):
        return 0, signal, noise
    yd = yd.double()
    fin_r, fin_y = torch.isfinite(rd), torch.isfinite(yd)
    both = fin_r & fin_y
    return (int((fin_r & ~fin_y).sum()), float((rd[both] ** 2).sum()),
            float(((yd[both] - rd[both]) ** 2).sum()))


Interceptor.handlers = handler_table(Interceptor)


def same_random(device: Any) -> Any:
    """A context after which torch's random state on ``device`` (and the CPU's) is as it was
    before: a computation made only for the capture draws no bits the model would have."""
    device = torch.device(device)
    devices = [] if device.type == "cpu" else [device]
    return torch.random.fork_rng(devices=devices, device_type=device.type)


def _per_dim(v: Any, d: int) -> list[int]:
    """An int or a sequence of ``d`` ints (a convolution argument) as a list of ``d``."""
    return [int(v)] * d if isinstance(v, int) else [int(i) for i in v]


def _parameter(t: Tensor) -> bool:
    """True for an ``nn.Parameter`` or a view of one (``weight.t()``)."""
    return isinstance(t, torch.nn.Parameter) or isinstance(t._base, torch.nn.Parameter)


def _recurring(t: Tensor) -> bool:
    """Whether a right operand that is no parameter may be kept in ``Interceptor.recent``:
    it has a version counter, which the cache key holds (not an inference tensor), and no
    gradient (a kept quantization would reuse an earlier graph)."""
    return not t.is_inference() and not t.requires_grad


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
