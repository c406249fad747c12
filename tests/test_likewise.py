"""Ratios compare like with like: the report generator refuses two runs that differ in more
than the factor a ratio names; order-free attribution, subset pairing, Holm and the topic
bootstrap behave as their docstrings say."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fpsim_experiments import bootstrap
from fpsim_experiments.gpt2.data import split_topics, window_topics
from fpsim_experiments.likewise import Ratios, attribution, check, describe, first_windows


def run(fmt: str, kl: list[float], scaling: str = "none", **recipe) -> dict:
    """A run as range-vs-precision writes it, with per-window KL sums over 10 positions."""
    n = len(kl)
    w = {"positions": 10, "kl": [10 * k for k in kl], "loss": [1.0] * n, "top1": [10] * n,
         "finite": [10] * n, "kl_finite": [10 * k for k in kl]}
    rec = {"scaling": scaling, "saturate": False, "flush": True, "full_subnormals": False,
           **recipe}
    ln = rec.pop("ln_fp32", False)
    return {"format": fmt, "scaling": scaling, "recipe": rec, "ln_fp32": ln,
            "e2e": {"kl": sum(kl) / n, "windows": w}}


RNG = np.random.default_rng(1)
BASE = list(RNG.uniform(1, 2, 40))


def test_a_ratio_of_runs_differing_in_more_than_its_factor_is_refused():
    e3 = run("e3m4", BASE, ln_fp32=True, flush=False, full_subnormals=True)
    e4 = run("e4m3", BASE)                       # quantizes the LayerNorms, flushes, subnormals
    with pytest.raises(ValueError, match="also differ in flush.*full_subnormals.*ln_fp32"):
        check(e3, e4, "format")
    with pytest.raises(ValueError, match="ln_fp32"):
        Ratios(40).ratio(e3, e4, "format")
    e4_same = run("e4m3", BASE, ln_fp32=True, flush=False, full_subnormals=True)
    check(e3, e4_same, "format")                 # one factor: accepted
    assert Ratios(40).ratio(e3, e4_same, "format").point == pytest.approx(1.0)
    with pytest.raises(ValueError, match="unknown factor"):
        check(e3, e4_same, "formats")


def test_describe_reads_every_kind_of_run():
    assert describe(run("e4m3", BASE, scaling="tensor"))["weights"] == "tensor"
    ln = {"format": "e3m4", "scaling": "none-ln-fp32", "recipe": {"scaling": "none"}}
    assert describe(ln)["ln_fp32"] and describe(ln)["activations"] == "none"
    case = {"describe": {"format": "e4m3", "weights": "channel"}}
    assert describe(case)["weights"] == "channel"


def test_attribution_is_order_free_and_multiplies_to_the_total():
    f, s = 1.5, 4.0                              # independent factors: no interaction
    base = run("e3m4", [k * f * s for k in BASE], ln_fp32=True)
    nf = run("e3m4", [k * s for k in BASE], ln_fp32=True, flush=False)
    full = run("e3m4", [k * f for k in BASE], ln_fp32=True, full_subnormals=True)
    both = run("e3m4", BASE, ln_fp32=True, flush=False, full_subnormals=True)
    a = attribution(Ratios(40), base, nf, full, both, ("flush", "full_subnormals"))
    assert a["flush Shapley"].point == pytest.approx(f)
    assert a["full_subnormals Shapley"].point == pytest.approx(s)
    assert a["interaction"].point == pytest.approx(1.0)
    assert a["flush Shapley"].point * a["full_subnormals Shapley"].point == \
        pytest.approx(a["total"].point)
    # with an interaction, the two orders differ and the Shapley values average them
    nf2 = run("e3m4", [k * 3 for k in BASE], ln_fp32=True, flush=False)
    b = attribution(Ratios(40), base, nf2, full, both, ("flush", "full_subnormals"))
    first, after = b["flush first"].point, b["flush after"].point
    assert first != pytest.approx(after)
    assert b["flush Shapley"].point == pytest.approx(math.sqrt(first * after))


def test_subset_runs_pair_with_the_first_windows():
    full, part = run("e4m3", BASE), run("e5m2", [2 * k for k in BASE[:10]])
    cut = first_windows(full["e2e"], 10)
    assert cut["kl"] == pytest.approx(sum(BASE[:10]) / 10) and len(cut["windows"]["kl"]) == 10
    r = Ratios(40).ratio(part, full, "format")
    assert r.point == pytest.approx(2.0) and r.n == 10 and "first 10 windows" in r.text()


def test_holm_marks_verdicts_that_do_not_survive_as_exploratory():
    ratios = Ratios(40)
    strong = run("e5m2", [3 * k for k in BASE])
    weak = run("e6m1", [k * (1.02 + 0.05 * (i % 2)) for i, k in enumerate(BASE)])
    base = run("e4m3", BASE)
    for _ in range(2):                           # collect, correct, render again
        rs = [ratios.ratio(strong, base, "format"), ratios.ratio(weak, base, "format")]
        if ratios.decided is None:
            ratios.holm()
    assert rs[0].side("worse", "better") == "worse"
    assert bootstrap.holm([0.001, 0.02, 0.03]) == [True, True, True]
    assert bootstrap.holm([0.01, 0.04, 0.03, math.nan]) == [True, False, False, False]
    assert "family is the 2 ratios" in ratios.summary()


def test_topic_bootstrap_resamples_whole_topics():
    topics = window_topics(256, 125)
    assert len(topics) == 125 and set(topics) <= set(split_topics()[1])
    runs = [t for i, t in enumerate(topics) if i == 0 or t != topics[i - 1]]
    assert len(runs) == len(set(runs))           # each topic's windows are contiguous
    labels = [sorted(set(topics)).index(t) for t in topics]
    w = bootstrap.cluster_weights(labels, resamples=50)
    for t in set(labels):                        # a topic's windows are drawn together
        cols = w[:, [i for i, x in enumerate(labels) if x == t]]
        assert (cols == cols[:, :1]).all()
    assert (bootstrap.window_weights(125, 50).sum(1) == 125).all()


def test_one_topic_gives_no_topic_interval_and_each_topic_its_own_ratio():
    """A quick run's windows come from one topic: a cluster bootstrap of one cluster is a
    degenerate interval ([x, x]), so none is printed; with two topics each gets its ratio."""
    a = run("e3m4", [1.0, 1.0, 2.0, 2.0])
    b = run("e4m3", [1.0, 1.0, 1.0, 1.0])
    one = Ratios(4, ["t"] * 4).ratio(a, b, "format")
    assert one.topics is None and one.per_topic is None and "topics" not in one.text()
    two = Ratios(4, ["s", "s", "t", "t"]).ratio(a, b, "format")
    assert two.per_topic == [1.0, 2.0] and two.topics is not None
