"""``fpsim experiment all --quick`` on the default tiny model: files, keys, sites, formats and sane values.

One quick run is shared by every test (a session fixture); the module is marked ``slow``
(``pytest -m "not slow"`` runs the fast suite; CI runs everything).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fpsim_experiments import cli, fp8
from fpsim_experiments.report import load_json
from fpsim.cli import main as fpsim_main

N_LAYER = 4
SITES = {f"h{i}.{s}" for i in range(N_LAYER) for s in ("ln_1", "attn.c_attn", "attn.qk", "attn.av", "attn.c_proj",
                                                       "ln_2", "mlp.c_fc", "mlp.c_proj")} | {"ln_f", "lm_head"}
E2E = {"loss", "ppl", "kl", "kl_finite", "top1", "finite", "nonfinite_sites", "windows", "ci",
       "events"}
REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow
SITE_STATS = {"outputs", "overflow", "saturated", "flushed", "rel_median", "rel_p99", "rel_max", "snr_db",
              "a_overflow", "a_saturated", "a_flushed"}


@pytest.fixture(scope="session")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("results")
    start = time.perf_counter()
    assert fpsim_main(["experiment", "all", "--quick", "--out", str(d)]) == 0
    print(f"fpsim experiment all --quick: {time.perf_counter() - start:.0f} s")
    return d


def data(out: Path, name: str) -> dict:
    return load_json(out / name / "results.json")


def test_every_experiment_writes_json_figures_and_a_report(out: Path) -> None:
    for name in cli.EXPERIMENTS:
        d = out / name
        assert (d / "results.json").is_file() and (d / "REPORT.md").is_file(), name
        pngs = list(d.glob("*.png"))
        assert pngs and all(p.stat().st_size > 10_000 for p in pngs), name
        for png in pngs:
            assert f"]({png.name})" in (d / "REPORT.md").read_text(), (name, png.name)
        meta = data(out, name)["meta"]
        assert meta["model"] == "fpsim_experiments/gpt2/tiny" and meta["quick"] and meta["tokens"] == 512
    index = (out / "REPORT.md").read_text()
    assert all(f"[{name}]({name}/REPORT.md)" in index for name in cli.EXPERIMENTS)


def test_fp32_recipe_matches_the_model_and_fp64_is_close(out: Path) -> None:
    base = data(out, "range-vs-precision")["baseline"]
    assert base["fp32"]["kl"] == 0 and base["fp32"]["top1"] == 1.0 and base["fp32"]["nonfinite_sites"] == []
    assert 0 <= base["fp64"]["kl"] < 1e-9 and base["fp64"]["top1"] > 0.99
    assert 0.5 < base["fp32"]["loss"] < 3  # a trained byte-level model: nats per byte


def test_range_vs_precision_covers_every_split(out: Path) -> None:
    from fpsim_experiments import range_vs_precision as rvp

    d = data(out, "range-vs-precision")
    assert set(d["budgets"]) == {"8"}                    # --quick: B=8 only
    b8 = d["budgets"]["8"]
    assert b8["formats"] == ["e2m5", "e3m4", "e4m3", "e5m2", "e6m1", "e7m0"]
    assert set(b8["skipped"]) == {"e0m7", "e1m6"}
    formats, skipped = rvp.splits(16)                    # what the full run covers
    assert {"e12m3", "e15m0"} <= set(skipped) and "e11m4" in [f.name for f in formats]
    assert len(d["runs"]) == 2 * sum(len(b["formats"]) for b in d["budgets"].values())
    ln = d["ln_fp32_runs"]  # no scaling with LayerNorm inputs in FP32, end to end only
    assert len(ln) == sum(len(b["formats"]) for b in d["budgets"].values())
    assert all(set(r["e2e"]) == E2E and set(r["fp32_sites"]) == {n for n in SITES if "ln" in n} for r in ln)
    for run in d["runs"]:
        assert set(run["e2e"]) == E2E and set(run["sites"]) == SITES
        for name, s in run["sites"].items():
            assert SITE_STATS <= set(s) and 0 <= s["overflow"] <= 1 and 0 <= s["a_flushed"] <= 1, (run["recipe"], name)
        if math.isfinite(run["e2e"]["kl"]):
            assert run["e2e"]["kl"] >= 0 and 0 <= run["e2e"]["top1"] <= 1
    runs = {(r["format"], r["scaling"]): r for r in d["runs"]}
    e2m5 = runs["e2m5", "none"]
    assert e2m5["summary"]["overflow_sites"] and e2m5["summary"]["operand_overflow"] > 0
    assert not math.isfinite(e2m5["e2e"]["kl"]) and e2m5["e2e"]["nonfinite_sites"]
    assert math.isfinite(runs["e2m5", "tensor"]["e2e"]["kl"])  # scaling brings it into range
    assert runs["e4m3", "none"]["e2e"]["kl"] < runs["e5m2", "none"]["e2e"]["kl"] < runs["e6m1", "none"]["e2e"]["kl"]
    report = (out / "range-vs-precision" / "REPORT.md").read_text()
    assert "## B = 8 bits" in report and "## B = 12 bits" not in report
    assert "the best split is" in report and "Quick run (`--quick`)" in report


def test_fp16_vs_bf16_fp8_and_histograms(out: Path) -> None:
    r = {x["recipe"]["name"]: x for x in data(out, "fp16-vs-bf16")["runs"]}
    fp16, bf16 = r["fp16 in/out, fp32 acc"], r["bf16 in/out, fp32 acc"]
    assert 0 < fp16["e2e"]["kl"] < bf16["e2e"]["kl"] < 1e-2
    assert "e2e" not in r["fp16 in/out, fp16 acc (sequential)"]  # emulated accumulation: per site only
    assert "e2e" in r["fp16 in/out, fp32 acc, no flush"]      # what FP16's flushes cost
    assert set(r["bf16 in/out, bf16 acc (sequential)"]["sites"]) == SITES
    f8 = {x["recipe"]["name"]: x for x in data(out, "fp8")["runs"]}
    assert set(f8) == set(fp8.QUICK_RECIPES)                 # --quick: 9 of the 19
    assert f8["mxfp8_e4m3/block"]["e2e"]["kl"] < f8["mxfp4/block"]["e2e"]["kl"]
    assert f8["e4m3/tensor"]["e2e"]["kl"] < f8["e5m2/tensor"]["e2e"]["kl"]
    assert f8["mxfp4/block"]["bits"] == 4.25 and f8["nvfp4/block"]["bits"] == 4.5
    h = data(out, "histograms")
    assert {"fp16", "bf16", "mxfp4", "nvfp4"} <= set(h["histograms"])
    for fmt, sites in h["histograms"].items():
        assert set(sites) == SITES
        assert all(len(s["counts"]) == len(h["edges"]) - 1 for s in sites.values())
    assert h["histograms"]["fp16"]["lm_head"]["median"] < h["histograms"]["mxfp4"]["lm_head"]["median"]


def test_accumulation_and_activations(out: Path) -> None:
    acc = {x["recipe"]["name"]: x for x in data(out, "accumulation")["runs"]}
    assert {"fp64 sequential", "fp32 sequential", "bf16 chunked", "fp16 pairwise", "tensor core (hopper_bf16)"} <= set(acc)
    for run in acc.values():
        assert set(run["sites"]) == SITES and "e2e" not in run
        assert all("accum_swamped" in s for s in run["sites"].values())
    med = {n: sorted(s["snr_db"] for s in r["sites"].values())[len(SITES) // 2] for n, r in acc.items()}
    # against the FP64 sum of the same BF16 operands: the FP64 accumulator is exact but for the final FP32 rounding
    assert med["bf16 sequential"] < med["bf16 pairwise"] < med["fp32 sequential"] < med["fp64 sequential"]
    floor = data(out, "accumulation")["input_floor"]
    assert set(floor["sites"]) == SITES and floor["recipe"]["name"] == "fp64 sequential"
    assert med["fp16 sequential"] < med["fp32 sequential"]
    act_data = data(out, "activations")
    assert act_data["windows"] * act_data["window_tokens"] == 512  # every end-to-end window
    act = act_data["sites"]
    assert set(act) == SITES
    ln = act["ln_f"]
    assert ln["rows"] == 512 and ln["sum_x2_max"] >= ln["sum_centred_max"] > 0 and len(ln["a_argmax"]) == 3
    assert "FP16" in (out / "activations" / "REPORT.md").read_text()


def test_render_rebuilds_reports_from_json(out: Path) -> None:
    before = {n: (out / n / "REPORT.md").read_text() for n in cli.EXPERIMENTS}
    for n in cli.EXPERIMENTS:
        (out / n / "REPORT.md").unlink()
    assert cli.main(["all", "--render", "--out", str(out)]) == 0
    assert {n: (out / n / "REPORT.md").read_text() for n in cli.EXPERIMENTS} == before


def test_range_ablations_and_uncertainty(out: Path) -> None:
    d = data(out, "range-vs-precision")
    abl = {(r["budget"], r["ablation"]): r for r in d["ablation_runs"]}
    assert {(8, "saturate"), (8, "no flush"), (8, "fn encoding")} <= set(abl)
    assert not any(name.startswith("bias") for _, name in abl)      # --quick: no bias sweep
    assert abl[8, "fn encoding"]["format"] == "e3m4fn" and abl[8, "fn encoding"]["max"] == 30
    for r in d["runs"] + d["ln_fp32_runs"] + d["ablation_runs"]:
        e = r["e2e"]
        assert len(e["windows"]["kl"]) == 2 and e["windows"]["positions"] == 256
        if math.isfinite(e["kl"]):
            lo, hi = e["ci"]["kl"]
            assert lo <= e["kl"] <= hi and e["kl_finite"] == pytest.approx(e["kl"]) \
                and e["finite"] == 1
    runs = {(r["format"], r["scaling"]): r for r in d["runs"]}
    e2m5 = runs["e2m5", "none"]["e2e"]
    assert sum(v["overflow"] for v in e2m5["events"].values()) > 0  # counted end to end
    flushed = runs["e4m3", "none"]["e2e"]["events"]
    assert sum(v["flushed"] for v in flushed.values()) > 0
    report = (out / "range-vs-precision" / "REPORT.md").read_text()
    assert "## Attribution" in report and "[CI undefined]" not in report.split("## Attribution")[0]
    assert "The steeper side is" in report or "no measurable difference" in report


def _quick_json(tmp: Path, threads: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-m", "fpsim.cli", "experiment", "fp16-vs-bf16", "--quick",
                    "--tokens", "512", "--threads", str(threads), "--out", str(tmp)],
                   check=True, env=env, cwd=REPO, capture_output=True)
    d = json.loads((tmp / "fp16-vs-bf16" / "results.json").read_text())
    del d["meta"]["seconds"]
    return d


def test_same_numbers_in_separate_processes_with_different_thread_counts(tmp_path: Path) -> None:
    one, two = _quick_json(tmp_path / "a", 1), _quick_json(tmp_path / "b", 2)
    assert one == two  # every number, bit for bit, not only the printed digits
    assert one["runs"][0]["e2e"]["kl"] > 0


def test_range_vs_precision_runs_are_their_recipes_in_order(out: Path) -> None:
    """Every end-to-end run goes to the runner in one list; each group's first and last run
    computed directly here gives its numbers (a list read out of order would not)."""
    from fpsim_experiments import context, range_vs_precision as rvp
    from fpsim_experiments.endtoend import RecipeRun
    from fpsim_experiments.gpt2.model import site_kind
    from fpsim_experiments.recipes import Recipe

    d = data(out, rvp.NAME)
    ctx = context.build(sizes=context.QUICK, quick=True)
    but_ln = [n for n in ctx.site_names if site_kind(n) != "layernorm"]

    def direct(recipe: Recipe, ln_fp32: bool = False) -> str:
        ops = RecipeRun({n: recipe for n in but_ln} if ln_fp32 else recipe)
        return json.dumps(ctx.end_to_end_ops(ops)["windows"])   # NaN too, bit for bit

    def got(run: dict) -> str:
        return json.dumps(run["e2e"]["windows"])

    fmt = {f.name: f for b in rvp.BUDGETS for f in rvp.splits(b)[0]}
    for run in (d["runs"][0], d["runs"][-1]):
        assert got(run) == direct(Recipe(fmt[run["format"]], scaling=run["scaling"]))
    for run in (d["ln_fp32_runs"][0], d["ln_fp32_runs"][-1]):
        assert got(run) == direct(Recipe(fmt[run["format"]]), True)
    abl = [(b, *a) for b in rvp.QUICK_BUDGETS for a in rvp.ablations(b, sweep=False)]
    for i in (0, -1):
        b, name, recipe, ln_fp32 = abl[i]
        assert d["ablation_runs"][i]["ablation"] == name
        assert got(d["ablation_runs"][i]) == direct(recipe, ln_fp32)
    assert "p3109_bias_ablation" not in d and d["p3109_runs"] == []      # --quick: no P3109


def test_a_process_pool_writes_the_same_results(out: Path, tmp_path: Path) -> None:
    """``--executor pool``: the end-to-end runs on 2 worker processes, the same results.json
    as in this process (but its seconds); the task files are gone once it is written."""
    assert fpsim_main(["experiment", "practice", "--quick", "--executor", "pool", "--workers",
                       "2", "--out", str(tmp_path)]) == 0
    pool, here = data(tmp_path, "practice"), data(out, "practice")
    del pool["meta"]["seconds"], here["meta"]["seconds"]
    assert json.dumps(pool, sort_keys=True) == json.dumps(here, sort_keys=True)    # NaN too
    assert not (tmp_path / "practice" / "tasks").exists()
