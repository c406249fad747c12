"""``fpsim experiment range-vs-precision --model tiny|whisper-tiny.en|minilm|DIR``: at a fixed
bit budget, does running out of range hurt more than losing precision, on any model?

The study of :mod:`.range_vs_precision` as a function of (model, inputs, metric), computed
through :func:`fpsim.emulate` alone: each arm is a :class:`fpsim.Recipe` at every dot-product
site and every norm's statistics (or the norms in FP32), against the FP32 reference (every
site's sums in FP64 rounded once to FP32).  The arms (:func:`arms`):

- the IEEE-style splits ``eXmY_ieee`` of 8 bits (e2m5, e3m4, e4m3, e5m2), 12 bits (e3m8 ...
  e6m5) and 16 bits (e4m11, e5m10, e6m9, e8m7), unscaled and with per-tensor scaling (scale =
  amax / format max from the tensor itself, every call), at 8 bits also per channel (one scale
  per row of the activations and per output channel of the weights: a Recipe scales both
  operands alike, so "per-tensor activations with per-channel weights" is not an arm) and per
  site (one scale per site and operand, fixed over calls: the largest |value| the operand
  reaches there in the FP32 reference on the same units / format max, ``scaling="site"``
  calibrated by :class:`fpsim.emulation.Calibration` during the reference run; a value the
  format's errors push beyond it overflows), and per tensor with the scale a power of two
  (``per-tensor pow2``: the smallest one that keeps the amax within the format,
  :class:`fpsim.Recipe`'s ``pow2``), which keeps on the format's grid
  every value that is on it unscaled, as an exact amax / max scale does not;
- the encodings at 8 bits, unscaled: OCP-style ``eXmYfn`` (no inf, the top binade finite) and
  saturating (overflow clamped to the largest finite value); and per site, saturating: a
  static calibrated scale with a saturating cast, as FP8 inference deploys it (per-site scaling
  lets a value the format's errors push beyond its calibrated amax overflow; saturating clamps
  it there);
- ablations at 8 bits, unscaled, of e3m4 and e4m3: no flush (values that round to zero keep
  their FP32 value), full-width subnormals, the norms in FP32; and, with the norms in FP32, no
  flush, full subnormals and both: the corners of the order-free attribution
  (:func:`attributions`), which splits the cost of the bottom of the range between flush and
  subnormal width as the tiny model's study does (:func:`.likewise.order_free`).

Every metric is scored unit by unit (windows, sentences or clips: :mod:`.models`) and its 95%
interval resamples units (:func:`.bootstrap.sums_ratio`).  A comparison is a paired ratio of
the model's first metric between two arms that differ in one named factor only; its p-value
(:func:`.bootstrap.p_value`) joins one Holm family per model, with the attribution's Shapley
values and interaction, and a side is called only when the interval excludes 1 and the
ratio survives Holm.  A capture pass on the first units
(:data:`CAPTURE_UNITS`) records per site the operand amax and the elements that overflowed,
saturated or flushed (:meth:`fpsim.emulation.Emulation.table`).

Each arm is a task of the sweep runner (``fpsim_experiments.sweep.runner.execute``): in this
process, on a local process pool or on Ray, its result written to ``OUT/.../tasks`` as it
ends, so ``--resume`` computes only the arms a killed run left.  The driver computes the
inputs and the FP32 reference once and saves them there (``StudyWork``); a worker reads them
once per process, so every arm sees the same bits whichever executor runs it, and a resumed
run reads the reference back (:func:`saved_reference`) when its inputs are the same.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import pickle
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

import fpsim
from fpsim import Recipe, Rule, Rules
from fpsim.emulation import Calibration
from fpsim.emulation.recipe import FP32

from . import bootstrap, likewise, models
from .bootstrap import fmt_ci
from .models.base import Scores, pieces
from .range_findings import INTERACT_ABOVE, INTERACT_BELOW
from .report import finish, num, page, pct, table, versions
from .sweep import runner
from .sweep.runs import Execution

NAME = "range-vs-precision"
SPLITS = {8: (2, 3, 4, 5), 12: (3, 4, 5, 6), 16: (4, 5, 6, 8)}    # exponent bits per budget
QUICK_SPLITS = {8: (3, 4, 5)}
ABLATED = (3, 4)                    # exponent bits of the 8-bit splits the ablations run on
CAPTURE_UNITS = {"quick": 1, "full": 8}
#: what an arm is, factor by factor (a comparison names the one factor its arms differ in)
FACTORS = ("budget", "ebits", "encoding", "scaling", "flush", "subnormals", "norms")
#: the order-free attribution: the factors removed from a base arm (unscaled, norms in FP32)
ATTRIBUTION = ("flush", "subnormals")
#: an arm's name for a scaling other than ``per-<scaling>``
SCALING_WORDS = {"pow2": "per-tensor pow2"}
#: the reference: FP32 at every product and every norm's statistics, named for each kind
REFERENCE = Rules([Rule(FP32, kind="norm")], default=FP32)


@dataclass(frozen=True)
class Arm:
    """One run of the study: a recipe at every site, the norms under it or in FP32."""

    recipe: Recipe
    factors: dict[str, Any] = field(hash=False)
    #: every arm compares with the one FP32 reference (a task of the sweep runner)
    ref_key: ClassVar[str] = "reference"

    @property
    def name(self) -> str:
        return self.recipe.name

    @property
    def slug(self) -> str:
        """The readable part of its task file's name."""
        return self.name

    def rules(self) -> Rules:
        """The rules of :func:`fpsim.emulate`: norms named first (FP32 or the recipe), then
        every other site."""
        norms = FP32 if self.factors["norms"] == "fp32" else self.recipe
        return Rules([Rule(norms, kind="norm"), Rule(self.recipe)], default=FP32)


