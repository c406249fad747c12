"""Recipes: how each dot-product site of a network is computed (NumPy only, no torch).

A ``Recipe`` names the operand formats, the scaling that maps operands into them, the
accumulator (format, summation order, chunk) and the format the result is written in.
``Rules`` picks a recipe per site of any model: by glob on the module path (``"*.attn*"``)
and by op kind (``KINDS``), first match wins.  ``fpsim.emulate`` runs a PyTorch model under
them; the experiments use the same recipes on GPT-2.  The arithmetic itself (torch) is in
``fpsim.emulation.sites``.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

from .. import mx
from ..arith.accumulator import NATIVE_ORDERS, Accumulator
from ..blockrules import is_block_format_name
from ..formats import Format, get_format
from ..inputs import check_flag
from ..rounding import check_mode, check_saturate
from ..stochastic import check_srbits
from .casts import SCALINGS as CAST_SCALINGS
from .casts import Backward, Cast

#: The scalings a Recipe's ``scaling=`` takes (those of ``fpsim.emulation.casts.SCALINGS``
#: that need no per-site state); the others go in a ``Cast`` operand.
SCALINGS = tuple(name for name, s in CAST_SCALINGS.items() if s.recipe)
TILE = 128  # DeepSeek-V3 fine-grained scaling: 1 x TILE activations, TILE x TILE weights
NATIVE = ("fp32", "fp64")  # accumulators summed in FP64 by torch and rounded once to themselves
#: How a native FP32 accumulator is summed (``Recipe.native_sums``): "fp64" in FP64 and rounded
#: once (the same bits on every thread count, and on every machine where torch's BLAS sums in
#: one order: MKL_CBWR=COMPATIBLE), "host" by the host's own FP32 GEMM (not reproducible).
NATIVE_SUMS = ("fp64", "host")
#: Op kinds a ``Rule`` selects: ``linear`` (F.linear, addmm, F.bilinear, any product with a
#: module's parameter: a layer's product and bias), ``matmul`` (matmul / @ / mm / bmm / baddbmm /
#: einsum / dot / mv / tensordot ...), ``conv`` (every convolution), ``attention`` (the Q.K^T and
#: P.V of scaled_dot_product_attention), ``norm`` (layer / RMS / batch / group / instance norm
#: statistics).  The ops of each: ``fpsim.emulation.ops``.
KINDS = ("linear", "matmul", "conv", "attention", "norm")
FormatLike = str | Format


def _block_name(fmt: Any) -> bool:
    """True for the name of an MX / NVFP4 block format (or an alias: ``"mxfp8"``)."""
    return is_block_format_name(fmt)


def format_name(fmt: FormatLike | Cast | None) -> str | None:
    """Name of a scalar or block format, label of a ``Cast`` (None stays None)."""
    if isinstance(fmt, Cast):
        return fmt.describe()
    return None if fmt is None else (fmt if isinstance(fmt, str) else fmt.name)


@dataclass(frozen=True)
class Recipe:
    """How a dot-product site is computed.

    The formats are the positional arguments: ``Recipe("e4m3")`` rounds both operands to E4M3,
    ``Recipe("e4m3", "e5m2")`` the left one to E4M3 and the right one to E5M2, ``Recipe()`` is
    plain FP32; everything else is keyword-only.  ``name`` (keyword) labels the recipe in reports;
    without it the name is derived from the fields ([``describe``][]: ``"e4m3/tensor"``,
    ``"bf16 out=bf16"``, ``"fp32 acc=fp16 sequential"``).

    ``inputs``: format of the activation operand (None keeps FP32); ``weights``: format of the
    second operand (None: the same as ``inputs``).  ``scaling``: ``none``, per-``tensor`` or
    per-``channel`` amax scaling (scale = amax / format max in FP32 from the tensor itself at
    every call: "current" scaling, which cannot overflow; delayed scaling is in ``practice``) or
    ``block`` (``inputs`` is an MX / NVFP4 name of ``fpsim.mx``; ``scale_rounding`` its
    scale rule, None: the OCP floor; a block format implies it: ``Recipe("nvfp4")``) or ``tile`` (DeepSeek-V3: one scale per 1 x 128 tile of
    the left operand and per 128 x 128 block of the right one, along the reduction axis).
    ``accum``, ``order``, ``chunk``, ``tensor_core``, ``native_sums``: shorthand for the
    accumulator, an [``fpsim.Accumulator``][] ([``accumulator``][] gives it; ``accum`` may be
    one, the others then stay at their defaults); ``order=None`` with an
    FP32/FP64 accumulator is torch's native matmul, anything else goes through
    [``fpsim.matmul``][] (``tensor_core``: a preset of ``fpsim.arith.TENSOR_CORES``, with
    ``order="tensor_core"``).  ``output``: the
    format the result is rounded to (None keeps it).  ``saturate``: clamp overflow to the
    largest finite value instead of inf/NaN (operands without scaling and the output).
    ``pow2``: the scales of a ``tensor``, ``channel`` or ``site`` scaling rounded up to a power
    of two (the smallest that keeps the amax within the format; ``Cast``'s ``pow2``).
    ``rounding``: the rounding mode of operands, accumulator and output; ``srbits``: its number
    of random bits when stochastic (None: every dropped bit; e.g. ``rounding="stochastic",
    srbits=8``, docs/stochastic.md).  ``flush``: False keeps nonzero operand values that round
    to zero at their FP32 value (an ablation that removes underflow, not a real format).
    ``full_subnormals``: values below the smallest normal that do not flush keep the format's
    full mantissa width, as if its exponent range went on downwards (an ablation that removes the precision subnormals lose; needs
    ``scaling='none'`` and a floating-point format).  ``native_sums``: how a native FP32
    accumulator (``accum="fp32"``, ``order=None``) sums: ``"fp64"`` (default) in FP64, rounded
    once to FP32: deterministic, the same bits on every thread count, and on every machine
    when torch's BLAS sums in a fixed order (MKL picks its kernels by CPU unless
    ``MKL_CBWR=COMPATIBLE`` is set before its first call, as ``fpsim_experiments`` and the
    tests do: FP64 sums of wide-range operands are not exact, so their order can move the
    FP32 result by an ulp);
    ``"host"``: torch's own FP32 matmul, as fast as the host's GEMM but NOT deterministic (its
    summation order, hence its bits, depend on the machine, the BLAS library and the thread
    count), the bias added to its FP32 result afterwards (with torch's own gradient), as
    torchao's emulation does, e.g. ``Recipe("e4m3", scaling="tensor", native_sums="host",
    name="fast")``.

    Training: ``inputs`` / ``weights`` may be a [``fpsim.emulation.casts.Cast``][] (its own
    scaling: Transformer Engine / torchao scaled casts, delayed scaling, NVFP4 2-D blocks;
    ``scaling`` stays ``none``); ``backward`` (a [``fpsim.emulation.casts.Backward``][]) sets
    the input- and weight-gradient GEMMs (None: gradients unquantized, the forward's operand
    settings re-applied along each GEMM's reduction axis, the forward's accumulator).  The
    published recipes are in [``fpsim.emulation.presets``][].
    """

    inputs: FormatLike | None = None
    weights: FormatLike | None = None
    _: dataclasses.KW_ONLY
    name: str = ""
    scaling: str = "none"
    accum: str | Accumulator = "fp32"
    order: str | None = None
    chunk: int | None = None
    tensor_core: str | None = None
    output: FormatLike | None = None
    saturate: bool = False
    pow2: bool = False
    rounding: str = "rne"
    flush: bool = True
    scale_rounding: str | None = None
    full_subnormals: bool = False
    srbits: int | None = None
    native_sums: str = "fp64"
    backward: Backward | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"Recipe name must be a string, got {self.name!r}")
        check_saturate(self.saturate)
        check_srbits(self.srbits, check_mode(self.rounding))
        for flag in ("flush", "full_subnormals", "pow2"):     # "no" would count as True
            check_flag(getattr(self, flag), flag)
        if isinstance(self.accum, Accumulator):
            self._unpack(self.accum)
        if self.native_sums not in NATIVE_SUMS:
            raise ValueError(f"recipe {self.name!r}: native_sums {self.native_sums!r} is not one "
                             f"of {NATIVE_SUMS}")
        if self.order in NATIVE_ORDERS:
            raise ValueError(f"recipe {self.name!r}: order={self.order!r} is spelled order=None"
                             + (", native_sums='host'" if self.order == "host" else ""))
        if self.native_sums == "host" and self.order is not None:
            raise ValueError(f"recipe {self.name!r}: native_sums='host' is torch's own FP32 "
                             "matmul: it needs accum='fp32' and order=None")
        try:
            self.accumulator()
        except (ValueError, TypeError) as e:
            raise type(e)(f"recipe {self.name!r}: {e}") from None
        accum = get_format(self.accum).name
        if accum in NATIVE:                          # "FP32", "float32": torch's native sum too
            object.__setattr__(self, "accum", accum)
        if self.scaling == "none" and any(_block_name(f) for f in (self.inputs, self.weights)):
            object.__setattr__(self, "scaling", "block")    # a block format's only scaling
        if self.scaling not in SCALINGS:
            raise ValueError(
                f"recipe {self.name!r}: scaling {self.scaling!r} is not one of {SCALINGS}"
            )
        if self.backward is not None and not isinstance(self.backward, Backward):
            raise TypeError(f"recipe {self.name!r}: backward= takes a Backward, not "
                            f"{self.backward!r}")
        if self.pow2 and not CAST_SCALINGS[self.scaling].pow2:
            takes = " or ".join(repr(k) for k in SCALINGS if CAST_SCALINGS[k].pow2)
            raise ValueError(f"recipe {self.name!r}: pow2=True rounds the scales of a "
                             f"{takes} scaling to powers of two, and "
                             f"scaling={self.scaling!r} has none to round")
        casts = [f for f in (self.inputs, self.weights) if isinstance(f, Cast)]
        if casts and (self.scaling != "none" or self.full_subnormals or not self.flush
                      or self.pow2):
            raise ValueError(f"recipe {self.name!r}: a Cast operand carries its own scaling "
                             "and ablations; leave scaling='none', full_subnormals and flush "
                             "as they are (give the Cast full_subnormals=True or flush=False)")
        for fmt in (self.inputs, self.weights):
            if fmt is None or isinstance(fmt, Cast):
                continue
            if self.scaling == "block":
                mx.get_mx_format(fmt)
            elif _block_name(fmt):
                raise ValueError(
                    f"recipe {self.name!r}: {fmt} is a block format, scaled by its blocks; "
                    f"leave scaling out (scaling={self.scaling!r} does not apply to it)"
                )
            else:
                try:
                    get_format(fmt)
                except ValueError as e:
                    raise ValueError(
                        f"Recipe: {str(e).rstrip('.')}. The positional arguments are the "
                        "operand formats (inputs, weights); a label goes in name=..."
                    ) from None
        if self.scaling != "none" and self.inputs is None:
            raise ValueError(
                f"recipe {self.name!r}: scaling {self.scaling!r} needs an input format"
            )
        if self.output is not None:
            get_format(self.output)
        if self.full_subnormals and (
            self.scaling != "none" or any(
                get_format(f).is_int for f in (self.inputs, self.weights) if f is not None
            )
        ):
            raise ValueError(
                f"recipe {self.name!r}: full_subnormals is an ablation of unscaled "
                "floating-point operands; use scaling='none' and an eXmY format"
            )
        if not self.name:
            object.__setattr__(self, "name", self.describe())
        self._check_operands()

    def _unpack(self, acc: Accumulator) -> None:
        """The shorthand fields of ``accum=Accumulator(...)`` (the others left at defaults)."""
        given = [f for f in ("order", "chunk", "tensor_core", "native_sums")
                 if getattr(self, f) != _DEFAULTS[f]]
        if given:
            raise ValueError(f"recipe {self.name!r}: accum= is an Accumulator, which carries "
                             f"the order, chunk, tensor core and native sums; give "
                             f"{', '.join(given)} inside it (Accumulator(..., order=...)), "
                             "not beside it")
        fields = {"accum": acc.fmt, "order": acc.order if acc.emulated else None,
                  "chunk": acc.chunk, "tensor_core": acc.tensor_core,
                  "native_sums": "host" if acc.order == "host" else "fp64"}
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    def accumulator(self) -> Accumulator:
        """The [``fpsim.Accumulator``][] the shorthand fields describe: ``order=None`` is
        ``"native"`` for an FP32 / FP64 accumulator (``"host"`` with ``native_sums="host"``),
        else ``"sequential"``.

        >>> acc = Recipe("e4m3", accum="fp16", order="pairwise").accumulator()
        >>> acc
        Accumulator(fmt='fp16', order='pairwise', chunk=None, tensor_core=None)
        >>> Recipe("e4m3", accum=acc) == Recipe("e4m3", accum="fp16", order="pairwise")
        True
        """
        return _accumulator(self.accum, self.order, self.chunk, self.tensor_core,
                            self.native_sums)

    def describe(self) -> str:
        """A name made of the fields that differ from plain FP32: operand formats (``"e4m3"``,
        ``"e4m3*e5m2"`` when the weights differ), ``/scaling``, then ``acc=``, the order and
        chunk, ``out=`` and the ablations (``sat``, ``no-flush``, ...).

        >>> Recipe("e4m3", scaling="tensor").describe(), Recipe(accum="fp64").describe()
        ('e4m3/tensor', 'fp64')
        """
        host = " host-sums" if self.native_sums == "host" else ""
        if self.plain:
            return self.accum + host
        ops = format_name(self.inputs) or "fp32"
        w = format_name(self.weights)
        if w is not None and w != ops:
            ops += f"*{w}"
        words = [ops if self.scaling == "none" else f"{ops}/{self.scaling}"]
        if self.emulated or self.accum != "fp32":
            acc = f"acc={format_name(self.accum)}"
            acc += "" if self.order is None else f" {self.order}"
            acc += "" if self.tensor_core is None else f"={self.tensor_core}"
            words.append(acc if self.chunk is None else f"{acc}/{self.chunk}")
        if self.output is not None:
            words.append(f"out={format_name(self.output)}")
        for flag, word in ((self.saturate, "sat"), (self.pow2, "pow2"),
                           (not self.flush, "no-flush"),
                           (self.full_subnormals, "full-subnormals")):
            if flag:
                words.append(word)
        if self.rounding != "rne":
            words.append(self.rounding)
        if self.scale_rounding is not None:
            words.append(f"scale={self.scale_rounding}")
        return " ".join(words) + host

    @property
    def emulated(self) -> bool:
        """True when the accumulation needs [``fpsim.matmul``][] (not torch's FP32/FP64 matmul)."""
        return self.accumulator().emulated

    @property
    def plain(self) -> bool:
        """True for plain FP32 or FP64 arithmetic: no format anywhere, a native accumulator."""
        return (
            self.inputs is None
            and self.weights is None
            and self.output is None
            and not self.emulated
        )

    def _check_operands(self) -> None:
        """A tensor core reads only its instruction's operand formats: refuse operands it
        could not take unchanged (FP32 ones under an FP8 tensor core)."""
        model = self.accumulator().model
        for role, fmt in (("inputs", self.inputs), ("weights", self.weight_format)):
            elem = element_format(fmt)
            if model is not None and not model.reads(elem):
                reads = ", ".join(f.name for f in model.operands)
                raise ValueError(
                    f"recipe {self.name!r}: tensor_core={model.name!r} reads {reads} operands, "
                    f"and the {role} are {elem.name}" + (" (none given: FP32 as they come)"
                                                         if fmt is None else "")
                    + f"; give {role}= one of {reads} (or a narrower format), or a tensor core "
                    f"that reads {elem.name} (fpsim tensor-cores lists them)")

    @property
    def weight_format(self) -> FormatLike | None:
        return self.inputs if self.weights is None else self.weights

    def cast(self, fmt: FormatLike | Cast | None, axis: int = -1) -> Cast | None:
        """The ``Cast`` of an operand in ``fmt`` under this recipe, reducing along
        ``axis`` (a Cast stays itself, None stays None): ``Recipe("e4m3", scaling="tensor")``
        is shorthand for ``Cast("e4m3", "tensor")`` on both operands.  A ``tile`` recipe's
        right operand (``axis`` other than -1) is in 128 x 128 blocks, ``tile2d``.

        >>> Recipe("e4m3", scaling="tensor").cast("e4m3")
        Cast(fmt='e4m3', scaling='tensor', rounding='rne', saturate=False, pow2=False, \
history=1024, margin=0, scale_rounding=None, srbits=None, full_subnormals=False, flush=True, \
amax=None)
        """
        if fmt is None or isinstance(fmt, Cast):
            return fmt
        scaling = "tile2d" if self.scaling == "tile" and axis != -1 else self.scaling
        return _cast(fmt, scaling, self.rounding, self.saturate, self.scale_rounding,
                     self.srbits, self.full_subnormals, self.flush, self.pow2)

    def at_site(self, amax: dict[str, float]) -> "Recipe":
        """This recipe at one site when it scales per site: its operands as ``site`` Casts
        with the site's calibrated amax (``amax``: ``"a"`` the left operand's, ``"b"`` the
        right one's; a norm site has ``"a"`` only), named as before.

        >>> r = Recipe("e4m3", scaling="site").at_site({"a": 720.0, "b": 2.0})
        >>> r.inputs.describe(), r.weights.amax, r.name
        ('e4m3/site', 2.0, 'e4m3/site')
        """
        def cast(fmt: FormatLike | None, role: str) -> Cast | None:
            return None if fmt is None or role not in amax else Cast(
                fmt, "site", rounding=self.rounding, saturate=self.saturate, srbits=self.srbits,
                flush=self.flush, amax=float(amax[role]), pow2=self.pow2)

        return dataclasses.replace(self, inputs=cast(self.inputs, "a"),
                                   weights=cast(self.weight_format, "b"), scaling="none",
                                   flush=True, pow2=False)

    def to_json(self) -> dict[str, Any]:
        """The recipe's fields with formats as names."""
        d = dataclasses.asdict(self)
        if not self.pow2:               # a field added later: earlier recipes' JSON unchanged
            del d["pow2"]
        for key in ("inputs", "weights", "output"):
            d[key] = format_name(getattr(self, key))
        d["backward"] = None if self.backward is None else self.backward.describe()
        return d


@functools.lru_cache(maxsize=1024)
def _cast(fmt: FormatLike, scaling: str, rounding: str, saturate: bool,
          scale_rounding: str | None, srbits: int | None, full_subnormals: bool,
          flush: bool, pow2: bool = False) -> Cast:
    """One Cast per distinct description (checked once: a site quantizes at every call)."""
    return Cast(fmt, scaling, rounding=rounding, saturate=saturate, pow2=pow2,
                scale_rounding=scale_rounding, srbits=srbits, full_subnormals=full_subnormals,
                flush=flush)


@functools.lru_cache(maxsize=1024)
def element_format(fmt: FormatLike | Cast | None) -> Format:
    """The format of an operand's elements under ``fmt`` (a block format's or a Cast's element
    format; None: FP32, the operand as it comes).

    >>> element_format(Cast("mxfp8_e4m3", "block")).name, element_format(None).name
    ('fp8_e4m3fn', 'fp32')
    """
    if isinstance(fmt, Cast):
        fmt = fmt.fmt
    if fmt is None:
        return get_format("fp32")
    return mx.get_mx_format(fmt).elem if is_block_format_name(fmt) else get_format(fmt)


@functools.lru_cache(maxsize=1024)
def _accumulator(accum: Any, order: str | None, chunk: int | None, tensor_core: Any,
                 native_sums: str) -> Accumulator:
    """One Accumulator per distinct shorthand (checked once: a site sums at every call)."""
    return Accumulator(accum, "host" if native_sums == "host" else order, chunk, tensor_core)


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Recipe)}
FP32 = Recipe()
FP64 = Recipe(accum="fp64")


