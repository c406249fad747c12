"""``fpsim.Accumulator``: the one description of how products are summed, which
``fpsim.matmul``, ``Recipe``, ``Backward`` and the presets all use (issue 40)."""

import dataclasses

import numpy as np
import pytest

import fpsim
from fpsim import Accumulator, Recipe
from fpsim.emulation import presets
from fpsim.emulation.casts import SCALINGS as CAST_SCALINGS
from fpsim.emulation.casts import Backward, Cast

HOPPER = dict(order="tensor_core", tensor_core="hopper_fp8", chunk=128)
#: (matmul's keywords, the Accumulator they are shorthand for)
SHORTHANDS = [
    (dict(accum="fp16"), Accumulator("fp16", "sequential")),
    (dict(accum="bf16", order="pairwise"), Accumulator("bf16", "pairwise")),
    (dict(accum="fp16", order="chunked", chunk=64), Accumulator("fp16", "chunked", 64)),
    (dict(accum="e5m6", order="fma"), Accumulator("e5m6", "fma")),
    (dict(**HOPPER), Accumulator(**HOPPER)),
]


def bits(x):
    x = np.asarray(x)
    return x.view(np.uint32 if x.dtype == np.float32 else np.uint64)


def test_equal_descriptions_are_equal_and_hash_alike():
    same = [(Accumulator("FP32"), Accumulator("fp32", "native")),
            (Accumulator("float16"), Accumulator(fpsim.get_format("fp16"), "sequential")),
            (Accumulator(order="chunked"), Accumulator("fp32", "chunked", 128)),
            (Accumulator(order="tensor_core", tensor_core="Hopper-FP8"),
             Accumulator(fpsim.get_format("fp32"), "tensor_core", None, "hopper_fp8"))]
    for a, b in same:
        assert a == b and hash(a) == hash(b)
    assert len({a for pair in same for a in pair}) == len(same)
    assert Accumulator("fp16") != Accumulator("fp16", "pairwise")
    assert Accumulator("fp64").order == "native" and not Accumulator("fp64").emulated
    assert Accumulator("bf16").emulated and Accumulator(**HOPPER).model.group == 32
    with pytest.raises(dataclasses.FrozenInstanceError):
        Accumulator().order = "pairwise"


@pytest.mark.parametrize("kw,acc", SHORTHANDS, ids=lambda v: str(v))
def test_matmul_shorthand_is_the_accumulator_bit_for_bit(kw, acc):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((4, 256)).astype(np.float32)
    b = rng.standard_normal((256, 3)).astype(np.float32)
    if kw.get("order") == "tensor_core":
        a, b = (fpsim.quantize(x, "e4m3") for x in (a, b))
    short = fpsim.matmul(a, b, backend="numpy", **kw)
    assert bits(short).tobytes() == bits(fpsim.matmul(a, b, accum=acc, backend="numpy")).tobytes()


def test_recipe_shorthand_builds_the_accumulator():
    for kw, acc in SHORTHANDS:
        r = Recipe("e4m3", **kw)
        assert r.accumulator() == acc and r.emulated
        assert Recipe("e4m3", accum=acc).accumulator() == acc
    assert Recipe().accumulator() == Accumulator("fp32", "native") and not Recipe().emulated
    assert Recipe(native_sums="host").accumulator() == Accumulator(order="host")
    assert Recipe(accum=Accumulator(order="host")) == Recipe(native_sums="host")
    assert Recipe(accum=Accumulator("fp16", "pairwise"), name="x") == \
        Recipe(accum="fp16", order="pairwise", name="x")


def test_presets_and_backward_use_it():
    deepseek = presets.get_preset("deepseek-v3").recipe
    assert deepseek.accumulator() == Accumulator(**HOPPER)
    for name in ("torchao-float8-tensorwise", "torchao-float8-rowwise"):
        assert presets.get_preset(name).recipe.accumulator().order == "host"
    assert Backward(accum="bf16").accum == Accumulator("bf16", "sequential")
    assert Backward(accum=Accumulator("fp16", "pairwise")).describe() == "acc=fp16 pairwise"
    assert Backward().accum is None


