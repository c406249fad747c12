"""The cross-model table of README.md and docs/results.md is what the committed JSON gives
(``fpsim_experiments.across_models``), and a study that ran a subset of arms (Whisper's six)
gets its row with the arms it lacks said "not run"."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fpsim_experiments import across_models as am
from fpsim_experiments import model_study
from fpsim_experiments.report import write_json

REPO = Path(__file__).resolve().parents[1]


def test_the_pages_show_the_table_the_committed_json_gives() -> None:
    region = am.markdown(am.studies())
    for page in am.PAGES:
        shown = am.shown((REPO / page).read_text(encoding="utf-8"))
        assert shown is not None, f"{page} has no {am.BEGIN} region"
        assert shown == region, f"{page}'s cross-model table is stale: run `{am.COMMAND}`"


def _metric(values: list[float]) -> dict:
    """A metric as model_study.summarize stores it, one unit per value (denominators 1)."""
    return model_study.summarize({"m": (values, [1.0] * len(values))})["m"]


def _run(arm: model_study.Arm, values: list[float], overflow: int = 0) -> dict:
    site = {"site": "encoder.layers.3.fc2:linear", "kind": "linear", "recipe": arm.name,
            "calls": 1, "elements": 1000, "amax": 560.0, "overflow": overflow, "saturated": 0,
            "flushed": 10, "nonfinite": 0, "snr_db": 20.0}
    return {"name": arm.name, "factors": arm.factors, "recipe": {}, "metrics": {
        "m": _metric(values)}, "sites": [site], "missed": {}, "seconds": 1.0}


def _whisper(root: Path) -> None:
    """A study in model_study's shape with Whisper's six arms: unscaled e4m3 inf/NaN (it
    overflows), saturating e4m3 finite, per tensor e4m3 better than e5m2."""
    n = 12
    good = [0.1 + 0.01 * (i % 3) for i in range(n)]
    worse = [3 * v for v in good]
    bad = [math.nan] + good[1:]
    arms = [(model_study.arm(8, 4), bad, 5), (model_study.arm(8, 5), worse, 0),
            (model_study.arm(8, 4, scaling="tensor"), good, 0),
            (model_study.arm(8, 5, scaling="tensor"), worse, 0),
            (model_study.arm(8, 4, encoding="saturating"), good, 0),
            (model_study.arm(8, 5, encoding="saturating"), worse, 0)]
    data = {"model": {"name": "whisper-tiny.en", "unit": "clip", "parameters": 1, "units": n},
            "metrics": {"m": "a test metric"}, "primary": "m", "baseline": {},
            "capture_units": 2, "runs": [_run(a, v, o) for a, v, o in arms], "comparisons": [],
            "seconds": {}, "meta": {"arms": [a.name for a, _, _ in arms]}}
    folder = root / "range-vs-precision-whisper-tiny.en"
    folder.mkdir(parents=True)
    write_json(folder / "results.json", data)


def test_a_study_of_six_arms_gets_its_row(tmp_path: Path) -> None:
    assert [s.name for s in am.studies(tmp_path)] == []
    _whisper(tmp_path)
    (study,) = am.studies(tmp_path)
    assert study.name == "Whisper tiny.en"
    rows = {r.setting: r for r in am.rows_of(study)}
    unscaled = rows["unscaled"]
    assert unscaled.pairs[0].words() == "e3m4 not run"
    assert unscaled.fails() == "range, at e4m3 (worse than e5m2)"
    assert "e4m3 overflows at encoder.layers.3.fc2:linear (5)" in unscaled.where
    assert "e4m3 saturating is finite" in unscaled.why and "overflow makes the inf/NaN" in \
        unscaled.why
    assert rows["per tensor"].pairs[1].words().startswith("e4m3 / e5m2 0.333×")
    assert rows["per tensor"].pairs[1].words().endswith(": precision")
    assert rows["per tensor"].fails() == "precision down to e4m3 (e3m4 not run)"
    text = am.markdown([study])
    assert "e3m4 / e4m3" not in text.split("\n")[0]          # no claim on a pair not run
    assert "| Whisper tiny.en | saturating | e3m4 not run |" in text
    assert "e4m3 / e5m2 differs" not in text


def test_a_page_without_the_region_is_named() -> None:
    with pytest.raises(ValueError, match="README.md has no region"):
        am.replace("no table here", "x", "README.md")
    assert am.replace(f"a\n{am.BEGIN}\nold\n{am.END}\nb", "new", "p") == \
        f"a\n{am.BEGIN}\nnew\n{am.END}\nb"
