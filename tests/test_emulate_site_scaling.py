"""Per-site scaling (``Recipe(fmt, scaling="site")``): one scale per site and operand, its
calibrated amax / format max, fixed over calls; checked bit for bit against per-tensor
scaling (``fpsim.scaled_quantize``'s scale) on tensors whose amax is the calibrated one."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

import fpsim
from fpsim import Recipe, Rule, Rules
from fpsim.emulation import Calibration, sites
from fpsim.emulation.casts import Cast
from fpsim.emulation.recipe import FP32

FORMATS = ("e4m3_ieee", "e5m2", "e3m4_ieee")


def _bits(t: torch.Tensor) -> list[int]:
    return t.contiguous().view(torch.int32).flatten().tolist()


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_scale_is_the_amax_over_the_format_max_as_per_tensor_scaling_has_it(fmt):
    f = fpsim.get_format(fmt)
    x = torch.randn(6, 32, generator=torch.Generator().manual_seed(1)) * 50
    amax = float(x.abs().max())
    for a in (amax, 2.5 * amax, 1e-30, 0.0):
        scale = sites.site_scale(Cast(fmt, "site", amax=a), f)
        ref = fpsim.scaled_quantize(torch.tensor([a or 1.0], dtype=torch.float64), f)
        assert scale == (1.0 if a == 0 else float(ref.scales)), a
    assert sites.site_scale(Cast("e4m3_ieee", "site", amax=720.0), f if fmt == "e4m3_ieee"
                            else fpsim.get_format("e4m3_ieee")) == 3.0     # 720 / 240
    # the tensor's own amax: the per-tensor cast's bits
    site, _ = sites.quantize_cast(x, Cast(fmt, "site", amax=amax), -1)
    tensor, _ = sites.quantize_cast(x, Cast(fmt, "tensor"), -1)
    assert _bits(site) == _bits(tensor)
    # a larger calibrated amax: per-tensor scaling of x beside one element of that amax
    wider = torch.cat([x, torch.full((1, 32), 0.0)])
    wider[-1, 0] = 2.5 * amax
    site, _ = sites.quantize_cast(x, Cast(fmt, "site", amax=float(wider[-1, 0])), -1)
    tensor, _ = sites.quantize_cast(wider, Cast(fmt, "tensor"), -1)
    assert _bits(site) == _bits(tensor[:-1])


def test_calibrate_then_scale_per_site_overflow_and_saturation():
    layer = torch.nn.Linear(2, 1, bias=False)
    layer.weight.data.copy_(torch.tensor([[15.0, 15.0]]))
    cal = Calibration()
    with fpsim.emulate(FP32, watch=cal):
        layer(torch.tensor([[720.0, -1.0]]))
        layer(torch.tensor([[3.0, -2.0]]))               # a second call: the max over calls
    assert cal.amax == {":linear": {"a": 720.0, "b": 15.0}}
    x = torch.tensor([[7.0, 1000.0]])                   # 1000 / 3 = 333 beyond E4M3's 240
    with fpsim.emulate(Recipe("e4m3_ieee", scaling="site"), amax=cal.amax, capture=True) as em:
        y = layer(x)
    assert y.item() == float("inf") and em.table()[0]["overflow"] == 1
    with fpsim.emulate(Recipe("e4m3_ieee", scaling="site", saturate=True), amax=cal.amax):
        y = layer(x)
    assert y.item() == (6.75 + 240 * 3) * 15            # 7 / 3 -> 2.25; 1000 clamped at 720
    with fpsim.emulate(Recipe("e4m3_ieee", scaling="tensor")):
        y = layer(x)                                    # per tensor: x's own scale, 1000 / 240
    assert y.item() != (6.75 + 240 * 3) * 15


def test_per_site_equals_per_tensor_where_calibration_saw_the_same_operands():
    torch.manual_seed(0)
    x = torch.randn(4, 16) * 30
    rules = lambda r: Rules([Rule(r, kind="norm"), Rule(r)], default=FP32)  # noqa: E731
    conv = lambda t: torch.nn.Conv1d(4, 8, 3, padding=1)(t.view(4, 4, 4))  # noqa: E731
    for module, site in ((torch.nn.LayerNorm(16), ":layer_norm"),
                         (torch.nn.Linear(16, 8), ":linear"), (conv, ":conv")):
        cal = Calibration()
        with torch.no_grad(), fpsim.emulate(rules(FP32), watch=cal):
            torch.manual_seed(1)
            module(x)
        assert list(cal.amax) == [site] and cal.amax[site]["a"] == float(x.abs().max())
        runs = {}
        for scaling in ("site", "tensor"):
            r = Recipe("e4m3_ieee", scaling=scaling, name="r")
            with torch.no_grad(), fpsim.emulate(rules(r), amax=cal.amax):
                torch.manual_seed(1)
                runs[scaling] = module(x)
        assert _bits(runs["site"]) == _bits(runs["tensor"]), site


def test_a_convolution_calibrates_scales_per_site_and_keeps_flushed_values_without_flush():
    conv = torch.nn.Conv1d(1, 1, 1, bias=False)
    conv.weight.data.fill_(1.0)
    x = torch.tensor([[[240.0, 1e-4]]])                 # 1e-4: below E4M3's least subnormal
    cal = Calibration()
    with torch.no_grad(), fpsim.emulate(FP32, watch=cal):
        conv(x)
    assert cal.amax == {":conv": {"a": 240.0, "b": 1.0}}
    for flush, small in ((True, 0.0), (False, float(x[0, 0, 1]))):
        with torch.no_grad(), fpsim.emulate(Recipe("e4m3_ieee", scaling="site", flush=flush),
                                            amax=cal.amax):
            assert conv(x).flatten().tolist() == [240.0, small], flush


def test_per_site_weights_are_quantized_once_over_calls(monkeypatch):
    """Without gradients a per-site recipe goes the way of the other scalings, whose quantized
    weights are kept between calls (a greedy decoder's output layer at every token)."""
    from fpsim.emulation import quantizers

    torch.manual_seed(0)
    layer, x = torch.nn.Linear(8, 4), torch.randn(3, 8)
    cal = Calibration()
    with torch.no_grad(), fpsim.emulate(FP32, watch=cal):
        layer(x)
    shapes, cast = [], sites.quantize_cast
    for module in (sites, quantizers):
        monkeypatch.setattr(module, "quantize_cast", lambda t, *a, **k: shapes.append(
            tuple(t.shape)) or cast(t, *a, **k))
    with torch.no_grad(), fpsim.emulate(Recipe("e4m3_ieee", scaling="site"), amax=cal.amax):
        first = layer(x)
        assert _bits(layer(x)) == _bits(first)
    assert shapes == [(3, 8), (8, 4), (3, 8)]


def test_per_site_scaling_without_its_calibration_is_refused():
    layer = torch.nn.Linear(2, 1, bias=False)
    with pytest.raises(ValueError, match="site ':linear' has no calibrated amax"):
        with fpsim.emulate(Recipe("e4m3", scaling="site"), amax={}):
            layer(torch.ones(1, 2))
    with pytest.raises(ValueError, match="reads the site's calibrated amax"):
        sites.linear(Recipe("e4m3", scaling="site"), torch.ones(1, 2), torch.ones(2, 1), None)
    for bad in ({"scaling": "tensor", "amax": 1.0}, {"scaling": "site", "amax": -1.0},
                {"scaling": "site", "amax": float("inf")}, {"scaling": "site", "amax": True}):
        with pytest.raises(ValueError, match="calibrated largest"):
            Cast("e4m3", **bad)


def test_norm_statistics_keep_flushed_values_when_flush_is_off():
    """A norm statistic's input under ``flush=False`` keeps the values that would flush (as a
    product's operands do); it ignored the flag before."""
    x = torch.tensor([[1.0, 0.001, -0.002, 0.5]])       # e3m4's least subnormal is 2^-6
    fmt = "e3m4_ieee"
    kept = torch.tensor([[1.0, 0.001, -0.002, 0.5]])
    kept[0, 0], kept[0, 3] = (float(fpsim.quantize(torch.tensor(v), fmt)) for v in (1.0, 0.5))
    ref = (kept.double() @ kept.double().T).float()[0]
    assert sites.sum_squares(Recipe(fmt, flush=False), x).tolist() == ref.tolist()
    assert sites.sum_squares(Recipe(fmt), x).tolist() == [1.25]       # 0.001, -0.002 flushed
    mean, _ = sites.layernorm_stats(Recipe(fmt, flush=False), x)
    assert mean.tolist() == [float((kept.double().sum() / 4).float())]
    cast = Recipe(fmt, scaling="site").at_site({"a": 15.5})          # a Cast's own flush
    assert sites.sum_squares(dataclasses.replace(cast, inputs=dataclasses.replace(
        cast.inputs, flush=False)), x).tolist() == ref.tolist()
