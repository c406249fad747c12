"""Fake quantization in torch: forward equals fpsim.quantize, gradients pass straight through;
quantize_linear_layers puts a model's linear layers under fpsim.emulate, bit for bit against
an exact reference, and takes them back out without a trace."""

from __future__ import annotations

from fractions import Fraction

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


def exact_gemm(a, b, bias=None):
    """``a @ b (+ bias)`` summed exactly (fractions), rounded once to float32: the slow
    reference of fpsim.emulate's FP32 sums.  Asserts that the float64 step loses nothing (no
    double rounding on the way to float32)."""
    A = [[Fraction(v) for v in row] for row in a.detach().double().tolist()]
    B = [[Fraction(v) for v in row] for row in b.detach().double().tolist()]
    c = None if bias is None else [Fraction(v) for v in bias.detach().double().tolist()]
    out = []
    for row in A:
        sums = [sum((row[k] * B[k][j] for k in range(len(B))), Fraction(0))
                + (0 if c is None else c[j]) for j in range(len(B[0]))]
        assert all(Fraction(float(s)) == s for s in sums), "not exact in float64"
        out.append([float(s) for s in sums])
    return torch.tensor(out, dtype=torch.float64).float()


def reference(m, x, wf, af):
    """The model under quantize_linear_layers, written out: operands rounded, exact sums
    rounded once to FP32, GELU and LayerNorm by torch."""
    lin1, _, conv, norm, lin2 = m
    h = F.gelu(exact_gemm(q(x, af), q(lin1.weight, wf).t(), lin1.bias))
    h = exact_gemm(q(h, af), q(conv.weight, wf), conv.bias)
    return exact_gemm(q(norm(h), af), q(lin2.weight, wf).t(), lin2.bias)


def test_wrapped_model_equals_exact_reference():
    m, x = model(), torch.randn(5, 8)
    with quantize_linear_layers(m, weights="e4m3", activations="bf16") as handle:
        assert handle.names == ["0", "2", "4"]
        out = m(x)
        assert torch.equal(out, reference(m, x, "e4m3", "bf16"))
        assert handle.emulation.missed == {}
    assert not torch.equal(out, m(x))


def test_inference_and_a_layer_called_alone_are_emulated_too():
    m, x = model(), torch.randn(5, 8)
    with quantize_linear_layers(m, weights="e4m3", activations="bf16"):
        with torch.no_grad():
            assert torch.equal(m(x), reference(m, x, "e4m3", "bf16"))
        h = torch.randn(5, 4)
        assert torch.equal(m[4](h), exact_gemm(q(h, "bf16"), q(m[4].weight, "e4m3").t(),
                                               m[4].bias))


def test_a_failing_forward_leaves_no_context_behind():
    m = model()
    with quantize_linear_layers(m, weights="e4m3"):
        with pytest.raises(RuntimeError):
            m(torch.randn(5, 7))                       # wrong width: the first layer raises
        with fpsim.emulate(fpsim.Recipe()):            # none left active
            pass
        assert torch.equal(m[0](torch.ones(1, 8)),
                           exact_gemm(torch.ones(1, 8), q(m[0].weight, "e4m3").t(), m[0].bias))


def test_activations_alone_leave_weights_exact():
    """A recipe's weights=None means "as the inputs": activations alone must not round W."""
    m, x = model(), torch.randn(5, 8)
    with quantize_linear_layers(m, activations="e4m3"):
        out = m(x)
    lin1, _, conv, norm, lin2 = m
    h = F.gelu(exact_gemm(q(x, "e4m3"), lin1.weight.t(), lin1.bias))
    h = exact_gemm(q(h, "e4m3"), conv.weight, conv.bias)
    assert torch.equal(out, exact_gemm(q(norm(h), "e4m3"), lin2.weight.t(), lin2.bias))


def test_restore_gives_back_identical_modules_and_outputs():
    m, x = model(), torch.randn(5, 8)
    before = m(x)
    params = [(n, id(p), p.detach().clone()) for n, p in m.named_parameters()]
    classes = [type(mod) for mod in m.modules()]
    keys = list(m.state_dict())
    handle = quantize_linear_layers(m, weights="e2m1", activations="e4m3", saturate=True)
    assert not torch.equal(m(x), before)
    handle.restore()
    handle.restore()                                   # a second restore is harmless
    assert torch.equal(m(x), before)
    assert [(n, id(p)) for n, p in m.named_parameters()] == [(n, i) for n, i, _ in params]
    assert all(torch.equal(p, v) for (_, p), (_, _, v) in zip(m.named_parameters(), params))
    assert [type(mod) for mod in m.modules()] == classes and list(m.state_dict()) == keys
    assert all(not mod._forward_pre_hooks and not mod._forward_hooks for mod in m.modules())


