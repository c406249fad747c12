"""Ratios of two end-to-end runs that compare like with like, with the intervals and the
multiple-comparison correction the reports state.

Every run is described factor by factor (``describe``: format, activation and weight
scaling, saturation, flush, subnormal width, LayerNorms in FP32, attention semantics).  A
ratio names the factor(s) it measures, and ``Ratios.ratio`` refuses two runs that differ
in anything else: "e3m4 without flush and subnormal loss / e4m3" would otherwise credit the
format with what keeping the LayerNorms in FP32 did.

Each ratio carries two paired 95% percentile intervals: over windows (the windows of text
resampled, as ``.bootstrap`` does) and over topics (the held-out topics resampled, each
bringing all its windows: a cluster bootstrap; the windows of one topic are not independent
text).  Each ratio that decides a verdict joins a family; ``Ratios.holm`` applies Holm's
correction to the family's p-values (``.bootstrap.p_value``), and a side is called only
when the window interval excludes 1 *and* the ratio survives Holm; otherwise the sentence
says it is exploratory.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import bootstrap
from .bootstrap import fmt_ci

FACTORS = ("format", "activations", "weights", "saturate", "flush", "full_subnormals",
           "ln_fp32", "attention")
LN_FP32 = "none-ln-fp32"


def describe(run: dict) -> dict[str, Any]:
    """A run of range-vs-precision (a split, an ablation, a P3109 run or a case), factor by
    factor."""
    if "describe" in run:
        return dict(run["describe"])
    recipe = run.get("recipe", {})
    scaling = run.get("scaling", recipe.get("scaling", "none"))
    ln = bool(run.get("ln_fp32")) or scaling == LN_FP32
    scaling = "none" if scaling == LN_FP32 else scaling
    return {"format": run["format"], "activations": scaling, "weights": scaling,
            "saturate": bool(recipe.get("saturate", False)), "flush": recipe.get("flush", True),
            "full_subnormals": bool(recipe.get("full_subnormals", False)), "ln_fp32": ln,
            "attention": "eager"}


def differences(a: dict, b: dict) -> list[str]:
    """The factors in which runs ``a`` and ``b`` differ."""
    da, db = describe(a), describe(b)
    return [k for k in FACTORS if da.get(k) != db.get(k)]


def check(a: dict, b: dict, factors: str | Sequence[str]) -> None:
    """Raise ValueError unless ``a`` and ``b`` differ in the named factor(s) only."""
    named = {factors} if isinstance(factors, str) else set(factors)
    unknown = named - set(FACTORS)
    if unknown:
        raise ValueError(f"unknown factor(s) {sorted(unknown)}; one of {FACTORS}")
    extra = [k for k in differences(a, b) if k not in named]
    if extra:
        da, db = describe(a), describe(b)
        raise ValueError(
            f"{label(a)} / {label(b)}: the ratio names {sorted(named)} but the runs also differ "
            "in " + ", ".join(f"{k} ({da.get(k)} vs {db.get(k)})" for k in extra)
            + "; compare runs that differ in the named factor only")


def label(run: dict) -> str:
    """A short name of a run: its format and what differs from the plain unscaled run."""
    d = describe(run)
    parts = [d["format"]]
    if d["activations"] == d["weights"]:
        if d["activations"] != "none":
            parts.append(f"per-{d['activations']}")
    else:
        parts.append(f"activations {d['activations']}, weights per-{d['weights']}"
                     if d["weights"] != "none" else
                     f"activations per-{d['activations']}, weights unscaled")
    for key, text in (("ln_fp32", "LN FP32"), ("saturate", "saturating")):
        if d[key]:
            parts.append(text)
    if not d["flush"]:
        parts.append("no flush")
    if d["full_subnormals"]:
        parts.append("full subnormals")
    if d["attention"] != "eager":
        parts.append(f"{d['attention']} attention")
    return parts[0] + (f" ({', '.join(parts[1:])})" if len(parts) > 1 else "")


@dataclass
class Ratio:
    """A ratio of end-to-end KL with its intervals and, after ``Ratios.holm``, whether it
    survives the correction."""

    name: str
    point: float
    windows: list[float]
    topics: list[float] | None
    p: float
    decides: bool
    holm: bool | None = None
    n: int | None = None
    full: int | None = None
    per_topic: list[float] | None = None      # the ratio on each topic's windows alone

    def text(self) -> str:
        """``1.23× [1.21, 1.26] (topics [1.1, 1.4])``, and the windows when a subset."""
        out = f"{self.point:.3g}× {fmt_ci(self.windows)}"
        if self.topics is not None:
            out += f" (topics {fmt_ci(self.topics)}"
            out += f"; first {self.n} windows)" if self.n != self.full else ")"
        elif self.n != self.full:
            out += f" (first {self.n} windows)"
        return out

    def side(self, above: str, below: str, same: str = "no measurable difference") -> str:
        """``above``/``below`` when the window interval excludes 1 and the ratio survives Holm;
        when only the interval excludes 1, the side marked exploratory; else ``same``."""
        called = bootstrap.verdict(self.windows, above, below, same)
        if called == same or self.holm is None or self.holm:
            return called
        return f"{called} by its 95% interval, exploratory: not significant after Holm"


@dataclass
class Ratios:
    """The ratios of one report: paired window and topic bootstraps and the Holm family.

    ``topics``: the cluster (held-out topic) of each window, or None when unknown (no topic
    interval then).  Render twice: the first pass (``holm()`` not yet called) collects the
    family; after ``holm`` the same calls return ratios that know whether they survive.
    """

    windows: int
    topics: Sequence[str] | None = None
    family: dict[str, Ratio] = field(default_factory=dict)
    decided: dict[str, bool] | None = None

    def _weights(self, n: int) -> tuple[Any, Any]:
        """Window and topic bootstrap counts for the first ``n`` windows."""
        w, labels = bootstrap.window_weights(n), self._labels(n)
        if labels is None:
            return w, None
        return w, bootstrap.cluster_weights([sorted(set(labels)).index(t) for t in labels])

    def _labels(self, n: int) -> list[str] | None:
        """The topics of the first ``n`` windows; None without topics or with one only (a
        cluster bootstrap of one cluster is a degenerate interval)."""
        if self.topics is None or len(set(self.topics[:n])) < 2:
            return None
        return list(self.topics[:n])

    def _members(self, n: int) -> Any:
        """One row per topic of the first ``n`` windows: 1 on its windows (None: no topics)."""
        labels = self._labels(n)
        if labels is None:
            return None
        a = np.asarray(labels)
        return (a[None, :] == np.unique(a)[:, None]).astype(np.float64)

    def combine(self, runs: Sequence[dict], fn: Any, name: str,
                decides: bool = False) -> Ratio:
        """``fn`` of the runs' KLs (paired) with both intervals; joins the family when it
        ``decides`` a verdict.  Runs over fewer windows (a subset run: the first windows of
        the same text) pair with the others' first windows, and the name says so."""
        n = min(len(r["e2e"]["windows"]["kl"]) for r in runs)
        e2e = [first_windows(r["e2e"], n) for r in runs]
        if n < self.windows:
            name += f" (first {n} windows)"
        w, t = self._weights(n)
        point, ci, samples = bootstrap.combine(e2e, fn, w)
        topics = None if t is None else bootstrap.combine(e2e, fn, t)[1]
        r = Ratio(name, point, ci, topics, bootstrap.p_value(samples, point), decides, n=n)
        members = self._members(n)
        if members is not None:
            r.per_topic = [float(v) for v in bootstrap.combine(e2e, fn, members)[2]]
        r.full = self.windows
        if decides:
            self.family[name] = r
            if self.decided is not None:
                r.holm = self.decided.get(name, False)
        return r

    def ratio(self, a: dict, b: dict, factors: str | Sequence[str],
              decides: bool = True) -> Ratio:
        """KL(a) / KL(b) for runs that differ in ``factors`` only (else ValueError)."""
        check(a, b, factors)
        return self.combine([a, b], lambda x, y: x / y, f"{label(a)} / {label(b)}", decides)

    def holm(self) -> None:
        """Apply Holm's correction to the family collected so far (the next pass uses it)."""
        names = list(self.family)
        rejected = bootstrap.holm([self.family[n].p for n in names])
        self.decided = dict(zip(names, rejected))
        self.family = {}

    def top_two(self) -> float:
        """Share of the windows in the two largest topics (0 without topics)."""
        if not self.topics:
            return 0.0
        sizes = sorted(Counter(self.topics).values(), reverse=True)
        return sum(sizes[:2]) / len(self.topics)

    def summary(self) -> str:
        """What the family is and how many of its verdicts survive the correction."""
        if self.decided is None:
            return ""
        n = len(self.decided)
        kept = sum(self.decided.values())
        widths = sorted(
            math.log(r.topics[1] / r.topics[0]) / math.log(r.windows[1] / r.windows[0])
            for r in self.family.values()
            if r.topics and all(map(math.isfinite, r.topics + r.windows))
            and r.windows[1] > r.windows[0] and r.topics[0] > 0)
        spread = "" if not widths else (
            f" Interval widths (log scale), topic bootstrap / window bootstrap, over the family: "
            f"median {widths[len(widths) // 2]:.2f}, range {widths[0]:.2f}–{widths[-1]:.2f}; "
            f"the topic interval is the narrower for {sum(x < 1 for x in widths)} of "
            f"{len(widths)} ratios. With {len(set(self.topics or ()))} topics, two of which hold "
            f"{self.top_two():.0%} of the windows, the topic bootstrap has too few clusters "
            "to be trusted and is no check on the window interval: the ratio on one topic's "
            "windows alone often lies outside both (per topic, in the conclusions).")
        return (f"Multiple comparisons: the family is the {n} ratios of this report that decide a "
                f"verdict (a side called worse or better); Holm's step-down correction at a "
                f"family-wise 5% (p-values from the normal approximation of each ratio's "
                f"window bootstrap of log KL ratio) keeps {kept} of them; a verdict whose 95% "
                "interval excludes 1 but that does not survive is marked exploratory." + spread)