@dataclass(frozen=True)
class Rule:
    """``recipe`` for the sites whose module path matches the glob ``path`` (``fnmatch``:
    ``"*"`` any path, ``"model.layers.*.mlp.*"``, ``""`` the root module) and whose op kind is
    ``kind`` (one of ``KINDS``; None: any kind but ``norm``: a recipe applies to products,
    and norm statistics only where a rule names ``kind="norm"``).  ``recipe=None`` leaves
    those sites to torch.

    >>> Rule(Recipe("e4m3"), kind="norm").matches("ln_1", "norm"), Rule(None).matches("ln_1", "norm")
    (True, False)
    """

    recipe: Recipe | None
    path: str = "*"
    kind: str | None = None

    def __post_init__(self) -> None:
        if self.kind is not None and self.kind not in KINDS:
            raise ValueError(f"rule kind {self.kind!r} is not one of {KINDS} (or None: any)")

    def matches(self, path: str, kind: str) -> bool:
        """True when this rule applies to an op of ``kind`` in the module at ``path``."""
        return (self.kind == kind or (self.kind is None and kind != "norm")) \
            and fnmatch.fnmatchcase(path, self.path)

    def covers(self, other: "Rule") -> bool:
        """True when every site ``other`` matches is provably matched by this rule too (its
        path is ``"*"``, the same glob, or a glob matching ``other``'s literal path)."""
        if self.kind != other.kind and (self.kind is not None or other.kind == "norm"):
            return False
        if self.path in ("*", other.path):
            return True
        return not any(c in other.path for c in "*?[") \
            and fnmatch.fnmatchcase(other.path, self.path)

    def describe(self) -> str:
        """``path='lm_head', kind='linear'`` (the fields that select)."""
        return f"path={self.path!r}" + ("" if self.kind is None else f", kind={self.kind!r}")


