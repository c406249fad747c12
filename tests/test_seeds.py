"""model-seeds: per-model ratios, the two-level bootstrap across seeds, their verdicts, the
overflow's cause (schedule or seed), the report and the docs' sentences from the JSON."""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

import numpy as np
import pytest

from fpsim_experiments import bootstrap, likewise, seeds
from fpsim_experiments.report import load_json

REPO = Path(__file__).resolve().parents[1]


def _run(kl_per_window: list[float], finite: bool = True) -> dict:
    """An ``e2e`` dict with per-window KL sums over 100 positions each."""
    kl = [100 * k for k in kl_per_window]
    n = len(kl)
    return {"kl": sum(kl) / (100 * n) if finite else math.nan, "finite": 1.0 if finite else 0.9,
            "nonfinite_sites": [] if finite else ["h3.ln_1", "h2.ln_1"],
            "windows": {"positions": 100, "loss": [1.0] * n, "kl": kl}}


def _data(scale: dict[str, float], budgets: tuple[int, ...] = seeds.BUDGETS,
          models: tuple = (seeds.SHIPPED, 0, 1, 2)) -> dict:
    base = list(np.linspace(0.5, 1.5, 16))
    runs = {name: _run([scale.get(name, 1.0) * b for b in base])
            for name in seeds.recipes(budgets)}
    return {"models": [{"model": m, "seed": 0 if m == seeds.SHIPPED else m,
                        "schedule": "wall-clock" if m == seeds.SHIPPED else "steps",
                        "checkpoint": f"m{m}", "tokens": 1600, "runs": dict(runs)}
                       for m in models],
            "meta": {"steps": 900, "seconds": 1.0, "budgets": list(budgets), "tokens": 1600}}


def _set(data: dict, model, name: str, run: dict) -> None:
    m = next(m for m in data["models"] if m["model"] == model)
    m["runs"] = {**m["runs"], name: run}


def test_ratios_carry_each_models_ci_and_agree_only_when_every_seed_excludes_one() -> None:
    data = _data({"e3m4/none": 4.0, "e5m2/none": 1.0, "bf16": 60.0, "e3m4 nf": 10.0,
                  "e4m3/tensor": 3.0})
    by = {r["comparison"]: r for r in seeds.ratios(data)}
    e3 = by["B=8, no scaling: e3m4 / e4m3"]
    assert [p["model"] for p in e3["seeds"]] == [0, 1, 2]          # the shipped one apart
    assert e3["shipped"]["model"] == seeds.SHIPPED and e3["shipped"]["ratio"] == 4.0
    assert [p["ratio"] for p in e3["seeds"]] == [4.0] * 3
    assert all(p["ci"][0] > 1 for p in e3["seeds"]) and e3["holds"] == "above 1"
    assert e3["pooled"]["ratio"] == pytest.approx(4.0) and e3["pooled"]["verdict"] == "above 1"
    assert by["B=8, no scaling: e5m2 / e4m3"]["holds"] == "no measurable difference"
    assert by["B=8, per tensor: e4m3 / e3m4"]["holds"] == "above 1"
    assert by["bf16 / fp16"]["holds"] == "above 1"
    assert by["B=8, subnormal bits: e3m4 LN FP32 no flush / + full subnormals"]["holds"] == \
        "above 1"
    assert {"B=12, no scaling: e3m8 / e4m7", "B=16, per tensor: e2m13 / e4m11",
            "B=16, no scaling, LN FP32: e3m12 / e5m10"} <= set(by)
    _set(data, 1, "e5m2/none", _run([0.5] * 16))
    r = {r["comparison"]: r for r in seeds.ratios(data)}["B=8, no scaling: e5m2 / e4m3"]
    assert r["holds"] == "differs between seeds"
    assert "the seeds disagree (1 below 1, 2 no measurable difference)" in seeds.conclusion(r)


def test_the_shipped_model_stays_out_of_the_pooled_ratio() -> None:
    data = _data({"e3m4/none": 4.0})
    _set(data, seeds.SHIPPED, "e3m4/none", _run(list(np.linspace(5, 15, 16))))
    e3 = seeds.ratios(data)[0]
    assert e3["shipped"]["ratio"] == pytest.approx(10.0)
    assert e3["pooled"]["ratio"] == pytest.approx(4.0)