def test_emulated_sums_follow_the_accumulator_forward_and_backward():
    """A Recipe's forward GEMM and its Backward's dgrad and wgrad GEMMs are fpsim.matmul under
    their Accumulator, bit for bit (and FP16 pairwise sums differ from FP32's)."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 3, bias=False)
    x = torch.randn(64, 256, requires_grad=True)
    fwd, bwd = Accumulator("fp16", "pairwise"), Accumulator("bf16", "chunked", 16)
    with fpsim.emulate(Recipe(accum=fwd, backward=Backward(accum=bwd))):
        y = lin(x)
    g = torch.randn_like(y)
    y.backward(g)
    W, xs = lin.weight.detach().numpy(), x.detach().numpy()
    want_y = fpsim.matmul(xs, W.T, accum=fwd, backend="numpy")
    want_dx = fpsim.matmul(g.numpy(), W, accum=bwd, backend="numpy")
    want_dw = fpsim.matmul(xs.T, g.numpy(), accum=bwd, backend="numpy").T
    for got, want in ((y, want_y), (x.grad, want_dx), (lin.weight.grad, want_dw)):
        assert bits(got.detach().numpy()).tobytes() == bits(want).tobytes()
    assert not np.array_equal(want_y, xs @ W.T)


@pytest.mark.parametrize("make,match", [
    (lambda: Accumulator("int8"), "integer format"),
    (lambda: Accumulator("fp16", "native"), "use order='sequential'"),
    (lambda: Accumulator("fp16", "host"), "needs accum='fp32'"),
    (lambda: Accumulator(chunk=64), "chunk applies to"),
    (lambda: Accumulator(order="tensor_core"), "needs tensor_core="),
    (lambda: Accumulator(order="random"), "unknown order"),
    (lambda: fpsim.matmul(np.ones((2, 3)), np.ones((3, 2)), accum=Accumulator("fp16"),
                          order="pairwise"), "give order inside it"),
    (lambda: fpsim.matmul(np.ones((2, 3)), np.ones((3, 2)), accum=Accumulator()),
     "fpsim.matmul emulates an order"),
    (lambda: Recipe(accum=Accumulator("fp16"), chunk=64), "give chunk inside it"),
    (lambda: Recipe(order="host"), "order=None, native_sums='host'"),
    (lambda: Recipe("e4m3", accum="fp16", order="native"), "order='native' is spelled"),
])
def test_bad_accumulators_name_the_problem_and_the_fix(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_backward_accum_takes_an_accumulator():
    with pytest.raises(TypeError, match="takes an Accumulator"):
        Backward(accum=16)
    with pytest.raises(TypeError, match="takes a Cast"):
        Backward(grad="e5m2")
    assert Cast("e5m2") == Backward(grad=Cast("e5m2")).grad


def test_scaling_lists_are_views_of_the_one_table():
    from fpsim import cli
    from fpsim_experiments import range_vs_precision
    assert cli.SCALINGS == tuple(n for n, s in CAST_SCALINGS.items() if s.cli)
    assert range_vs_precision.SCALINGS == ("none", "tensor")   # the names in its results


SMALL = ["e2m1", "e2m3", "e3m2", "e4m3", "e5m2", "e4m3_ieee", "e3m4", "e5m2fnuz", "e4m3fnuz",
         "e8m0", "int4", "int8", "uint8", "fp16", "bf16"]


@pytest.mark.parametrize("narrow", SMALL)
def test_fits_is_every_finite_value_of_one_format_in_the_other(narrow):
    """``fits`` against the formats' values themselves, every code of every pair."""
    from fpsim.arith.tc_models import fits

    a = fpsim.values(narrow)
    a = a[np.isfinite(a)]
    for wide in SMALL + ["fp32"]:
        w = fpsim.values(wide) if wide != "fp32" else None
        held = (np.isin(a, w[np.isfinite(w)]).all() if w is not None
                else (a.astype(np.float32) == a).all())
        assert fits(fpsim.get_format(narrow), fpsim.get_format(wide)) == held, (narrow, wide)


def test_a_tensor_core_refuses_operands_its_instruction_cannot_read():
    for kw in (dict(inputs="fp32"), dict(inputs=None), dict(inputs="e3m4"),
               dict(inputs="e4m3", weights="fp16")):
        with pytest.raises(ValueError, match="tensor_core='hopper_fp8' reads fp8_e4m3fn, "
                                             "fp8_e5m2 operands"):
            Recipe(**kw, order="tensor_core", tensor_core="hopper_fp8")
    with pytest.raises(ValueError, match="the weights are fp16; give weights="):
        Recipe("e4m3", weights="fp16", order="tensor_core", tensor_core="hopper_fp8")
    ok = [Recipe("e4m3_ieee", scaling="tensor", **HOPPER),      # a narrower FP8
          Recipe("e4m3", weights="e5m2", order="tensor_core", tensor_core="hopper_fp16"),
          Recipe("int8", order="tensor_core", tensor_core="hopper_bf16"),
          Recipe(Cast("mxfp4", "block"), order="tensor_core", tensor_core="blackwell_mxf8f6f4"),
          Recipe("fp32", order="tensor_core",
                 tensor_core=fpsim.arith.TensorCoreModel(4, 24))]       # custom: any operands
    assert all(r.accumulator().model is not None for r in ok)