def split(ebits: int, budget: int, encoding: str = "ieee") -> str:
    """The format name of a split: ``e4m3_ieee`` (IEEE-style: inf/NaN in the all-ones
    exponent) or ``e4m3fn`` (OCP-style: no inf, one NaN)."""
    m = budget - 1 - ebits
    return f"e{ebits}m{m}_ieee" if encoding in ("ieee", "saturating") else f"e{ebits}m{m}fn"


def arm(budget: int, ebits: int, *, encoding: str = "ieee", scaling: str = "none",
        flush: bool = True, subnormals: str = "format", norms: str = "format") -> Arm:
    """The arm of a split with the given factors (its recipe named after what differs)."""
    fmt = split(ebits, budget, encoding)
    words = [fmt]
    words += [] if scaling == "none" else [SCALING_WORDS.get(scaling, f"per-{scaling}")]
    words += ["saturating"] if encoding == "saturating" else []
    words += [] if flush else ["no flush"]
    words += ["full subnormals"] if subnormals == "full" else []
    words += ["norms FP32"] if norms == "fp32" else []
    pow2 = scaling == "pow2"                      # per tensor, power-of-two scales
    recipe = Recipe(fmt, scaling="tensor" if pow2 else scaling, pow2=pow2,
                    saturate=encoding == "saturating", flush=flush,
                    full_subnormals=subnormals == "full", name=" ".join(words))
    return Arm(recipe, {"budget": budget, "ebits": ebits, "encoding": encoding,
                        "scaling": scaling, "flush": flush, "subnormals": subnormals,
                        "norms": norms})


def arms(quick: bool) -> list[Arm]:
    """Every arm of the study (``quick``: the 8-bit splits e3m4, e4m3, e5m2 unscaled and per
    tensor, e4m3 per channel, fn, saturating and with the norms in FP32)."""
    if quick:
        out = [arm(8, e, scaling=s) for e in QUICK_SPLITS[8] for s in ("none", "tensor")]
        return out + [arm(8, 4, scaling="channel"), arm(8, 4, encoding="fn"),
                      arm(8, 4, encoding="saturating"), arm(8, 4, norms="fp32")]
    out = [arm(b, e, scaling=s) for b, es in SPLITS.items() for e in es
           for s in (("none", "tensor", "channel", "site") if b == 8 else ("none", "tensor"))]
    out += [arm(8, e, encoding=c) for e in SPLITS[8][1:] for c in ("fn", "saturating")]
    out += [arm(8, e, encoding="saturating", scaling="site") for e in SPLITS[8][1:]]
    out += [arm(8, e, scaling="pow2") for e in SPLITS[8][1:]]
    out += [a for e in ABLATED for a in (arm(8, e, flush=False), arm(8, e, subnormals="full"),
                                         arm(8, e, norms="fp32"))]
    out += [arm(8, e, norms="fp32", **k) for e in ABLATED for k in (
        {"flush": False}, {"subnormals": "full"}, {"flush": False, "subnormals": "full"})]
    return out


def chosen(names: list[str] | None, quick: bool) -> list[Arm]:
    """The arms ``--cases`` names, in that order (None: every arm of :func:`arms`).

    >>> [a.name for a in chosen(["e4m3_ieee", "e5m2_ieee per-tensor"], quick=False)]
    ['e4m3_ieee', 'e5m2_ieee per-tensor']
    """
    if not names:
        return arms(quick)
    by = {a.name: a for a in arms(False)}
    unknown = [n for n in names if n not in by]
    if unknown:
        raise SystemExit(f"fpsim experiment {NAME}: no arm {unknown[0]!r}; --cases takes arm "
                         f"names as the report writes them: {', '.join(repr(n) for n in by)}")
    return [by[n] for n in names]


#: an arm's encoding and ablations as the plain IEEE-style arm has them
PLAIN = {"encoding": "ieee", "flush": True, "subnormals": "format", "norms": "format"}


