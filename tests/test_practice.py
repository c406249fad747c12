"""Deployed FP8 recipes: DeepSeek-V3 tiles bit for bit, delayed scaling, the ``practice`` run."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import fpsim
from fpsim_experiments import context, practice
from fpsim_experiments.recipes import tile_quantize

E4M3 = fpsim.get_format("e4m3")


def test_tiles_are_scaled_quantize_per_1x128_and_per_128x128_block() -> None:
    g = torch.Generator().manual_seed(0)
    W = torch.randn(300, 200, generator=g) * torch.rand(300, 200, generator=g) ** 4
    qw = tile_quantize(W, E4M3, -2)
    for k0 in range(0, 300, 128):          # short last blocks: 44 rows, 72 columns
        for n0 in range(0, 200, 128):
            blk = W[k0:k0 + 128, n0:n0 + 128].double()
            want = fpsim.scaled_quantize(blk, E4M3, granularity="tensor").values.float()
            assert torch.equal(qw[k0:k0 + 128, n0:n0 + 128], want), (k0, n0)
    x = torch.randn(2, 3, 300, generator=g)
    qx = tile_quantize(x, E4M3, -1)
    for t0 in range(0, 300, 128):
        tile = x[1, 2, t0:t0 + 128].double()
        want = fpsim.scaled_quantize(tile, E4M3, granularity="tensor").values.float()
        assert torch.equal(qx[1, 2, t0:t0 + 128], want)


def test_delayed_scaling_is_fpsim_emulates_amax_history() -> None:
    """practice's delayed run is fpsim.emulate's TE delayed cast: scale 1 on the first call
    (1000 saturates at 448), then 448 / the largest amax of the previous calls; weights by
    their own amax."""
    layer = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.eye(2))
    em = fpsim.emulate(practice.DELAYED)
    with torch.no_grad(), em:
        y1 = layer(torch.tensor([[1000.0, 0.5]]))
        y2 = layer(torch.tensor([[100.0, 0.5]]))
    assert y1.tolist() == [[448.0, 0.5]]
    s = float(torch.tensor(448.0) / torch.tensor(1000.0))              # FP32, as TE
    assert y2[0, 0] == float(torch.tensor(fpsim.quantize(100.0 * s, E4M3)) / torch.tensor(s))
    assert em.amax_history(":linear")["x"]["history"] == [1000.0, 100.0]


def test_a_delayed_run_keeps_its_amax_histories_from_batch_to_batch() -> None:
    from fpsim_experiments.endtoend import RecipeRun
    from fpsim_experiments.gpt2.model import GPT2, GPT2Config

    torch.manual_seed(0)
    model = GPT2(GPT2Config(n_layer=1, n_head=2, n_embd=32, n_positions=8)).eval()
    run = RecipeRun({"h0.mlp.c_fc": practice.DELAYED})
    with torch.no_grad():
        for seed in (1, 2):
            run(model, torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(seed)))
    history = run.emulation.amax_history("transformer.h.0.mlp.c_fc:linear")["x"]["history"]
    assert len(history) == 2 and history[0] != history[1]


@pytest.fixture(scope="module")
def small() -> context.Context:
    sizes = context.Sizes(tokens=512, capture_windows=1, rows=16, cols=16, emulation_rows=4,
                          emulation_cols=8)
    return context.build(sizes=sizes, quick=True)


@pytest.mark.slow
def test_practice_runs_every_recipe_with_intervals(small: context.Context, tmp_path: Path) -> None:
    data = practice.run(small)
    names = [r["name"] for r in data["runs"]]
    planned = [r.name for r in practice.end_to_end_runs(small)]
    assert len(planned) == 6                           # --quick (this context) leaves out MXFP8
    assert names == [n for n in planned if "MXFP8" not in n] and len(names) == 4
    assert any("delayed" in n for n in names)
    for r in data["runs"]:
        e = r["e2e"]
        assert math.isfinite(e["kl"]) and e["ci"]["kl"][0] <= e["kl"] <= e["ci"]["kl"][1]
        assert 0 < e["kl"] < 0.1, r["name"]
    touched = {n for r in data["runs"][:3] for n, e in r["e2e"]["events"].items()
               if e["flushed"] or e["saturated"]}
    assert touched and all(n.split(".", 1)[-1] in practice.LINEAR for n in touched)
    acc = {x["recipe"]["name"]: x for x in data["accumulators"]}
    linear = practice.sites_of(small, practice.LINEAR)
    assert len(acc) == 3 and all(list(x["sites"]) == linear for x in acc.values())
    data["meta"] = {**small.meta(), "seconds": 0}
    report = practice.render(data, tmp_path)
    assert "## Conclusions" in report and (tmp_path / "practice.png").is_file()


@pytest.mark.parametrize("split", [(9, 2), (10, 1), (11, 4)])
def test_clamped_per_tensor_scaling_is_the_unscaled_run(small: context.Context, split) -> None:
    """range-vs-precision reuses the unscaled run where every FP32 scale is the clamp 2^-126:
    computed anyway here, both give the same JSON to the last digit."""
    import json

    from fpsim_experiments.range_vs_precision import scale_clamped, split_format
    from fpsim_experiments.recipes import Recipe

    fmt = split_format(*split)
    assert scale_clamped({"max": fmt.max})
    runs = small.run([Recipe(fmt, scaling=s) for s in ("none", "tensor")])
    for r in runs:
        del r["recipe"]
    assert json.dumps(runs[0], sort_keys=True) == json.dumps(runs[1], sort_keys=True)