def test_user_parametrizations_compose_and_stay():
    from torch.nn.utils import parametrize

    class Double(torch.nn.Module):
        def forward(self, w):
            return 2 * w

    lin, x = torch.nn.Linear(4, 3), torch.randn(2, 4)
    parametrize.register_parametrization(lin, "weight", Double())
    before = lin(x)
    with quantize_linear_layers(lin, weights="e4m3"):
        out = lin(x)
    assert torch.equal(out, exact_gemm(x, q(lin.weight, "e4m3").t(), lin.bias))  # q(2 W)
    assert parametrize.is_parametrized(lin, "weight")
    assert torch.equal(lin(x), before)


def test_training_updates_the_full_precision_weights():
    m, x = model(), torch.randn(5, 8)
    w = m[0].weight
    with quantize_linear_layers(m, weights="e4m3", grad="e5m2"):
        m(x).square().sum().backward()
    assert w.grad is not None and w.grad.shape == w.shape and w.grad.abs().sum() > 0
    assert m[0].weight is w


def test_one_sgd_step_is_the_hand_computed_update():
    """loss = sum(y^2), y = fp32(x q(W)^T + b): the output gradient 2y is rounded to E5M2 as an
    operand of the weight-gradient GEMM, whose sum q(2y)^T x is FP32 (not rounded again), and
    one SGD step moves the full-precision W by -lr times that, computed here exactly in
    float64 (dyadic values: every sum is exact)."""
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
    y = (x.astype(np.float64) @ qw.T + b0).astype(np.float32)
    dy = fpsim.quantize(2 * y.astype(np.float64), "e5m2")
    grad = (dy.T @ x.astype(np.float64)).astype(np.float32)
    assert np.array_equal(lin.weight.grad.numpy(), grad)
    assert not np.array_equal(grad, fpsim.quantize(grad, "e5m2"))  # no second rounding
    assert np.array_equal(lin.bias.grad.numpy(), (2 * y).sum(0))   # dy unrounded, summed
    want = (w0.astype(np.float64) - 0.5 * grad.astype(np.float64)).astype(np.float32)
    assert np.array_equal(lin.weight.detach().numpy(), want)       # full precision, updated
    assert not np.array_equal(want, fpsim.quantize(want, "e4m3"))  # not the rounded copy


def test_include_selects_layers():
    m, x = model(), torch.randn(5, 8)
    with quantize_linear_layers(m, weights="e2m1", include=lambda n, _: n == "4") as h:
        assert h.names == ["4"]
        out = m(x)
    lin1, gelu, conv, norm, lin2 = m
    h = norm(conv(gelu(lin1(x))))                      # the others: torch's own, untouched
    assert torch.equal(out, exact_gemm(h, q(lin2.weight, "e2m1").t(), lin2.bias))


def test_a_layer_that_only_holds_its_weight_is_still_quantized():
    """A Conv1D whose weight its parent multiplies (GPT-2's attention style): the product is
    the layer's, found through its parameter, with both operands rounded."""
    class Holder(torch.nn.Module):                     # weights only, used by someone else
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(3, 3))

    Holder.__name__ = "Conv1D"

    class Parent(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c_attn = Holder()

        def forward(self, x):
            return x @ self.c_attn.weight

    p, x = Parent(), torch.randn(4, 3)
    assert is_matmul_layer(p.c_attn)
    with quantize_linear_layers(p, weights="bf16", activations="e4m3") as h:
        out = p(x)
    assert h.emulation.matched == {"c_attn:matmul": (1, "c_attn", "matmul")}
    assert torch.equal(out, exact_gemm(q(x, "e4m3"), q(p.c_attn.weight, "bf16")))


def test_a_layer_used_twice_is_emulated_under_either_name():
    lin = torch.nn.Linear(4, 4)
    m, x = torch.nn.Sequential(lin, torch.nn.ReLU(), lin), torch.randn(3, 4)
    with quantize_linear_layers(m, weights="e2m1") as h:
        assert h.names == ["0", "2"]
        out = m(x)
    w = q(lin.weight, "e2m1").t()
    assert torch.equal(out, exact_gemm(exact_gemm(x, w, lin.bias).relu(), w, lin.bias))


def test_the_handle_does_not_nest_with_another_context():
    m = model()
    with quantize_linear_layers(m, weights="e4m3"), fpsim.emulate(fpsim.Recipe()):
        with pytest.raises(RuntimeError, match="already active"):
            m(torch.randn(5, 8))


@pytest.mark.parametrize("kwargs, match", [
    ({}, "nothing to quantize"),
    ({"weights": "fp7"}, "unknown format"),
    ({"weights": "e4m3", "include": lambda n, m: False}, "no nn.Linear"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        quantize_linear_layers(model(), **kwargs)


@pytest.mark.parametrize("fmts", [(None, "e4m3"), ("e5m2", None), ("e5m2", "e4m3")])
def test_gradient_formats_per_tensor_class_name_the_alternative(fmts):
    with pytest.raises(ValueError, match=r"one format serves both.*Backward"):
        fpsim.nn.GradFormats(*fmts)
