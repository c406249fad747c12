"""Training under fpsim.emulate: the three GEMMs of every product site against a slow
reference written here (explicit quantize along each GEMM's reduction axis + a float64 matmul
rounded once), for every preset; the random Hadamard transform; stochastic rounding of
gradients; delayed-scaling state; a few training steps per preset."""

import math

import numpy as np
import pytest
import torch

import fpsim
from fpsim import mx
from fpsim.emulation import Recipe, Rule, Rules
from fpsim.emulation import hadamard, presets
from fpsim.emulation.casts import Backward, Cast
from fpsim.formats import get_format

torch.manual_seed(0)


# ------------------------------------------------------------------------------------------
# The slow reference: one function per scaling, written from the published rules
# ------------------------------------------------------------------------------------------
def ref_cast(x, c, axis):
    """``x`` (float32) quantized by Cast ``c`` reducing along ``axis``: float32 values."""
    x = x.detach().float()
    if c.scaling == "none":
        return fpsim.quantize(x, c.fmt, saturate=c.saturate, rounding=c.rounding)
    if c.scaling in ("tensorwise", "rowwise"):        # torchao.float8, written out
        fmax = get_format(c.fmt).max
        amax = x.abs().amax(dim=axis, keepdim=True) if c.scaling == "rowwise" else x.abs().max()
        s = (fmax / torch.clamp(amax.double(), min=1e-12)).float()
        if c.pow2:
            s = torch.exp2(torch.floor(torch.log2(s)))
        q = fpsim.quantize(torch.clamp(x * s, -fmax, fmax), c.fmt)
        return q / s
    if c.scaling == "block":
        return mx.quantize(x, c.fmt, axis=axis, scale_rounding=c.scale_rounding,
                           rounding=c.rounding).dequantize(torch.float32)
    if c.scaling == "block2d":                        # tile by tile, one global tensor scale
        ts = mx.quantize(x, "nvfp4").tensor_scale
        out = torch.empty_like(x)
        for i in range(0, x.shape[0], 16):
            for j in range(0, x.shape[1], 16):
                t = x[i:i + 16, j:j + 16]
                q = mx.quantize(t.reshape(-1), "nvfp4", block_size=t.numel(), tensor_scale=ts,
                                rounding=c.rounding)
                out[i:i + 16, j:j + 16] = q.dequantize(torch.float32).reshape(t.shape)
        return out
    if c.scaling == "tile":                           # every test axis is <= 128: one tile
        moved = x.movedim(axis, -1)
        st = fpsim.scaled_quantize(moved.double(), c.fmt, granularity="channel", axis=0)
        return st.values.float().movedim(-1, axis)
    if c.scaling == "tile2d":                         # <= 128 x 128: one block
        return fpsim.scaled_quantize(x.double(), c.fmt).values.float()
    raise AssertionError(c.scaling)


def ref_sum(recipe, a, b):
    """The accumulator: float64 matmul rounded once to float32, torch's FP32 matmul (host
    sums: the torchao presets), or fpsim.matmul's model."""
    acc = recipe.accumulator()
    if acc.order == "host":
        return a.float() @ b.float()
    if acc.order == "native":
        return (a.double() @ b.double()).float()
    return fpsim.matmul(a.double(), b.double(), accum=acc).float()


def ref_hadamard(x, axis, n=16, seed=0):
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], n)
    # Sylvester's Hadamard matrix entry by entry: (-1)^popcount(i & j)
    h = np.array([[(-1.0) ** bin(i & j).count("1") for j in range(n)] for i in range(n)])
    t = torch.from_numpy(h * signs / math.sqrt(n))
    moved = x.double().movedim(axis, -1)
    out = (moved.reshape(*moved.shape[:-1], -1, n) @ t.T).reshape(moved.shape)
    return out.movedim(-1, axis).float()


