"""Capture, per-site replay and end-to-end recipes on a tiny random GPT-2 checkpoint."""

from __future__ import annotations

import math

import pytest
import torch

import fpsim
from fpsim_experiments.capture import capture
from fpsim_experiments.endtoend import RecipeRun, compare, logits
from fpsim_experiments.gpt2.checkpoint import load_gpt2, save_gpt2
from fpsim_experiments.gpt2.model import GPT2, GPT2Config
from fpsim_experiments.recipes import (FP32, Recipe, layernorm, linear, matmul, quantize_operand,
                                 rounding_limit)
from fpsim_experiments.replay import error_stats, reference, references, replay, site_output, summary

CFG = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=16, vocab_size=40)
SITE_SHAPES = {  # site: (a, b, output) for batch 3, T 16, C 32, 2 heads of 16
    "h{i}.ln_1": ((3, 16, 32), None, (3, 16)),
    "h{i}.attn.c_attn": ((3, 16, 32), (32, 96), (3, 16, 96)),
    "h{i}.attn.qk": ((3, 2, 16, 16), (3, 2, 16, 16), (3, 2, 16, 16)),
    "h{i}.attn.av": ((3, 2, 16, 16), (3, 2, 16, 16), (3, 2, 16, 16)),
    "h{i}.attn.c_proj": ((3, 16, 32), (32, 32), (3, 16, 32)),
    "h{i}.ln_2": ((3, 16, 32), None, (3, 16)),
    "h{i}.mlp.c_fc": ((3, 16, 32), (32, 128), (3, 16, 128)),
    "h{i}.mlp.c_proj": ((3, 16, 128), (128, 32), (3, 16, 32)),
}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> GPT2:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("ckpt") / "gpt2"
    save_gpt2(GPT2(CFG), path)
    return load_gpt2(path)


@pytest.fixture(scope="module")
def wins() -> torch.Tensor:
    return torch.randint(0, CFG.vocab_size, (3, CFG.n_positions + 1), generator=torch.Generator().manual_seed(1))


def test_capture_gets_every_site_with_its_shapes(model: GPT2, wins: torch.Tensor) -> None:
    sites, out = capture(model, wins[:, :-1])
    expected = {k.format(i=i): v for i in range(CFG.n_layer) for k, v in SITE_SHAPES.items()}
    expected |= {"ln_f": ((3, 16, 32), None, (3, 16)), "lm_head": ((3, 16, 32), (32, 40), (3, 16, 40))}
    assert list(sites)[:3] == ["h0.ln_1", "h0.attn.c_attn", "h0.attn.qk"] and list(sites)[-1] == "lm_head"
    assert set(sites) == set(expected)
    for name, (a, b, o) in expected.items():
        s = sites[name]
        assert (tuple(s.a.shape), None if s.b is None else tuple(s.b.shape), tuple(s.output.shape)) == (a, b, o), name
    assert torch.equal(out, RecipeRun(FP32)(model, wins[:, :-1]))  # the deterministic reference
    assert sites["h1.attn.qk"].mask.tolist() == torch.ones(16, 16, dtype=torch.bool).tril().tolist()


def test_fp32_replay_reproduces_the_capture_and_is_close_to_fp64(model: GPT2, wins: torch.Tensor) -> None:
    sites, _ = capture(model, wins[:, :-1])
    for name, site in sites.items():
        assert torch.equal(site_output(site, FP32), site.output), name
    stats = replay(sites, FP32)
    for name, s in stats.items():
        assert s["overflow"] == s["flushed"] == 0, name
        assert s["rel_median"] < 1e-6 and s["rel_p99"] < 1e-4 and s["snr_db"] > 100, (name, s)
    assert summary(stats)["overflow_sites"] == []


def test_reference_is_fp64_arithmetic_on_the_captured_operands(model: GPT2, wins: torch.Tensor) -> None:
    site = capture(model, wins[:, :-1])[0]["h0.mlp.c_fc"]
    want = site.a.double() @ site.b.double() + site.bias.double()
    assert torch.equal(reference(site), want.reshape(-1))
    ln = capture(model, wins[:, :-1])[0]["h1.ln_2"]
    x = ln.a.double()
    assert torch.allclose(reference(ln), ((x - x.mean(-1, keepdim=True)) ** 2).sum(-1).reshape(-1), rtol=1e-12)


