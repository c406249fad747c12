"""The training experiment: per-tensor scaling, gradient counting, verdicts and a tiny end-to-end
run through the CLI (the full run is results/training/)."""

from __future__ import annotations

import dataclasses
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("matplotlib")

import fpsim  # noqa: E402
from experiments import cli, training as T  # noqa: E402
from experiments.gpt2.model import GPT2  # noqa: E402
from experiments.gpt2.ops import forward  # noqa: E402
from experiments.report import load_json  # noqa: E402


def bits(t):
    return t.contiguous().view(torch.int32)


def test_current_scaling_is_a_power_of_two_that_fits_the_maximum():
    rec = T.Recorder()
    cast = T.Cast("e4m3", T.RECIPES[5], None, rec)
    x = torch.tensor([3e-3, -0.7, 1e-6, 0.0])
    s = 2.0 ** 9                                        # 0.7 * 2^9 = 358 <= 448 < 0.7 * 2^10
    assert cast._scale(x) == s
    assert torch.equal(bits(cast(x)), bits(fpsim.quantize(x * s, "e4m3", saturate=True) / s))


def test_delayed_scaling_uses_the_previous_steps_amax_and_saturates():
    cast = T.Cast("e4m3", T.RECIPES[6], None, T.Recorder())
    assert cast._scale(torch.tensor([100.0])) == 1.0    # no history yet: scale 1
    assert cast._scale(torch.tensor([5.0])) == 4.0      # from the previous amax, 100
    big = cast(torch.tensor([1000.0]))                  # history max 100 -> scale 4; 4000 saturates
    assert big.item() == 448.0 / 4
    assert len(cast.history) == 3


def test_recorder_counts_against_each_format():
    rec = T.Recorder()
    rec.on = True
    rec.add("activation", torch.tensor([0.0, 1e-9, -1e-6, 1.0, 1e5, math.inf]))
    s = rec.take()["activation"]
    assert (s["count"], s["zero"], s["nonfinite"]) == (6, 1, 1)
    assert s["fp16"] == {"lost": 1, "subnormal": 1, "over": 2}   # inf counts as over
    assert s["bf16"] == {"lost": 0, "subnormal": 0, "over": 1}
    assert sum(s["hist"]) == 4 and rec.stats == {}
    rec.on = False
    rec.add("activation", torch.ones(3))
    assert rec.stats == {}


def test_fp32_recipe_trains_exactly_as_plain_torch():
    torch.manual_seed(0)
    m = GPT2(T.MODEL)
    idx = torch.randint(0, 256, (2, 9))
    m(idx).square().mean().backward()
    plain = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    ops = T.TrainOps(T.RECIPES[0], T.Recorder())
    forward(m, idx, ops).square().mean().backward()
    assert all(torch.equal(a, p.grad) for a, p in zip(plain, m.parameters()))


def test_bootstrap_ci_is_seeded_and_brackets_the_mean():
    vals = [0.1, 0.3, 0.2]
    mean, lo, hi = T.bootstrap_ci(vals)
    assert (mean, lo, hi) == T.bootstrap_ci(vals) and lo <= mean <= hi and lo >= 0.1 and hi <= 0.3
    assert T.bootstrap_ci([1.0, 1.0]) == (1.0, 1.0, 1.0)
    assert all(math.isnan(v) for v in T.bootstrap_ci([1.0, math.nan]))


def _run(name, finals, grads=None, skipped=0):
    counts = {f: {"lost": 0, "subnormal": 0, "over": 0} for f in T.FORMATS}
    g = grads or {"0": {c: {"count": 10, "zero": 0, **counts} for c in T.CLASSES}}
    recipe = next(r for r in T.RECIPES if r.name == name)
    return {"recipe": dataclasses.asdict(recipe),
            "seeds": [{"seed": i, "heldout_loss": v, "nonfinite_steps": 0, "skipped": skipped,
                       "grads": g} for i, v in enumerate(finals)]}


