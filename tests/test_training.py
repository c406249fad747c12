"""The training experiment: recipes as fpsim.emulate rules, t-intervals, verdicts that never
relabel an interval excluding 0, and a tiny end-to-end run through the CLI (the committed run
is results/training/)."""

from __future__ import annotations

import dataclasses
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("matplotlib")

from fpsim_experiments import cli, training as T  # noqa: E402
from fpsim_experiments.report import load_json  # noqa: E402


def test_recipes_become_emulation_rules():
    by = {r.name: r for r in T.RECIPES}
    assert by["fp32"].rules() is None
    fp16 = by["fp16"].rules()
    assert [r.kind for r in fp16.rules] == ["linear", "matmul"] and fp16.default is None
    site = fp16.rules[0].recipe
    assert site.inputs.name == "fp16" and site.backward.grad.name == "fp16"
    fp8 = by["fp8 e4m3 gradients"].rules().rules
    assert [r.kind for r in fp8] == ["linear"]
    assert fp8[0].recipe.backward.grad.scaling == "tensorwise"
    assert by["fp8 e4m3 gradients unscaled"].rules().rules[0].recipe.backward.grad.scaling \
        == "none"
    assert by["nvfp4"].grad_format == "nvfp4" and by["fp32"].grad_format is None
    assert set(T.SHARED.recipes) <= set(by) and T.FULL.seeds >= 10 and T.SHARED.seeds >= 10


def test_t_interval_matches_the_textbook():
    mean, lo, hi = T.t_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    half = 2.776 * math.sqrt(2.5) / math.sqrt(5)          # t_{0.975, 4} s / sqrt(n)
    assert mean == 3.0 and lo == pytest.approx(3 - half) and hi == pytest.approx(3 + half)
    assert all(math.isnan(v) for v in T.t_interval([1.0, math.nan]))


def _run(name, finals, flushed=0, skipped=0):
    recipe = next(r for r in T.RECIPES if r.name == name)
    g = {"0": {"elements": 100, "flushed": flushed, "overflow": 0}}
    return {"recipe": dataclasses.asdict(recipe), "seconds": 1.0,
            "seeds": [{"seed": i, "heldout_loss": v, "nonfinite_steps": 0, "skipped": skipped,
                       "grads": g, "loss": [5.0, v], "scale": []}
                      for i, v in enumerate(finals)]}


def test_verdicts_follow_the_interval_only():
    data = {"initial_heldout_loss": 5.0, "runs": [_run("fp32", [3.0, 3.1, 3.2, 3.0])]}
    cases = [(_run("bf16", [3.0, 3.12, 3.19, 3.01]), "no difference resolved", "-"),
             (_run("fp16", [4.5, 4.6, 4.7, 4.5], flushed=5), "stalled", "underflow"),
             (_run("fp16 static loss scale", [3.2, 3.35, 3.4, 3.2], skipped=3),
              "worse than FP32", "overflow"),
             # a small gap whose interval excludes 0 is not relabelled "as FP32"
             (_run("fp8 e4m3 gradients", [2.99, 3.09, 3.19, 2.99]), "better than FP32", "-"),
             (_run("fp8 e5m2 gradients", [3.0, math.nan, 3.0, 3.0]), "diverged", "rounding")]
    for run, state, cause in cases:
        v = T.verdict(data, run)
        assert (v["state"], v["cause"]) == (state, cause), run["recipe"]["name"]


def test_a_verdict_without_a_mechanism_is_called_exploratory():
    """A preset's gap whose interval excludes 0 but that no flushed or overflowed gradients
    explain is printed as exploratory; a cause-backed verdict is not."""
    runs = [_run("fp32", [3.0, 3.1, 3.2, 3.0]), _run("nvfp4", [3.1, 3.2, 3.3, 3.1]),
            _run("fp16 static loss scale", [3.2, 3.35, 3.4, 3.2], skipped=3)]
    data = {"initial_heldout_loss": 5.0, "plan": {"seeds": 4}, "runs": runs}
    lines = T.conclusions(data)
    nvfp4 = next(x for x in lines if x.startswith("nvfp4:"))
    assert "worse than FP32" in nvfp4 and "No mechanism shown" in nvfp4 and "exploratory" in nvfp4
    scaled = next(x for x in lines if x.startswith("fp16 static loss scale:"))
    assert "Cause: overflow" in scaled and "exploratory" not in scaled