def _finder(planned: list[Arm]) -> Any:
    """``other(f, **change)``: the name of the planned arm with factors ``f`` but for
    ``change`` (None: not planned)."""
    by = {tuple(a.factors[k] for k in FACTORS): a.name for a in planned}
    return lambda f, **change: by.get(tuple({**f, **change}[k] for k in FACTORS))


def comparisons(planned: list[Arm]) -> list[tuple[str, str, str, str]]:
    """(question, arm a, arm b, factor) of every like-with-like ratio among ``planned``: a
    metric(a) / metric(b) above 1 means a is worse.  An arm with more than one ablation is
    no comparison's: it is a corner of :func:`attributions`."""
    other = _finder(planned)
    out = []
    for a in planned:
        f = a.factors
        base = f["encoding"] == "ieee" and f["flush"] and f["subnormals"] == "format" \
            and f["norms"] == "format"
        if base:
            if nxt := other(f, ebits=f["ebits"] + 1):
                out.append(("range: one exponent bit fewer / one mantissa bit fewer", a.name,
                            nxt, "ebits"))
            if f["scaling"] == "tensor" and (b := other(f, scaling="none")):
                out.append(("per-tensor scaling / unscaled", a.name, b, "scaling"))
            if f["scaling"] == "channel" and (b := other(f, scaling="tensor")):
                out.append(("per-channel / per-tensor scaling", a.name, b, "scaling"))
            if f["scaling"] == "site" and (b := other(f, scaling="tensor")):
                out.append(("per-site / per-tensor scaling", a.name, b, "scaling"))
            if f["scaling"] == "pow2" and (b := other(f, scaling="tensor")):
                out.append(("power-of-two / exact per-tensor scale", a.name, b, "scaling"))
            if f["scaling"] == "pow2" and (b := other(f, scaling="none")):
                out.append(("power-of-two per-tensor scale / unscaled", a.name, b, "scaling"))
            continue
        ieee = other(f, **PLAIN)
        if ieee is None or sum(f[k] != v for k, v in PLAIN.items()) != 1:
            continue
        what = {"fn": "fn encoding / IEEE-style", "saturating": "saturating / IEEE-style"}
        if f["encoding"] != "ieee":
            out.append((what[f["encoding"]], a.name, ieee, "encoding"))
        elif not f["flush"]:
            out.append(("no flush / flush", a.name, ieee, "flush"))
        elif f["subnormals"] == "full":
            out.append(("full-width subnormals / the format's", a.name, ieee, "subnormals"))
        elif f["norms"] == "fp32":
            out.append(("norms in FP32 / norms in the format", a.name, ieee, "norms"))
    return out


def attributions(planned: list[Arm]) -> list[tuple[str, str, str, str]]:
    """(base, first, second, both) of every order-free attribution among ``planned``: a base
    arm, plain but for the norms in FP32, then it without :data:`ATTRIBUTION`'s first factor
    (no flush), without its second (full subnormals) and without both.

    >>> attributions(arms(False))[0]
    ('e3m4_ieee norms FP32', 'e3m4_ieee no flush norms FP32', \
'e3m4_ieee full subnormals norms FP32', 'e3m4_ieee no flush full subnormals norms FP32')
    """
    other = _finder(planned)
    out = []
    for a in planned:
        if a.factors != {**a.factors, **PLAIN, "norms": "fp32"}:
            continue
        corners = (other(a.factors, flush=False), other(a.factors, subnormals="full"),
                   other(a.factors, flush=False, subnormals="full"))
        if all(corners):
            out.append((a.name, *corners))
    return out


def run_arms(adapter: models.Adapter, inputs: list, ref: list, planned: list[Arm],
             capture: int, ex: Execution, amax: dict[str, dict[str, float]] | None = None,
             ref_seconds: float = 0.0, kept: bool = False) -> list[dict[str, Any]]:
    """``run_arm`` of every planned arm on ``ex`` (``runner.execute``), in plan order
    (``amax``: per-site scaling's calibration; the inputs and reference, computed in
    ``ref_seconds``, saved in the task folder for the workers and for ``--resume``, unless
    ``kept``: the folder's file already holds them, :func:`saved_reference`); raises naming
    every arm that failed after the others ended (those are kept for ``--resume``)."""
    source = adapter.source
    if ex.executor != "inprocess" and source is None:
        raise ValueError(f"--executor {ex.executor} rebuilds the model in each worker, and this "
                         "adapter was not made by fpsim_experiments.models.get: run in-process")
    source = source if source is not None else ("object", id(adapter))
    folder = ex.folder
    if folder is None:
        if ex.executor != "inprocess":
            raise ValueError(f"--executor {ex.executor} needs a folder for the task files")
        saved = ""
    else:
        folder.mkdir(parents=True, exist_ok=True)
        saved = str(folder / REFERENCE_FILE)
        if not kept:
            part = folder / f"{REFERENCE_FILE}.part"     # replaced whole: a worker may map it
            torch.save({"inputs": inputs, "reference": ref, "amax": amax,
                        "seconds": ref_seconds, "versions": versions()}, part)
            os.replace(part, saved)
    _ADAPTERS.clear()
    _ADAPTERS[source] = adapter
    _SAVED.clear()
    _SAVED[saved] = (inputs, ref, amax)
    work = StudyWork(source, saved, capture)
    meta = {"model": adapter.name, **adapter.describe(inputs), "capture": capture}
    specs = {a: {**meta, "arm": a.name, "recipe": a.recipe.to_json(), "factors": a.factors}
             for a in planned}
    outcome = runner.execute(work, planned, specs, folder, ex.executor, workers=ex.workers,
                             address=ex.address, resume=ex.resume, retries=ex.retries,
                             desc=f"{adapter.name}: arms")
    if outcome.failed:
        kept = f"; the {len(outcome.results)} finished are kept in {folder}: rerun with " \
               "--resume to compute only the others" if folder is not None else ""
        raise RuntimeError(f"{len(outcome.failed)} arm(s) failed: " + "; ".join(
            f"{f['task']}: {f['error']}" for f in outcome.failed) + kept)
    return [{k: v for k, v in outcome.results[a].items() if k != "versions"} for a in planned]


