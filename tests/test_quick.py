"""``--quick`` is a first try: it plans far fewer end-to-end runs than the full experiments
(counted here on a stand-in context that computes nothing, so this test takes a second; the
slow test_experiments.py runs ``all --quick`` for real)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("torch")
pytest.importorskip("matplotlib")

from fpsim_experiments import fp8, practice, range_vs_precision, training
from fpsim_experiments.gpt2.model import site_names
from fpsim_experiments.sweep.runs import Run


class Planner(SimpleNamespace):
    """A context that records what an experiment asks for and returns empty results."""

    def __init__(self, quick: bool) -> None:
        super().__init__(quick=quick, baseline={}, e2e=0, replayed=0,
                         site_names=site_names(SimpleNamespace(n_layer=4)))

    def replay(self, recipes, where=None, desc=None):
        self.replayed += len(recipes)
        return [{} for _ in recipes]

    def end_to_end_runs(self, runs: list[Run], label, desc=None):
        self.e2e += len(runs)
        return [{"e2e": {}, "overflows": {}, "seconds": 0.0} for _ in runs]

    def run(self, recipes, e2e=True, desc=None):
        self.e2e += len(recipes)
        return [{"recipe": r.to_json()} for r in recipes]


@pytest.mark.parametrize("module, full, quick", [
    (range_vs_precision, 108, 25), (fp8, 19, 9), (practice, 6, 4)])
def test_quick_plans_far_fewer_end_to_end_runs(module, full, quick, monkeypatch) -> None:
    monkeypatch.setattr("fpsim_experiments.replay.summary", lambda stats: {})
    counts = {}
    for q in (False, True):
        ctx = Planner(q)
        module.run(ctx)
        counts[q] = ctx.e2e
    assert counts == {False: full, True: quick}


def test_quick_training_is_a_few_short_runs() -> None:
    q = training.QUICK
    assert set(q.recipes) <= {r.name for r in training.RECIPES} and len(q.recipes) <= 8
    assert q.steps * q.seeds * len(q.recipes) <= 200 < training.FULL.steps * training.FULL.seeds


def test_the_docs_quick_times_are_the_measured_ones() -> None:
    """docs/experiments.md shows the table benchmarks/quick_times.py makes from its JSON."""
    import importlib.util
    import json
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("quick_times",
                                                  root / "benchmarks" / "quick_times.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    data = json.loads((root / "benchmarks" / "results" / "quick_times.json").read_text())
    doc = (root / "docs" / "experiments.md").read_text()
    shown = re.search(r"<!-- quick times -->\n(.*?)\n<!-- /quick times -->", doc, re.S)
    assert shown and shown.group(1) == module.markdown(data)
    assert {r["experiment"] for r in data["rows"]} >= {"all", "range-vs-precision", "fp8"}
