"""``capture=True`` observes: every result, forward and backward, is bit for bit the same as
without it, whatever the recipe or preset (sites left to torch stay torch's own arithmetic,
SDPA included); and the ``native`` preset is torch itself, bit for bit, captured or not.

Architectures: the Hugging Face GPT-2 and Llama of ``test_emulate.py`` (SDPA and eager
attention) and every model of ``test_emulate_models.py``."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_emulate import IDS, gpt2, llama
from test_emulate_models import MODELS

import fpsim
from fpsim import Recipe, Rule, Rules
from fpsim.emulation import presets

#: recipes over every scaling, rounding and accumulator path, norms left to torch (they
#: have no emulated backward); ``NORMS``: forward-only rules that emulate norm statistics too
RECIPES = {
    "fp32": Recipe(),
    "host sums": Recipe("e4m3", scaling="tensor", native_sums="host"),
    "e4m3/tensor": Recipe("e4m3", scaling="tensor"),
    "e4m3/channel": Recipe("e4m3", scaling="channel"),
    "e4m3/tile": Recipe("e4m3", scaling="tile"),
    "e2m1 sat": Recipe("e2m1", saturate=True),
    "mxfp8": Recipe("mxfp8_e4m3", scaling="block"),
    "nvfp4": Recipe("nvfp4", scaling="block"),
    "bf16 out": Recipe("bf16", output="bf16"),
    "fp16 acc": Recipe(accum="fp16", order="pairwise"),
    "e4m3 stochastic": Recipe("e4m3", rounding="stochastic"),
    "attention only": Rules([Rule(Recipe("e4m3"), kind="attention")], default=None),
    "nothing": Rules([], default=None),
    **{p: presets.rules(p) for p in presets.PRESETS},
}
NORMS = {
    "norms stochastic": Rules([Rule(Recipe("e5m2", rounding="stochastic"), kind="norm")],
                              default=Recipe("e4m3", rounding="stochastic")),
    "norms block": Rules([Rule(Recipe("mxfp8_e4m3", scaling="block"), kind="norm")],
                         default=None),
}
LMS = {"gpt2 sdpa": lambda: gpt2("sdpa"), "gpt2 eager": lambda: gpt2("eager"),
       "llama sdpa": lambda: llama("sdpa"), "llama eager": lambda: llama("eager")}


def bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bits as integers (NaNs compare too)."""
    t = t.detach().contiguous()
    return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()])


def outputs(model, inputs, rules, capture: bool, backward: bool) -> list[torch.Tensor]:
    """The model's output under ``rules`` and, with ``backward``, every parameter gradient
    of a fixed linear function of it; random state seeded alike for every call."""
    args, kwargs = ((), inputs) if isinstance(inputs, dict) else (inputs, {})
    model.zero_grad(set_to_none=True)
    torch.manual_seed(123)
    with torch.set_grad_enabled(backward):
        ctx = fpsim.emulate(rules, capture=capture) if rules is not None else None
        if ctx is None:
            y = model(*args, **kwargs)
        else:
            with ctx:
                y = model(*args, **kwargs)
        if not isinstance(y, torch.Tensor):
            y = y.logits if getattr(y, "logits", None) is not None else y.last_hidden_state
        got = [y]
        if backward:
            w = torch.randn(y.shape, generator=torch.Generator().manual_seed(9), dtype=y.dtype)
            (y * w).sum().backward()
            got += [p.grad for p in model.parameters() if p.grad is not None]
            assert len(got) > 1
    return got


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(bits(x), bits(y)) for x, y in zip(a, b))


#: recipes that change the result on today's main when captured (attention left to torch,
#: stochastic rounding, the presets) and one of each scaling family: the fast selection
FAST = ["e4m3/tensor", "mxfp8", "e4m3 stochastic", "nothing", "torchao-float8-tensorwise",
        "nvfp4"]


def check_capture(model, inputs, names, backward=True):
    outputs(model, inputs, None, False, backward)         # first-call effects, once
    for name in names:
        rules = RECIPES[name]
        assert same(outputs(model, inputs, rules, False, backward),
                    outputs(model, inputs, rules, True, backward)), name
    with torch.no_grad():
        for name, rules in NORMS.items():
            assert same(outputs(model, inputs, rules, False, False),
                        outputs(model, inputs, rules, True, False)), name


@pytest.mark.parametrize("arch", ["gpt2 sdpa", "gpt2 eager", "llama sdpa"])
def test_capture_changes_no_result_forward_and_backward(arch):
    check_capture(LMS[arch](), (IDS,), FAST)


