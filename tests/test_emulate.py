"""fpsim.emulate on models built here from configs with random weights (nothing downloaded):
Hugging Face GPT-2 and Llama (RMSNorm, rotary, SwiGLU, grouped-query attention), and
hand-built layers whose emulated results are known exactly."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from torch import nn  # noqa: E402

import fpsim  # noqa: E402
from fpsim import Recipe, Rule, Rules  # noqa: E402
from fpsim.emulation.context import COLUMNS  # noqa: E402
from fpsim.emulation.intercept import einsum_plan  # noqa: E402
from fpsim.emulation.recipe import FP32, FP64  # noqa: E402

SEQUENTIAL_FP64 = Recipe(accum="fp64", order="sequential", name="fp64 sequential")
E4M3 = Recipe("e4m3")


def gpt2(attn: str = "sdpa", dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=16, vocab_size=61,
                                  attn_implementation=attn)
    return transformers.GPT2LMHeadModel(cfg).to(dtype).eval()


def rmsnorm_in_own_dtype(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """LlamaRMSNorm.forward without its cast to FP32, so an FP64 model is FP64 throughout."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


@pytest.fixture
def fp64_norms(monkeypatch: pytest.MonkeyPatch) -> None:
    """HF's LlamaRMSNorm computes in FP32 whatever the model's dtype: keep it in FP64."""
    from transformers.models.llama import modeling_llama

    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", rmsnorm_in_own_dtype)


def llama(attn: str = "sdpa", dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=61,
                                   max_position_embeddings=16, attn_implementation=attn)
    return transformers.LlamaForCausalLM(cfg).to(dtype).eval()


IDS = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(1))


def gpt2_sites(n_layer: int = 2) -> list[str]:
    per_block = ["ln_1:layer_norm", "attn.c_attn:addmm", "attn:qk", "attn:pv",
                 "attn.c_proj:addmm", "ln_2:layer_norm", "mlp.c_fc:addmm", "mlp.c_proj:addmm"]
    return ([f"transformer.h.{i}.{s}" for i in range(n_layer) for s in per_block]
            + ["transformer.ln_f:layer_norm", "lm_head:linear"])


def llama_sites(n_layer: int = 2) -> list[str]:
    per_block = ["input_layernorm:rms_norm", "self_attn.q_proj:linear",
                 "self_attn.k_proj:linear", "self_attn.v_proj:linear", "self_attn:qk",
                 "self_attn:pv", "self_attn.o_proj:linear", "post_attention_layernorm:rms_norm",
                 "mlp.gate_proj:linear", "mlp.up_proj:linear", "mlp.down_proj:linear"]
    return ([f"model.layers.{i}.{s}" for i in range(n_layer) for s in per_block]
            + ["model.norm:rms_norm", "lm_head:linear"])


def logits(model: nn.Module, recipe: Recipe | Rules | None = None, capture: bool = False):
    """The model's logits, natively or under ``recipe``, and the emulation context."""
    with torch.no_grad():
        if recipe is None:
            return model(IDS).logits, None
        with fpsim.emulate(recipe, capture=capture) as em:
            return model(IDS).logits, em


@pytest.mark.parametrize("build, expected", [(gpt2, gpt2_sites()), (llama, llama_sites())])
def test_each_site_seen_once_per_forward(build, expected):
    model = build()
    with torch.no_grad(), fpsim.emulate(FP32, capture=True) as em:
        model(IDS)
        model(IDS)
    assert list(em.sites) == expected                  # forward order, nothing missed or extra
    assert {s.calls for s in em.sites.values()} == {2}
    kinds = {name: s.kind for name, s in em.sites.items()}
    assert kinds[expected[0]] == "norm" and kinds[expected[1]] == "linear"
    assert {k for n, k in kinds.items() if n.endswith((":qk", ":pv"))} == {"attention"}


def test_eager_attention_is_two_matmul_sites():
    with torch.no_grad(), fpsim.emulate(FP32, capture=True) as em:
        gpt2("eager")(IDS)
    assert [n for n in em.sites if n.startswith("transformer.h.0.attn:")] == [
        "transformer.h.0.attn:matmul", "transformer.h.0.attn:matmul#2"]