def reference(recipe, x, W, bias, G):
    """(y, dx, dW, dbias) of ``y = x @ W^T + bias`` with ``dy = G`` under ``recipe``."""
    bw = recipe.backward
    cx, cw, cg = recipe.inputs, recipe.weight_format, bw.grad
    b = W.detach().t()                                # [K, N]
    qx, qb = ref_cast(x, cx, -1), ref_cast(b, cw, -2)
    if recipe.accumulator().order == "native":                  # the bias joins the FP64 sum
        y = torch.addmm(bias.detach().double(), qx.double(), qb.double()).float()
    else:
        y = ref_sum(recipe, qx, qb) + bias.detach()
    dx = ref_sum(recipe, ref_cast(G, cg, -1), ref_cast(b.t(), cw, -2))
    xt, g2 = x.detach().t(), G
    if bw.hadamard:
        xt, g2 = ref_hadamard(xt, -1, bw.hadamard), ref_hadamard(G, -2, bw.hadamard)
    db = ref_sum(recipe, ref_cast(xt, cx, -1), ref_cast(g2, cg, -2))
    dbias = None if bias is None else G.sum(0) if recipe.accumulator().order == "host" \
        else G.double().sum(0).float()
    return y, dx, db.t(), dbias


def deterministic(recipe):
    """``recipe`` with stochastic gradient rounding made RNE (stochastic: tested apart)."""
    bw = recipe.backward
    if bw.grad.rounding == "rne":
        return recipe
    g = Cast(bw.grad.fmt, bw.grad.scaling)
    return Recipe(name=recipe.name, inputs=recipe.inputs, weights=recipe.weights,
                  backward=Backward(grad=g, hadamard=bw.hadamard),
                  accum=recipe.accumulator())


BIT_EXACT = [p for p in presets.PRESETS if p not in ("te-delayed", "native")]


def bits(t):
    return t.detach().float().contiguous().view(torch.int32)


@pytest.mark.parametrize("name", BIT_EXACT)
def test_linear_three_gemms_match_the_reference(name):
    recipe = deterministic(presets.PRESETS[name].recipe)
    g = torch.Generator().manual_seed(1)
    lin = torch.nn.Linear(64, 48)
    with torch.no_grad():             # magnitudes spread over binades: block scales differ
        lin.weight.copy_(torch.randn(48, 64, generator=g)
                         * torch.exp(2 * torch.randn(48, 64, generator=g)) / 8)
    x = (torch.randn(2, 16, 64, generator=g)                    # the tokens: 2 x 16
         * torch.exp(2 * torch.randn(2, 16, 64, generator=g))).requires_grad_()
    G = torch.randn(2, 16, 48, generator=g) * 1e-3
    with fpsim.emulate(Rules([Rule(recipe)], default=None)):
        y = lin(x)
        (y * G).sum().backward()
    ry, rdx, rdW, rdb = reference(recipe, x.reshape(32, 64), lin.weight, lin.bias,
                                  G.reshape(32, 48))
    assert torch.equal(bits(y.reshape(32, 48)), bits(ry))
    assert torch.equal(bits(x.grad.reshape(32, 64)), bits(rdx))
    assert torch.equal(bits(lin.weight.grad), bits(rdW))
    assert torch.equal(bits(lin.bias.grad), bits(rdb))


@pytest.mark.parametrize("name", BIT_EXACT)
def test_matmul_site_gradients_of_both_operands_match(name):
    """A product of two activations (Q.K^T-like, a batch of one, so that per-tensor scales
    are the slice's): both operands get gradients."""
    recipe = deterministic(presets.PRESETS[name].recipe)
    g = torch.Generator().manual_seed(2)
    a = torch.randn(1, 32, 48, generator=g).requires_grad_()
    b = torch.randn(1, 48, 32, generator=g).requires_grad_()
    G = torch.randn(1, 32, 32, generator=g)
    with fpsim.emulate(Rules([Rule(recipe)], default=None)):
        (torch.matmul(a, b) * G).sum().backward()
    bw = recipe.backward
    for i in range(1):
        da = ref_sum(recipe, ref_cast(G[i], bw.grad, -1),
                     ref_cast(b[i].detach().t(), recipe.weight_format, -2))
        at, gi = a[i].detach().t(), G[i]
        if bw.hadamard:
            at, gi = ref_hadamard(at, -1), ref_hadamard(gi, -2)
        db = ref_sum(recipe, ref_cast(at, recipe.inputs, -1), ref_cast(gi, bw.grad, -2))
        assert torch.equal(bits(a.grad[i]), bits(da))
        assert torch.equal(bits(b.grad[i]), bits(db))