def test_fp16_overflows_at_a_planted_huge_activation(model: GPT2, wins: torch.Tensor) -> None:
    planted = GPT2(CFG)
    planted.load_state_dict(model.state_dict())
    with torch.no_grad():
        planted.transformer.wpe.weight[3, 5] = 1e5  # beyond FP16's 65504: the residual stream at position 3
    sites, _ = capture(planted, wins[:, :-1])
    fp16 = Recipe("fp16", output="fp16", name="fp16")
    stats = replay(sites, fp16)
    ln = stats["h0.ln_1"]
    assert ln["a_overflow"] == pytest.approx(3 / (3 * 16 * 32))  # one element per window
    assert ln["overflow"] == pytest.approx(3 / (3 * 16))  # that token's sum of squares
    assert stats["h0.attn.c_attn"]["a_overflow"] == stats["h0.attn.c_attn"]["overflow"] == 0
    assert summary(stats)["overflow_sites"][0] == "h0.ln_1"
    assert summary(replay(sites, FP32))["overflow_sites"] == []
    ops = RecipeRun(fp16)
    e2e = compare(planted, wins, logits(planted, wins), ops)
    assert list(ops.nonfinite)[0] == "h0.ln_1" and math.isnan(e2e["kl"]) and e2e["finite"] < 1
    # saturating instead of overflowing: the same element is clamped, nothing is inf
    sat = replay(sites, Recipe("fp16", output="fp16", saturate=True, name="fp16 sat"))["h0.ln_1"]
    assert sat["a_overflow"] == sat["overflow"] == 0 and sat["a_saturated"] == ln["a_overflow"]
    assert sat["saturated"] == ln["overflow"]  # the sum of squares clamped at 65504


def test_fp32_recipe_end_to_end_matches_the_model(model: GPT2, wins: torch.Tensor) -> None:
    ref = logits(model, wins)
    e2e = compare(model, wins, ref, RecipeRun(FP32))
    assert e2e["kl"] == 0 and e2e["top1"] == 1.0 and e2e["finite"] == 1.0
    lossy = compare(model, wins, ref, RecipeRun(Recipe("e3m2")))
    assert lossy["kl"] > 1e-6 and lossy["top1"] < 1.0


def test_per_site_recipes_only_change_their_site(model: GPT2, wins: torch.Tensor) -> None:
    recipe = Recipe("e3m2")
    ops = RecipeRun({"lm_head": recipe})
    assert ops.recipe_for("lm_head").name == "e3m2" and ops.recipe_for("h0.attn.qk") is FP32
    x = wins[:, :-1]
    got = ops(model, x)
    # every site before lm_head is the reference: lm_head's input is the captured one, bit for bit
    sites, ref = capture(model, x)
    W = model.transformer.wte.weight.t()
    assert torch.equal(got, linear(recipe, sites["lm_head"].a, W, None))
    assert not torch.equal(got, ref)
    assert ops.events["lm_head"]["flushed"] > 0  # e3m2 flushes small weights; no other site rounds
    assert all(e["flushed"] == e["overflow"] == 0 for n, e in ops.events.items() if n != "lm_head")
    e2e = compare(model, wins, logits(model, wins), RecipeRun({"lm_head": recipe}))
    assert 0 < e2e["kl"] and e2e["windows"]["positions"] == CFG.n_positions


@pytest.mark.parametrize("scaling", ["tensor", "channel"])
def test_scaling_is_fpsim_scaled_quantize_along_the_reduction_axis(scaling: str) -> None:
    x = torch.tensor([[1e6, -3.0, 0.5, 0.0], [2e-3, 1e-4, -7e-4, 1e-3]])
    recipe = Recipe("e4m3", scaling=scaling)
    q, limit = quantize_operand(x, "e4m3", recipe, axis=-1)
    want = fpsim.scaled_quantize(x.double(), "e4m3", granularity=scaling, axis=0 if scaling == "channel" else None)
    assert torch.equal(q, want.values.float()) and q[0, 0] == 1e6
    assert torch.equal(quantize_operand(x.T, "e4m3", recipe, axis=-2)[0], q.T)  # right operand: per column
    assert (x.abs() < limit).all()
    if scaling == "channel":  # the small row has its own scale: 3 significant bits survive
        assert ((q[1] - x[1]).abs() <= x[1].abs() / 16).all()
    else:  # one scale for both rows: the small row falls below E4M3's smallest subnormal
        assert (q[1] == 0).all()
    unscaled, _ = quantize_operand(x, "e4m3", Recipe("e4m3"), axis=-1)
    assert torch.isnan(unscaled[0, 0])  # E4M3FN has no inf: overflow is NaN