@pytest.mark.parametrize("build", [gpt2, llama])
def test_fp64_recipe_is_the_fp64_forward(build, fp64_norms):
    """On an FP64 model the native FP64 recipe makes torch's own calls: the same bits (eager
    attention; SDPA is decomposed, so it agrees to rounding)."""
    model = build("eager", torch.float64)
    ref, _ = logits(model)
    got, _ = logits(model, FP64)
    assert torch.equal(got, ref)
    sdpa = build("sdpa", torch.float64)
    got, _ = logits(sdpa, FP64)
    assert torch.allclose(got, logits(sdpa)[0], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("build", [gpt2, llama])
def test_fp64_accumulate_reproduces_the_fp64_forward(build, fp64_norms):
    """fpsim.matmul's sequential FP64 accumulator differs from BLAS's FP64 only in summation
    order; the FP32 forward is a million times further off, so the test can tell them apart."""
    model = build("sdpa", torch.float64)
    ref, _ = logits(model)
    got, em = logits(model, SEQUENTIAL_FP64, capture=True)
    scale = float(ref.abs().max())
    assert float((got - ref).abs().max()) < 1e-13 * scale
    assert all(s.snr_db > 250 for s in em.sites.values() if s.kind != "norm")
    assert {s.recipe for s in em.sites.values() if s.kind == "norm"} == {None}  # torch's
    fp32, _ = logits(build("sdpa", torch.float32))
    assert float((fp32.double() - ref).abs().max()) > 1e-8 * scale


def adversarial_layer() -> tuple[nn.Module, torch.Tensor]:
    """A dot product 2048 + 1 + 1 + ... (1000 ones): in FP16 each 1 is below half an ulp of
    2048, so every addition is swamped; the exact sum is 3048."""
    layer = nn.Sequential(nn.Linear(1001, 1, bias=False))
    with torch.no_grad():
        layer[0].weight.fill_(1.0)
    x = torch.ones(1, 1001)
    x[0, 0] = 2048.0
    return layer, x


def test_fp16_accumulator_swamps_on_the_adversarial_layer():
    layer, x = adversarial_layer()
    fp16 = Recipe(accum="fp16", order="sequential", name="fp16 accumulator")
    with torch.no_grad(), fpsim.emulate(fp16, capture=True) as em:
        y = layer(x)
    assert y.item() == 2048.0
    site = em.sites["0:linear"]
    assert site.swamped == 1000
    assert site.snr_db == pytest.approx(20 * math.log10(3048 / 1000))
    with torch.no_grad(), fpsim.emulate(FP32, capture=True) as em:
        assert layer(x).item() == 3048.0
    assert em.sites["0:linear"].swamped is None       # torch's accumulator: not measured


def test_capture_table_columns_and_operand_events():
    layer = nn.Sequential(nn.Linear(4, 2, bias=False))
    with torch.no_grad():
        layer[0].weight.copy_(torch.tensor([[1.0, 1, 1, 1], [0.5, 0.5, 0.5, 0.5]]))
    x = torch.tensor([[1000.0, 1e-9, 3.0, -2.0], [1.0, 2.0, 3.0, 4.0]])
    with torch.no_grad(), fpsim.emulate(E4M3, capture=True) as em:
        y = layer(x)
    table = em.table()
    assert len(table) == 1 and tuple(table[0]) == COLUMNS
    row = table[0]
    assert row["site"] == "0:linear" and row["kind"] == "linear" and row["recipe"] == "e4m3"
    assert (row["calls"], row["elements"], row["amax"]) == (1, 16, 1000.0)
    assert (row["overflow"], row["saturated"], row["flushed"]) == (1, 0, 1)  # 1000 > 448: NaN
    assert (row["outputs"], row["nonfinite"]) == (4, 2)  # the first row of x feeds both outputs
    assert torch.equal(y[1], torch.tensor([10.0, 5.0]))
    assert row["snr_db"] == math.inf                     # the second row is exact
    assert row["swamped"] is None
    assert "0:linear" in em.report() and em.report().splitlines()[0].split() == list(COLUMNS)


def test_rules_select_by_kind_and_module_path():
    rules = Rules([Rule(E4M3, kind="linear", path="transformer.h.0.*"),
                   Rule(None, kind="attention"),
                   Rule(SEQUENTIAL_FP64, kind="norm")])
    _, em = logits(gpt2(), rules, capture=True)
    got = {n: s.recipe for n, s in em.sites.items()}
    assert got["transformer.h.0.attn.c_attn:addmm"] == "e4m3"
    assert got["transformer.h.1.attn.c_attn:addmm"] == "fp32"      # the default
    assert got["transformer.h.0.attn:qk"] is None                    # left to torch
    assert got["transformer.ln_f:layer_norm"] == "fp64 sequential"
    assert got["lm_head:linear"] == "fp32"


def test_sites_left_to_torch_give_torch_bits():
    model = llama()
    ref, _ = logits(model)
    got, _ = logits(model, Rules(default=None))
    assert torch.equal(got, ref)


def test_recipe_only_changes_the_selected_sites():
    model = gpt2()
    base, _ = logits(model, FP32)
    lm_only, _ = logits(model, Rules([Rule(E4M3, path="lm_head")]))
    body_only, _ = logits(model, Rules([Rule(E4M3, path="transformer.*")]))
    assert not torch.equal(lm_only, base) and not torch.equal(body_only, base)
    assert not torch.equal(lm_only, body_only)


def test_bad_rules_are_named():
    with pytest.raises(ValueError, match="kind 'conv2d'"):
        Rule(E4M3, kind="conv2d")
    with pytest.raises(TypeError, match="Rule objects"):
        Rules([E4M3])
    with pytest.raises(TypeError, match="Recipe or Rules"):
        fpsim.emulate(3)
    with pytest.raises(ValueError, match=r"is a preset \(native, .*Recipe\('e4m3'\)"):
        fpsim.emulate("e4m3")


def test_einsum_that_is_a_product_is_emulated_like_bmm():
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(3, 4, 40, generator=g), torch.randn(3, 40, 5, generator=g)
    rec = Recipe(accum="fp16", order="sequential", name="fp16 accumulator")
    with fpsim.emulate(rec, capture=True) as em:
        want = torch.bmm(a, b)
        got = torch.einsum("bik,bkj->bij", a, b)
        swapped = torch.einsum("bkj,bik->bji", b, a)
        ellipsis = torch.einsum("...ik,...kj->...ij", a, b)   # not lowered: torch's bmm is
    assert torch.equal(got, want) and torch.equal(swapped, want.transpose(1, 2))
    assert not torch.equal(want, a @ b)                        # the accumulator is emulated
    assert list(em.sites) == [":matmul", ":einsum", ":einsum#2", ":bmm"]
    assert torch.equal(ellipsis, want)
    assert einsum_plan("ij,jk->ik", a[0], b[0]) == ([], ["i"], ["j"], ["k"], "ik")
    assert einsum_plan("ii,ik->ik", a[0, :4, :4], b[0, :4]) is None  # a diagonal


def test_matmul_of_vectors_and_scaled_attention_mask():
    g = torch.Generator().manual_seed(3)
    v, m = torch.randn(6, generator=g), torch.randn(6, 6, generator=g)
    with fpsim.emulate(FP64):
        assert torch.equal(v @ m, (v.double() @ m.double()).float())
        assert torch.equal(m @ v, (m.double() @ v.double()).float())
        assert (v @ v).shape == ()
    q, k, val = (torch.randn(1, 2, 5, 8, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.rand(5, 5, generator=g) > 0.3
    mask.fill_diagonal_(True)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, val, attn_mask=mask)
    with fpsim.emulate(FP64):
        got = torch.nn.functional.scaled_dot_product_attention(q, k, val, attn_mask=mask)
    assert torch.allclose(got, ref, rtol=1e-13, atol=1e-15)


def test_experiments_share_the_library_recipe():
    from fpsim_experiments import recipes
    from fpsim.emulation import sites

    assert recipes.Recipe is fpsim.Recipe and recipes.FP32 is FP32
    assert recipes.linear is sites.linear and recipes.layernorm is sites.layernorm


def test_norm_functions_and_their_statistics():
    """F.rms_norm and F.layer_norm (with and without affine parameters) under the FP64 recipe
    are torch's own in FP64; under FP16 sums their statistic swamps like any dot product."""
    F = torch.nn.functional
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 64, generator=g, dtype=torch.float64)
    w = torch.randn(64, generator=g, dtype=torch.float64)
    with fpsim.emulate(Rules([Rule(FP64, kind="norm")]), capture=True) as em:
        rms = F.rms_norm(x, (64,), w, eps=1e-6)
        ln = F.layer_norm(x, (64,))
    assert torch.allclose(rms, F.rms_norm(x, (64,), w, eps=1e-6), rtol=1e-14, atol=0)
    assert torch.allclose(ln, F.layer_norm(x, (64,)), rtol=1e-13, atol=1e-15)
    assert list(em.sites) == [":rms_norm", ":layer_norm"]
    assert {s.kind for s in em.sites.values()} == {"norm"}
    big = torch.full((1, 1025), 1.0)
    big[0, 0] = 64.0                                    # 64^2 = 4096: then 1024 additions of 1
    fp16 = Recipe(accum="fp16", order="sequential", name="fp16 sums")
    with fpsim.emulate(Rules([Rule(fp16, kind="norm")]), capture=True) as em:
        y = F.rms_norm(big, (1025,), eps=0.0)
    assert em.sites[":rms_norm"].swamped == 1024       # ulp of 4096 in FP16 is 4
    assert torch.equal(y, big * torch.rsqrt(torch.tensor(4096.0 / 1025)))


def test_contexts_do_not_nest_and_end_cleanly():
    layer, x = adversarial_layer()
    with fpsim.emulate(FP32):
        with pytest.raises(RuntimeError, match="do not nest"):
            with fpsim.emulate(FP64):
                pass
    with pytest.raises(ZeroDivisionError):
        with fpsim.emulate(FP32):
            1 / 0
    with torch.no_grad():
        assert layer(x).item() == 3048.0                  # torch again, nothing left registered
        with fpsim.emulate(Recipe(accum="fp16", order="sequential")):
            assert layer(x).item() == 2048.0


def test_only_parameters_are_cached():
    """A right operand that is not a parameter is quantized again whenever its bits change,
    even when its address, shape and version stay the same (``.data`` writes do not bump the
    version)."""
    rec = Recipe("e4m3", scaling="tensor")
    x, w = torch.ones(2, 8), torch.ones(8, 8)
    with fpsim.emulate(rec):
        for scale in (1.0, 2.0, 3.0):
            w.data.fill_(scale)
            assert torch.equal(torch.addmm(torch.zeros(8), x, w), torch.full((2, 8), 8 * scale))


@pytest.mark.parametrize("preset", ["deepseek-v3", "torchao-float8-rowwise", "te-current",
                                    "te-mxfp8", "nvfp4", "te-delayed"])
def test_scaled_cast_weights_are_quantized_once(monkeypatch, preset):
    """A preset whose weights take a scaled cast (DeepSeek's tiles, torchao's and TE's
    scales) quantizes a parameter once per context, as plain recipes do, with the bits and
    captured counts of quantizing it every call; a delayed cast quantizes it every call, as
    each call advances its amax history."""
    from fpsim.emulation import backward, quantizers
    from fpsim.emulation.presets import get_preset

    calls = []
    cast = quantizers.cast
    monkeypatch.setattr(quantizers, "cast", lambda x, c, axis, **kw: calls.append(axis) or
                        cast(x, c, axis, **kw))
    torch.manual_seed(0)
    layer, x = torch.nn.Linear(64, 32), torch.randn(3, 64)
    recipe = get_preset(preset).recipe

    def three_calls() -> tuple[list, list, int]:
        calls.clear()
        with torch.no_grad(), fpsim.emulate(recipe, capture=True) as em:
            ys = [layer(x).view(torch.int32) for _ in range(3)]
        return ys, em.table(), calls.count(-2)

    kept, rows, quantized = three_calls()
    delayed = recipe.cast(recipe.weight_format, -2).scaling == "delayed"
    assert quantized == (3 if delayed else 1), preset
    monkeypatch.setattr(backward, "reusable", lambda cast: False)
    again, rows_again, quantized_again = three_calls()
    assert quantized_again == 3
    assert all(torch.equal(y, z) for y, z in zip(kept, again)) and rows == rows_again, preset


def test_a_weight_shared_by_a_plain_and_a_scaled_recipe():
    """Two sites whose weights share one storage, one under a plain recipe and one whose
    inputs take a Cast (its weight the same cast), keep an entry each: both give what they
    give alone."""
    from fpsim.emulation.casts import Cast

    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.p, self.q = nn.Linear(16, 8), nn.Linear(16, 8)
            self.q.weight = nn.Parameter(self.p.weight.data)    # the same storage
            with torch.no_grad():
                self.q.weight.mul_(1.0)         # and version as p's (its init wrote in place)
            assert self.q.weight._version == self.p.weight._version

        def forward(self, x: torch.Tensor) -> tuple:
            return self.p(x), self.q(x)

    torch.manual_seed(0)
    net, x = Two(), torch.randn(4, 16)
    plain = Recipe("e4m3")
    scaled = Recipe(inputs=Cast("e4m3", "tensor"), weights="e4m3")      # its weight: plain's
    rules = Rules([Rule(plain, "p"), Rule(scaled, "q")])
    with torch.no_grad():
        with fpsim.emulate(Rules([Rule(plain, "p")], default=None)):
            alone_p = net(x)[0]
        with fpsim.emulate(Rules([Rule(scaled, "q")], default=None)):
            alone_q = net(x)[1]
        with fpsim.emulate(rules):
            for _ in range(2):
                p, q = net(x)
                assert torch.equal(p, alone_p) and torch.equal(q, alone_q)


def test_recurring_operands_are_quantized_once(monkeypatch):
    """A right operand that recurs unchanged (a decoder's cached keys) is quantized once and
    widened to FP64 once it recurs, its result the same bits; a weight is widened to FP64
    once, whatever the calls."""
    from fpsim.emulation import sites

    calls, widened = [], []
    quantize, to = sites._quantize_counted, torch.Tensor.to
    monkeypatch.setattr(sites, "_quantize_counted", lambda x, *a: calls.append(x.shape) or
                        quantize(x, *a))
    monkeypatch.setattr(torch.Tensor, "to", lambda t, *a, **kw: (
        widened.append(t.shape) if t.shape in ((8, 4), (8, 5)) and a == (torch.float64,)
        else None) or to(t, *a, **kw))
    torch.manual_seed(0)
    x, k = torch.randn(3, 8), torch.randn(8, 5)
    layer = torch.nn.Linear(8, 4)
    with torch.no_grad(), fpsim.emulate(Recipe("e4m3", scaling="tensor")):
        first = x @ k
        assert torch.equal(x @ k, first) and len(calls) == 3     # x, k, then x only
        assert torch.equal(x @ k, first)
        assert torch.equal(layer(x), layer(x))
    assert widened == [(8, 5), (8, 5), (8, 4)]           # k's first use, then kept
    monkeypatch.undo()
    other = torch.nn.Linear(8, 4)                        # a weight of the same shape
    with torch.no_grad(), fpsim.emulate(Recipe("e4m3", scaling="tensor")):
        alone = other(x)
    with torch.no_grad(), fpsim.emulate(Recipe("e4m3", scaling="tensor")):
        layer(x)
        assert torch.equal(other(x), alone)


def test_interceptor_and_its_weight_cache_free_without_the_cycle_collector():
    """An emulation context's interceptor (and the quantized weights it caches) is freed by
    reference counting when the context ends: no reference cycle keeps it for the cyclic
    garbage collector, which runs too rarely to stop caches of several forward passes piling
    up (issue #11: gigabytes on GPT-2 124M)."""
    import gc
    import weakref

    model = gpt2()
    em = fpsim.emulate(Recipe("e4m3", scaling="tensor"))
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        with torch.no_grad(), em:
            model(IDS)
            interceptor = weakref.ref(em._state)
            assert em._state.cache                        # the weights were quantized and kept
        assert interceptor() is None
    finally:
        if enabled:
            gc.enable()


def test_a_block_format_implies_its_block_scaling():
    assert Recipe("nvfp4") == Recipe("nvfp4", scaling="block")
    assert Recipe("mxfp8_e4m3").describe() == "mxfp8_e4m3/block"
    with pytest.raises(ValueError, match="block format, scaled by its blocks; leave scaling"):
        Recipe("nvfp4", scaling="tensor")


def test_report_without_capture_says_why_it_is_empty():
    with torch.no_grad(), fpsim.emulate(E4M3) as em:
        gpt2()(IDS)
    assert em.report().splitlines()[-1] == (
        "(no per-site statistics: this context was made without capture=True; "
        "fpsim.emulate(..., capture=True) records them)")
    with torch.no_grad(), fpsim.emulate(E4M3, capture=True) as em:
        gpt2()(IDS)
    assert "capture=True" not in em.report()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_gpt2_trains_under_a_plain_recipe(attn):
    """A plain Recipe emulates the products and leaves LayerNorm to torch: backward() runs
    through every layer (ln_f included) and changes the gradients from native ones."""
    model = gpt2(attn)                   # eval: no dropout, the same graph twice
    grads = []
    for recipe in (None, Recipe("e4m3", scaling="tensor")):
        model.zero_grad(set_to_none=True)
        with fpsim.emulate(recipe) if recipe is not None else torch.enable_grad():
            out = model(IDS, labels=IDS)
        out.loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    native, low = grads
    assert all(g is not None for g in low.values())
    assert not torch.equal(low["transformer.ln_f.weight"], native["transformer.ln_f.weight"])
