"""Attribution switches of range-vs-precision: saturate, no flush, fn encoding, bias."""

from __future__ import annotations

import math

import torch

import fpsim
from fpsim_experiments import range_vs_precision as rvp
from fpsim_experiments.likewise import Ratios
from fpsim_experiments.endtoend import RecipeRun
from fpsim_experiments.recipes import Recipe, linear, softmax


def test_no_flush_keeps_values_below_the_smallest_subnormal_and_only_those() -> None:
    f = rvp.split_format(3, 4)                      # IEEE-style e3m4: min subnormal 2^-6
    x = torch.tensor([[1e-3, -2e-3, 0.0, 0.3, 100.0, 2.0**-6]]).T   # one product per row
    w = torch.ones(1, 1)
    flushed = linear(Recipe(f), x, w, None)[:, 0]
    kept = linear(Recipe(f, flush=False), x, w, None)[:, 0]
    assert flushed[:3].tolist() == [0.0, 0.0, 0.0] and math.isinf(flushed[4])
    assert kept[:3].tolist() == x[:3, 0].tolist()   # put back at their FP32 value
    assert torch.equal(kept[3:], flushed[3:])       # everything else rounds as before


def test_saturate_clamps_overflow_at_the_largest_finite_value() -> None:
    f = rvp.split_format(3, 4)
    assert f.max == 15.5
    x = torch.tensor([[15.7, 15.8, -100.0]]).T
    y = linear(Recipe(f, saturate=True), x, torch.ones(1, 1), None)[:, 0]
    assert y.tolist() == [15.5, 15.5, -15.5]
    y = linear(Recipe(f), x, torch.ones(1, 1), None)[:, 0]
    assert y[0] == 15.5 and y[1] == math.inf and y[2] == -math.inf  # rounding limit 15.75


def test_fn_encoding_and_bias_sweep_move_the_range() -> None:
    fn = rvp.fn_format(3, 4)
    assert fn.max == 30 and fn.min_subnormal == 2.0**-6            # one NaN code, no inf
    assert math.isnan(float(fpsim.quantize(torch.tensor([40.0]), fn)[0]))
    runs = {name: r for name, r, _ in rvp.ablations(8)}
    assert {"saturate", "no flush", "saturate, no flush", "fn encoding", "LN FP32, no flush"} \
        <= set(runs)
    maxima = [runs[f"bias {b}"].inputs.max for b in rvp.BIASES]
    assert maxima == sorted(maxima, reverse=True) and maxima[0] == 15.5 * 4  # bias 1: 4x range
    assert "bias 1" not in {name for name, _, _ in rvp.ablations(12)}


def test_end_to_end_ops_count_overflow_and_flush_per_site() -> None:
    recipe = Recipe(rvp.split_format(3, 4), name="e3m4")
    ops = RecipeRun({"h0.mlp.c_fc": recipe})
    x, W = torch.tensor([[1e-3, 20.0, 0.5]]), torch.full((3, 2), 0.25)
    for _ in range(2):
        events: dict = {}
        y = linear(recipe, x, W, None, events)
        ops.watch("transformer.h.0.mlp.c_fc:linear", "linear", recipe, (x, W), events, y)
    e = ops.events["h0.mlp.c_fc"]
    assert e == {"elements": 2 * (3 + 6), "overflow": 2, "saturated": 0, "flushed": 2}


def test_softmax_is_computed_in_fp64_and_rounded_once() -> None:
    x = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 10
    assert torch.equal(softmax(x), torch.softmax(x.double(), -1).float())


