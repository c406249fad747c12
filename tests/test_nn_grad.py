"""The backward pass through fpsim.nn (fpsim.emulate's backward GEMMs): the output gradient
rounded as a GEMM operand, bit for bit against an exact reference, and loss scaling that skips
and rescales exactly as torch.amp.GradScaler."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import fpsim  # noqa: E402
from fpsim.emulation.casts import Cast  # noqa: E402
from fpsim.nn import GradFormats, LossScaler, quantize_linear_layers, round_through  # noqa: E402
from test_nn import exact_gemm  # noqa: E402


def q(t, fmt, **kw):
    return fpsim.quantize(t.detach(), fmt, **kw)


def bits(t):
    return t.detach().contiguous().view(torch.int32)


@pytest.mark.parametrize("fwd, grad", [("bf16", "fp16"), ("e4m3", "e5m2"), ("fp16", "fp16")])
def test_linear_backward_equals_exact_reference(fwd, grad):
    """dx = fp32(q(dy) @ q(W)), dW = fp32(q(dy)^T @ q(x)) (exact sums rounded once, the
    forward's rounded operands reused straight through), dbias = fp32(sum of dy)."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, 12, generator=gen).requires_grad_()
    lin = torch.nn.Linear(12, 5)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(5, 12, generator=gen))
    up = torch.randn(6, 5, generator=gen) * 1e-3
    with quantize_linear_layers(lin, weights=fwd, activations=fwd, grad=GradFormats(grad, grad)):
        lin(x).backward(up)
    xq, wq, gq = q(x, fwd), q(lin.weight, fwd), q(up, grad)
    assert torch.equal(bits(x.grad), bits(exact_gemm(gq, wq)))
    assert torch.equal(bits(lin.weight.grad), bits(exact_gemm(gq.t(), xq)))
    assert torch.equal(bits(lin.bias.grad), bits(exact_gemm(torch.ones(1, 6), up)[0]))
    unrounded = exact_gemm(up, wq)                     # the test must be able to fail
    assert not torch.equal(x.grad, unrounded)


def test_gradient_format_alone_rounds_only_dy():
    lin, x = torch.nn.Linear(4, 3), torch.randn(2, 4, requires_grad=True)
    up = torch.randn(2, 3)
    with quantize_linear_layers(lin, grad="e4m3"):
        lin(x).backward(up)
    gq = q(up, "e4m3")
    assert torch.equal(bits(x.grad), bits(exact_gemm(gq, lin.weight)))
    assert torch.equal(bits(lin.weight.grad), bits(exact_gemm(gq.t(), x)))


def test_rounding_options_reach_the_recipe():
    lin = torch.nn.Linear(4, 3)
    g = GradFormats("e5m2", "e5m2", "stochastic", saturate=True, srbits=8)
    with quantize_linear_layers(lin, "e4m3", "e4m3", rounding="stochastic", srbits=4,
                                saturate=True, grad=g) as h:
        recipe = h.emulation.rules.rules[0].recipe
    assert (recipe.rounding, recipe.srbits, recipe.saturate) == ("stochastic", 4, True)
    assert recipe.backward.grad == Cast("e5m2", rounding="stochastic", saturate=True, srbits=8)


def test_gradient_cast_takes_srbits():
    """One random bit: StochasticA rounds up only where floor(2 f) + r >= 2, f the dropped
    fraction of an ulp, so values less than half an ulp above a grid point always round down,
    which every random bit of a full-width draw would not."""
    from fpsim.emulation.quantizers import cast

    torch.manual_seed(0)
    x = 1 + (torch.randint(0, 4, (2000,)) + torch.rand(2000) * 0.4) / 4    # e5m2's ulp: 1/4
    down = q(x, "e5m2", rounding="rtz")
    one_bit, _, _ = cast(x, Cast("e5m2", rounding="stochastic", srbits=1), -1)
    full, _, _ = cast(x, Cast("e5m2", rounding="stochastic"), -1)
    assert torch.equal(one_bit, down) and not torch.equal(full, down)


@pytest.mark.parametrize("fmt, scaling", [
    ("e4m3", "none"), ("e4m3", "tensor"), ("e4m3", "channel"), ("mxfp8_e4m3", "block"),
    ("nvfp4", "block2d"), ("e4m3", "tile"), ("e4m3", "tile2d"), ("e4m3", "tensorwise"),
    ("e4m3", "rowwise"), ("e4m3", "delayed")])