def test_two_level_bootstrap_resamples_seeds_then_windows() -> None:
    flat = [1.0] * 8
    two = _run([2.0] * 8), _run([8.0] * 8)
    one = _run(flat)
    # no window variation: the seed draws alone; geometric means of 2 draws of {2, 8} are
    # 2, 4 or 8 with probabilities 1/4, 1/2, 1/4, so the 95% interval is [2, 8]
    q, ci = seeds.hierarchical([(two[0], one), (two[1], one)])
    assert q == pytest.approx(4.0) and ci == pytest.approx([2.0, 8.0])
    q, ci = seeds.hierarchical([(two[0], one)] * 3)         # identical seeds: no spread at all
    assert ci == pytest.approx([2.0, 2.0])
    # one seed: only windows are resampled, each draw paired, so it matches the window
    # bootstrap's spread (other draws, so not the same numbers)
    rng = np.random.default_rng(5)
    base = rng.uniform(1, 3, 40)           # b follows a window by window: pairing narrows
    a, b = _run(list(base)), _run(list(base * rng.uniform(0.8, 1.0, 40)))
    q, ci = seeds.hierarchical([(a, b)])
    q1, ci1 = bootstrap.ratio(a, b)
    assert q == pytest.approx(q1)
    assert abs(math.log(ci[1] / ci[0]) / math.log(ci1[1] / ci1[0]) - 1) < 0.25
    # seeds that differ widen the interval beyond each seed's window interval
    c = _run([4 * x / 100 for x in a["windows"]["kl"]])          # a's windows, 4 times the KL
    assert bootstrap.ratio(c, b)[0] == pytest.approx(4 * q1)
    _, wide = seeds.hierarchical([(a, b), (c, b)])
    assert wide[0] < ci1[1] and wide[1] > 4 * ci1[0]
    assert math.log(wide[1] / wide[0]) > 2 * math.log(ci1[1] / ci1[0])
    with pytest.raises(ValueError, match="same windows"):
        seeds.hierarchical([(a, _run([1.0] * 3))])


def test_a_format_with_non_finite_logits_is_the_worse_side_without_a_ratio(tmp_path: Path) -> None:
    data = _data({"e3m4/none": 4.0})
    _set(data, seeds.SHIPPED, "e3m4/none", _run([1.0] * 16, finite=False))
    _set(data, 1, "e3m4/none", _run([1.0] * 16, finite=False))
    e3 = seeds.ratios(data)[0]
    assert e3["shipped"]["nonfinite"] == ["e3m4/none"] and math.isnan(e3["shipped"]["ratio"])
    assert e3["seeds"][1]["nonfinite"] == ["e3m4/none"] and e3["holds"] == "above 1"
    assert e3["pooled"] is None                           # no ratio on seed 1: none pooled
    text = seeds.render(data, tmp_path)
    assert "shipped e3m4/none inf/NaN logits; seed 0 4× [" in text
    assert "undefined (inf/NaN logits on a seed)" in text
    assert (tmp_path / "ratios_per_seed.png").exists()


def test_the_overflow_is_put_down_to_the_schedule_or_the_seed() -> None:
    data = _data({})
    _set(data, seeds.SHIPPED, "e3m4/none", _run([1.0] * 16, finite=False))
    lines = seeds.overflow_lines(data)
    assert lines[0].startswith("B=8, e3m4 without scaling: inf/NaN logits on 0 of 3 "
                               "step-schedule seeds; shipped (seed 0, wall-clock schedule) "
                               "(90% of positions finite, first at h2.ln_1).")
    assert "goes with the schedule, not the seed" in lines[0] and len(lines) == 3
    assert "Seed 0" not in lines[1]                        # B=12: nothing overflows
    _set(data, 1, "e3m4/none", _run([1.0] * 16, finite=False))
    line = seeds.overflow_lines(data)[0]
    assert "on 1 of 3" in line and "goes with the schedule" not in line
    assert "but 1 of the other 2 step-schedule seeds overflow: the overflow does not need " \
        "the wall-clock schedule" in line
    _set(data, 0, "e3m4/none", _run([1.0] * 16, finite=False))
    assert "on 2 of 3" in seeds.overflow_lines(data)[0]
    assert "goes with the seed, not the wall-clock schedule" in seeds.overflow_lines(data)[0]


def test_seed_zero_on_steps_is_not_the_shipped_model(tmp_path: Path) -> None:
    from fpsim_experiments import context
    assert seeds.checkpoint(seeds.SHIPPED, quick=False, cache=tmp_path) == context.DEFAULT_MODEL
    for s in (0, 1):
        ready = tmp_path / f"tiny-seed{s}-{seeds.STEPS}steps"
        ready.mkdir()
        (ready / "model.safetensors").write_bytes(b"")
        assert seeds.checkpoint(s, quick=False, cache=tmp_path) == ready   # trained once, reused
    assert seeds.label(0) != seeds.label(seeds.SHIPPED)
    assert seeds.models(False) == [seeds.SHIPPED, *seeds.SEEDS] and len(seeds.SEEDS) >= 5
    assert seeds.models(False, (3,)) == [seeds.SHIPPED, 3]


def test_seeds_option() -> None:
    p = argparse.ArgumentParser()
    seeds.add_arguments(p)
    assert p.parse_args(["--seeds", "0,2"]).seeds == (0, 2)
    for bad in ("0,0", "a", "-1"):
        with pytest.raises(SystemExit):
            p.parse_args(["--seeds", bad])
    from fpsim_experiments import cli
    with pytest.raises(SystemExit):
        cli.parse_args(["fp8", "--seeds", "1"])