def test_full_subnormals_keep_the_mantissa_width_below_the_smallest_normal() -> None:
    f = rvp.split_format(3, 4)            # IEEE-style e3m4: min normal 2^-2, min subnormal 2^-6
    x = torch.tensor([[0.1, -0.1, 1e-3, 0.3, 0.0078125 * 1.01, 0.2421875]]).T
    w = torch.ones(1, 1)
    sub = linear(Recipe(f), x, w, None)[:, 0].tolist()
    full = linear(Recipe(f, full_subnormals=True), x, w, None)[:, 0].tolist()
    nf = linear(Recipe(f, flush=False, full_subnormals=True), x, w, None)[:, 0].tolist()
    # 0.1 = 6.4 * 2^-6 (subnormal: 6 * 2^-6) = 25.6 * 2^-8 (full 4-bit mantissa: 26 * 2^-8)
    assert sub[:2] == [6 / 64, -6 / 64] and full[:2] == [26 / 256, -26 / 256]
    assert sub[2] == full[2] == 0.0 and nf[2] == x[2, 0].item()   # flush is the other switch
    assert sub[3] == full[3] == 19 / 64                               # normals unchanged
    assert sub[4] == 2.0**-6 and full[4] == 2.0**-7                 # rounds up only as subnormal
    assert sub[5] == 0.25 and full[5] == 31 / 128  # subnormal tie 15.5 * 2^-6; exact at full width
    runs = {name: r for name, r, ln in rvp.ablations(8) if ln}
    assert runs["LN FP32, no flush, full subnormals"].full_subnormals
    assert not runs["LN FP32, no flush, full subnormals"].flush


def test_full_subnormals_refuse_scaled_or_integer_operands() -> None:
    import pytest
    with pytest.raises(ValueError, match="full_subnormals"):
        Recipe("e4m3", scaling="tensor", full_subnormals=True)
    with pytest.raises(ValueError, match="full_subnormals"):
        Recipe("int8", full_subnormals=True)


def _synthetic_run(fmt: fpsim.Format, kl: list[float], flushed: int) -> dict:
    """A run dict as range-vs-precision stores it: per-window KL sums over 10 positions each."""
    windows = {"positions": 10, "kl": kl, "loss": kl, "top1": [10] * len(kl),
               "finite": [10] * len(kl), "kl_finite": kl}
    kl_mean = sum(kl) / (10 * len(kl))
    return {"format": fmt.name, "ebits": fmt.ebits, "max": fmt.max, "scaling": "none",
            "budget": 8, "min_subnormal": fmt.min_subnormal,
            "e2e": {"kl": kl_mean, "windows": windows, "ci": {"kl": [kl_mean, kl_mean]},
                    "events": {"s": {"elements": 100, "overflow": 0, "saturated": 0,
                                     "flushed": flushed}}}}


def test_p3109_bias_ablation_separates_the_bias_from_the_encoding() -> None:
    abl = rvp.p3109_bias_ablation()
    p3109, _ = rvp.p3109_formats(4)
    e4m3 = rvp.split_format(4, 3)
    # the ablation has P3109's bottom of the range and e4m3's encoding (and its 16 top codes
    # given to inf/NaN: max 120 = e4m3's 240 / 2)
    assert abl.min_subnormal == p3109.min_subnormal == e4m3.min_subnormal / 2 == 2.0**-10
    assert abl.max == e4m3.max / 2 == 120
    kl = [1.0 + 0.1 * (i % 7) for i in range(40)]
    data = {"runs": [], "p3109_runs": [_synthetic_run(p3109, [0.9 * v for v in kl], 6)],
            "p3109_bias_ablation": _synthetic_run(abl, [0.9 * v for v in kl], 6)}
    ieee = {4: _synthetic_run(e4m3, kl, 9)}
    (line,) = rvp.p3109_bias_lines(data, data["p3109_runs"], ieee, Ratios(40))
    assert "e4m3b8" in line and "0.9× [0.9, 0.9] e4m3 (better)" in line
    assert "e4m3b8 6% flushed, 0 overflowed, e4m3 9% flushed" in line
    assert f"{p3109.name} (6% flushed, 0 overflowed) 1× [1, 1] e4m3b8 " \
           "(no measurable difference)" in line
    del data["p3109_bias_ablation"]                 # results from before the ablation existed
    assert rvp.p3109_bias_lines(data, data["p3109_runs"], ieee, Ratios(40)) == []