def test_headline_says_range_only_when_the_runs_show_it():
    ok = [3.0, 3.1, 3.2]
    runs = [_run("fp32", ok), _run("fp16, GPT-2 batch", [4.5, 4.6, 4.7], flushed=5),
            _run("bf16", ok), _run("fp16 dynamic loss scale, GPT-2 batch", ok),
            _run("fp16", ok)]
    data = {"initial_heldout_loss": 5.0, "runs": runs}
    assert "fails for range (underflow)" in T.headline(data)
    runs[2] = _run("bf16", [4.5, 4.6, 4.7])
    assert "do not show FP16 failing for range" in T.headline(data)
    assert T.headline({"initial_heldout_loss": 5.0, "runs": runs[:2]}) is None


def test_flushes_are_told_per_step_and_per_gemm_of_the_nonzero_elements():
    """A share pooled over steps would hide that one step holds every flush; a share of all
    elements counts the zeros below a GEMM that flushed its whole gradient as unflushed."""
    def seed(steps):
        return {"seed": 0, "heldout_loss": 5.0, "nonfinite_steps": 0, "skipped": 0,
                "loss": [5.0], "scale": [], "grads": steps}

    early = _run("te-delayed", [3.0, 3.1])
    early["seeds"] = [seed({"0": {"elements": 100, "flushed": 40, "overflow": 0},
                            "5": {"elements": 100, "flushed": 0, "overflow": 0}})] * 2
    assert T.step_shares(early) == [(0, 0.4), (5, 0.0)] and T.gemm_shares(early) is None
    assert "at steps 0, 5: 40%, 0 (of all elements" in T.flush_text(early)
    gemms = {"head": {"elements": 60, "nonzero": 60, "flushed": 60, "overflow": 0},
             "mlp": {"elements": 40, "nonzero": 0, "flushed": 0, "overflow": 0}}
    dead = _run("fp8 e3m4 gradients unscaled", [5.0, 5.0])
    dead["seeds"] = [{**seed({"0": {"elements": 100, "flushed": 60, "overflow": 0,
                                    "gemms": gemms}}), "seed": i} for i in range(2)]
    assert T.gemm_shares(dead) == {"head": 1.0, "mlp": None}
    text = T.flush_text(dead)
    assert "60% (of all" in text and "at most 100% (head)" in text and "1 of 2 GEMMs" in text
    data = {"initial_heldout_loss": 5.01, "plan": {"seeds": 2},
            "runs": [_run("fp32", [3.0, 3.1]), dead]}
    assert T.stuck(dead) and not T.stuck(data["runs"][0])
    assert "did not learn" in T.conclusions(data)[-1]


def test_tiny_run_through_the_cli(tmp_path, monkeypatch):
    names = ("fp32", "fp16 dynamic loss scale", "fp8 e4m3 gradients unscaled", "nvfp4")
    monkeypatch.setattr(T, "FULL", T.Plan(steps=3, seeds=2, batch=2, heldout_windows=2,
                                          warmup=1, recipes=names))
    monkeypatch.setitem(T.PLANS, "full", T.FULL)
    assert cli.main(["training", "--out", str(tmp_path)]) == 0
    out = tmp_path / "training"
    data = load_json(out / "results.json")
    assert [r["recipe"]["name"] for r in data["runs"]] == list(names)
    assert [len(r["seeds"]) for r in data["runs"]] == [2] * 4
    run = data["runs"][1]["seeds"][0]
    assert len(run["loss"]) == 3 and len(run["scale"]) == 3 and set(run["grads"]) == {"0", "1", "2"}
    assert run["grads"]["0"]["elements"] > 0
    gemms = run["grads"]["0"]["gemms"]                    # per dgrad GEMM, nonzero counted
    assert sum(g["elements"] for g in gemms.values()) == run["grads"]["0"]["elements"]
    assert all(g["flushed"] <= g["nonzero"] <= g["elements"] for g in gemms.values())
    assert (out / "loss_curves.png").stat().st_size > 10_000
    report = (out / "REPORT.md").read_text()
    assert "## Conclusions" in report and "Student-t" in report and "Not run" in report
    (out / "REPORT.md").unlink()
    assert cli.main(["training", "--render", "--out", str(tmp_path)]) == 0
    assert (out / "REPORT.md").read_text() == report
    assert T.NAME not in cli.EXPERIMENTS               # not part of `all`: it trains models


@pytest.mark.parametrize("argv, match", [
    (["training", "--device", "cuda"], "no CUDA device"),
])
def test_device_errors_are_one_line(capsys, argv, match):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and match in err