@dataclass(frozen=True)
class Rules:
    """Per-site recipes: the first of ``rules`` that matches a site gives its recipe, else
    ``default`` (the deterministic FP32 reference; None leaves unmatched sites to torch).
    Norm statistics are torch's unless a ``Rule(..., kind="norm")`` gives them a recipe
    (neither ``default`` nor a rule without a kind applies to them).

    A rule that can never match, because an earlier one covers all its sites
    ([``Rule.covers``][]), is warned about when the Rules are built; ``em.report()`` shows
    which rule matched each site.

    For example "linear layers in E4M3 with per-tensor scaling, attention in BF16, norm
    statistics in FP32 (computed in FP64, rounded once), other products FP32"::

        Rules([Rule(Recipe("e4m3", scaling="tensor"), kind="linear"),
               Rule(Recipe("bf16", output="bf16"), kind="attention"),
               Rule(Recipe(), kind="norm")])
    """

    rules: Sequence[Rule] = ()
    default: Recipe | None = FP32

    def __post_init__(self) -> None:
        bad = [r for r in self.rules if not isinstance(r, Rule)]
        if bad:
            raise TypeError(f"Rules takes Rule objects, got {bad[0]!r}: wrap it as Rule(recipe, "
                            "path=..., kind=...)")
        object.__setattr__(self, "rules", tuple(self.rules))
        for j, later in enumerate(self.rules):
            first = next((i for i in range(j) if self.rules[i].covers(later)), None)
            if first is not None:
                warnings.warn(
                    f"Rules: rule {j} ({later.describe()}) can never match: rule {first} "
                    f"({self.rules[first].describe()}) comes first and takes all its sites; put "
                    "the narrower rule first", UserWarning, stacklevel=3)

    def match(self, path: str, kind: str) -> tuple[int | None, Recipe | None]:
        """The index of the first rule matching an op of ``kind`` at ``path`` (None: the
        default) and the recipe it gives (None: torch computes the op).  The default applies
        to products: a norm no ``kind="norm"`` rule matches is torch's."""
        for i, rule in enumerate(self.rules):
            if rule.matches(path, kind):
                return i, rule.recipe
        return None, None if kind == "norm" else self.default

    def select(self, path: str, kind: str) -> Recipe | None:
        """The recipe of an op of ``kind`` in the module at ``path`` (None: torch computes it)."""
        return self.match(path, kind)[1]

    @classmethod
    def of(cls, recipe: "Recipe | Rules") -> "Rules":
        """``recipe`` for every site, or ``recipe`` itself when it is already Rules."""
        if isinstance(recipe, Rules):
            return recipe
        if not isinstance(recipe, Recipe):
            raise TypeError(f"expected a Recipe or Rules, got {type(recipe).__name__}")
        return cls((), default=recipe)