def test_block_scaling_uses_fpsim_mx() -> None:
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    x[0, 0] = 1e4
    q, limit = quantize_operand(x, "mxfp4", Recipe("mxfp4", scaling="block"), axis=-1)
    want = fpsim.mx.quantize(x, "mxfp4", axis=-1).dequantize()
    assert torch.equal(q, want)
    assert limit.shape == x.shape and limit[0, 0] == 7 * 2.0 ** 11  # scale 2^11; E2M1 max 6, ulp 2


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp6_e3m2", "mxint8", "nvfp4"])
@pytest.mark.parametrize("shape, axis", [((3, 70), -1), ((2, 33, 5), -2), ((64, 7), 0)])
def test_block_limit_is_each_elements_block_top_value(fmt, shape, axis) -> None:
    """The block limit (computed per block and repeated along the axis) equals, bit for bit,
    every element's block's largest value dequantized (a full tensor of top codes) times
    rounding_limit / max: blocks padded at the end, NaN/inf/zero blocks, either axis."""
    import dataclasses

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=gen) * torch.exp2(
        torch.randint(-30, 30, shape, generator=gen).float())
    x.view(-1)[0], x.view(-1)[5], x.view(-1)[-1] = math.nan, math.inf, 3e38
    x.select(axis, 1).zero_()
    recipe = Recipe(fmt, scaling="block")
    _, limit = quantize_operand(x, fmt, recipe, axis=axis)
    arr = fpsim.mx.quantize(x, fmt, axis=axis, rounding=recipe.rounding,
                            scale_rounding=recipe.scale_rounding)
    elem = arr.fmt.elem
    top = dataclasses.replace(arr, codes=torch.full_like(arr.codes, elem.max_code))
    want = top.dequantize(torch.float64) * (rounding_limit(elem) / elem.max)
    assert limit.shape == x.shape and limit.dtype == torch.float64
    assert torch.equal(limit.view(torch.int64), want.view(torch.int64))


def test_recipe_validation() -> None:
    assert Recipe("mxfp4").scaling == "block"              # a block format's only scaling
    with pytest.raises(ValueError, match="block format"):
        Recipe("mxfp4", scaling="channel")
    with pytest.raises(ValueError, match="scaling"):
        Recipe("e4m3", scaling="row")
    with pytest.raises(ValueError, match="unknown format"):
        Recipe("fp7")
    with pytest.raises(ValueError, match="input format"):
        Recipe(scaling="tensor")
    assert Recipe("bf16", accum="fp16").emulated and not Recipe("bf16").emulated
    assert Recipe("e4m3", weights="e2m1").to_json()["weights"] == "e2m1"


def test_layernorm_under_recipes() -> None:
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(0)) * 3 + 1
    w, b = torch.rand(32) + 0.5, torch.randn(32)
    want = torch.nn.functional.layer_norm(x, (32,), w, b, 1e-5)
    # FP32: torch's LayerNorm in FP64, rounded once to FP32 (the same bits on any thread count)
    f64 = torch.nn.functional.layer_norm(x.double(), (32,), w.double(), b.double(), 1e-5)
    assert torch.equal(layernorm(FP32, x, w, b, 1e-5), f64.float())
    assert torch.allclose(layernorm(FP32, x, w, b, 1e-5), want, rtol=0, atol=1e-5)
    assert torch.allclose(layernorm(Recipe(accum="fp64"), x, w, b, 1e-5), want, atol=1e-5)
    assert not torch.allclose(layernorm(Recipe("e3m2"), x, w, b, 1e-5), want, atol=1e-2)


def test_error_stats_counts_and_errors() -> None:
    ref = torch.tensor([1.0, 2.0, -4.0, 1e5, 3.0, 0.0], dtype=torch.float64)
    y = torch.tensor([1.0, 2.5, -4.0, math.inf, 0.0, 0.0])
    s = error_stats(y, ref, output_max=65504)
    assert s["outputs"] == 6 and s["overflow"] == 1 / 6 and s["flushed"] == 1 / 6 and s["saturated"] == 0
    assert s["rel_max"] == 1.0 and s["rel_median"] == 0.125  # errors 0, .25, 0, 1 over the finite non-zero refs
    assert s["snr_db"] == pytest.approx(10 * math.log10((1 + 4 + 16 + 9) / (0.25 + 9)))
    clamped = error_stats(torch.tensor([65504.0]), torch.tensor([1e5]), output_max=65504)
    assert clamped["saturated"] == 1 and clamped["overflow"] == 0


def test_subsample_keeps_outputs_consistent(model: GPT2, wins: torch.Tensor) -> None:
    sites, _ = capture(model, wins[:, :-1])
    gen = torch.Generator().manual_seed(0)
    small = {n: s.subsample(5, 7, gen) for n, s in sites.items()}
    refs = references(small)
    for name, site in small.items():  # BLAS may sum a smaller product in another order
        assert torch.allclose(site_output(site, FP32), site.output, rtol=1e-5, atol=1e-6), name
        assert refs[name].numel() <= 2 * 5 * 7 if site.kind != "layernorm" else refs[name].numel() == 5


