"""The two attention semantics of the emulated P·V site, the weight recipe of RecipeRun and its
record of every overflowing element."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import fpsim

from fpsim_experiments.endtoend import RecipeRun
from fpsim_experiments.gpt2.model import GPT2, GPT2Config
from fpsim_experiments.recipes import FP32, Recipe, causal_matmul, layernorm, matmul

E3M4 = Recipe(name="e3m4", inputs="e3m4_ieee")


def probs(T: int, seed: int = 0) -> torch.Tensor:
    """Causal attention probabilities [1, 2, T, T] (masked keys exactly 0) on a dyadic grid, so
    every sum below is exact."""
    g = torch.Generator().manual_seed(seed)
    p = torch.randint(1, 8, (1, 2, T, T), generator=g).float()
    p = p.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), 0.0)
    return p / 8


def values(T: int, D: int = 3, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-8, 8, (1, 2, T, D), generator=g).float() / 4


def test_finite_values_give_the_eager_bits():
    p, v = probs(6), values(6)
    for recipe in (FP32, E3M4):
        assert torch.equal(causal_matmul(recipe, p, v), matmul(recipe, p, v))


def test_a_nan_at_a_later_key_reaches_earlier_queries_only_eagerly():
    p, v = probs(6), values(6)
    v[0, 0, 4, 1] = math.nan
    eager, causal = matmul(FP32, p, v), causal_matmul(FP32, p, v)
    assert torch.isnan(eager[0, 0, :, 1]).all()              # 0 · NaN at every earlier query
    assert not torch.isnan(causal[0, 0, :4]).any()           # queries before key 4: finite
    assert torch.isnan(causal[0, 0, 4:, 1]).all()            # queries that see key 4: NaN
    clean = v.clone()
    clean[0, 0, 4, 1] = 0.0
    ref = matmul(FP32, p, clean)
    assert torch.equal(causal[0, 0, :4], ref[0, 0, :4]) and torch.equal(causal[0, 1], ref[0, 1])


def test_infinities_at_kept_keys_follow_ieee():
    p, v = probs(4), values(4)
    p[0, 0, 3, 1] = 0.0                                       # a kept key with probability 0
    v[0, 0, 1, 0] = math.inf                                  # 0 · inf at query 3: NaN
    v[0, 0, 2, 1], v[0, 0, 3, 1] = math.inf, -math.inf        # +inf and -inf at query 3: NaN
    y = causal_matmul(FP32, p, v)
    assert y[0, 0, 1, 0] == math.inf and y[0, 0, 2, 1] == math.inf
    assert torch.isnan(y[0, 0, 3, 0]) and torch.isnan(y[0, 0, 3, 1])
    assert torch.isfinite(y[0, 0, 0]).all() and torch.isfinite(y[0, 0, 2, 2])


def test_the_attention_option_is_checked():
    with pytest.raises(ValueError, match="attention 'flash'"):
        RecipeRun(E3M4, attention="flash")


def _tiny() -> tuple[GPT2, torch.Tensor]:
    torch.manual_seed(3)
    model = GPT2(GPT2Config(n_layer=1, n_head=2, n_embd=32, n_positions=16)).eval()
    return model, torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(4))


def test_a_weight_recipe_equal_to_the_site_recipe_gives_the_same_bits():
    model, x = _tiny()
    plain, split = RecipeRun(E3M4), RecipeRun(E3M4, weights=E3M4)
    with torch.no_grad():
        assert torch.equal(plain(model, x), split(model, x))
        assert plain.events == split.events
        chan = RecipeRun(E3M4, weights=Recipe(name="w", inputs="e3m4_ieee", scaling="channel"))
        assert not torch.equal(chan(model, x), plain(model, x))
    assert chan.events["h0.attn.c_attn"]["flushed"] < split.events["h0.attn.c_attn"]["flushed"]


def test_causal_runs_skip_masked_keys_and_eager_runs_do_not():
    """attention='causal' is the model's SDPA call, which fpsim.emulate computes skipping
    masked keys: the same logits as eager while the values are finite."""
    model, x = _tiny()
    attention = {"h0.attn.qk": E3M4, "h0.attn.av": E3M4}
    with torch.no_grad():
        assert torch.equal(RecipeRun(E3M4, attention="causal")(model, x),
                           RecipeRun(E3M4)(model, x))
        assert torch.equal(RecipeRun(attention, attention="causal")(model, x),
                           RecipeRun(attention)(model, x))
        assert not torch.equal(RecipeRun(attention)(model, x), RecipeRun({})(model, x))


def test_emulated_causal_sdpa_skips_masked_keys():
    """fpsim.emulate's scaled_dot_product_attention(is_causal=True) never reads a masked key:
    an inf value at the last key reaches the last query only; the same mask given as a tensor
    is the eager product (0 * inf: NaN at every earlier query)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 4, 8, generator=g) for _ in range(3))
    v[0, 0, 3, 0] = math.inf
    keep = torch.ones(4, 4, dtype=torch.bool).tril()
    with torch.no_grad(), fpsim.emulate(FP32):
        causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        masked = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    assert torch.isfinite(causal[0, 0, :3]).all() and causal[0, 0, 3, 0] == math.inf
    assert torch.isnan(masked[0, 0, :3, 0]).all()
    assert torch.equal(causal[0, 0, :, 1:], masked[0, 0, :, 1:])


def test_every_overflowing_element_is_recorded_with_its_window():
    x = torch.zeros(2, 3, 4)
    x[1, 2, 3], x[0, 1, 0] = 40.0, -17.0                      # past e3m4's rounding limit 15.75
    ops = RecipeRun(E3M4)
    ops.window0 = 8
    events: dict = {}
    y = layernorm(E3M4, x, torch.ones(4), torch.zeros(4), 1e-5, events)
    ops.watch("transformer.h.2.ln_1:layer_norm", "norm", E3M4, (x,), events, y)
    where = sorted((o["window"], o["index"], o["value"]) for o in ops.overflows)
    assert where == [(8, [1, 0], -17.0), (9, [2, 3], 40.0)]
    assert ops.events["h2.ln_1"]["overflow"] == 2
