"""``fpsim.emulate``: run any PyTorch model's dot products under a recipe, and measure them.

Inside ``with fpsim.emulate(recipe) as em:`` every op that sums products is computed by
``fpsim.emulation.sites`` under the recipe that ``Rules`` selects for it: operands
rounded to the recipe's formats, summed in its accumulator and order (``fpsim.matmul``),
the result written in its output format.  Which ops those are is one table,
``fpsim.emulation.ops``: linear layers, every matmul spelling, convolutions (as implicit
GEMMs, ``fpsim.emulation.conv``), the Q.K^T and P.V of attention (its softmax in FP64,
rounded once), and, where a ``Rule(..., kind="norm")`` asks, the statistics of layer / RMS /
batch / group / instance norms (docs/emulate.md; otherwise norms are torch's own).  An op of that table that fpsim does not emulate is counted in
``em.missed`` and shown as a "not emulated" row, warned about at exit, and raises under
``strict=True``.  Each op is a *site* named ``"<module path>:<op>"``
(``"transformer.h.0.attn.c_attn:addmm"``, ``"model.layers.1.self_attn:qk"``); the module path
comes from forward pre-hooks on every module (or the module owning a parameter operand), and a
module that calls the same op again in one forward pass gets ``#2``, ``#3``...  With
``capture=True`` the context also keeps per-site statistics (``SiteStats``: operand amax,
overflowed / saturated / flushed operand elements, SNR of the result against FP64 arithmetic
on the same operands, swamped additions of an emulated accumulator) in ``em.sites``;
``em.table()`` lists them with the rule that chose each recipe.  ``capture="counts"`` records
the same statistics except the SNR: no FP64 reference is computed, which halves capture's cost
where that reference GEMM dominates it (a CPU's FP64 GEMM runs at half its FP32 rate, most
GPUs' at 1/64 or less); its ``nonfinite`` counts every inf/NaN result.

``em.attach(model)`` enters the context around every forward call of ``model`` instead of a
``with`` block (``fpsim.nn.quantize_linear_layers`` is built on it).

Product sites are differentiable: where a gradient is wanted, ``fpsim.emulation.backward``
computes each one's input- and weight-gradient GEMMs under the recipe's ``backward``
settings (see ``fpsim.emulation.presets`` for the published training recipes).  Emulated
norm statistics and convolutions have no backward pass: a result of theirs that autograd
tracks raises on backward (``fpsim.emulation.grad``).  Quantized weights are cached per
context (keyed by storage, shape and version, so an in-place update invalidates them).  torch
is imported when a context is entered, never by ``import fpsim``.
"""

from __future__ import annotations

import warnings
from typing import Any

from ..inputs import check_flag
from .recipe import Recipe, Rules
from .sitestats import COLUMNS, SiteStats


#: The last line of a report made without capture.
NOT_CAPTURED = ("(no per-site statistics: this context was made without capture=True; "
                "fpsim.emulate(..., capture=True) records them)")