def test_emulated_accumulators_go_through_fpsim_matmul(model: GPT2, wins: torch.Tensor) -> None:
    sites, _ = capture(model, wins[:, :-1])
    small = {n: sites[n].subsample(4, 8, torch.Generator().manual_seed(0)) for n in ("h0.ln_1", "h1.attn.qk", "lm_head")}
    seq32 = replay(small, Recipe(order="sequential"))
    f16 = replay(small, Recipe("fp16", accum="fp16"))
    for name in small:
        assert seq32[name]["rel_p99"] < 1e-5 and seq32[name]["accum_overflow"] == 0, name
        assert f16[name]["rel_median"] > seq32[name]["rel_median"], name
    # partial sums beyond FP16's 65504 overflow in an FP16 accumulator, not in FP32
    a, b = torch.full((2, 512), 200.0), torch.ones(512, 3)
    for accum, bad, peak in (("fp16", 6, math.inf), ("fp32", 0, 102400), ("bf16", 0, 65536)):
        events: dict = {}
        y = matmul(Recipe("fp16", accum=accum, order="sequential", name=accum), a, b, events)
        assert int((~torch.isfinite(y)).sum()) == events["accum"]["overflow"] == bad
        assert events["accum"]["max_partial"] == peak  # BF16 stalls at 2^16: 200 < half its ulp
        assert (events["accum"]["swamped"] > 0) == (accum == "bf16")
    tc = Recipe("bf16", order="tensor_core", tensor_core="hopper_bf16")
    assert replay(small, tc)["lm_head"]["rel_median"] < 1e-2


def test_sites_sort_in_forward_order():
    from fpsim_experiments.gpt2.model import site_order

    seen = ["lm_head", "ln_f", "h3.ln_1", "h10.attn.qk", "h3.mlp.c_proj", "h3.attn.av"]
    assert sorted(seen, key=site_order) == ["h3.ln_1", "h3.attn.av", "h3.mlp.c_proj",
                                            "h10.attn.qk", "ln_f", "lm_head"]


def test_inf_in_the_masked_half_of_qk_is_not_counted():
    import torch

    from fpsim_experiments.endtoend import RecipeRun

    ops = RecipeRun({})
    y = torch.zeros(1, 1, 4, 4)
    y[0, 0, 0, 3] = float("inf")                   # above the diagonal: masked away
    ops.record("h0.attn.qk", y, {}, ())
    assert ops.nonfinite == {}
    y[0, 0, 3, 0] = float("inf")                   # a position the model uses
    ops.record("h0.attn.qk", y, {}, ())
    assert ops.nonfinite == {"h0.attn.qk": 1}


def _events_by_definition(x: torch.Tensor, q: torch.Tensor, limit) -> dict[str, int]:
    fx, fq = torch.isfinite(x), torch.isfinite(q)
    return {"elements": x.numel(), "overflow": int((fx & ~fq).sum()),
            "saturated": int((fx & fq & (x.abs() >= limit)).sum()),
            "flushed": int((fx & (x != 0) & (q == 0)).sum())}


@pytest.mark.parametrize("case", ["clean", "flush", "overflow", "saturate", "nan", "inf", "zeros",
                                  "tensor-limit"])
def test_operand_events_fast_and_full_paths_match_the_definition(case):
    """The counts equal their definition whether they take the four-pass path (all finite and
    below the limit) or the full one."""
    from fpsim_experiments.recipes import operand_events

    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 48, generator=g, dtype=torch.float64) * 300
    x[0, :5] = 0.0
    x[1, :7] = 1e-9                                           # flushed by e4m3
    recipe = Recipe(inputs="e4m3", saturate=case == "saturate")
    if case == "nan":
        x[2, 3] = float("nan")
    elif case == "inf":
        x[2, 3] = -float("inf")
    elif case == "zeros":
        x = torch.zeros_like(x)
    elif case == "clean":
        x = x.clamp(-400, 400)
    scaling = "tensor" if case == "tensor-limit" else "none"
    recipe = Recipe(inputs="e4m3", saturate=case == "saturate", scaling=scaling)
    q, limit = quantize_operand(x, "e4m3", recipe, axis=-1)
    want = _events_by_definition(x, q, limit)
    assert operand_events(x, q, limit) == want
    if case == "flush":
        assert want["flushed"] == 7 and want["overflow"] > 0
    if case in ("overflow", "saturate"):
        assert want["overflow" if case == "overflow" else "saturated"] > 0