def test_every_comparison_divides_runs_that_differ_in_its_factor_only() -> None:
    for c in seeds.comparisons():
        likewise.check(seeds.describe(c.num), seeds.describe(c.den), c.factor)
    assert len(seeds.comparisons((8,))) < len(seeds.comparisons())
    with pytest.raises(ValueError, match="ln_fp32"):            # a ratio of mixed runs
        likewise.check(seeds.describe("e3m4 nf full"), seeds.describe("e4m3/none"),
                       ["format", "flush", "full_subnormals"])


def test_an_older_json_is_named_not_misread(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="older layout.*without --render"):
        seeds.render({"seeds": [], "meta": {}}, tmp_path)


def test_a_run_of_fewer_seeds_says_so(tmp_path: Path) -> None:
    text = seeds.render(_data({}, models=(seeds.SHIPPED, 0, 1)), tmp_path)
    assert "Seeds [2, 3, 4, 5] of the planned [0, 1, 2, 3, 4, 5] are not in this run" in text


# --------------------------------------------------------------------------------------------
# README and docs/results.md quote the committed JSON
# --------------------------------------------------------------------------------------------
COMMITTED = REPO / "results" / "model-seeds" / "results.json"


def _unwrap(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_docs_quote_the_committed_seed_results() -> None:
    """docs/results.md quotes ``summary`` and the README's headline ``readme_clause`` of the
    committed JSON, word for word (the message prints what to paste)."""
    data = load_json(COMMITTED)
    if "models" not in data:
        pytest.skip("results/model-seeds/results.json is of the older layout (seeds 0-2, 32 "
                    "windows): run `fpsim experiment model-seeds --out results`")
    docs = _unwrap((REPO / "docs" / "results.md").read_text(encoding="utf-8"))
    text = _unwrap(seeds.summary(data))
    assert text in docs, f"docs/results.md should quote the seeds' summary:\n{text}"
    clause = _unwrap(seeds.readme_clause(data))
    assert clause in _unwrap((REPO / "README.md").read_text()), \
        f"README.md's headline should say where e3m4 overflows: {clause}"


def test_range_vs_precision_cites_the_seeds_or_says_their_json_is_old() -> None:
    from fpsim_experiments import range_findings
    old = {"seeds": [{"seed": 0, "runs": {}}], "meta": {"tokens": 8192}}
    data = {"budgets": [], "model_seeds": old}
    assert any("older layout" in line for line in range_findings.overflow_lines(data))
    data["model_seeds"] = _data({})
    _set(data["model_seeds"], seeds.SHIPPED, "e3m4/none", _run([1.0] * 16, finite=False))
    line = range_findings.overflow_lines(data)[-1]
    assert "inf/NaN logits on 0 of 3 step-schedule seeds" in line


def test_the_shipped_models_runs_are_range_vs_precisions() -> None:
    """The shipped model's splits are the runs range-vs-precision committed, window by window:
    the same recipes on the same windows (once the seeds' results are regenerated)."""
    data = load_json(COMMITTED)
    if "models" not in data:
        pytest.skip("results/model-seeds/results.json is of the older layout")
    rvp = load_json(REPO / "results" / "range-vs-precision" / "results.json")
    theirs = {(r["format"], r["scaling"]): r["e2e"] for r in rvp["runs"]}
    theirs |= {(r["format"], seeds.LN): r["e2e"] for r in rvp["ln_fp32_runs"]}
    shipped = next(m for m in data["models"] if m["model"] == seeds.SHIPPED)
    compared = 0
    for name, e2e in shipped["runs"].items():
        f, _, variant = name.partition("/")
        if (f, variant) in theirs:
            assert np.array_equal(np.asarray(e2e["windows"]["kl"], float),
                                  np.asarray(theirs[f, variant]["windows"]["kl"], float),
                                  equal_nan=True), name
            compared += 1
    assert compared == sum(len(w) for w in seeds.EBITS.values()) * len(data["meta"]["budgets"])


def test_the_figure_names_every_model_and_marks_inf_nan(tmp_path: Path, monkeypatch) -> None:
    """The review's finding 6 (issue 42): the figure's legend names every model, seed 0 and the
    shipped model included, and marks a ratio that inf/NaN logits leave undefined."""
    figures = []

    def keep(fig, path):
        figures.append(fig)
        return path.name

    monkeypatch.setattr(seeds, "save", keep)
    data = _data({})
    _set(data, 0, "e3m4/none", _run([1.0] * 16, finite=False))
    seeds.render(data, tmp_path)
    labels = [t.get_text() for ax in figures[0].axes if ax.get_legend()
              for t in ax.get_legend().get_texts()]
    assert all(seeds.label(m) in labels for m in (seeds.SHIPPED, 0, 1, 2)), labels
    assert any(t.startswith("inf/NaN logits") for t in labels), labels