def test_delayed_scaling_state_survives_steps_and_is_inspectable():
    """TE delayed scaling: call t uses fmax / max(amax of calls < t), 1 before any history."""
    recipe = presets.PRESETS["te-delayed"].recipe
    lin = torch.nn.Linear(16, 8, bias=False)
    xs = [torch.randn(4, 16) * s for s in (1.0, 3.0, 0.5)]
    em = fpsim.emulate(Rules([Rule(recipe, kind="linear")], default=None))
    amaxes = []
    with em:
        for x in xs:
            lin(x).sum().backward()
            amaxes.append(float(x.abs().max()))
    state = em.amax_history(":linear")
    assert state["x"]["history"] == pytest.approx(amaxes, rel=0, abs=0)
    expected = float(torch.tensor(448.0) / torch.tensor(max(amaxes)))
    assert state["x"]["scale"] == expected
    assert set(state) == {"x", "w", "dy"}
    # the third call used the scale from the first two amaxes: check its forward values
    s = float(torch.tensor(448.0) / torch.tensor(max(amaxes[:2])))
    q = fpsim.quantize(xs[2] * torch.tensor(s), "e4m3", saturate=True) / torch.tensor(s)
    with em:
        em.histories.clear()
        for x in xs[:2]:
            lin(x)
        y = lin(xs[2])
    wq = fpsim.quantize(lin.weight.detach().t() * torch.tensor(
        float(torch.tensor(448.0) / lin.weight.detach().abs().max())), "e4m3", saturate=True)
    wq = wq / torch.tensor(float(torch.tensor(448.0) / lin.weight.detach().abs().max()))
    assert torch.equal(y, (q.double() @ wq.double()).float())
    with pytest.raises(KeyError, match="no delayed-scaling state"):
        em.amax_history("nowhere:linear")


def test_delayed_scale_of_a_tiny_amax_is_the_largest_fp32_as_in_transformer_engine():
    from fpsim.emulation.quantizers import AmaxHistory

    h = AmaxHistory(448.0, 4, 0)
    assert h.use(1e-40) == 1.0                      # the first call: scale 1, as TE's
    assert h.scale == float(torch.finfo(torch.float32).max)


def test_hadamard_is_orthogonal_and_keeps_the_wgrad_product_exactly():
    t = hadamard.matrix(16, seed=3)
    assert torch.equal(t @ t.T, torch.eye(16, dtype=torch.float64))
    assert torch.equal(t.T @ t, torch.eye(16, dtype=torch.float64))
    g = torch.Generator().manual_seed(4)
    # small integers: every product and sum is exact in float64
    x = torch.randint(-8, 8, (24, 32), generator=g).double()
    dy = torch.randint(-8, 8, (32, 12), generator=g).double()
    tx = hadamard.transform(x, -1, 16, seed=3)
    td = hadamard.transform(dy, -2, 16, seed=3)
    assert torch.equal(tx @ td, x @ dy)
    # a length that is not a multiple of 16 is zero-padded, and the product still holds
    assert torch.equal(hadamard.transform(x[:, :20], -1, 16) @ hadamard.transform(
        dy[:20], -2, 16), x[:, :20] @ dy[:20])


