"""Replay captured sites under a recipe and measure what the arithmetic did to each output.

The reference of a site is FP64 arithmetic on the same captured operands, so a site's error is
its own (its operands carry no error from earlier sites).  Per site: the share of outputs that
overflowed to inf/NaN, saturated (clamped at the output format's largest value) or flushed to
zero; the same events for each operand's elements; relative error (median, p99, max) and SNR
in dB over the outputs that stayed finite; for emulated accumulators also the share of sums
that overflowed, the largest partial sum and the swamped additions per output.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fpsim import get_format

from . import recipes
from .capture import Site
from .recipes import FP64, Recipe


def site_output(
    site: Site, recipe: Recipe, events: dict | None = None, cache: dict | None = None
) -> Tensor:
    """The site's result computed from its captured operands under ``recipe`` (``cache``: see
    recipes.linear)."""
    if site.kind == "linear":
        return recipes.linear(recipe, site.a, site.b, site.bias, events, cache)
    if site.kind == "matmul":
        return recipes.matmul(recipe, site.a, site.b, events)
    return recipes.layernorm_stats(recipe, site.a, events)[1]


def used(t: Tensor, site: Site) -> Tensor:
    """The outputs the model uses, flattened (the causal part of Q.K^T)."""
    return t.reshape(-1) if site.mask is None else t[site.mask.expand_as(t)]


@contextmanager
def one_thread() -> Iterator[None]:
    """torch on one CPU thread inside the block: its float64 GEMM splits the reduction by the
    thread count, so a reference computed on more threads would differ in the last bits."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def reference(site: Site) -> Tensor:
    """FP64 result of the site on its captured operands: the outputs the model uses, flattened;
    computed on one thread, so that it is the same for every thread count."""
    with one_thread():
        return used(site_output(site.to(torch.float64), FP64), site)


def references(sites: dict[str, Site]) -> dict[str, Tensor]:
    """``reference`` of every site."""
    return {n: reference(s) for n, s in sites.items()}


def error_stats(y: Tensor, ref: Tensor, output_max: float = math.inf) -> dict[str, float]:
    """Overflow / saturation / flush shares and relative-error statistics of ``y`` against ``ref``.

    Shares are of outputs with a finite reference.  Saturated: finite although ``|ref|`` exceeds
    ``output_max`` (the output format's largest value).  Relative errors and SNR use the outputs
    where both are finite (and ``ref != 0`` for relative errors); NaN when there are none.
    """
    y, ref = y.reshape(-1).double(), ref.reshape(-1).double()
    fin_ref, fin_y = torch.isfinite(ref), torch.isfinite(y)
    n = max(int(fin_ref.sum()), 1)
    both = fin_ref & fin_y
    err = (y[both] - ref[both]).abs()
    r = ref[both]
    rel = (err[r != 0] / r[r != 0].abs()).cpu().numpy()     # the reporting edge
    signal, noise = float((r * r).sum()), float((err * err).sum())
    return {
        "outputs": int(fin_ref.sum()),
        "overflow": int((fin_ref & ~fin_y).sum()) / n,
        "saturated": int((both & (ref.abs() > output_max)).sum()) / n,
        "flushed": int((fin_ref & (ref != 0) & (y == 0)).sum()) / n,
        "rel_median": float(np.median(rel)) if rel.size else math.nan,
        "rel_p99": float(np.quantile(rel, 0.99)) if rel.size else math.nan,
        "rel_max": float(rel.max()) if rel.size else math.nan,
        "snr_db": math.nan
        if not r.numel()
        else (10 * math.log10(signal / noise) if noise > 0 else math.inf),
        "ref_amax": float(r.abs().max()) if r.numel() else math.nan,
    }


def replay_site(
    site: Site, recipe: Recipe, ref: Tensor | None = None, cache: dict | None = None
) -> dict:
    """Error statistics of one site under ``recipe`` plus its operands' overflow/saturation/flush
    shares.

    ``ref``: the site's ``reference``, computed here when not given.
    """
    events: dict = {}
    y = site_output(site, recipe, events, cache)
    ref = reference(site) if ref is None else ref
    out_max = math.inf if recipe.output is None else get_format(recipe.output).max
    stats = error_stats(used(y, site), ref, out_max)
    for role in ("a", "b"):
        if role in events:
            for key in ("overflow", "saturated", "flushed"):
                stats[f"{role}_{key}"] = events[role][key] / max(events[role]["elements"], 1)
    if "accum" in events:
        acc = events["accum"]
        stats["accum_overflow"] = acc["overflow"] / max(acc["outputs"], 1)
        stats["accum_max_partial"] = acc["max_partial"]
        stats["accum_swamped"] = acc["swamped"] / max(acc["outputs"], 1)
    return stats


def replay(
    sites: dict[str, Site],
    recipe: Recipe,
    refs: dict[str, Tensor] | None = None,
    cache: dict | None = None,
) -> dict[str, dict]:
    """``replay_site`` for every site, keyed by site name (``refs``: ``references``)."""
    return {
        n: replay_site(s, recipe, None if refs is None else refs[n], cache)
        for n, s in sites.items()
    }


def summary(stats: dict[str, dict]) -> dict[str, Any]:
    """Across sites: where anything overflowed, the worst overflow shares and the mean flush share.

    ``overflow_sites``: sites where an output or an operand element overflowed to inf/NaN.
    ``operand_overflow``/``operand_saturated``: the largest share of any operand of any site;
    ``operand_flushed``: the mean share over all operands of all sites; ``snr_db_min``: the
    worst site's SNR.
    """

    def operand(key: str) -> list[float]:
        return [v for s in stats.values() for k, v in s.items() if k in (f"a_{key}", f"b_{key}")]

    return {
        "overflow_sites": [
            n
            for n, s in stats.items()
            if s["overflow"] > 0 or s.get("a_overflow", 0) > 0 or s.get("b_overflow", 0) > 0
        ],
        "output_overflow": max(s["overflow"] for s in stats.values()),
        "operand_overflow": max(operand("overflow")),
        "operand_saturated": max(operand("saturated")),
        "operand_flushed": sum(operand("flushed")) / len(operand("flushed")),
        "snr_db_min": min(
            (s["snr_db"] for s in stats.values() if not math.isnan(s["snr_db"])), default=math.nan
        ),
    }
