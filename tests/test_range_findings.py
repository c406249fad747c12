"""range-vs-precision's sentences on the committed JSON: what flushes at the bottom of e3m4's
range, and the counterpart that isolates the mantissa bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("matplotlib")

from fpsim import quantize
from fpsim_experiments import range_findings as F
from fpsim_experiments import range_vs_precision as R
from fpsim_experiments.range_cases import unbounded_below

RESULTS = Path(__file__).resolve().parents[1] / "results" / "range-vs-precision"


def _round_to(x: np.ndarray, mbits: int) -> np.ndarray:
    """x rounded to mbits fraction bits at its own exponent, ties to even (float64 reference)."""
    m, e = np.frexp(x.astype(np.float64))                   # x = m 2^e, 0.5 <= |m| < 1
    return np.ldexp(np.round(m * 2.0 ** (mbits + 1)), e - mbits - 1)


@pytest.mark.parametrize("ebits, mbits", [(3, 4), (4, 3), (3, 8), (4, 11)])
def test_unbounded_below_keeps_the_largest_value_and_rounds_every_fp32_at_its_mantissa_width(
        ebits: int, mbits: int) -> None:
    f = R.split_format(ebits, mbits)
    g = unbounded_below(f)
    assert (g.max, g.mbits) == (f.max, mbits) and g.min_normal < 2.0 ** -149
    rng = np.random.default_rng(0)
    x = np.ldexp(rng.uniform(0.5, 1, 20_000), rng.integers(-148, 0, 20_000)).astype(np.float32)
    x[:3] = [2.0 ** -149, 2.0 ** -126, np.float32(1e-30)]
    q = np.asarray(quantize(x, g), dtype=np.float64)
    assert np.array_equal(q, _round_to(x, mbits)) and (q != 0).all()


@pytest.fixture(scope="module")
def data() -> dict:
    return R.load(RESULTS)


def test_what_flushes_splits_into_weights_attention_and_activations(data: dict) -> None:
    run = F._ln(data, 8, 3)
    split = F.flushed_by_operand(data, run, "e3m4")
    total = sum(e["flushed"] for e in run["e2e"]["events"].values())
    assert sum(split.values()) == total
    shares = {k: v / total for k, v in split.items()}
    assert 0.05 < shares["weights"] < 0.2 and shares["attention"] > shares["activations"]
    # a site whose element count is not tokens x inputs + passes x weight cannot be split
    broken = {**run, "e2e": {**run["e2e"], "events": {**run["e2e"]["events"], "h0.mlp.c_fc": {
        **run["e2e"]["events"]["h0.mlp.c_fc"], "elements": 7}}}}
    assert F.flushed_by_operand(data, broken, "e3m4") is None


def test_the_no_flush_pairs_say_they_differ_in_more_than_the_mantissa_bit(data: dict) -> None:
    lines = F.attribution_lines(data, F.ratios_for(data))
    pairs = next(x for x in lines if x.startswith("B=8, e3m4 / e4m3"))
    assert pairs.count("differs in more than the mantissa bit") == 2
    assert "19.4% of e3m4's operand elements" in pairs
    assert "the mantissa bit alone): 0.244× [0.236, 0.251]" in pairs   # the committed pair
    data = {**data, "cases": {k: v for k, v in data["cases"].items()
                              if "unbounded below" not in k}}
    pairs = next(x for x in F.attribution_lines(data, F.ratios_for(data))
                 if x.startswith("B=8, e3m4 / e4m3"))
    assert "not run yet (`fpsim experiment range-cases --only mantissa`)" in pairs
