"""Fake quantization in torch: forward equals fpsim.quantize, gradients pass straight through,
layer wrapping is exact and fully reversible."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import fpsim  # noqa: E402
from fpsim.nn import fake_quantize, is_matmul_layer, quantize_linear_layers  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def q(t, fmt, **kw):
    return fpsim.quantize(t.detach(), fmt, **kw)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_equals_quantize(device, dtype):
    x = (torch.randn(300, generator=torch.Generator().manual_seed(0)) * 50).to(device, dtype)
    y = fake_quantize(x, "e4m3", rounding="rtz", saturate=True)
    assert y.dtype == dtype and y.device == x.device
    assert torch.equal(y, q(x, "e4m3", rounding="rtz", saturate=True))
    assert not torch.equal(y, x), "the test data must actually be rounded"


@pytest.mark.parametrize("device", DEVICES)
def test_gradient_passes_straight_through(device):
    x = torch.tensor([0.1, 1000.0, -3.3, 1e-6], device=device, requires_grad=True)
    upstream = torch.tensor([0.3, -2.0, 1.7, 0.01], device=device)
    (fake_quantize(x, "e4m3", saturate=True) * upstream).sum().backward()
    assert torch.equal(x.grad, upstream)


def test_gradient_rounded_to_grad_fmt():
    x = torch.randn(64, requires_grad=True)
    upstream = torch.randn(64) * 1e-3
    (fake_quantize(x, "bf16", grad_fmt="e5m2", grad_rounding="rtz") * upstream).sum().backward()
    assert torch.equal(x.grad, fpsim.quantize(upstream, "e5m2", rounding="rtz"))
    assert not torch.equal(x.grad, upstream)


class Conv1D(torch.nn.Module):
    """Hugging Face's GPT-2 layer: weight [in, out], y = x @ W + b (matched by class name)."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n_in, n_out))
        self.bias = torch.nn.Parameter(torch.randn(n_out))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), Conv1D(16, 4),
                               torch.nn.LayerNorm(4), torch.nn.Linear(4, 3))


def reference(m, x, wf, af):
    """The wrapped model's forward, written out by hand."""
    lin1, _, conv, norm, lin2 = m
    h = F.gelu(F.linear(q(x, af), q(lin1.weight, wf), lin1.bias))
    h = torch.addmm(conv.bias, q(h, af), q(conv.weight, wf))
    return F.linear(q(norm(h), af), q(lin2.weight, wf), lin2.bias)


def test_wrapped_model_equals_hand_written_fake_quantization():
    m, x = model(), torch.randn(5, 8)
    with quantize_linear_layers(m, weights="e4m3", activations="bf16") as handle:
        assert handle.names == ["0", "2", "4"]
        out = m(x)
        assert torch.equal(out, reference(m, x, "e4m3", "bf16"))
    assert not torch.equal(out, m(x))


def test_restore_gives_back_identical_modules_and_outputs():
    m, x = model(), torch.randn(5, 8)
    before = m(x)
    params = [(n, id(p)) for n, p in m.named_parameters()]
    classes = [type(mod) for mod in m.modules()]
    keys = list(m.state_dict())
    handle = quantize_linear_layers(m, weights="e2m1", activations="e4m3", saturate=True)
    assert not torch.equal(m(x), before)
    handle.restore()
    handle.restore()                                   # a second restore is harmless
    assert torch.equal(m(x), before)
    assert [(n, id(p)) for n, p in m.named_parameters()] == params
    assert [type(mod) for mod in m.modules()] == classes and list(m.state_dict()) == keys
    assert all(not mod._forward_pre_hooks for mod in m.modules())


def test_restore_keeps_parametrizations_it_did_not_add():
    from torch.nn.utils import parametrize

    class Double(torch.nn.Module):
        def forward(self, w):
            return 2 * w

    m, x = model(), torch.randn(5, 8)
    first = next(mod for mod in m.modules() if isinstance(mod, torch.nn.Linear))
    parametrize.register_parametrization(first, "weight", Double())
    before = m(x)
    with quantize_linear_layers(m, activations="e4m3"):
        assert not torch.equal(m(x), before)
    assert parametrize.is_parametrized(first, "weight")       # the user's own is still there
    assert torch.equal(m(x), before)


def test_training_updates_the_full_precision_weights():
    m, x = model(), torch.randn(5, 8)
    w = m[0].weight
    with quantize_linear_layers(m, weights="e4m3", grad="e5m2"):
        m(x).square().sum().backward()
    assert w.grad is not None and w.grad.shape == w.shape and w.grad.abs().sum() > 0
    assert m[0].weight is w


def test_one_sgd_step_is_the_hand_computed_update():
    """loss = sum(y^2), y = x·q(W)ᵀ + b: the output gradient q_e5m2(2y), the weight gradient
    q_e5m2(q_e5m2(2y)ᵀ·x) (straight through q), and one SGD step moves the full-precision W by
    -lr times that, computed here exactly in float64 (dyadic values: every sum is exact)."""
    w0 = np.array([[0.3, -1.1, 2.05], [0.7, 0.12, -0.5]], np.float32)
    b0 = np.array([0.25, -0.5], np.float32)
    x = np.array([[1.0, 0.5, -2.0], [0.25, 3.0, 1.5]], np.float32)
    lin = torch.nn.Linear(3, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.from_numpy(w0))
        lin.bias.copy_(torch.from_numpy(b0))
    opt = torch.optim.SGD(lin.parameters(), lr=0.5)
    with quantize_linear_layers(lin, weights="e4m3", grad="e5m2"):
        lin(torch.from_numpy(x)).square().sum().backward()
        opt.step()
    qw = fpsim.quantize(w0, "e4m3").astype(np.float64)           # 0.3 -> 0.3125, 2.05 -> 2
    y = x.astype(np.float64) @ qw.T + b0
    grad = fpsim.quantize(fpsim.quantize(2 * y, "e5m2").T @ x.astype(np.float64), "e5m2")
    assert np.array_equal(lin.weight.grad.numpy(), grad.astype(np.float32))
    want = (w0.astype(np.float64) - 0.5 * grad).astype(np.float32)
    assert np.array_equal(lin.weight.detach().numpy(), want)       # full precision, updated
    assert not np.array_equal(want, fpsim.quantize(want, "e4m3"))  # not the rounded copy


def test_include_selects_layers_and_weights_only():
    m = model()
    with quantize_linear_layers(m, weights="e2m1", include=lambda n, _: n == "4") as h:
        assert h.names == ["4"]
        assert torch.equal(m[4].weight, q(m[4].parametrizations.weight.original, "e2m1"))
        assert not hasattr(m[0], "parametrizations")


def test_parameter_holder_layers_warn_that_inputs_stay_unrounded():
    class Conv1D(torch.nn.Module):                     # weights only, used by someone else
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(3, 3))

    holder = torch.nn.Module()
    holder.c_attn = Conv1D()
    assert is_matmul_layer(holder.c_attn)
    with pytest.warns(UserWarning, match="inputs are not quantized"):
        handle = quantize_linear_layers(holder, weights="bf16", activations="bf16")
    assert torch.equal(holder.c_attn.weight, q(holder.c_attn.parametrizations.weight.original,
                                                  "bf16"))
    handle.restore()


@pytest.mark.parametrize("kwargs, match", [
    ({}, "nothing to quantize"),
    ({"weights": "fp7"}, "unknown format"),
    ({"weights": "e4m3", "include": lambda n, m: False}, "no nn.Linear"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        quantize_linear_layers(model(), **kwargs)
