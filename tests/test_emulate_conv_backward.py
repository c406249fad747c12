"""Convolutions train under fpsim.emulate: the input- and weight-gradient GEMMs of every conv
configuration against a slow reference written here (explicit quantization, float64 sums over
explicit patch positions, rounded once), torch's float64 gradients under an FP64 recipe, the
capture rows, and a few training steps of a conv net that lower the loss and repeat bit for
bit."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import fpsim  # noqa: E402
from fpsim import Recipe, Rule, Rules  # noqa: E402
from fpsim.emulation import conv as convmod  # noqa: E402
from fpsim.emulation.casts import Backward, Cast  # noqa: E402
from fpsim.emulation.sites import quantize_operand  # noqa: E402
from test_emulate_coverage import CONVS, _conv_args  # noqa: E402

FP64 = Recipe(accum="fp64")
E4M3_E5M2 = Recipe("e4m3", scaling="tensor", backward=Backward(grad=Cast("e5m2")))


def _grads(recipe, x, w, b, geo, dy):
    """(dx, dw, db) of aten.convolution's arguments under ``recipe``, through F.conv*."""
    x, w, b = (t.detach().clone().requires_grad_(True) for t in (x, w, b))
    stride, pad, dil, transposed, outpad, groups = geo
    f = {(1, False): torch.nn.functional.conv1d, (2, False): torch.nn.functional.conv2d,
         (3, False): torch.nn.functional.conv3d, (1, True): torch.nn.functional.conv_transpose1d,
         (2, True): torch.nn.functional.conv_transpose2d,
         (3, True): torch.nn.functional.conv_transpose3d}[(x.dim() - 2, transposed)]
    with fpsim.emulate(recipe, strict=True, capture=True) as em:
        if transposed:
            y = f(x, w, b, stride, pad, outpad, groups, dil)
        else:
            y = f(x, w, b, stride, pad, dil, groups)
    y.backward(dy)
    assert {":conv", ":conv/dgrad", ":conv/wgrad"} <= set(em.sites)
    return x.grad, w.grad, b.grad


@pytest.mark.parametrize("case", CONVS, ids=str)
def test_fp64_recipe_gradients_are_torch_float64(case):
    """FP64 sums of unquantized operands: torch's float64 gradients, rounded to FP32."""
    x, w, b, geo = _conv_args(*case)
    ref_y = torch.ops.aten.convolution(x.double(), w.double(), b.double(), *geo)
    dy = torch.randn(ref_y.shape, generator=torch.Generator().manual_seed(1))
    xd, wd, bd = (t.double().requires_grad_(True) for t in (x, w, b))
    torch.ops.aten.convolution(xd, wd, bd, *geo).backward(dy.double())
    for got, ref in zip(_grads(FP64, x, w, b, geo, dy), (xd.grad, wd.grad, bd.grad)):
        assert torch.allclose(got.double(), ref, rtol=1e-6, atol=1e-6)


def _reference(x, w, dy, stride, pad, dil, groups):
    """dx and dw of a direct convolution under E4M3_E5M2, slowly: x and w rounded to E4M3 with
    one scale each (x's taken on the padded input), dy to E5M2 unscaled, then for each kernel
    offset the products of every (image, output position, channel pair) added into float64
    sums, rounded once to float32."""
    d = x.dim() - 2
    xp = torch.nn.functional.pad(x, [p for i in reversed(range(d)) for p in (pad[i], pad[i])])
    qx = quantize_operand(xp, "e4m3", E4M3_E5M2, -1)[0].double()
    qw = quantize_operand(w, "e4m3", E4M3_E5M2, -1)[0].double()
    qdy = fpsim.quantize(dy, "e5m2").double()
    cout, out = dy.shape[1], dy.shape[2:]
    cin_g, cout_g = w.shape[1], cout // groups
    dxp, dw = torch.zeros(qx.shape, dtype=torch.float64), torch.zeros(qw.shape, dtype=torch.float64)
    for g in range(groups):
        ci, co = slice(g * cin_g, (g + 1) * cin_g), slice(g * cout_g, (g + 1) * cout_g)
        for k in itertools.product(*(range(s) for s in w.shape[2:])):
            # input positions o * stride + k * dilation of every output position o
            pos = tuple(slice(k[i] * dil[i], k[i] * dil[i] + (out[i] - 1) * stride[i] + 1,
                              stride[i]) for i in range(d))
            window = qx[(slice(None), ci, *pos)]                   # [n, cin_g, *out]
            wk = qw[(co, slice(None), *k)]                        # [cout_g, cin_g]
            g_dy = qdy[:, co]                                     # [n, cout_g, *out]
            dxp[(slice(None), ci, *pos)] += torch.einsum("no...,oi->ni...", g_dy, wk)
            dw[(co, slice(None), *k)] += torch.einsum("no...,ni...->oi", g_dy, window)
    crop = (slice(None), slice(None), *(slice(pad[i], qx.shape[2 + i] - pad[i])
                                        for i in range(d)))
    return dxp[crop].float(), dw.float()