def test_every_cast_rounds_stochastically_with_srbits(fmt, scaling):
    """Each scaling passes rounding and srbits through, its random bits from torch's seed."""
    from fpsim.emulation.quantizers import cast

    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(2))
    c = Cast(fmt, scaling, rounding="stochastic", srbits=3)
    runs = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        runs.append(cast(x, c, -1, scale=1.0 if scaling == "delayed" else None)[0])
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


def test_round_through_identity_forward_rounds_only_the_gradient():
    x = torch.tensor([1e-9, 3.0, 70000.0], requires_grad=True)
    y = round_through(x, None, fpsim.nn.rounder("fp16"))
    assert torch.equal(y, x)
    y.backward(torch.tensor([1e-9, 1.0 / 3, 70000.0]))
    assert x.grad.tolist() == [0.0, float(q(torch.tensor(1.0 / 3), "fp16")), math.inf]


def _grads(seq):
    """Gradients a step would see: finite values, or inf / NaN in one of two parameters."""
    vals = {"ok": (1.0, 2.0), "inf": (math.inf, 1.0), "nan": (1.0, math.nan)}
    return [vals[s] for s in seq]


SEQUENCE = ["ok", "ok", "inf", "ok", "ok", "ok", "nan", "inf", "ok", "ok", "ok", "ok", "ok"]


def _drive(scaler, seq, device="cpu"):
    """Run ``seq`` through a scaler with the GradScaler call pattern; record what it did."""
    p = [torch.nn.Parameter(torch.zeros(1, device=device)) for _ in range(2)]
    opt = torch.optim.SGD(p, lr=1.0)
    log = []
    for g in _grads(seq):
        opt.zero_grad()
        loss = scaler.scale(torch.tensor(1.0, device=device))
        before = [t.detach().clone() for t in p]
        for t, v in zip(p, g):
            t.grad = torch.full((1,), v, device=device) * loss.detach()
        scaler.unscale_(opt)
        scaler.step(opt)
        stepped = not all(torch.equal(a, b) for a, b in zip(before, p))
        scaler.update()
        log.append((stepped, float(scaler.get_scale()), [t.grad.item() for t in p]))
    return log


def _same(a, b):
    return all(x[0] == y[0] and x[1] == y[1] and
               all(u == v or (math.isnan(u) and math.isnan(v)) for u, v in zip(x[2], y[2]))
               for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("kw", [{}, {"init_scale": 8.0, "growth_interval": 3},
                                {"init_scale": 3.0, "growth_factor": 3.0, "backoff_factor": 0.25,
                                 "growth_interval": 2}])
def test_dynamic_scaler_matches_torch_grad_scaler(kw):
    try:
        real = torch.amp.GradScaler("cpu", **kw)
    except (RuntimeError, TypeError) as e:              # pragma: no cover - old torch
        pytest.skip(f"torch.amp.GradScaler does not run on CPU here: {e}")
    want = _drive(real, SEQUENCE)
    got = _drive(LossScaler(**kw), SEQUENCE)
    assert _same(got, want), (got, want)
    assert [s for s, _, _ in got].count(False) == 3     # the inf/NaN steps were skipped


def test_dynamic_scaler_rules_written_out():
    s = LossScaler(init_scale=4.0, growth_interval=2)
    log = _drive(s, ["ok", "ok", "inf", "ok", "inf", "ok", "ok"])
    assert [(st, sc) for st, sc, _ in log] == [(True, 4.0), (True, 8.0), (False, 4.0), (True, 4.0),
                                               (False, 2.0), (True, 2.0), (True, 4.0)]
    assert s.skipped == 2


def test_static_scaler_skips_but_keeps_its_scale():
    s = LossScaler(init_scale=1024.0, dynamic=False)
    log = _drive(s, SEQUENCE)
    assert {sc for _, sc, _ in log} == {1024.0}
    assert [st for st, _, _ in log] == [x == "ok" for x in SEQUENCE] and s.skipped == 3


def test_scale_growth_stops_at_float32_max():
    s = LossScaler(init_scale=2.0 ** 126, growth_interval=1)
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    for _ in range(3):
        p.grad = torch.zeros(1)
        s.step(opt)
        s.update()
    assert s.get_scale() == 2.0 ** 127 and s.skipped == 0


@pytest.mark.parametrize("kw", [{"init_scale": 0.0}, {"growth_factor": 1.0},
                                {"backoff_factor": 1.0}, {"growth_interval": 0}])
def test_bad_scaler_arguments(kw):
    with pytest.raises(ValueError, match="loss scaling needs"):
        LossScaler(**kw)


def test_update_without_step_is_an_error():
    with pytest.raises(RuntimeError, match="needs a step"):
        LossScaler().update()