class Emulation:
    """The context ``emulate`` returns: enter it to emulate, read ``sites`` after.

    ``sites`` maps a site name to its ``SiteStats``, in the order the sites were first
    called (filled with ``capture=True``).  ``missed`` maps ``"<module path>:<op>"`` to the
    calls of ops that sum products and ran in plain torch, not emulated (always filled; empty
    when everything was emulated or left to torch by the rules).  ``matched`` maps each site
    to ``(index of the rule that chose its recipe or None for the default, path, kind)``.

    ``watch``: called after each forward call of a product or layer-norm site that a recipe
    computed, as ``watch(site, kind, recipe, operands, events, result)`` (``operands``: a
    product's ``(a, b)``, with its bias third where it adds one, or a layer norm's
    ``(input,)``; ``events``: each operand's elements counted, overflowed, saturated and
    flushed, as ``capture`` counts them, under keys ``"a"`` and ``"b"``); it sees every
    element, where ``capture`` keeps sums only.
    """

    def __init__(self, rules: Rules, capture: bool | str, strict: bool = False,
                 watch: Any = None, amax: dict[str, dict[str, float]] | None = None) -> None:
        self.rules = rules
        #: whether per-site statistics are recorded, and (``reference``) the SNR against FP64
        mode = capture_mode(capture)
        self.capture = mode is not False
        self.reference = mode is True
        self.strict = strict
        self.watch = watch
        #: per-site scaling's calibration: site -> {"a": amax, "b": amax} (``Calibration``)
        self.amax = amax
        self._at_site: dict[tuple[str, Recipe], Recipe] = {}
        self.sites: dict[str, SiteStats] = {}
        self.missed: dict[str, SiteStats] = {}
        self.matched: dict[str, tuple[int | None, str, str]] = {}
        #: delayed scaling: (site, tensor) -> its AmaxHistory (``x``, ``w``, ``dy``), kept
        #: from call to call and step to step while this object lives
        self.histories: dict[tuple[str, str], Any] = {}
        self._state: Any = None

    def __enter__(self) -> "Emulation":
        if self._state is not None:
            raise RuntimeError("this fpsim.emulate context is already active; make a new one")
        from .intercept import Interceptor   # imports torch

        state = Interceptor(self)
        state.start()
        self._state = state
        return self

    def __exit__(self, *exc: Any) -> None:
        state, self._state = self._state, None
        state.stop()
        if self.missed:
            calls = sum(s.calls for s in self.missed.values())
            names = ", ".join(list(self.missed)[:5]) + (", ..." if len(self.missed) > 5 else "")
            warnings.warn(f"fpsim.emulate: {calls} call(s) of ops that sum products ran in "
                          f"plain torch, not emulated: {names} (rows 'not emulated' in "
                          "em.report(); strict=True raises at the first)", stacklevel=2)
        for text in self.shadowed():
            warnings.warn(f"fpsim.emulate: {text}", stacklevel=2)

    def attach(self, module: Any) -> "Attached":
        """Run every forward call of ``module``, or of any module inside it, within this
        context, without a ``with`` block: entered when the outermost such call starts, left
        when it returns; module paths always count from ``module``.  The backward GEMMs of the
        sites it ran need no context.  Returns a handle whose ``remove()`` detaches it.

        >>> import torch
        >>> layer = torch.nn.Linear(2, 1, bias=False)
        >>> with torch.no_grad():
        ...     _ = layer.weight.copy_(torch.tensor([[1.0, 1.0]]))
        >>> hooks = emulate(Recipe("e2m1")).attach(layer)
        >>> layer(torch.tensor([[1.2, 2.6]])).tolist()    # 1 + 3: operands rounded to E2M1
        [[4.0]]
        >>> hooks.remove(); layer(torch.tensor([[1.2, 2.6]])).tolist()
        [[3.799999952316284]]
        """
        return Attached(self, module)

    def shadowed(self) -> list[str]:
        """Rules that matched no site although a site they match ran: an earlier rule took
        it (README's old example: ``kind='linear'`` before ``path='lm_head'``)."""
        used = {index for index, _, _ in self.matched.values()}
        out = []
        for j, rule in enumerate(self.rules.rules):
            if j in used:
                continue
            taken = next(((name, index) for name, (index, path, kind) in self.matched.items()
                          if rule.matches(path, kind)), None)
            if taken is not None:
                out.append(f"rule {j} ({rule.describe()}) matched no site: {taken[0]} went to "
                           f"rule {taken[1]}, which comes first")
        return out

    def table(self) -> list[dict[str, Any]]:
        """One row per site (``COLUMNS``), in the order the sites were first called, then
        one per op that ran not emulated (recipe ``"not emulated"``)."""
        return [s.row() for s in (*self.sites.values(), *self.missed.values())]

    def at_site(self, site: str, recipe: Recipe) -> Recipe:
        """``recipe`` at ``site``: itself, or with ``scaling="site"`` its operands scaled by
        the site's calibrated amax (``Recipe.at_site``); raises when this context has none
        for the site."""
        if recipe.scaling != "site":
            return recipe
        found = self._at_site.get((site, recipe))
        if found is None:
            amax = (self.amax or {}).get(site)
            if amax is None:
                raise ValueError(
                    f"recipe {recipe.name!r} scales per site and site {site!r} has no "
                    f"calibrated amax (fpsim.emulate(..., amax=) holds {len(self.amax or {})} "
                    "sites): record them with watch=fpsim.emulation.Calibration() on the same "
                    "model, over inputs that reach every site")
            found = self._at_site[(site, recipe)] = recipe.at_site(amax)
        return found

    def amax_history(self, site: str) -> dict[str, dict[str, Any]]:
        """Delayed scaling state of ``site``: per tensor (``x``, ``w``, ``dy``) its amax
        history (oldest first) and the scale its next call uses."""
        found = {role: h.state() for (name, role), h in self.histories.items() if name == site}
        if not found:
            known = sorted({name for name, _ in self.histories})
            raise KeyError(f"no delayed-scaling state for site {site!r}; sites with one: "
                           f"{known[:5]}")
        return found

    def report(self) -> str:
        """``table`` as aligned plain text; without ``capture=True`` a last line says
        that per-site statistics were not recorded (only ops not emulated are listed)."""
        rows = [[_cell(r[c]) for c in COLUMNS] for r in self.table()]
        widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c)
                  for i, c in enumerate(COLUMNS)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths))]
        lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows]
        if not self.capture:
            lines.append(NOT_CAPTURED)
        return "\n".join(lines)