@pytest.mark.parametrize("case", [c for c in CONVS if not c[8]], ids=str)
def test_gradients_are_the_slow_reference_bit_for_bit(case):
    """E4M3 per-tensor forward, E5M2 gradients, FP32 sums: the input and weight gradients
    equal the slow reference's codes; the bias gradient is dy summed in FP64."""
    x, w, b, geo = _conv_args(*case)
    stride, pad, dil, _, _, groups = geo
    y = torch.ops.aten.convolution(x, w, b, *geo)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(2)) * 4
    dx, dw, db = _grads(E4M3_E5M2, x, w, b, geo, dy)
    want_dx, want_dw = _reference(x, w, dy, stride, pad, dil, groups)
    assert torch.equal(dx, want_dx)
    assert torch.equal(dw, want_dw)
    assert torch.equal(db, dy.double().sum([0, *range(2, dy.dim())]).float())


@pytest.mark.parametrize("recipe", [
    Recipe("mxfp8_e4m3", scaling="block", name="mx",
           backward=Backward(grad=Cast("mxfp8_e5m2", scaling="block"))),
    Recipe("e4m3", accum="fp16", order="sequential", name="fp16 sums",
           backward=Backward(grad=Cast("e5m2"))),
], ids=lambda r: r.name)
@pytest.mark.parametrize("case", [CONVS[2], CONVS[4], CONVS[7]], ids=str)
def test_block_and_emulated_accumulator_gradients(recipe, case):
    """Gradients cast along each backward GEMM's own reduction (MX blocks) or summed in an
    emulated FP16 accumulator: close to FP64's, not equal to them, the same when rerun."""
    x, w, b, geo = _conv_args(*case)
    dy = torch.randn(torch.ops.aten.convolution(x, w, b, *geo).shape,
                     generator=torch.Generator().manual_seed(3))
    exact = _grads(FP64, x, w, b, geo, dy)
    got = _grads(recipe, x, w, b, geo, dy)
    again = _grads(recipe, x, w, b, geo, dy)
    for g, e, a in zip(got, exact, again):
        assert torch.equal(g, a)
        rel = float((g - e).norm() / e.norm())
        assert 0 < rel < 0.2 or torch.equal(g, e) and g is got[2]


def test_capture_rows_of_the_backward_gemms():
    conv = nn.Conv2d(3, 4, 3, padding=1)
    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(4), requires_grad=True)
    with fpsim.emulate(E4M3_E5M2, capture=True) as em:
        conv(x).square().sum().backward()
    rows = {n: em.sites[n] for n in (":conv", ":conv/dgrad", ":conv/wgrad")}
    assert [r.kind for r in rows.values()] == ["conv", "dgrad", "wgrad"]
    assert all(r.calls == 1 and 5 < r.snr_db < 60 for r in rows.values())


def test_a_conv_net_trains_and_repeats_bit_for_bit():
    """A few SGD steps of a small conv net with every conv and linear site under E4M3 / E5M2
    lower the loss and give the same weights when rerun from the same seed."""
    def run() -> tuple[list[float], list[torch.Tensor]]:
        torch.manual_seed(0)
        net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                            nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2), nn.ReLU(),
                            nn.Flatten(), nn.Linear(8 * 4 * 4, 5))
        x, t = torch.randn(16, 3, 8, 8), torch.randint(0, 5, (16,))
        opt = torch.optim.SGD(net.parameters(), lr=0.3)
        losses = []
        rules = Rules([Rule(E4M3_E5M2, kind="conv"), Rule(E4M3_E5M2, kind="linear")],
                      default=None)
        for _ in range(8):
            opt.zero_grad()
            with fpsim.emulate(rules, strict=True):
                loss = nn.functional.cross_entropy(net(x), t)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        return losses, [p.detach().clone() for p in net.parameters()]

    losses, params = run()
    assert losses[-1] < 0.8 * losses[0]
    again, params2 = run()
    assert again == losses and all(torch.equal(p, q) for p, q in zip(params, params2))


def test_a_conv_site_refuses_training_casts():
    conv = nn.Conv1d(2, 2, 3)
    recipe = Recipe(Cast("e4m3", "tensorwise", saturate=True), name="te")
    with pytest.raises(ValueError, match="convolution site takes formats"):
        with torch.no_grad(), fpsim.emulate(recipe):
            conv(torch.randn(1, 2, 5))


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths")
def test_unbatched_input_and_same_padding():
    conv = nn.Conv1d(2, 4, 4, padding="same")
    x = torch.randn(2, 9, requires_grad=True)
    with fpsim.emulate(FP64, strict=True):
        y = conv(x)
    y.sum().backward()
    assert y.shape == (4, 9)
    xd = x.detach().double().requires_grad_(True)
    conv.double()(xd).sum().backward()
    assert torch.allclose(x.grad.double(), xd.grad, rtol=1e-6, atol=1e-6)


def test_dgrad_of_a_wide_activation_in_pieces_equals_one_piece(monkeypatch):
    """The input gradient's patches built in pieces give the whole patch matrix's bits."""
    x, w, b, geo = _conv_args(*CONVS[3])
    dy = torch.randn(torch.ops.aten.convolution(x, w, b, *geo).shape,
                     generator=torch.Generator().manual_seed(5))
    whole = _grads(E4M3_E5M2, x, w, b, geo, dy)
    monkeypatch.setattr(convmod, "PIECE", 40)
    assert all(torch.equal(p, q) for p, q in zip(_grads(E4M3_E5M2, x, w, b, geo, dy), whole))