def first_windows(e2e: dict, n: int) -> dict:
    """``e2e`` restricted to its first ``n`` windows: per-window sums cut, KL, loss, top-1 and
    finite share recomputed from them (unchanged when it has ``n`` windows)."""
    w = e2e["windows"]
    if len(w["kl"]) == n:
        return e2e
    cut = {k: (v[:n] if isinstance(v, list) else v) for k, v in w.items()}
    count = w["positions"] * n
    out = {k: math.fsum(cut[k]) / count for k in ("loss", "kl", "top1", "finite")}
    fin = math.fsum(cut["finite"])
    out["kl_finite"] = math.fsum(cut["kl_finite"]) / fin if fin else math.nan
    return {**out, "windows": cut}


def order_free(factors: tuple[str, str]) -> dict[str, tuple[tuple[int, ...], Any, Any]]:
    """The terms of an order-free split of M(base) / M(both) between two factors removed from
    a base run (M: a lower-is-better metric such as KL; runs 0 base, 1 ``first`` without
    factors[0], 2 ``second`` without factors[1], 3 ``both``), as metric factors: each factor
    removed first and removed second (the two orders), the Shapley value of each (the
    geometric mean of its two orders), the interaction (M(first)·M(second) / (M(base)·M(both)):
    what removing both gains beyond the product of removing each alone; 1 when the factors act
    independently) and the total.  Each term: (the runs it reads, its function of their
    metrics, the factor(s) its two runs differ in; None for the terms of all four runs, which
    decide a verdict and join the Holm family).  The Shapley values multiply to the total.

    >>> m = (8.0, 4.0, 2.0, 1.0)           # base, first, second, both
    >>> {k: fn(*[m[i] for i in runs]) for k, (runs, fn, _) in order_free(("a", "b")).items()}
    {'a first': 2.0, 'b after': 4.0, 'b first': 4.0, 'a after': 2.0, 'a Shapley': 2.0, \
'b Shapley': 4.0, 'interaction': 1.0, 'total': 8.0}
    """
    f0, f1 = factors
    return {f"{f0} first": ((0, 1), lambda b, x: b / x, f0),
            f"{f1} after": ((1, 3), lambda x, z: x / z, f1),
            f"{f1} first": ((0, 2), lambda b, y: b / y, f1),
            f"{f0} after": ((2, 3), lambda y, z: y / z, f0),
            f"{f0} Shapley": ((0, 1, 2, 3), lambda b, x, y, z: ((b / x) * (y / z)) ** 0.5, None),
            f"{f1} Shapley": ((0, 1, 2, 3), lambda b, x, y, z: ((b / y) * (x / z)) ** 0.5, None),
            "interaction": ((0, 1, 2, 3), lambda b, x, y, z: (x * y) / (b * z), None),
            "total": ((0, 3), lambda b, z: b / z, factors)}


def attribution(ratios: Ratios, base: dict, first: dict, second: dict, both: dict,
                factors: tuple[str, str]) -> dict[str, Ratio]:
    """``order_free``'s split of KL(base) / KL(both) between two factors removed from
    ``base`` (``first`` removes factors[0], ``second`` factors[1], ``both`` both), each term
    a ``Ratio`` with its intervals; a two-run term refuses runs that differ in more than its
    factor(s)."""
    runs = (base, first, second, both)
    check(base, both, factors)
    out = {}
    for term, (idx, fn, measures) in order_free(factors).items():
        pair = [runs[i] for i in idx]
        if measures is not None:
            check(*pair, measures)
            name = f"{label(pair[0])} / {label(pair[1])}"
        else:
            name = f"{label(base)}: " + (term if term == "interaction" else
                                         f"{term.removesuffix(' Shapley')} (Shapley)")
        out[term] = ratios.combine(pair, fn, name, measures is None)
    return out


def finite(*runs: dict) -> bool:
    """Whether every run's end-to-end KL is finite (a ratio can be taken)."""
    return all(math.isfinite(r["e2e"]["kl"]) for r in runs)
