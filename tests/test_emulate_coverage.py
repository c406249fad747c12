"""What fpsim.emulate catches beyond linear layers: convolutions against fpsim.matmul on an
explicit im2col (bit for bit), every matmul spelling, norm statistics, ops named as not
emulated (strict raises), Rules that can never match, and backward through an emulated site."""

from __future__ import annotations

import math
import warnings

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import fpsim  # noqa: E402
from fpsim import Recipe, Rule, Rules  # noqa: E402
from fpsim.emulation import conv as convmod  # noqa: E402

FP64 = Recipe(accum="fp64")
FP16_SUMS = Recipe("e4m3", accum="fp16", order="sequential")
G = torch.Generator().manual_seed(7)

# (dims, C_in, C_out, kernel, stride, padding, dilation, groups, transposed, output_padding)
CONVS = [
    (1, 4, 6, 3, 1, 0, 1, 1, False, 0),
    (1, 4, 4, 4, 2, 3, 1, 4, False, 0),          # depthwise, stride, padding
    (1, 4, 6, 3, 1, 2, 2, 2, False, 0),          # dilation, groups
    (2, 3, 4, 3, 2, 1, 1, 1, False, 0),
    (2, 4, 6, 3, 1, 2, 2, 2, False, 0),
    (2, 4, 4, 3, 1, 1, 1, 4, False, 0),          # depthwise 2d
    (3, 2, 4, 2, 1, 1, 1, 1, False, 0),
    (1, 4, 6, 3, 2, 1, 1, 2, True, 1),           # transposed, groups, output padding
    (2, 3, 4, 3, 2, 1, 1, 1, True, 0),
    (2, 2, 4, 3, 1, 0, 2, 1, True, 0),           # transposed, dilation
]

#: channels per group that MX (32) and NVFP4 (16) blocks divide: the activation is quantized
#: along each pixel's channels once, not patch by patch
WIDE = [
    (2, 64, 8, 3, 2, 1, 2, 2, False, 0),         # 32 channels per group, stride, dilation
    (1, 32, 6, 3, 1, 1, 1, 1, False, 0),
    (2, 16, 4, 3, 1, 1, 1, 1, False, 0),          # NVFP4's 16 only
    (1, 32, 4, 3, 2, 1, 1, 1, True, 1),           # transposed
]


