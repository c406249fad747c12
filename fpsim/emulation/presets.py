"""Published low-precision training recipes as data: name one, train under it.

Each preset is a [``fpsim.emulation.recipe.Recipe``][] for the linear layers (``nn.Linear``,
``Conv1D``: the sites of kind ``linear``) with its forward casts and [``Backward``][]; every
other op stays with torch, as in the frameworks that publish them.  [``rules``][] turns a
name into the [``Rules``][] that [``fpsim.emulate``][] takes, with chosen layers kept in BF16.
Sources (also in ``docs/training.md``):

- ``native``: no recipe at all: torch computes every op (``fpsim.emulate("native")`` is the
  model's own FP32 forward and backward, bit for bit; with ``capture=True`` its sites are
  recorded, their arithmetic unchanged).

- ``torchao-float8-tensorwise``: torchao 0.18.0 ``Float8LinearConfig()`` (the default of
  ``convert_to_float8_training``): input and weight E4M3 (e4m3fn), grad_output E5M2, one
  dynamic (current) scale per tensor, all three GEMMs.  torchao's arithmetic end to end: its
  emulated GEMM is torch's FP32 ``mm`` on the dequantized operands, the bias added after it
  (``native_sums="host"``); bit for bit against ``convert_to_float8_training(...,
  Float8LinearConfig(emulate=True))`` in ``tests/test_training_torchao.py``.
- ``torchao-float8-rowwise``: ``Float8LinearConfig.from_recipe_name("rowwise")``: E4M3 for all
  three tensors, one scale per row along each GEMM's reduction axis, scales rounded down to a
  power of two; summed as torchao sums (the same test).
- ``te-delayed``: Transformer Engine ``DelayedScaling(margin=0, fp8_format=HYBRID,
  amax_history_len=1024, amax_compute_algo="max")``: E4M3 forward, E5M2 backward, the scale
  from the largest amax of the previous 1024 calls.  The first call is TE's first step: scale
  1 (TE initialises every scale to 1 and the amax history to zeros, and updates the scales
  when ``fp8_autocast`` exits), so elements beyond the format's largest value saturate on it.
  TE updates once per autocast exit, fpsim after every call: the same when each site runs
  once per step.
- ``te-current``: TE ``Float8CurrentScaling(fp8_format=HYBRID)``: per-tensor scale from the
  tensor itself.
- ``te-mxfp8``: TE ``MXFP8BlockScaling(fp8_format=E4M3)``: MXFP8 E4M3 in 1 x 32 blocks along
  each GEMM's reduction axis (E8M0 scales, NVIDIA's round-up rule), forward and backward.
- ``nvfp4``: NVIDIA, "Pretraining Large Language Models with NVFP4" (arXiv 2509.25149):
  NVFP4 (E2M1, E4M3 scales per 16 elements, an FP32 tensor scale), weights in 16 x 16 2-D
  blocks, gradients stochastically rounded, a 16-point random Hadamard transform on both
  weight-gradient operands; keep the chosen layers in BF16 with ``rules(..., bf16=...)``.
- ``deepseek-v3``: DeepSeek-V3 technical report (arXiv 2412.19437) section 3.3: E4M3 for the
  inputs of all three GEMMs, 1 x 128 tiles for activations and gradients, 128 x 128 blocks
  for weights, Hopper's FP8 tensor-core accumulator promoted to FP32 every 128 products.

>>> em = fpsim.emulate(rules("torchao-float8-tensorwise"))
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import mx
from ..arith.accumulator import Accumulator
from ..blockrules import is_block_format_name
from ..formats import get_format
from ..names import normalize, resolve
from .casts import Backward, Cast
from .recipe import FP32, FP64, SCALINGS, Recipe, Rule, Rules


@dataclass(frozen=True)
class Preset:
    """A named training recipe and the publication or code it follows (``recipe`` None:
    torch's own arithmetic, the ``native`` preset)."""

    name: str
    recipe: Recipe | None
    source: str


def _tensorwise(fmt: str) -> Cast:
    return Cast(fmt, "tensorwise", saturate=True)


def _delayed(fmt: str) -> Cast:
    return Cast(fmt, "delayed", saturate=True, history=1024, margin=0)


_ROWWISE = Cast("e4m3", "rowwise", saturate=True, pow2=True)
_MXFP8 = Cast("mxfp8_e4m3", "block", scale_rounding="ceil")
_DEEPSEEK_ACT = Cast("e4m3", "tile")
#: torchao's emulated GEMM: torch's own FP32 ``mm`` (``native_sums="host"``), then the bias.
_TORCHAO_SUMS = Accumulator(order="host")
#: Hopper's FP8 tensor-core accumulator, promoted to FP32 every 128 products (DeepSeek-V3).
_HOPPER_PROMOTED = Accumulator(order="tensor_core", tensor_core="hopper_fp8", chunk=128)

PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("native", None, "torch itself: every op its own FP32 arithmetic, bit for bit "
           "(capture=True records the sites without changing them)"),
    Preset("torchao-float8-tensorwise",
           Recipe(name="torchao-float8-tensorwise", inputs=_tensorwise("e4m3"),
                  backward=Backward(grad=_tensorwise("e5m2")), accum=_TORCHAO_SUMS),
           "torchao 0.18.0 torchao.float8 Float8LinearConfig() (tensorwise dynamic scaling)"),
    Preset("torchao-float8-rowwise",
           Recipe(name="torchao-float8-rowwise", inputs=_ROWWISE,
                  backward=Backward(grad=_ROWWISE), accum=_TORCHAO_SUMS),
           "torchao 0.18.0 Float8LinearConfig.from_recipe_name('rowwise')"),
    Preset("te-delayed",
           Recipe(name="te-delayed", inputs=_delayed("e4m3"),
                  backward=Backward(grad=_delayed("e5m2"))),
           "Transformer Engine DelayedScaling(margin=0, fp8_format=HYBRID, "
           "amax_history_len=1024, amax_compute_algo='max')"),
    Preset("te-current",
           Recipe(name="te-current", inputs=_tensorwise("e4m3"),
                  backward=Backward(grad=_tensorwise("e5m2"))),
           "Transformer Engine Float8CurrentScaling(fp8_format=HYBRID)"),
    Preset("te-mxfp8",
           Recipe(name="te-mxfp8", inputs=_MXFP8, backward=Backward(grad=_MXFP8)),
           "Transformer Engine MXFP8BlockScaling(fp8_format=E4M3)"),
    Preset("nvfp4",
           Recipe(name="nvfp4", inputs=Cast("nvfp4", "block"),
                  weights=Cast("nvfp4", "block2d"),
                  backward=Backward(grad=Cast("nvfp4", "block", rounding="stochastic"),
                                    hadamard=16)),
           "NVIDIA, Pretraining Large Language Models with NVFP4, arXiv 2509.25149"),
    Preset("deepseek-v3",
           Recipe(name="deepseek-v3", inputs=_DEEPSEEK_ACT, weights=Cast("e4m3", "tile2d"),
                  accum=_HOPPER_PROMOTED,
                  backward=Backward(grad=_DEEPSEEK_ACT)),
           "DeepSeek-V3 Technical Report, arXiv 2412.19437, section 3.3"),
)}