class Attached:
    """What ``Emulation.attach`` installed: two forward hooks on a module and on each
    module inside it."""

    def __init__(self, em: Emulation, root: Any) -> None:
        self.em, self.root, self.depth = em, root, 0    # depth: hooked calls under way
        self.hooks = [h for m in root.modules()
                      for h in (m.register_forward_pre_hook(self.enter),
                                m.register_forward_hook(self.leave, always_call=True))]

    def enter(self, module: Any, args: Any) -> None:
        if self.depth == 0:
            self.em.__enter__()
            # the context's module hooks start after this call began: push the root (its
            # paths) and, when the call is one of a module inside it, that module's path
            self.em._state.enter_module(self.root, args)
            if module is not self.root:
                self.em._state.enter_module(module, args)
        self.depth += 1

    def leave(self, module: Any, args: Any, output: Any) -> None:
        if self.depth == 0:                       # the call failed before entering
            return
        self.depth -= 1
        if self.depth == 0:
            self.em.__exit__(None, None, None)

    def remove(self) -> None:
        """Remove the hooks (a second call does nothing)."""
        for h in self.hooks:
            h.remove()
        self.hooks = []


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


class Calibration:
    """A ``watch`` of ``emulate`` that records, per site, the largest finite magnitude of
    each operand over every call it sees (``amax``: site -> ``{"a": ..., "b": ...}``; a norm
    site has ``"a"`` only): the calibration that ``scaling="site"`` reads from
    ``emulate(..., amax=)``.

    >>> import torch
    >>> layer = torch.nn.Linear(2, 1, bias=False)
    >>> _ = layer.weight.data.fill_(15.0)
    >>> cal = Calibration()
    >>> with emulate(Recipe(), watch=cal):
    ...     _ = layer(torch.tensor([[720.0, -1.0]]))
    >>> cal.amax
    {':linear': {'a': 720.0, 'b': 15.0}}
    >>> with emulate(Recipe("e4m3_ieee", scaling="site"), amax=cal.amax):   # scales 3, 1/16
    ...     layer(torch.tensor([[7.0, 0.0]])).item()     # 7 / 3 rounds to 2.25: 6.75 * 15
    101.25
    """

    def __init__(self) -> None:
        self.amax: dict[str, dict[str, float]] = {}

    def __call__(self, site: str, kind: str, recipe: Any, operands: tuple, events: Any,
                 result: Any) -> None:
        from .intercept import operand_scan

        seen = self.amax.setdefault(site, {})
        for role, x in zip(("a", "b"), operands[:2]):
            seen[role] = max(seen.get(role, 0.0), operand_scan(x)[0])


def capture_mode(capture: Any) -> bool | str:
    """``emulate``'s ``capture``: True, False or ``"counts"`` (the statistics without the FP64
    reference, so without SNR); anything else is refused, naming the three.

    >>> capture_mode("counts"), capture_mode(1)
    ('counts', True)
    """
    if isinstance(capture, str) and capture == "counts":
        return "counts"
    try:
        return check_flag(capture, "capture")
    except TypeError:
        raise TypeError(f"capture={capture!r}: pass True (statistics with SNR against FP64), "
                        "'counts' (the same without the FP64 reference) or False") from None


def emulate(recipe: Recipe | Rules | str, *, capture: bool | str = False,
            strict: bool = False, watch: Any = None,
            amax: dict[str, dict[str, float]] | None = None) -> Emulation:
    """A context manager that computes every dot-product site of any PyTorch model under
    ``recipe`` (one ``fpsim.emulation.recipe.Recipe`` for all product sites, or
    ``fpsim.emulation.recipe.Rules`` selecting per module path and op kind, or the name
    of a preset of ``fpsim.emulation.presets``: ``"native"`` is torch's own arithmetic bit
    for bit, ``"torchao-float8-tensorwise"``... on the linear layers); with
    ``capture`` it also records per-site statistics (``"counts"``: all but the SNR, which
    needs an FP64 reference of every result).  An op that sums products and that fpsim
    does not emulate is named in ``em.missed`` / ``em.report()`` and warned about at exit;
    with ``strict`` it raises instead, naming op and module; ``watch`` is called on each
    emulated call (``Emulation``); ``amax``: per site, the calibrated operand amaxes that a
    recipe with ``scaling="site"`` scales by (``Calibration`` records them).  See the module
    docstring for the ops caught and how sites are named, docs/emulate.md for the whole story.

    >>> with fpsim.emulate(Recipe("e4m3", scaling="tensor"), capture=True) as em:
    ...     logits = model(ids)
    >>> print(em.report())
    """
    if isinstance(recipe, str):
        from .presets import PRESETS, rules
        try:
            recipe = rules(recipe)
        except ValueError:
            raise ValueError(
                f"fpsim.emulate({recipe!r}): a name is a preset ({', '.join(PRESETS)}); for "
                f"operands in a format pass a Recipe: fpsim.emulate(Recipe({recipe!r}))") from None
    if watch is not None and not callable(watch):
        raise TypeError(f"fpsim.emulate(watch=...) takes a function of (site, kind, recipe, "
                        f"operands, events, result), not {type(watch).__name__}")
    return Emulation(Rules.of(recipe), capture,
                     check_flag(strict, "strict"), watch, amax)