def _value(scores: tuple[list[float], list[float]]) -> float:
    n, d = math.fsum(scores[0]), math.fsum(scores[1])
    return n / d if d else math.nan


def summarize(scores: dict[str, tuple[list[float], list[float]]]) -> dict[str, Any]:
    """Each metric's value (sum of numerators / sum of denominators) and 95% interval over
    units, with the per-unit sums kept for paired ratios."""
    weights = bootstrap.window_weights(len(next(iter(scores.values()))[0]))
    return {k: {"value": _value(v), "ci": bootstrap.percentile_interval(
        bootstrap.sums_ratio(v[0], v[1], weights)), "num": list(v[0]), "den": list(v[1])}
        for k, v in scores.items()}


def combined(metrics: list[dict], fn: Any) -> dict[str, Any]:
    """``fn`` of several arms' metrics (:func:`summarize`'s), with its paired interval over
    units (every arm resampled on the same units) and two-sided p-value; its value NaN where
    a zero metric makes it infinite."""
    weights = bootstrap.window_weights(len(metrics[0]["num"]))
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        samples = np.asarray(fn(*[bootstrap.sums_ratio(m["num"], m["den"], weights)
                                  for m in metrics]), dtype=np.float64)
        values = [m["value"] for m in metrics]
        point = float(fn(*map(np.float64, values)))
    if not math.isfinite(point) and 0 in values:
        point = math.nan
    return {"ratio": point, "ci": bootstrap.percentile_interval(samples),
            "p": bootstrap.p_value(samples, point)}


def ratio(a: dict, b: dict) -> dict[str, Any]:
    """metric(a) / metric(b) with its paired interval over units and two-sided p-value."""
    return combined([a, b], lambda x, y: x / y)


def attribute(metrics: list[dict]) -> dict[str, dict[str, Any]]:
    """Every term of :func:`.likewise.order_free`'s split of :data:`ATTRIBUTION` (``metrics``:
    base, first, second, both), a :func:`combined` each; ``decides``: whether it joins the
    Holm family (the Shapley values and the interaction)."""
    return {term: {**combined([metrics[i] for i in idx], fn), "decides": measures is None}
            for term, (idx, fn, measures) in likewise.order_free(ATTRIBUTION).items()}


def _sites(table_rows: list[dict]) -> list[dict]:
    keep = ("site", "kind", "recipe", "calls", "elements", "amax", "overflow", "saturated",
            "flushed", "nonfinite", "snr_db")
    return [{k: r[k] for k in keep} for r in table_rows]


def run_arm(adapter: models.Adapter, model: Any, units: list, ref: list, arm_: Arm,
            capture: int, amax: dict[str, dict[str, float]] | None = None) -> dict[str, Any]:
    """One arm: its metrics on every unit, then its sites captured on the first ``capture``
    (``amax``: per-site scaling's calibration).  The units run and are scored piece by piece
    (``pieces``) in one emulation, entered once per piece, so only a piece's
    outputs are held; ``seconds`` counts the runs, not the scoring."""
    em, seconds = fpsim.emulate(arm_.rules(), amax=amax), 0.0
    scores: Scores = {}
    for part in pieces(adapter, len(units)):
        start = time.perf_counter()
        with em:
            out = adapter.run(model, units[part], ref[part])
        seconds += time.perf_counter() - start
        for k, (num_, den) in adapter.score(units[part], ref[part], out).items():
            kept = scores.setdefault(k, ([], []))
            kept[0].extend(num_)
            kept[1].extend(den)
    with fpsim.emulate(arm_.rules(), capture=True, amax=amax) as cap:
        adapter.trace(model, units[:capture], ref[:capture])
    return {"name": arm_.name, "factors": arm_.factors, "recipe": arm_.recipe.to_json(),
            "metrics": summarize(scores),
            "sites": _sites(cap.table()), "missed": {site: stats.calls for site, stats in em.missed.items()},
            "seconds": round(seconds, 2)}


