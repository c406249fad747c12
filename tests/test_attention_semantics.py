"""The two attention semantics of the emulated P·V site, the weight recipe of RecipeOps and its
record of every overflowing element."""

from __future__ import annotations

import math

import pytest
import torch

from fpsim_experiments.endtoend import RecipeOps
from fpsim_experiments.recipes import FP32, Recipe, causal_matmul, matmul

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
        RecipeOps(E3M4, attention="flash")


def test_a_weight_recipe_equal_to_the_site_recipe_gives_the_same_bits():
    g = torch.Generator().manual_seed(2)
    x, W, b = torch.randn(2, 5, 16, generator=g), torch.randn(16, 8, generator=g) * 0.1, None
    plain, split = RecipeOps(E3M4), RecipeOps(E3M4, weights=E3M4)
    assert torch.equal(plain.linear("h0.attn.c_attn", x, W, b),
                       split.linear("h0.attn.c_attn", x, W, b))
    assert plain.events == split.events
    chan = RecipeOps(E3M4, weights=Recipe(name="w", inputs="e3m4_ieee", scaling="channel"))
    y = chan.linear("h0.attn.c_attn", x, W, b)
    assert not torch.equal(y, plain.linear("h0.attn.c_attn", x, W, b))
    assert chan.events["h0.attn.c_attn"]["flushed"] < plain.events["h0.attn.c_attn"]["flushed"]


def test_every_overflowing_element_is_recorded_with_its_window():
    x = torch.zeros(2, 3, 4)
    x[1, 2, 3], x[0, 1, 0] = 40.0, -17.0                      # past e3m4's rounding limit 15.75
    ops = RecipeOps(E3M4)
    ops.window0 = 8
    ops.layernorm("h2.ln_1", x, torch.ones(4), torch.zeros(4), 1e-5)
    where = sorted((o["window"], o["index"], o["value"]) for o in ops.overflows)
    assert where == [(8, [1, 0], -17.0), (9, [2, 3], 40.0)]
    assert ops.events["h2.ln_1"]["overflow"] == 2