def test_stochastic_rounding_of_gradients_is_unbiased():
    """NVFP4's gradient cast (1 x 16 blocks, SR): over many independent draws (rows repeated:
    blocks are per row) the mean of each element approaches its exact value; RNE's error is
    systematic.  The backward pass uses it: two seeds give two different dgrads."""
    grad = presets.PRESETS["nvfp4"].recipe.backward.grad
    g = torch.Generator().manual_seed(5)
    # every 16-element block holds +-1 (its amax): the block scales are then exact (448
    # under the tensor scale), nothing saturates, and SR alone rounds
    G = torch.rand(8, 16, generator=g) * 2 - 1
    G[:, 3] = torch.where(torch.rand(8, generator=g) < 0.5, -1.0, 1.0)
    reps = 4000
    torch.manual_seed(6)
    from fpsim.emulation.quantizers import cast
    q = cast(G.repeat(reps, 1), grad, -1)[0].double().reshape(reps, 8, 16)
    se = q.std(0) / math.sqrt(reps)
    err = (q.mean(0) - G.double()).abs()
    # 1e-4: an element within 1e-4 of a grid point may not move in 4000 draws (no spread);
    # the grid's spacing here is 1/12 or more, RNE's errors up to half that
    assert bool((err <= 5 * se + 1e-4).all())
    z = err[se > 0] / se[se > 0]
    assert float((z ** 2).mean()) < 1.5
    rne = cast(G, Cast(grad.fmt, grad.scaling), -1)[0].double()
    assert float(((rne - G.double()).abs() > 5 * se).float().mean()) > 0.3
    W = torch.randn(16, 32, generator=g)
    recipe = presets.PRESETS["nvfp4"].recipe
    grads, x = [], torch.randn(8, 32, generator=g).requires_grad_()
    for seed in (1, 1, 2):
        torch.manual_seed(seed)
        x.grad = None
        with fpsim.emulate(Rules([Rule(recipe)], default=None)):
            (torch.nn.functional.linear(x, W) * G).sum().backward()
        grads.append(x.grad.clone())
    assert torch.equal(grads[0], grads[1]) and not torch.equal(grads[0], grads[2])


def tiny_mlp():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                               torch.nn.Linear(64, 64), torch.nn.GELU(),
                               torch.nn.Linear(64, 8))


def train(name, steps=6):
    model = tiny_mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(8)
    x = torch.randn(64, 32, generator=g)
    target = torch.randn(64, 8, generator=g)
    torch.manual_seed(9)                              # stochastic rounding's bits
    losses = []
    with fpsim.emulate(presets.rules(name, bf16=("4",) if name == "nvfp4" else ())):
        for _ in range(steps):
            loss = torch.nn.functional.mse_loss(model(x), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses, [p.detach().clone() for p in model.parameters()]


@pytest.mark.slow                                     # 7 presets x 2 runs: ~1 min on 2 cores
@pytest.mark.parametrize("name", list(presets.PRESETS))
def test_a_few_steps_decrease_the_loss_and_rerun_bit_identical(name):
    losses, params = train(name)
    assert losses[-1] < losses[0]
    again, params2 = train(name)
    assert again == losses
    assert all(torch.equal(bits(p), bits(q)) for p, q in zip(params, params2))


def test_capture_gives_backward_rows():
    model = tiny_mlp()
    x = torch.randn(16, 32)
    with fpsim.emulate(presets.rules("torchao-float8-tensorwise"), capture=True) as em:
        model(x).square().sum().backward()
    rows = {r["site"]: r for r in em.table()}
    assert {"2:linear/dgrad", "2:linear/wgrad", "0:linear/wgrad"} <= set(rows)
    assert "0:linear/dgrad" not in rows               # the input needs no gradient
    assert rows["2:linear/dgrad"]["kind"] == "dgrad" and rows["2:linear/dgrad"]["snr_db"] > 20


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="training preset"):
        presets.get_preset("torchao-float9")
    assert presets.get_preset(" TorchAO-Float8_Tensorwise ").name == "torchao-float8-tensorwise"
    with pytest.raises(ValueError, match="carries its own scaling"):
        Recipe(name="x", inputs=Cast("e4m3", "tensorwise"), scaling="tensor")
    with pytest.raises(ValueError, match="power of four"):
        Backward(hadamard=8)
    with pytest.raises(TypeError, match="takes a Cast"):
        Backward(grad="e5m2")
    with pytest.raises(ValueError, match="block format, scaled by its blocks"):
        Cast("mxfp8_e4m3", "tensorwise")
    assert Cast("nvfp4") == Cast("nvfp4", "block")     # a block format's only scaling
    ln = torch.nn.LayerNorm(8)
    with fpsim.emulate(Rules([Rule(Recipe(name="e4m3", inputs="e4m3"), kind="norm")])):
        y = ln(torch.randn(2, 8)).sum()
    with pytest.raises(RuntimeError, match="a norm statistic"):
        y.backward()


