"""What a sweep runs: models, held-out text, recipes, seeds, metrics and sizes, from TOML, YAML
or a Python dict.

A recipe entry is a preset name (``"bf16"``, ``"e4m3/tensor"``, ``"mxfp4"``, a name of
``named_recipes``), a table of ``fpsim.Recipe`` fields, a table with
``rules`` (each a recipe plus ``path`` / ``kind``, first match wins) and ``default``, or in
Python a ``Recipe`` / ``Rules`` object.  Every entry becomes ``fpsim.Rules``.  Unknown
keys, formats, scalings and op kinds are refused with the accepted ones named.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fpsim import Recipe, Rule, Rules
from fpsim.emulation.presets import lookup
from fpsim.emulation.recipe import KINDS
from fpsim.rounding import STOCHASTIC

REPO = Path(__file__).resolve().parents[2]
#: fpsim's own models, by name (``models = ["tiny"]``).
BUILTIN_MODELS = {"tiny": REPO / "fpsim_experiments" / "gpt2" / "tiny",
                  "massive_synthetic": REPO / "fpsim_experiments" / "gpt2" / "massive_synthetic"}
#: What a sweep can report: end-to-end metrics (always computed together from the same
#: logits) and ``sites``, the per-site capture of fpsim.emulate (an FP64 product per site call).
METRICS = ("kl", "loss", "top1", "finite", "sites")
DEFAULT_METRICS = ("kl", "loss", "top1")
KEYS = {"models", "text", "recipes", "seeds", "metrics", "tokens", "window", "batch",
        "task_batches"}
RECIPE_KEYS = {f.name for f in dataclasses.fields(Recipe)}


@dataclass(frozen=True)
class Sweep:
    """A sweep's definition (picklable: it travels to every worker).

    ``models``: checkpoint directories; ``recipes``: name -> ``fpsim.Rules``, in order;
    ``seeds``: each draws its own held-out windows; ``text``: a UTF-8 file (None: fpsim's
    held-out text); ``tokens``: held-out tokens per (model, seed), in windows of ``window``
    tokens (at most the model's positions), run ``batch`` windows per forward pass and
    ``task_batches`` batches per task.
    """

    models: tuple[str, ...]
    recipes: Mapping[str, Rules]
    seeds: tuple[int, ...] = (0,)
    metrics: tuple[str, ...] = DEFAULT_METRICS
    text: str | None = None
    tokens: int = 2048
    window: int = 256
    batch: int = 8
    task_batches: int = 1

    @property
    def capture(self) -> bool:
        """Whether tasks capture per-site statistics."""
        return "sites" in self.metrics

    def to_json(self) -> dict[str, Any]:
        """Everything that determines the numbers, as plain data (models as given)."""
        return {"models": [display(m) for m in self.models], "text": self.text,
                "recipes": {k: rules_json(v) for k, v in self.recipes.items()},
                "seeds": list(self.seeds), "metrics": list(self.metrics), "tokens": self.tokens,
                "window": self.window, "batch": self.batch, "task_batches": self.task_batches}


def display(model: str | Path) -> str:
    """A model as reports name it: its built-in name, or relative to the repository."""
    p = Path(model).resolve()
    for name, path in BUILTIN_MODELS.items():
        if p == path.resolve():
            return name
    return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(model)


def rules_json(rules: Rules) -> dict[str, Any]:
    """``fpsim.Rules`` as plain data (a recipe None: torch computes those sites)."""
    def one(r: Recipe | None) -> dict[str, Any] | None:
        return None if r is None else r.to_json()
    return {"rules": [{"recipe": one(r.recipe), "path": r.path, "kind": r.kind}
                      for r in rules.rules], "default": one(rules.default)}


def digest(obj: Any) -> str:
    """A short hash of JSON-able ``obj`` (sorted keys): a task's identity on disk."""
    text = json.dumps(obj, sort_keys=True, allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def named_recipes() -> dict[str, Rules]:
    """Name -> per-site rules: FP8 (E4M3) on the linear layers as Transformer Engine places it,
    FP8 and MXFP8 everywhere (norm statistics included), BF16 operands everywhere (the
    ``any-model`` experiment's recipes, and sweep presets by these names)."""
    e4m3 = Recipe("e4m3", scaling="tensor", name="E4M3 per-tensor")
    return {
        "E4M3 per-tensor, linear layers": Rules([Rule(e4m3, kind="linear")]),
        "E4M3 per-tensor, every site": _everywhere(e4m3),
        "MXFP8 E4M3, every site": _everywhere(Recipe("mxfp8_e4m3", name="MXFP8 E4M3")),
        "BF16 operands, every site": _everywhere(Recipe("bf16", name="BF16")),
    }


def _everywhere(recipe: Recipe) -> Rules:
    """``recipe`` for every site, norm statistics too (a default reaches products only)."""
    return Rules([Rule(recipe, kind="norm")], default=recipe)


def preset(name: str) -> Recipe | Rules:
    """A recipe by name: a name of ``named_recipes`` (Rules), else fpsim's registry
    (``fpsim.emulation.presets.lookup``: ``fp32``, ``fp64``, a format such as ``bf16``,
    ``e4m3`` or a block format, ``FORMAT/SCALING`` such as ``e4m3/tensor``, or a training
    preset such as ``torchao-float8-tensorwise``)."""
    named = named_recipes()
    return named[name] if name in named else lookup(name)


def _recipe(name: str, entry: Any) -> Recipe:
    if isinstance(entry, Recipe):
        return entry
    if isinstance(entry, str):
        r = preset(entry)
        if isinstance(r, Rules):
            raise ValueError(f"recipe {name!r}: {entry!r} is a set of rules, not one recipe")
        return r
    if not isinstance(entry, Mapping):
        raise ValueError(f"recipe {name!r}: expected a preset name or a table of Recipe fields, "
                         f"got {entry!r}")
    unknown = set(entry) - RECIPE_KEYS
    if unknown:
        raise ValueError(f"recipe {name!r}: unknown field(s) {', '.join(sorted(unknown))}; "
                         f"Recipe takes {', '.join(sorted(RECIPE_KEYS))}")
    return Recipe(**{"name": name, **entry})


def _default(name: str, entry: Any) -> Recipe | None:
    """A rule set's default: a recipe, or ``"torch"`` (None: unmatched sites left to torch)."""
    return None if entry == "torch" else _recipe(f"{name} default", entry)


def parse_recipe(name: str, entry: Any) -> Rules:
    """One ``recipes`` entry as ``fpsim.Rules`` (see the module docstring)."""
    if isinstance(entry, Rules):
        rules = entry
    elif isinstance(entry, str):
        rules = Rules.of(preset(entry))
    elif isinstance(entry, Mapping) and "rules" in entry:
        extra = set(entry) - {"rules", "default"}
        if extra:
            raise ValueError(f"recipe {name!r}: a rule set takes 'rules' and 'default', not "
                             f"{', '.join(sorted(extra))}")
        out = []
        for i, rule in enumerate(entry["rules"]):
            if not isinstance(rule, Mapping) or "recipe" not in rule or \
                    set(rule) - {"recipe", "path", "kind"}:
                raise ValueError(f"recipe {name!r}: rule {i + 1} must be a table with 'recipe' "
                                 "and optionally 'path' (a glob) and 'kind' "
                                 f"({', '.join(KINDS)})")
            recipe = None if rule["recipe"] == "torch" else _recipe(f"{name} rule {i + 1}",
                                                                   rule["recipe"])
            out.append(Rule(recipe, path=rule.get("path", "*"), kind=rule.get("kind")))
        rules = Rules(out, default=_default(name, entry.get("default", "fp32")))
    else:
        rules = Rules.of(_recipe(name, entry))
    for r in [*(rule.recipe for rule in rules.rules), rules.default]:
        if r is not None and r.rounding in STOCHASTIC:
            raise ValueError(f"recipe {name!r}: stochastic rounding ({r.rounding}) draws fresh "
                             "random bits in fpsim.emulate, so its numbers could be neither "
                             "repeated nor resumed; a sweep takes deterministic rounding modes")
    return rules


def _positive(data: Mapping[str, Any], key: str, default: int) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"sweep config: {key} must be a positive integer, got {value!r}")
    return value


def resolve_model(model: str, base: Path) -> str:
    """A built-in model name or a directory (relative to the config file) as an absolute path."""
    if model in BUILTIN_MODELS:
        return str(BUILTIN_MODELS[model])
    p = (base / Path(model).expanduser()).resolve()
    if not (p / "config.json").is_file():
        raise ValueError(f"sweep config: model {model!r}: {p} has no config.json; give a local "
                         "Hugging Face directory (save_pretrained writes one) or one of "
                         f"{', '.join(BUILTIN_MODELS)}; nothing is downloaded")
    return str(p)


def from_dict(data: Mapping[str, Any], base: str | Path = ".") -> Sweep:
    """A ``Sweep`` from a config mapping; relative paths are taken from ``base``.

    >>> from_dict({"models": ["tiny"], "recipes": ["bf16", "e4m3/tensor"]}).seeds
    (0,)
    """
    unknown = set(data) - KEYS
    if unknown:
        raise ValueError(f"sweep config: unknown key(s) {', '.join(sorted(unknown))}; the keys "
                         f"are {', '.join(sorted(KEYS))}")
    base = Path(base)
    models = data.get("models")
    if isinstance(models, str):
        models = [models]
    if not models:
        raise ValueError("sweep config: 'models' names no model; give e.g. models = [\"tiny\"]")
    recipes = data.get("recipes")
    if isinstance(recipes, (list, tuple)):     # a list of presets or objects, named by their name
        recipes = {getattr(r, "name", None) or str(r): r for r in recipes}
    if not recipes:
        raise ValueError("sweep config: 'recipes' is empty; give presets (recipes = [\"bf16\"]) "
                         "or a [recipes] table")
    seeds = data.get("seeds", [0])
    if isinstance(seeds, int) or any(isinstance(s, bool) or not isinstance(s, int)
                                     for s in seeds) or not seeds:
        raise ValueError(f"sweep config: seeds must be a list of integers, got {seeds!r}")
    metrics = tuple(data.get("metrics", DEFAULT_METRICS))
    bad = [m for m in metrics if m not in METRICS]
    if bad:
        raise ValueError(f"sweep config: unknown metric(s) {', '.join(bad)}; choose from "
                         f"{', '.join(METRICS)}")
    text = data.get("text")
    if text is not None:
        path = (base / Path(text).expanduser()).resolve()
        if not path.is_file():
            raise ValueError(f"sweep config: text {text!r}: {path} is not a file; give a UTF-8 "
                             "text file or leave text out for fpsim's held-out text")
        text = str(path)
    return Sweep(models=tuple(dict.fromkeys(resolve_model(str(m), base) for m in models)),
                 recipes={str(k): parse_recipe(str(k), v) for k, v in recipes.items()},
                 seeds=tuple(dict.fromkeys(seeds)), metrics=metrics, text=text,
                 tokens=_positive(data, "tokens", 2048), window=_positive(data, "window", 256),
                 batch=_positive(data, "batch", 8),
                 task_batches=_positive(data, "task_batches", 1))


def load(path: str | Path) -> Sweep:
    """A ``Sweep`` from a TOML file (YAML when it ends in ``.yaml`` / ``.yml``)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"sweep config {path}: {exc.strerror or exc}") from None
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ValueError(f"sweep config {path}: YAML needs PyYAML (pip install pyyaml); or "
                             "write the config in TOML") from None
        try:
            data = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ValueError(f"sweep config {path}: not valid YAML: {exc}") from None
    else:
        try:
            import tomllib
        except ImportError:                       # Python 3.10
            try:
                import tomli as tomllib
            except ImportError:
                raise ValueError(f"sweep config {path}: TOML on Python 3.10 needs tomli (pip "
                                 "install tomli)") from None
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"sweep config {path}: not valid TOML: {exc}") from None
    if not isinstance(data, Mapping):
        raise ValueError(f"sweep config {path}: expected a table of keys at the top level")
    return from_dict(data, path.resolve().parent)