#: The adapters and the saved inputs and reference this process has, by source and file
#: (a worker keeps them between tasks; the driver registers its own)
_ADAPTERS: dict[Any, models.Adapter] = {}
_SAVED: dict[str, tuple[list, list, Any]] = {}


@dataclass(frozen=True)
class StudyWork:
    """The study's arms as the sweep runner's work: ``source`` names the model
    (``models.get``'s argument, or ``("object", id)`` for an adapter made otherwise, this
    process only), ``saved`` the file of the inputs and the FP32 reference, ``capture`` the
    units of the capture pass; the file also holds per-site scaling's calibration."""

    source: Any
    saved: str
    capture: int

    def reference(self, task: Arm, device: str) -> str:
        """The saved file (read once per process by ``compute``)."""
        if self.saved not in _SAVED and not Path(self.saved).is_file():
            raise FileNotFoundError(f"{self.saved}: the study's inputs and reference are not "
                                    "there; a Ray cluster on other machines needs --out on a "
                                    "filesystem they share")
        return self.saved

    def compute(self, task: Arm, ref: str, device: str) -> dict[str, Any]:
        """``run_arm`` of the arm on the saved inputs, with the versions that computed it."""
        if self.source not in _ADAPTERS:
            _ADAPTERS[self.source] = models.get(self.source)
        if ref not in _SAVED:
            _SAVED.clear()
            # mapped, not read: the workers of a pool share the reference's pages
            d = torch.load(ref, weights_only=False, mmap=True)
            _SAVED[ref] = d["inputs"], d["reference"], d["amax"]
        adapter, (inputs, out, amax) = _ADAPTERS[self.source], _SAVED[ref]
        return {**run_arm(adapter, adapter.model(), inputs, out, task, self.capture, amax),
                "versions": versions()}


def reference(adapter: models.Adapter, model: Any, inputs: list, calibrate: bool
              ) -> tuple[list, dict[str, dict[str, float]] | None, float]:
    """The FP32 reference run on ``inputs``: its outputs, with ``calibrate`` every site's
    operand amax in it (per-site scaling's calibration, else None), and its seconds."""
    cal = Calibration() if calibrate else None
    start = time.perf_counter()
    with torch.no_grad(), fpsim.emulate(REFERENCE, watch=cal):
        ref = adapter.run(model, inputs)
    return ref, None if cal is None else cal.amax, time.perf_counter() - start


def same(a: Any, b: Any) -> bool:
    """Whether two inputs are equal bit for bit: tensors and arrays by dtype, shape and value,
    dataclasses field by field, lists, tuples and dicts item by item, anything else by ``==``.

    >>> same([torch.tensor([1.0, -0.0])], [torch.tensor([1.0, -0.0])])
    True
    >>> same({"x": np.zeros(2)}, {"x": np.zeros(2, np.float32)})
    False
    """
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    if dataclasses.is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name))
                   for f in dataclasses.fields(a))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


#: the inputs and FP32 reference a study saves beside its task files
REFERENCE_FILE = "reference.pt"


def saved_reference(ex: Execution, inputs: list, calibrate: bool
                    ) -> tuple[list, dict[str, dict[str, float]] | None, float] | None:
    """With ``--resume``, the reference a killed run saved in the task folder (outputs,
    calibration, seconds), when it was computed from the same inputs under the same versions
    (:func:`.report.versions`) and holds the calibration the arms need; else None, and the
    reference is computed again."""
    path = None if ex.folder is None or not ex.resume else ex.folder / REFERENCE_FILE
    if path is None or not path.is_file():
        return None
    try:
        d = torch.load(path, weights_only=False)
    except (OSError, EOFError, RuntimeError, pickle.UnpicklingError):   # cut short by a kill
        return None
    if not isinstance(d, dict) or d.get("versions") != versions() \
            or (calibrate and d["amax"] is None) or not same(d["inputs"], inputs):
        return None
    return d["reference"], d["amax"] if calibrate else None, d["seconds"]