def test_every_scaling_of_the_one_table_is_applied():
    """casts.SCALINGS is the one list of scalings: Recipe's and Cast's are read from it, and
    every entry is applied by quantizers.cast (a new scaling without its code fails here)."""
    from fpsim.emulation import quantizers
    from fpsim.emulation.casts import SCALINGS
    from fpsim.emulation.recipe import SCALINGS as RECIPE_SCALINGS

    assert RECIPE_SCALINGS == tuple(n for n, s in SCALINGS.items() if s.recipe)
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(5)) * 1000
    for name, s in SCALINGS.items():
        c = Cast("nvfp4" if s.block else "e4m3", name, saturate=name != "none",
                 amax=2000.0 if s.calibrated else None)
        history = quantizers.AmaxHistory(448.0, 4, 0) if name == "delayed" else None
        q, limit, _ = quantizers.cast(x, c, -1, history=history)
        assert q.shape == x.shape and not torch.equal(q, x), name
    r = Recipe("e4m3", scaling="tile")               # a recipe's right operand: 128 x 128
    assert r.cast("e4m3", -1).scaling == "tile" and r.cast("e4m3", -2).scaling == "tile2d"


def test_one_registry_the_sweep_names():
    """The sweep's names resolve through fpsim's registry (presets.lookup): formats, FORMAT/
    SCALING, fp32 / fp64 and the training presets; a format's name wins over a preset's."""
    from fpsim_experiments.sweep.config import preset

    assert preset("e4m3/tensor") == presets.lookup("e4m3/tensor") == Recipe(
        "e4m3", scaling="tensor", name="e4m3/tensor")
    assert preset("nvfp4") == Recipe("nvfp4", name="nvfp4")          # the format, not the preset
    assert preset("te-delayed") == presets.rules("te-delayed")
    assert preset("native") == Rules([], default=None)
    with pytest.raises(ValueError, match="neither a format nor a preset"):
        presets.lookup("fp9")


# ---------------------------------------------------------------------------------------
# a Cast's own ablations: flush=False and full_subnormals are honoured or refused, never
# dropped (a Recipe of Casts ignored a Cast's flush=False)
@pytest.mark.parametrize("grad", [False, True])
def test_a_cast_that_keeps_flushed_values_is_the_recipe_that_does(grad):
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 4, bias=False)
    x = torch.randn(8, 16) * 2.0 ** -12          # most of it below E4M3's smallest subnormal
    x[0, :4] = torch.tensor([1.0, -0.0, 2.0 ** -10, -(2.0 ** -11)])
    x.requires_grad_(grad)
    out = {}
    for key, recipe in {
        "cast": Recipe(Cast("e4m3", flush=False), Cast("e4m3", flush=False)),
        "recipe": Recipe("e4m3", flush=False),
        "flushed": Recipe(Cast("e4m3"), Cast("e4m3")),
    }.items():
        with torch.set_grad_enabled(grad), fpsim.emulate(recipe):
            out[key] = lin(x).detach()
    assert torch.equal(out["cast"].view(torch.int32), out["recipe"].view(torch.int32))
    assert not torch.equal(out["cast"], out["flushed"])


def test_a_casts_ablations_that_do_not_apply_are_refused():
    with pytest.raises(ValueError, match="full_subnormals is an ablation of unscaled"):
        Cast("e4m3", "tensorwise", full_subnormals=True)
    with pytest.raises(ValueError, match="full_subnormals is an ablation of unscaled"):
        Cast("int8", full_subnormals=True)
    with pytest.raises(ValueError, match="give the Cast full_subnormals=True or flush=False"):
        Recipe(Cast("e4m3"), Cast("e4m3"), flush=False)