def test_verdicts():
    lost = {f: {"lost": 5 if f == "fp16" else 0, "subnormal": 0, "over": 0} for f in T.FORMATS}
    under = {"0": {c: {"count": 10, "zero": 0, **lost} for c in T.CLASSES}}
    data = {"initial_heldout_loss": 5.0, "runs": [_run("fp32", [3.0, 3.1, 3.2])]}
    cases = [(_run("bf16", [3.0, 3.1, 3.2]), "as FP32", "-"),
             (_run("fp16", [4.5, 4.6, 4.7], under), "stalled", "underflow"),
             (_run("fp16 static loss scale", [3.2, 3.35, 3.4], skipped=3), "worse than FP32",
              "overflow"),
             (_run("fp8 current scaling", [3.0, math.nan, 3.0]), "diverged", "rounding")]
    for run, state, cause in cases:
        v = T.verdict(data, run)
        assert (v["state"], v["cause"]) == (state, cause), run["recipe"]["name"]


def test_headline_says_range_only_when_the_runs_show_it():
    lost = {f: {"lost": 5 if f == "fp16" else 0, "subnormal": 0, "over": 0} for f in T.FORMATS}
    under = {"0": {c: {"count": 10, "zero": 0, **lost} for c in T.CLASSES}}
    ok = [3.0, 3.1, 3.2]
    runs = [_run("fp32", ok), _run("fp16, GPT-2 batch", [4.5, 4.6, 4.7], under),
            _run("bf16, GPT-2 batch", ok), _run("fp16 dynamic loss scale, GPT-2 batch", ok),
            _run("fp16", ok)]
    data = {"initial_heldout_loss": 5.0, "runs": runs}
    assert "fails for range (underflow)" in T.headline(data)
    runs[2] = _run("bf16, GPT-2 batch", [4.5, 4.6, 4.7])
    assert "do not show FP16 failing for range" in T.headline(data)
    assert T.headline({"initial_heldout_loss": 5.0, "runs": runs[:2]}) is None


def test_tiny_run_through_the_cli(tmp_path, monkeypatch):
    monkeypatch.setattr(T, "FULL", T.Plan(steps=3, seeds=2, batch=2, heldout_windows=2))
    monkeypatch.setattr(T, "RECIPES", (T.RECIPES[0], T.RECIPES[4], T.RECIPES[7], T.RECIPES[9]))
    assert cli.main(["training", "--out", str(tmp_path)]) == 0
    out = tmp_path / "training"
    data = load_json(out / "results.json")
    assert [len(r["seeds"]) for r in data["runs"]] == [2] * 4
    run = data["runs"][1]["seeds"][0]
    assert len(run["loss"]) == 3 and len(run["scale"]) == 3 and set(run["grads"]) == {"0", "1", "2"}
    assert (out / "loss_curves.png").stat().st_size > 10_000
    assert (out / "gradient_windows.png").stat().st_size > 10_000
    report = (out / "REPORT.md").read_text()
    assert "## Conclusions" in report and "fp16, GPT-2 batch" in report
    (out / "REPORT.md").unlink()
    assert cli.main(["training", "--render", "--out", str(tmp_path)]) == 0
    assert (out / "REPORT.md").read_text() == report
    assert T.NAME not in cli.EXPERIMENTS               # not part of `all`: it trains models


def test_triton_kernels_train_bit_identically_to_the_cpu_path(monkeypatch):
    """The --device cuda path (fpsim.quantize through the Triton kernels), run in the Triton
    interpreter on CPU tensors, gives the same losses and weights as the NumPy path."""
    import os

    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("needs CUDA or TRITON_INTERPRET=1 (conftest sets it without CUDA)")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = dataclasses.replace(T.MODEL, n_layer=1, n_head=1, n_embd=8, n_positions=8)
    torch.manual_seed(0)
    init = GPT2(cfg).state_dict()
    data = torch.randint(0, 256, (200,))
    held = data[:18].view(2, 9).to(device)
    plan = T.Plan(steps=2, seeds=1, batch=2, warmup=1)
    import kernels

    calls = []
    real = kernels.quantize
    monkeypatch.setattr(kernels, "quantize", lambda *a, **k: calls.append(1) or real(*a, **k))
    recipe = T.RECIPES[6]                               # fp8 delayed: scaling, E4M3 and E5M2
    ref = T.train_one(recipe, 0, plan, init, data, held.cpu(), "numpy", cfg)
    assert not calls
    got = T.train_one(recipe, 0, plan, init, data, held, "triton", cfg)
    assert calls and got["loss"] == ref["loss"] and got["heldout_loss"] == ref["heldout_loss"]
    assert got["grads"] == ref["grads"] and got["grads"][1]["activation"]["count"] > 0


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