@pytest.mark.slow                                 # 4 models x 25 recipes x 2 runs: minutes
@pytest.mark.parametrize("arch", list(LMS))
def test_capture_changes_no_result_under_every_recipe_and_preset(arch):
    check_capture(LMS[arch](), (IDS,), list(RECIPES))


@pytest.mark.parametrize("arch", list(LMS))
def test_native_preset_is_torch_bit_for_bit(arch):
    model = LMS[arch]()
    ref = outputs(model, (IDS,), None, False, True)
    for capture in (False, True):
        assert same(outputs(model, (IDS,), "native", capture, True), ref), capture
    with torch.no_grad(), fpsim.emulate("native", capture=True) as em:
        model(IDS)
    assert em.sites and all(s.recipe is None for s in em.sites.values())


#: models whose attention torch decomposes below F.scaled_dot_product_attention (aten
#: level: no emulated backward), run forward only under a recipe
FORWARD_ONLY = {"torch TransformerEncoder"}


def _model(name):
    build, inputs = MODELS[name]
    torch.manual_seed(0)
    model = build().eval()
    given = inputs()
    return model, (given if isinstance(given, dict) else tuple(given))


@pytest.mark.slow                                 # 12 models, forward and backward: minutes
@pytest.mark.parametrize("name", list(MODELS))
def test_every_model_native_and_captured_alike(name):
    """Every architecture of test_emulate_models: ``native`` is torch's bits, captured or not,
    forward and backward; capture changes nothing under a scaled recipe and the presets."""
    model, inputs = _model(name)
    ref = outputs(model, inputs, None, False, True)
    for capture in (False, True):
        assert same(outputs(model, inputs, "native", capture, True), ref), capture
    check_capture(model, inputs, ["e4m3/tensor", "nvfp4", "te-delayed", "e4m3 stochastic"],
                  backward=name not in FORWARD_ONLY)


def _sites(model, inputs, rules, capture) -> dict:
    args, kwargs = ((), inputs) if isinstance(inputs, dict) else (inputs, {})
    torch.manual_seed(123)
    with fpsim.emulate(rules, capture=capture) as em:
        y = model(*args, **kwargs)
        y = y if isinstance(y, torch.Tensor) else getattr(y, "logits", None)
        if y is None:
            y = model(*args, **kwargs).last_hidden_state
        w = torch.randn(y.shape, generator=torch.Generator().manual_seed(9), dtype=y.dtype)
        (y * w).sum().backward()
    return em.sites


@pytest.mark.parametrize("name", ["resnet (BatchNorm)", "bert"])
@pytest.mark.parametrize("recipe", ["e4m3/tensor", "fp16 acc", "e2m1 sat"])
def test_capture_counts_is_capture_without_the_reference(name, recipe):
    """``capture="counts"`` changes no result (forward and every gradient) and records every
    statistic ``capture=True`` does, bit for bit, except the SNR (no FP64 reference)."""
    model, inputs = _model(name)
    model.train(False)
    rules = RECIPES[recipe]
    outputs(model, inputs, None, False, True)
    assert same(outputs(model, inputs, rules, False, True),
                outputs(model, inputs, rules, "counts", True))
    full, counts = (_sites(model, inputs, rules, c) for c in (True, "counts"))
    assert list(full) == list(counts) and any("/" in s for s in counts)   # backward rows too
    for site, st in full.items():
        got = counts[site]
        assert not got.reference and got.signal == got.noise == 0.0
        assert got.row()["snr_db"] is None and st.row()["snr_db"] is not None
        for key in ("calls", "elements", "amax", "overflow", "saturated", "flushed",
                    "nonzero", "outputs", "swamped", "nonfinite"):   # references all finite
            assert getattr(got, key) == getattr(st, key), (site, key)


def test_capture_refuses_what_it_cannot_mean():
    for bad in ("yes", "count", None, 2):
        with pytest.raises(TypeError, match="'counts'"):
            fpsim.emulate(Recipe("e4m3"), capture=bad)
    assert fpsim.emulate(Recipe("e4m3"), capture="counts").capture
    assert not fpsim.emulate(Recipe("e4m3"), capture="counts").reference


def test_capture_counts_counts_inf_and_nan_results():
    """Without a reference ``nonfinite`` counts every inf/NaN result: here each output overflows
    (unscaled E4M3's operands NaN) while FP64 is finite, so both modes count them all."""
    layer = torch.nn.Linear(4, 3)
    x = torch.full((2, 4), 1e6)
    rows = {}
    for capture in (True, "counts"):
        with torch.no_grad(), fpsim.emulate(Recipe("e4m3"), capture=capture) as em:
            layer(x)
        (st,) = em.sites.values()
        rows[capture] = (st.outputs, st.nonfinite, st.overflow)
    assert rows[True] == rows["counts"] == (6, 6, 8)
