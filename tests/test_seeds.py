"""model-seeds: per-seed ratios, their verdicts across seeds, and the report."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from fpsim_experiments import likewise, seeds


def _run(kl_per_window: list[float]) -> dict:
    """An ``e2e`` dict with per-window KL sums over 100 positions each."""
    kl = [100 * k for k in kl_per_window]
    n = len(kl)
    return {"kl": sum(kl) / (100 * n), "windows": {"positions": 100, "loss": [1.0] * n, "kl": kl}}


def _data(scale: dict[str, float]) -> dict:
    base = list(np.linspace(0.5, 1.5, 16))
    runs = {name: _run([scale.get(name, 1.0) * b for b in base]) for name in seeds.recipes()}
    return {"seeds": [{"seed": s, "model": f"m{s}", "tokens": 1600, "runs": runs}
                      for s in seeds.SEEDS],
            "meta": {"steps": 900, "seconds": 1.0}}


def test_ratios_carry_each_seeds_ci_and_agree_only_when_all_exclude_one() -> None:
    data = _data({"e3m4": 4.0, "e5m2": 1.0, "bf16": 60.0, "e3m4 nf": 10.0})
    by = {r["comparison"]: r for r in seeds.ratios(data)}
    e3 = by["e3m4 / e4m3, no scaling"]
    assert [p["ratio"] for p in e3["seeds"]] == [4.0] * 3
    assert all(p["ci"][0] > 1 for p in e3["seeds"]) and e3["holds"] == "above 1"
    assert by["e5m2 / e4m3, no scaling"]["holds"] == "no measurable difference"
    assert by["bf16 / fp16"]["holds"] == "above 1"
    assert "e3m4 LN FP32, no flush, full subnormals / e4m3" not in by   # a mixed baseline
    assert by["subnormal bits: e3m4 LN FP32 no flush / + full subnormals"]["holds"] == "above 1"
    data["seeds"][1]["runs"] = {**data["seeds"][1]["runs"], "e5m2": _run([0.5] * 16)}
    assert {r["comparison"]: r for r in seeds.ratios(data)}[
        "e5m2 / e4m3, no scaling"]["holds"] == "differs between seeds"


def test_a_format_with_non_finite_logits_is_the_worse_side_without_a_ratio(tmp_path: Path) -> None:
    data = _data({"e3m4": 4.0})
    broken = dict(data["seeds"][0]["runs"])
    broken["e3m4"] = {**broken["e3m4"], "kl": math.nan}
    data["seeds"][0] = {**data["seeds"][0], "runs": broken}
    e3 = seeds.ratios(data)[0]
    assert e3["seeds"][0]["nonfinite"] == ["e3m4"] and math.isnan(e3["seeds"][0]["ratio"])
    assert e3["holds"] == "above 1"
    text = seeds.render(data, tmp_path)
    assert "seed 0 e3m4 inf/NaN logits; seed 1 4× [" in text
    assert (tmp_path / "ratios_per_seed.png").exists()


def test_seed_zero_is_the_embedded_model_and_others_are_cached_by_steps(tmp_path: Path) -> None:
    from fpsim_experiments import context
    assert seeds.checkpoint(0, quick=False, cache=tmp_path) == context.DEFAULT_MODEL
    ready = tmp_path / f"tiny-seed1-{seeds.STEPS}steps"
    ready.mkdir()
    (ready / "model.safetensors").write_bytes(b"")
    assert seeds.checkpoint(1, quick=False, cache=tmp_path) == ready   # trained once, reused


def test_every_comparison_divides_runs_that_differ_in_its_factor_only() -> None:
    for name, num, den, _, factor in seeds.COMPARISONS:
        likewise.check(seeds.describe(num), seeds.describe(den), factor)
    with pytest.raises(ValueError, match="ln_fp32"):            # the ratio that was removed
        likewise.check(seeds.describe("e3m4 nf full"), seeds.describe("e4m3"),
                       ["format", "flush", "full_subnormals"])