# ---------------------------------------------------------------------------------------
# pow2: every scaling with a scale of its own rounds it to a power of two, or refuses the flag
# (a tensor, channel or site Cast dropped pow2=True without a word)
def _pow2_scale(amax: float, fmax: float) -> float:
    """The smallest power of two 2^k (k in E8M0's [-127, 127]) with amax / 2^k <= fmax,
    found with exact rationals."""
    from fractions import Fraction

    if amax == 0:
        return 1.0
    k = math.frexp(amax / fmax)[1] - 2
    while Fraction(amax) > Fraction(fmax) * Fraction(2) ** k:
        k += 1
    return math.ldexp(1.0, min(max(k, -127), 127))


@pytest.mark.parametrize("fmt", ["e4m3", "e4m3_ieee", "e5m2", "e2m1"])
@pytest.mark.parametrize("scaling", ["tensor", "channel", "site"])
def test_pow2_scales_of_fpsims_own_scalings(monkeypatch, fmt, scaling):
    """Values are quantize(x / 2^k) * 2^k, 2^k the smallest power of two that keeps the amax
    within the format (per tensor, per row along the reduction axis, or the site's calibrated
    amax), bit for bit on the compiled pass and the general one; the amax exactly the
    format's max times a power of two, ties, zeros and an amax below E8M0's range included."""
    from fpsim.emulation import onepass, sites

    f = get_format(fmt)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, 40, generator=gen) * 37.0
    x[1] *= 2.0 ** -20
    x[2] = 0.0
    x[3, :3] = torch.tensor([f.max * 8, -0.0, f.max * 8 * 0.75])   # amax: max * 2^3 exactly
    x[4] *= 2.0 ** -140 / 37.0                                    # below 2^-127 * max
    for axis in (-1, 0):
        amax = 1.7 * float(x.abs().max()) if scaling == "site" else None
        c = Cast(fmt, scaling, pow2=True, amax=amax)
        x64 = x.double().movedim(axis, -1)
        if scaling == "channel":
            spans = x64.abs().amax(dim=-1, keepdim=True)
            scale = torch.tensor([[_pow2_scale(float(s), f.max)] for s in spans])
        else:
            top = amax if scaling == "site" else float(x64.abs().max())
            scale = torch.tensor(_pow2_scale(top, f.max), dtype=torch.float64)
        want = (fpsim.quantize(x64 / scale, f) * scale).movedim(-1, axis).float()
        paths = {"compiled": sites.quantize_cast(x, c, axis)[0]}
        with monkeypatch.context() as m:
            m.setattr(onepass, "tensor_scaled", lambda *a: None)
            paths["general"] = sites.quantize_cast(x, c, axis)[0]
        for name, got in paths.items():
            assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (name, axis)
    y = x[:1] * 1.3                                   # an amax / max that is no power of two
    two, exact = (Cast(fmt, scaling, pow2=p, amax=1.7 * float(y.abs().max())
                       if scaling == "site" else None) for p in (True, False))
    assert not torch.equal(sites.quantize_cast(y, two, -1)[0], sites.quantize_cast(y, exact, -1)[0])


def test_pow2_is_refused_where_a_cast_has_no_scale_of_its_own():
    for scaling, fmt in (("none", "e4m3"), ("block", "mxfp8_e4m3"), ("tile", "e4m3"),
                         ("delayed", "e4m3")):
        with pytest.raises(ValueError, match=f"a '{scaling}' cast has none of its own to round"):
            Cast(fmt, scaling, pow2=True)
    assert Cast("e4m3", "tensor", pow2=True).describe() == "e4m3/tensor pow2"
    r = Recipe("e4m3", scaling="channel", pow2=True)          # a Recipe passes it to its Casts
    assert r.describe() == "e4m3/channel pow2" and r.cast("e4m3").pow2
    assert Recipe("e4m3", scaling="site", pow2=True).at_site({"a": 3.0, "b": 1.0}).weights.pow2
    assert "pow2" not in Recipe("e4m3", scaling="tensor").to_json()   # earlier JSON unchanged
    for bad in ({}, {"scaling": "block"}, {"scaling": "tile"}):
        with pytest.raises(ValueError, match="pow2=True rounds the scales"):
            Recipe("mxfp8_e4m3" if bad.get("scaling") == "block" else "e4m3", pow2=True, **bad)