def _conv_args(dims, cin, cout, k, stride, pad, dil, groups, transposed, outpad):
    x = torch.randn(2, cin, *[7] * dims, generator=G)
    wshape = (cin, cout // groups) if transposed else (cout, cin // groups)
    w = torch.randn(*wshape, *[k] * dims, generator=G) / 4
    b = torch.randn(cout, generator=G)
    geo = ([stride] * dims, [pad] * dims, [dil] * dims, transposed, [outpad] * dims, groups)
    return x, w, b, geo


@pytest.mark.parametrize("case", CONVS + WIDE, ids=str)
@pytest.mark.parametrize("recipe", [FP16_SUMS, Recipe("e4m3", scaling="channel"),
                                    Recipe("mxfp8_e4m3", scaling="block"),
                                    Recipe("nvfp4", scaling="block"), FP64], ids=str)
def test_conv_is_fpsim_matmul_on_explicit_im2col(case, recipe, monkeypatch):
    """The conv site equals fpsim.emulation.sites.matmul on the whole im2col of the same
    operands (the sums of fpsim.matmul), plus the bias, in the output format; pieces of a few
    patches change nothing (NVFP4's tensor scale is the activation tensor's, which a strided,
    dilated convolution need not read whole), nor does building them with torch's strided
    copies instead of the compiled gather."""
    from fpsim.emulation.sites import _operands, _product, quantize_operand, round_output, unflush

    x, w, b, geo = _conv_args(*case)
    ref_native = torch.ops.aten.convolution(x.double(), w.double(), b.double(), *geo)
    xp, wd, stride = convmod.direct(x, w, *geo[:5], geo[5])
    cols = convmod.im2col(xp, wd.shape[2:], stride, geo[2], geo[5])
    qa, qb = _operands(recipe, cols, convmod.weight_matrix(wd, geo[5]), None)
    if recipe.inputs == "nvfp4":
        ts = fpsim.blockrules.nvfp4_tensor_scale(xp.reshape(1, -1))
        qa = unflush(cols, quantize_operand(cols, "nvfp4", recipe, -1, tensor_scale=ts)[0],
                     recipe)
    want = _product(recipe, qa, qb, None, None)
    n, out = x.shape[0], ref_native.shape[2:]
    want = want.transpose(0, 1).reshape(n, *out, -1).movedim(-1, 1) + b.reshape(-1, *[1] * len(out))
    want = round_output(want, recipe)
    image = math.prod(out) * x.shape[1] * math.prod(wd.shape[2:])
    # pieces of a few patches, of one image; patches gathered by numba's kernel, then by torch
    for piece, jit in ((50, True), (image, True), (50, False)):
        monkeypatch.setattr(convmod, "PIECE", piece)
        if not jit:
            monkeypatch.setattr(fpsim.convert, "jit_kernels", lambda: None)
        with torch.no_grad(), fpsim.emulate(recipe, strict=True) as em:
            got = torch.ops.aten.convolution(x, w, b, *geo)
        assert got.shape == ref_native.shape
        assert torch.equal(got, want)
        assert not em.missed
    if recipe is FP64:                                      # FP64 sums: torch's own, rounded
        assert torch.allclose(got.double(), ref_native, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("cin", [8, 32])                 # patch rows quantized; input once
def test_nvfp4_tensor_scale_is_the_activations_even_where_unread(cin):
    """A stride-2, dilation-2 convolution never reads odd rows: a largest value planted there
    still sets NVFP4's tensor scale (the activation tensor's, as it is quantized before the
    convolution), which the patch matrix alone would not."""
    from fpsim.emulation.sites import _operands, _product, quantize_operand, round_output, unflush

    recipe = Recipe("nvfp4", scaling="block")
    x = torch.randn(1, cin, 9, 9, generator=G)
    x[0, 0, 3, 4] = 1000.0                                   # row 3: never read
    w = torch.randn(4, cin, 3, 3, generator=G)
    with torch.no_grad(), fpsim.emulate(recipe, strict=True):
        got = F.conv2d(x, w, stride=2, dilation=2)
    cols = convmod.im2col(x, [3, 3], [2, 2], [2, 2], 1)
    assert float(cols.abs().max()) < 1000
    _, qb = _operands(recipe, cols, convmod.weight_matrix(w, 1), None)
    want = {}
    for name, ts in (("tensor", fpsim.blockrules.nvfp4_tensor_scale(x.reshape(1, -1))),
                     ("patches", None)):
        qa = unflush(cols, quantize_operand(cols, "nvfp4", recipe, -1, tensor_scale=ts)[0],
                     recipe)
        want[name] = round_output(_product(recipe, qa, qb, None, None), recipe)[0]
    got = got.movedim(1, -1).reshape(-1, 4)
    assert torch.equal(got, want["tensor"]) and not torch.equal(got, want["patches"])


def test_reduction_runs_kernel_offsets_then_channels():
    """K of a convolution's implicit GEMM is (kernel offset, channel), channels fastest, as an
    NHWC implicit GEMM runs it: a conv site equals fpsim's matmul on patch rows built here
    in that order, under recipes where the order shows (sequential FP16 sums; MX blocks of 32
    across kernel offsets: 12 channels x 3 x 3), and differs from the channel-major order."""
    from fpsim.emulation.sites import _operands, _product, round_output

    x = torch.randn(2, 12, 6, 6, generator=G) * 3
    w = torch.randn(5, 12, 3, 3, generator=G)
    xp = F.pad(x, [1, 1, 1, 1])
    rows = torch.stack([torch.stack([xp[n, :, i + a, j + b] for a in range(3) for b in range(3)])
                        .reshape(-1) for n in range(2) for i in range(6) for j in range(6)])
    cols = w.permute(2, 3, 1, 0).reshape(-1, 5)                 # [(a, b, c), C_out]
    for recipe in (FP16_SUMS, Recipe("mxfp8_e4m3", scaling="block")):
        qa, qb = _operands(recipe, rows[None], cols[None], None)
        want = round_output(_product(recipe, qa, qb, None, None)[0], recipe)
        want = want.reshape(2, 6, 6, 5).movedim(-1, 1)
        with torch.no_grad(), fpsim.emulate(recipe, strict=True):
            got = F.conv2d(x, w, padding=1)
        assert torch.equal(got, want)
        channel_major = rows.reshape(-1, 9, 12).transpose(1, 2).reshape(-1, 108)
        qa, qb = _operands(recipe, channel_major[None], w.reshape(5, -1).T[None], None)
        other = round_output(_product(recipe, qa, qb, None, None)[0], recipe)
        assert not torch.equal(other.reshape(2, 6, 6, 5).movedim(-1, 1), want)


@pytest.mark.parametrize("case", WIDE, ids=str)
@pytest.mark.parametrize("recipe", [Recipe("mxfp8_e4m3", scaling="block"),
                                    Recipe("nvfp4", scaling="block"),
                                    Recipe("mxfp4", scaling="block", accum="fp16")], ids=str)
def test_channel_blocks_quantize_the_input_once(case, recipe, monkeypatch):
    """Blocks within each pixel's channels: the activation is quantized once along them (the
    patch rows are never quantized) and gives the patch-wise quantization's output, bit for
    bit; the activation's counted elements are the padded input's."""
    x, w, b, geo = _conv_args(*case)
    cin_g = (w.shape[0] if geo[3] else x.shape[1]) // geo[5]
    if not convmod._channel_blocks(recipe, cin_g):
        pytest.skip("blocks straddle kernel offsets here")
    with torch.no_grad(), fpsim.emulate(recipe, strict=True, capture=True) as em:
        fast = torch.ops.aten.convolution(x, w, b, *geo)
    xp, wd, _ = convmod.direct(x, w, *geo[:5], geo[5])
    assert em.sites[":conv"].elements == xp.numel() + wd.numel()
    monkeypatch.setattr(convmod, "_channel_blocks", lambda *a: False)
    calls = []
    real = convmod.quantize_operand
    monkeypatch.setattr(convmod, "quantize_operand",
                        lambda t, *a, **k: calls.append(t.shape) or real(t, *a, **k))
    with torch.no_grad(), fpsim.emulate(recipe, strict=True):
        slow = torch.ops.aten.convolution(x, w, b, *geo)
    assert torch.equal(fast, slow)
    assert len(calls) >= 1 and all(len(c) == 3 for c in calls)   # patch rows [g, M, K]


@pytest.mark.parametrize("case", CONVS, ids=str)
def test_conv_host_sums_are_torch_conv_on_the_quantized_operands(case):
    """Host FP32 sums of an activation quantized whole: torch's convolution on the quantized
    operands, within FP32 rounding of the deterministic sums, and not the unquantized conv."""
    x, w, b, geo = _conv_args(*case)
    got = {}
    for sums in ("fp64", "host"):
        with torch.no_grad(), fpsim.emulate(Recipe("e4m3", scaling="tensor", native_sums=sums),
                                            strict=True):
            got[sums] = torch.ops.aten.convolution(x, w, b, *geo)
    assert torch.allclose(got["host"], got["fp64"], rtol=1e-5, atol=1e-5)
    assert not torch.equal(got["host"], torch.ops.aten.convolution(x, w, b, *geo))


# torch warns that padding='same' with an even kernel copies the input: what the test wants
@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths")
def test_conv_tensor_scaling_and_padding_modes():
    torch.manual_seed(0)
    convs = [nn.Conv2d(3, 4, 3, padding=1, padding_mode=m) for m in
             ("zeros", "reflect", "replicate", "circular")] + [nn.Conv1d(3, 4, 4, padding="same")]
    x2, x1 = torch.randn(2, 3, 6, 6, generator=G), torch.randn(2, 3, 9, generator=G)
    for c in convs:
        x = x1 if isinstance(c, nn.Conv1d) else x2
        c.double()
        with torch.no_grad(), fpsim.emulate(FP64, strict=True, capture=True) as em:
            y = c(x.double())
        ref = c(x.double())
        c.float()
        assert torch.equal(y.float(), ref.float()), c
        assert list(em.sites) == [":conv"]
        with torch.no_grad(), fpsim.emulate(Recipe("e4m3", scaling="tensor")):
            low = c(x)
        assert not torch.equal(low, ref.float())


def test_matmul_spellings_are_sites():
    a, m = torch.randn(5, generator=G), torch.randn(4, 5, generator=G)
    w = torch.randn(2, 3, 5, generator=G)
    cases = {
        "dot": lambda: torch.dot(a, a), "vdot": lambda: torch.vdot(a, a),
        "mv": lambda: torch.mv(m, a), "addmv": lambda: torch.addmv(torch.ones(4), m, a, beta=2),
        "inner": lambda: torch.inner(m, m), "vecdot": lambda: torch.linalg.vecdot(m, m),
        "tensordot": lambda: torch.tensordot(m, m, dims=([1], [1])),
        "multi_dot": lambda: torch.linalg.multi_dot([m, m.T, m]),
        "einsum3": lambda: torch.einsum("ij,jk,kl->il", m, m.T, m),
        "bilinear": lambda: F.bilinear(m[:, :3], m, w),
        "addbmm": lambda: torch.addbmm(torch.ones(4, 4), m[None].repeat(2, 1, 1),
                                       m.T[None].repeat(2, 1, 1), alpha=0.5),
        "linalg.matmul": lambda: torch.linalg.matmul(m, m.T),
    }
    for name, f in cases.items():
        ref = f()
        with torch.no_grad(), fpsim.emulate(FP64, strict=True, capture=True) as em:
            got = f()
        assert em.sites, name
        assert torch.allclose(got, ref, rtol=1e-5, atol=1e-5), name
        with torch.no_grad(), fpsim.emulate(Recipe("e2m1"), capture=True) as em:
            low = f()
        assert not torch.equal(low, ref), name
    with fpsim.emulate(FP64, capture=True) as em:
        torch.linalg.multi_dot([m, m.T, m, m.T])
    assert len(em.sites) == 3                             # one site per pairwise product


def test_norm_statistics_are_sites():
    x = torch.randn(4, 6, 5, generator=G)
    inorm = nn.InstanceNorm1d(6, affine=True, track_running_stats=True)
    for mod in (nn.BatchNorm1d(6), nn.GroupNorm(3, 6), inorm):
        mod.double()
        ref_state = {k: v.clone() for k, v in mod.state_dict().items()}
        ref = mod(x.double())
        ref_after = {k: v.clone() for k, v in mod.state_dict().items()}
        mod.load_state_dict(ref_state)
        with torch.no_grad(), fpsim.emulate(Rules([Rule(FP16_SUMS, kind="norm")]),
                                            strict=True, capture=True) as em:
            low = mod(x.double())
        assert [s.kind for s in em.sites.values()] == ["norm"], mod
        assert not torch.equal(low, ref)
        mod.load_state_dict(ref_state)
        with torch.no_grad(), fpsim.emulate(Rules([Rule(Recipe("fp64", accum="fp64",
                                                            order="sequential"), kind="norm")]),
                                            strict=True):
            got = mod(x.double())
        assert torch.allclose(got, ref, rtol=1e-12, atol=1e-12), mod
        for k, v in mod.state_dict().items():                # running statistics updated alike
            assert torch.allclose(v.double(), ref_after[k].double(), rtol=1e-12, atol=1e-12), k


class PlantedMM(torch.autograd.Function):
    """A custom op whose product runs through a path fpsim does not emulate (torch.cdist: an
    aten kernel with its own matrix product inside)."""

    @staticmethod
    def forward(ctx, a, b):
        return torch.cdist(a, b)

    @staticmethod
    def backward(ctx, g):
        return None, None


def test_planted_op_is_named_and_fails_strict():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(4, 4)

        def forward(self, x):
            return PlantedMM.apply(self.inner(x), x)

    net, x = Net(), torch.randn(3, 4, generator=G)
    with torch.no_grad(), pytest.warns(UserWarning, match="not emulated: :cdist_forward"):
        with fpsim.emulate(FP64) as em:
            net(x)
            net(x)
    assert em.missed[":cdist_forward"].calls == 2
    rows = {r["site"]: r for r in em.table()}
    assert rows[":cdist_forward"]["recipe"] == "not emulated"
    assert "not emulated" in em.report()
    with torch.no_grad(), pytest.raises(RuntimeError, match=r"aten::_cdist_forward in module "):
        with fpsim.emulate(FP64, strict=True):
            net(x)


def test_rules_that_never_match_warn_and_the_report_names_the_rule():
    lin = Recipe("e4m3", scaling="tensor")
    with pytest.warns(UserWarning, match=r"rule 1 \(path='lm_head', kind='linear'\) can never"):
        Rules([Rule(lin, kind="linear"), Rule(FP64, path="lm_head", kind="linear")])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Rules([Rule(FP64, path="lm_head"), Rule(lin, kind="linear")])
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    rules = Rules([Rule(lin, kind="linear"), Rule(FP64, path="1")])
    with torch.no_grad(), pytest.warns(UserWarning, match=r"rule 1 .* matched no site: 1:linear "
                                                          r"went to rule 0"):
        with fpsim.emulate(rules, capture=True) as em:
            net(torch.randn(3, 4, generator=G))
    assert [r["rule"] for r in em.table()] == ["rule 0", "rule 0"]


def test_backward_through_an_emulated_site_says_what_to_do():
    """Linear layers and convolutions have an emulated backward (fpsim.emulation.backward,
    conv.trainable); a norm statistic and an aten-level convolution do not, and their backward
    says what to do instead of differentiating torch's op on operands the recipe never used."""
    lin = nn.Linear(4, 3)
    x = torch.randn(2, 4, generator=G)
    with fpsim.emulate(Recipe("e4m3")):
        lin(x).sum().backward()
    assert lin.weight.grad is not None
    lin.weight.grad = None
    w = torch.randn(2, 2, 3, generator=G, requires_grad=True)
    with fpsim.emulate(Recipe("e4m3")):
        y = torch.ops.aten.convolution(torch.randn(1, 2, 5, generator=G), w, None, [1], [0],
                                       [1], False, [0], 1).sum()
    with pytest.raises(RuntimeError, match=r"without an emulated backward.*F\.conv\*"):
        y.backward()
    ln = nn.LayerNorm(4)
    with fpsim.emulate(Rules([Rule(Recipe("e4m3"), kind="norm")])):
        y = ln(x).sum()
    with pytest.raises(RuntimeError, match=r"'<root>'.*a norm statistic.*torch.no_grad\(\)"):
        y.backward()
    with fpsim.emulate(Rules(default=None)):                # nothing emulated: torch's gradient
        lin(x).sum().backward()
    assert lin.weight.grad is not None


def test_a_norm_left_to_torch_is_not_named_missed_under_grad_and_capture():
    """Rules that leave norms to torch, with capture and autograd on: torch's own layer norm
    (recomputed with its gradient) is not a 'not emulated' row, and its gradient flows."""
    ln, lin = nn.LayerNorm(4), nn.Linear(4, 3)
    x = torch.randn(2, 4, generator=G, requires_grad=True)
    rules = Rules([Rule(None, kind="norm")], default=Recipe("e4m3"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with fpsim.emulate(rules, capture=True) as em:
            lin(ln(x)).sum().backward()
    assert em.missed == {} and x.grad is not None and ln.weight.grad is not None


def test_handlers_are_registered_where_they_are_written():
    """Every torch function and aten op fpsim emulates is registered by a decorator on its
    handler, and every aten op so registered is in ops.ATEN (its kind and site name)."""
    from fpsim.emulation.aten import AtenMode
    from fpsim.emulation.intercept import Interceptor
    from fpsim.emulation.ops import ATEN

    assert set(AtenMode.handlers) <= set(ATEN) and "aten::mm" in AtenMode.handlers
    assert Interceptor.handlers[F.linear][0] is Interceptor.linear
    assert Interceptor.handlers[F.layer_norm] == (Interceptor.layer_norm, True)
