"""Sentences of the fp8 and fp16-vs-bf16 reports that the review found over-claimed: a ranking
orders two formats only where their paired interval excludes 1, and FP16's flushes are priced
by an ablation or said not to be."""

from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from fpsim_experiments import fp8, fp16_vs_bf16
from fpsim_experiments.likewise import Ratios

RNG = np.random.default_rng(3)


def run(name: str, kl: list[float], flushed: int = 0) -> dict:
    """An end-to-end run over windows of 10 positions with per-window KL sums."""
    n = len(kl)
    w = {"positions": 10, "kl": [10 * k for k in kl], "loss": [10.0] * n, "top1": [10] * n,
         "finite": [10] * n, "kl_finite": [10 * k for k in kl]}
    return {"recipe": {"name": name, "inputs": name}, "bits": 8.0,
            "e2e": {"kl": float(np.mean(kl)), "loss": 1.0, "windows": w,
                    "events": {"s": {"elements": 1000, "flushed": flushed, "overflow": 0}}}}


def test_a_ranking_orders_only_what_its_interval_separates() -> None:
    base = RNG.uniform(1, 2, 40)
    tie = base * RNG.uniform(0.99, 1.01, 40)
    text = fp8.ranking([run("b", list(2 * base)), run("a", list(base)), run("c", list(tie))],
                       Ratios(40), lambda r: "")
    names = re.findall(r"(?:^| [<≈] )(\w) \(", text)
    assert set(names[:2]) == {"a", "c"} and names[2] == "b"
    assert re.findall(r" ([<≈]) ", text) == ["≈", "<"] and text.count("×") == 2


def test_fp16_flushes_are_priced_only_by_their_ablation() -> None:
    runs = {"fp16 in/out, fp32 acc": run("fp16", [1.0, 1.1, 1.2, 0.9], flushed=5)}
    assert "not measured" in fp16_vs_bf16.flush_price(runs)
    runs[fp16_vs_bf16.NO_FLUSH] = run("no flush", [0.5, 0.55, 0.6, 0.45])
    assert "2× [" in fp16_vs_bf16.flush_price(runs) and "the flushes cost" in \
        fp16_vs_bf16.flush_price(runs)
    assert fp16_vs_bf16.flushed(runs["fp16 in/out, fp32 acc"]["e2e"]) == "0.5% (5)"
    assert fp16_vs_bf16.flushed(runs[fp16_vs_bf16.NO_FLUSH]["e2e"]) == "none"


def test_a_narrow_interval_is_never_printed_as_a_point() -> None:
    from fpsim_experiments.bootstrap import fmt_ci
    from fpsim_experiments.deepseek import ci

    assert fmt_ci([15.06, 15.14]) == "[15.06, 15.14]" and fmt_ci([1.0, 1.0]) == "[1, 1]"
    assert fmt_ci([0.5, 0.6]) == "[0.5, 0.6]"
    assert ci({"value": 0.151, "lo": 0.1506, "hi": 0.1514}) == "15.1% [15.06%, 15.14%]"