def study(adapter: models.Adapter, quick: bool, units: int | None = None,
          planned: list[Arm] | None = None,
          execution: Execution | None = None) -> dict[str, Any]:
    """The whole study of one model: reference, every arm (default :func:`arms`), every
    comparison with Holm; ``units``: inputs (default the adapter's quick or full size);
    ``execution``: where the arms run (default this process, no task files)."""
    size = "quick" if quick else "full"
    model = adapter.model()
    inputs = adapter.inputs(units or adapter.sizes[size])
    planned = arms(quick) if planned is None else planned
    execution = execution or Execution()
    calibrate = any(a.factors["scaling"] == "site" for a in planned)
    kept = saved_reference(execution, inputs, calibrate)
    ref, amax, ref_seconds = kept or reference(adapter, model, inputs, calibrate)
    start = time.perf_counter()
    with torch.no_grad():
        for part in pieces(adapter, len(inputs)):     # outputs dropped piece by piece
            adapter.run(model, inputs[part])
    native = time.perf_counter() - start
    capture = min(len(inputs), CAPTURE_UNITS[size])
    runs = run_arms(adapter, inputs, ref, planned, capture, execution, amax, ref_seconds,
                    kept=kept is not None)
    baseline = summarize(adapter.score(inputs, ref, ref))
    by = {r["name"]: r for r in runs}
    primary = next(iter(adapter.metrics))
    comps = []
    for question, a, b, factor in comparisons(planned):
        ma, mb = by[a]["metrics"][primary], by[b]["metrics"][primary]
        comps.append({"question": question, "a": a, "b": b, "factor": factor,
                      "metric": primary, "a_finite": math.isfinite(ma["value"]),
                      "b_finite": math.isfinite(mb["value"]), **ratio(ma, mb)})
    attrs = []
    for names in attributions(planned):
        terms = attribute([by[n]["metrics"][primary] for n in names])
        attrs.append({"runs": dict(zip(("base", "first", "second", "both"), names)),
                      "factors": list(ATTRIBUTION), "metric": primary, "terms": terms})
    family = comps + [t for a in attrs for t in a["terms"].values() if t["decides"]]
    for c, survives in zip(family, bootstrap.holm([c["p"] for c in family])):
        c["holm"] = survives
    return {"model": {"name": adapter.name, "unit": adapter.unit,
                      "parameters": sum(p.numel() for p in model.parameters()),
                      **adapter.describe(inputs)},
            "metrics": dict(adapter.metrics), "primary": primary, "baseline": baseline,
            "capture_units": capture, "runs": runs, "comparisons": comps,
            "attributions": attrs,
            **({} if amax is None else {"calibration": {"units": len(inputs),
                                                        "sites": len(amax)}}),
            "seconds": {"native": round(native, 2), "reference": round(ref_seconds, 2),
                        **({"reference_reused": True} if kept else {})}}


# --------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------
def _cell(m: dict) -> str:
    return f"{num(m['value'])} {fmt_ci(m['ci'])}" if math.isfinite(m["value"]) else "NaN"


def _emulated(run: dict) -> list[dict]:
    """A run's capture rows of the sites its recipe emulated."""
    return [s for s in run["sites"] if s["recipe"] != "not emulated"]


def trouble(run: dict) -> tuple[list[dict], int, int, int]:
    """The sites that overflowed (most first), and the operand elements flushed, saturated and
    in all, in the capture pass."""
    rows = _emulated(run)
    over = sorted((s for s in rows if s["overflow"]), key=lambda s: -s["overflow"])
    return (over, sum(s["flushed"] for s in rows), sum(s["saturated"] for s in rows),
            sum(s["elements"] for s in rows) or 1)


def flushed_by_op(run: dict) -> list[tuple[str, float]]:
    """The share of a run's flushed operand elements at each kind of op (the part of a site's
    name after ``:``: ``linear``, ``pv``, ``qk``, ...), largest first.

    >>> flushed_by_op({"sites": [{"site": "l.0:pv", "recipe": "x", "flushed": 3},
    ...                          {"site": "l.0.fc:linear", "recipe": "x", "flushed": 1}]})
    [('pv', 0.75), ('linear', 0.25)]
    """
    by: dict[str, int] = {}
    for s in _emulated(run):
        op = s["site"].rpartition(":")[2]
        by[op] = by.get(op, 0) + s["flushed"]
    total = sum(by.values())
    return [] if not total else sorted(((op, n / total) for op, n in by.items() if n),
                                       key=lambda kv: -kv[1])


def verdict(c: dict) -> str:
    """A comparison in words: its ratio, interval and the side it calls (Holm-corrected)."""
    if not math.isfinite(c["ratio"]) or not all(map(math.isfinite, c["ci"])):
        bad = [n for n, ok in ((c["a"], c["a_finite"]), (c["b"], c["b_finite"])) if not ok]
        return (f"{c['a']} / {c['b']}: " + (f"inf/NaN at {' and '.join(bad)}" if bad else
                                           "undefined (a zero metric)"))
    side = bootstrap.verdict(c["ci"], f"{c['a']} worse", f"{c['a']} better")
    if side != "no measurable difference" and not c["holm"]:
        side += " by its interval, exploratory: not significant after Holm"
    return f"{c['a']} / {c['b']}: {c['ratio']:.3g}× {fmt_ci(c['ci'])}, {side}"