#: The recipe of layers a preset keeps in BF16: BF16 operands and gradients, FP32 sums.
BF16 = Recipe(name="bf16", inputs="bf16", backward=Backward(grad=Cast("bf16")))


def get_preset(name: str) -> Preset:
    """The preset called ``name`` (resolved like every fpsim name: case, white space and
    ``-`` / ``_`` ignored; an unknown name lists the presets; a block format's name lists
    the presets, those of that format first)."""
    key = normalize(name) if isinstance(name, str) else name
    if is_block_format_name(name) and key not in {normalize(k) for k in PRESETS}:
        fmt = key.split("_")[0]
        first = [k for k in PRESETS if fmt in normalize(k)]
        listed = ", ".join([*first, *(k for k in PRESETS if k not in first)])
        raise ValueError(f"{name!r} is a block format, not a training preset; the presets "
                         f"are {listed}. For the format itself: Recipe({name!r}) or "
                         f"fpsim.mx.quantize(x, {name!r})")
    return resolve("training preset", name, {normalize(k): p for k, p in PRESETS.items()},
                   known=list(PRESETS))


def lookup(name: str) -> Recipe | Rules:
    """A recipe or preset by name, the one registry the sweep and the experiments name: a
    preset of ``PRESETS`` (its ``rules``), ``fp32`` / ``fp64`` (plain recipes), a
    format (operands in it, FP32 sums; a block format with its blocks: ``mxfp4``, ``nvfp4``)
    or ``FORMAT/SCALING`` (``e4m3/tensor``, ``e4m3/channel``, ``e4m3/tile``: a scaling a
    Recipe takes, ``fpsim.emulation.recipe.SCALINGS``).  A format's name comes first:
    ``"nvfp4"`` is NVFP4 operands at every product site; the training preset of that name is
    ``rules("nvfp4")``.

    >>> lookup("e4m3/tensor") == Recipe("e4m3", scaling="tensor", name="e4m3/tensor")
    True
    """
    if name.lower() in ("fp32", "fp64"):
        return FP32 if name.lower() == "fp32" else FP64
    fmt, slash, scaling = name.partition("/")
    if not slash and not _format_name(name):
        if normalize(name) in {normalize(k) for k in PRESETS}:
            return rules(name)
        raise ValueError(f"recipe preset {name!r}: neither a format nor a preset "
                         f"({', '.join(PRESETS)}); a name is FORMAT (e4m3, bf16, nvfp4...), "
                         "FORMAT/SCALING (e4m3/tensor), fp32 or fp64")
    if scaling and scaling not in SCALINGS:
        raise ValueError(f"recipe preset {name!r}: scaling {scaling!r} is not one of "
                         f"{', '.join(SCALINGS)}; a name is FORMAT or FORMAT/SCALING, fp32, "
                         f"fp64 or a preset: {', '.join(PRESETS)}")
    return Recipe(fmt, name=name, scaling=scaling or "none")


def _format_name(name: str) -> bool:
    """True when ``name`` names a scalar or block format."""
    try:
        get_format(name)
    except ValueError:
        return name.lower() in mx.MX_FORMATS
    return True


def rules(name: str, *, bf16: tuple[str, ...] = ()) -> Rules:
    """[``Rules``][] running the linear layers under preset ``name``, those whose module path
    matches a glob of ``bf16`` in BF16 instead (NVFP4 keeps some layers in BF16), everything
    else in torch.

    >>> r = rules("nvfp4", bf16=("lm_head", "*.layers.11.*"))
    >>> [(rule.path, rule.recipe.name) for rule in r.rules]
    [('lm_head', 'bf16'), ('*.layers.11.*', 'bf16'), ('*', 'nvfp4')]
    """
    if isinstance(bf16, str):
        raise TypeError("bf16= takes a tuple of module-path globs, e.g. ('lm_head',)")
    recipe = get_preset(name).recipe
    keep = [Rule(BF16, path=g, kind="linear") for g in bf16]
    return Rules([*keep] if recipe is None else [*keep, Rule(recipe, kind="linear")],
                 default=None)
