"""fpsim.emulate(watch=...): every emulated product and LayerNorm call, with its operands, its
events and its result, and nothing else changed."""

from __future__ import annotations

import pytest
import torch

import fpsim
from fpsim import Recipe, Rule, Rules


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.LayerNorm(8), torch.nn.Linear(8, 4),
                               torch.nn.Linear(4, 3, bias=False))


def test_watch_sees_every_emulated_call_with_the_counts_capture_sums() -> None:
    model, x = _model(), torch.randn(5, 8) * 40
    with torch.no_grad():
        model[1].weight.mul_(80)              # some weights past E3M4's 15.5: they overflow
    recipe = Recipe("e3m4_ieee", name="e3m4")
    rules = Rules([Rule(Recipe(name="fp32"), kind="norm"), Rule(None, path="2")], default=recipe)
    seen: list = []
    given: list = []

    def watch(site: str, kind: str, r: Recipe, operands: tuple, events: dict, y) -> None:
        seen.append((site, kind, r.name, [tuple(t.shape) for t in operands], events, y))
        given.append(operands)

    with torch.no_grad():
        with fpsim.emulate(rules, capture=True) as em:
            captured = model(x)
        with fpsim.emulate(rules, watch=watch) as watching:
            watched = model(x)
        with fpsim.emulate(rules):
            plain = model(x)
    assert watching.sites == {}                # watching is not capturing (no FP64 references)
    same = {"rtol": 0, "atol": 0, "equal_nan": True}
    torch.testing.assert_close(watched, plain, **same)
    torch.testing.assert_close(watched, captured, **same)
    # the linear left to torch (path "2") is not a call the recipe computed
    assert [(s, k, n, shapes) for s, k, n, shapes, _, _ in seen] == [
        ("0:layer_norm", "norm", "fp32", [(5, 8)]),
        ("1:linear", "linear", "e3m4", [(5, 8), (8, 4), (4,)])]    # a product's bias third
    assert torch.equal(given[1][1], model[1].weight.t()) and torch.equal(given[1][2], model[1].bias)
    linear = em.sites["1:linear"]
    events = seen[1][4]
    assert linear.overflow == events["a"]["overflow"] + events["b"]["overflow"] > 0
    assert linear.flushed == events["a"]["flushed"] + events["b"]["flushed"]
    assert linear.elements == events["a"]["elements"] + events["b"]["elements"] == 72
    with torch.no_grad():                     # the result seen is the one the model went on with
        torch.testing.assert_close(model[2](seen[1][5]), plain, **same)


def test_watch_must_be_callable() -> None:
    with pytest.raises(TypeError, match="watch"):
        fpsim.emulate(Recipe("e4m3"), watch="print")
