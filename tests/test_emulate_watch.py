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


def test_capture_alone_asks_the_accumulator_for_swamped_additions_only(monkeypatch) -> None:
    """capture records swamped additions, not the largest partial sums: it asks the emulated
    accumulator for those alone (``return_stats="swamped"``, counted faster), unless a watch,
    which sees every event, is there too; the table is the same either way."""
    from fpsim.emulation import sites

    asked: list = []
    real = sites.emulated_matmul

    def spy(*args, **kw):
        asked.append(kw["return_stats"])
        return real(*args, **kw)

    monkeypatch.setattr(sites, "emulated_matmul", spy)
    model, x = _model(), torch.randn(5, 8)
    with torch.no_grad():
        model[1].weight[:, 0] *= 1e4           # a first product that swamps the others
    fp16 = Recipe("fp16", accum="fp16", name="fp16")
    rules = Rules([Rule(fp16, kind="norm")], default=fp16)
    seen: list = []
    with torch.no_grad():
        with fpsim.emulate(rules, capture=True) as alone:
            model(x)
        assert "swamped" in asked and True not in asked       # False: a LayerNorm's mean
        asked.clear()
        with fpsim.emulate(rules, capture=True, watch=lambda *a: seen.append(a)) as watched:
            model(x)
    assert True in asked
    assert all(isinstance(ev["accum"]["max_partial"], float) for *_, ev, _ in seen)
    assert [s.row() for s in alone.sites.values()] == [s.row() for s in watched.sites.values()]
    assert sum(s.swamped or 0 for s in alone.sites.values()) > 0