def nonfinite(run: dict, metric: str, unit: str) -> str:
    """The arm's name and on how many units (``unit``s) its metric is inf or NaN.

    >>> nonfinite({"name": "a", "metrics": {"m": {"num": [1.0, math.nan, math.inf]}}}, "m",
    ...           "clip")
    'a (2 of 3 clips)'
    """
    num = run["metrics"][metric]["num"]
    return f"{run['name']} ({sum(not math.isfinite(v) for v in num)} of {len(num)} {unit}s)"


def conclusions(data: dict) -> list[str]:
    """Per budget and scaling the best split; where the 8-bit unscaled splits overflow; every
    comparison's verdict."""
    p = data["primary"]
    out = []
    runs = [r for r in data["runs"] if r["factors"]["encoding"] == "ieee"
            and r["factors"]["flush"] and r["factors"]["subnormals"] == "format"
            and r["factors"]["norms"] == "format"]
    for b in sorted({r["factors"]["budget"] for r in runs}):
        for s in ("none", "tensor", "pow2", "channel", "site"):
            series = [r for r in runs if r["factors"]["budget"] == b and r["factors"]["scaling"] == s]
            finite = [r for r in series if math.isfinite(r["metrics"][p]["value"])]
            if not series:
                continue
            parts = []
            if finite:
                best = min(finite, key=lambda r: r["metrics"][p]["value"])
                parts.append(f"lowest {p} {_cell(best['metrics'][p])} at {best['name']}")
            bad = [nonfinite(r, p, data["model"]["unit"]) for r in series if r not in finite]
            parts += [f"inf/NaN at {', '.join(bad)}"] if bad else []
            label = "unscaled" if s == "none" else SCALING_WORDS.get(s, f"per-{s}")
            out.append(f"B={b}, {label}: " + "; ".join(parts) + ".")
    for r in runs:
        if r["factors"]["budget"] == 8 and r["factors"]["scaling"] == "none":
            over, flushed, _, elements = trouble(r)
            where = ", ".join(f"{s['site']} ({s['overflow']} elements, amax {num(s['amax'])})"
                              for s in over[:3])
            ops = ", ".join(f"{op} {pct(share)}" for op, share in flushed_by_op(r)[:3])
            out.append(f"{r['name']}: {pct(flushed / elements)} of operand elements flushed"
                       + (f" (of them at {ops})" if ops else "") + "; "
                       + (f"overflow at {where}" if over else "nothing overflowed")
                       + f" (capture of {data['capture_units']} {data['model']['unit']}s).")
    kept = sum(bool(c["holm"]) for c in data["comparisons"])
    out += [verdict(c) + "." for c in data["comparisons"]]
    attrs = data.get("attributions", [])
    out += [attribution_line(data, a) for a in attrs]
    decided = [t for a in attrs for t in a["terms"].values() if t["decides"]]
    if not decided:
        out.append(f"{kept} of {len(data['comparisons'])} comparisons of {p} survive Holm's "
                   "correction at 5% family-wise.")
        return out
    out.append(f"{kept + sum(bool(t['holm']) for t in decided)} of "
               f"{len(data['comparisons']) + len(decided)} verdicts of {p} (the "
               f"{len(data['comparisons'])} comparisons, and the attributions' Shapley values "
               "and interactions) survive Holm's correction at 5% family-wise.")
    return out


def _term(t: dict) -> str:
    """An attribution term: ``1.23× [1.2, 1.3]``, and for a Shapley value or interaction
    whether it survives Holm."""
    if not math.isfinite(t["ratio"]) or not all(map(math.isfinite, t["ci"])):
        return "undefined"
    text = f"{t['ratio']:.3g}× {fmt_ci(t['ci'])}"
    return text + ("" if not t["decides"] or t["holm"] or not bootstrap.excludes_one(t["ci"])
                   else " (exploratory: not significant after Holm)")


def attribution_line(data: dict, a: dict) -> str:
    """An order-free attribution in words, as metric factors (the tiny model's study's
    sentence, ``.range_findings.attribution_lines``)."""
    p, runs, t = data["primary"], a["runs"], a["terms"]
    by = {r["name"]: r for r in data["runs"]}
    bad = [n for n in runs.values() if not math.isfinite(by[n]["metrics"][p]["value"])]
    head = (f"{runs['base']} (unscaled, norms in FP32), what the bottom of the range costs, as "
            f"{p} factors")
    if bad:
        return f"{head}: inf/NaN at {', '.join(bad)}, no attribution."
    f0, f1 = a["factors"]
    side = bootstrap.verdict(t["interaction"]["ci"], INTERACT_ABOVE, INTERACT_BELOW,
                             "no measurable interaction")
    return (f"{head} ({p} {num(by[runs['base']]['metrics'][p]['value'])} -> "
            f"{num(by[runs['both']]['metrics'][p]['value'])}, {_term(t['total'])}): "
            f"{f0} removed first {_term(t[f'{f0} first'])}, then {f1} "
            f"{_term(t[f'{f1} after'])}; {f1} first {_term(t[f'{f1} first'])}, then {f0} "
            f"{_term(t[f'{f0} after'])}; order-free (Shapley, geometric mean of the two "
            f"orders) {f0} {_term(t[f'{f0} Shapley'])}, {f1} {_term(t[f'{f1} Shapley'])}, "
            f"interaction {_term(t['interaction'])} ({side}).")


def render(data: dict, out: Path) -> str:
    """REPORT.md: conclusions, the table of every arm, and the sites that overflowed."""
    meta, model = data["meta"], data["model"]
    names = list(data["metrics"])
    rows = [["FP32 (reference)", "-", *[_cell(data["baseline"][k]) for k in names], "-", "-"]]
    for r in data["runs"]:
        over, flushed, saturated, elements = trouble(r)
        rows.append([r["name"], r["seconds"], *[_cell(r["metrics"][k]) for k in names],
                     ", ".join(s["site"] for s in over[:2]) or "-",
                     f"{pct(flushed / elements)} / {pct(saturated / elements)}"])
    body = ["## Every arm", "", "Metrics: " + "; ".join(f"`{k}`: {v}" for k, v in
                                                       data["metrics"].items()) + ".", "",
            table(["arm", "s", *names, "overflow at (capture)", "flushed / saturated"], rows),
            ""]
    missed = sorted({m for r in data["runs"] for m in r["missed"]})
    if missed:
        body += [f"Not emulated (computed by torch in FP32): {', '.join(missed)}.", ""]
    unit = model["unit"]
    intro = (f"`{model['name']}`, {model['parameters']:,} parameters; inputs: "
             + ", ".join(f"{v} {k}" for k, v in model.items()
                         if k not in ("name", "unit", "parameters"))
             + f" ({unit}s are the bootstrap's independent unit); {meta['seconds']} s. Every "
             "dot product and norm statistic runs through fpsim.emulate under each arm's "
             "recipe; the reference is FP32 (sums in FP64, rounded once). Formats: `eXmY` is "
             "IEEE-style (inf/NaN in the all-ones exponent: e4m3 has max 240), `fn` OCP-style.")
    size = meta.get("units", {})
    if size.get("asked") and size["asked"] < size["full"] and not meta["quick"]:
        intro += (f" Inputs: {size['asked']} (`--units`), fewer than the study's full "
                  f"{size['full']}.")
    if "calibration" in data:
        intro += (f" Per-site scaling (`per-site`): one scale per site and operand, the same at "
                  f"every call, its amax the largest |value| the operand reached at that site in "
                  f"the FP32 reference on these {data['calibration']['units']} {unit}s "
                  f"({data['calibration']['sites']} sites), so the scales were calibrated on the "
                  "units they are scored on; a value beyond it overflows.")
    if meta.get("resumed"):                     # how a run resumed with --resume was computed
        intro += " " + meta["resumed"]
    if data["seconds"].get("reference_reused"):
        intro += (" The FP32 reference was read from the task folder, where the run this one "
                  "resumed had saved it from the same inputs (`--resume`).")
    run = meta.get("arms", {})
    if run and run["run"] < run["of"]:
        intro += (f" Arms: {run['run']} of the study's {run['of']} (chosen with `--cases`); "
                  "the others were not run, so no comparison involves them.")
    return page(f"{NAME}: {model['name']}", meta, intro, conclusions(data), body)


def slug(name: str) -> str:
    """A folder name for a model: its name, or a directory's last part."""
    return Path(name).name if "/" in name else name


def selected(model: str) -> bool:
    """Whether ``--model`` asks for this study: a name of :data:`models.NAMES`, or a
    directory that is not a GPT-2 checkpoint (those keep the tiny model's study)."""
    from .anymodel import model_type

    return model in models.NAMES or model_type(model) not in (None, "gpt2")


def main(args: argparse.Namespace) -> int:
    """Run (or ``--render``) the study of ``args.model`` into ``OUT/range-vs-precision-<model>``."""
    out = args.out / f"{NAME}-{slug(args.model)}"
    data = None
    ex = Execution(args.executor, args.workers, args.address, out / "tasks", args.resume)
    if not args.render:
        torch.set_num_threads(args.threads)
        os.environ["FPSIM_THREADS"] = str(args.threads)   # fpsim.parallel reads it per call
        start = time.perf_counter()
        adapter = models.get(args.model)
        planned = chosen(args.cases, args.quick)
        data = study(adapter, args.quick, args.units, planned=planned, execution=ex)
        data["meta"] = {"model": adapter.name, "quick": args.quick, "threads": args.threads,
                        "arms": {"run": len(planned), "of": len(arms(args.quick))},
                        "units": {"asked": args.units, "full": adapter.sizes["full"]},
                        "executor": args.executor, "workers": args.workers, **versions(),
                        "seconds": round(time.perf_counter() - start, 1)}
    finish(NAME, out, data, render)
    if data is not None:
        ex.finish()
    return 0
