"""Captured sites are streamed: the experiments hold one site at a time, whatever the depth.

Every :class:`fpsim_experiments.capture.Site` ever built is tracked (a weak set filled by a wrapped
``Site.__init__``) and the most alive at once is recorded while the experiments that consume
sites run on random checkpoints of 1 and 3 layers.  CPython frees a dropped Site at once, so
the count is exact: it must be the same small number at both depths (holding every capture
would make it grow by the 8 sites of each extra block).
"""

from __future__ import annotations

import json
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch

from fpsim_experiments import accumulation, activations, context, deepseek, histograms
from fpsim_experiments.capture import Site, capture
from fpsim_experiments.gpt2.checkpoint import save_gpt2
from fpsim_experiments.gpt2.model import GPT2, GPT2Config, site_kind, site_names
from fpsim_experiments.recipes import Recipe

SIZES = context.Sizes(tokens=128, capture_windows=2, rows=8, cols=8, emulation_rows=2,
                      emulation_cols=4)
RECIPES = (Recipe("e4m3", scaling="tensor", name="e4m3/tensor"),
           Recipe("bf16", accum="bf16", order="sequential", output="bf16", name="bf16 acc"))
#: The most Sites alive at once: the whole site, its two subsamples and an FP64 copy of one of
#: them while its reference is computed.
MOST_ALIVE = 4


class AliveSites:
    """Tracks every Site built while active; ``most`` is the largest number alive at once."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.alive: weakref.WeakSet[Site] = weakref.WeakSet()
        self.most = 0
        init = Site.__init__

        def tracked(site: Site, *args: Any, **kwargs: Any) -> None:
            init(site, *args, **kwargs)
            self.alive.add(site)
            self.most = max(self.most, len(self.alive))

        monkeypatch.setattr(Site, "__init__", tracked)


def _context(tmp: Path, layers: int) -> context.Context:
    torch.manual_seed(layers)
    cfg = GPT2Config(n_layer=layers, n_head=2, n_embd=32, n_positions=64, vocab_size=256)
    save_gpt2(GPT2(cfg), tmp / f"gpt2-{layers}")
    return context.build(tmp / f"gpt2-{layers}", SIZES, quick=True)


def _consume_every_way(ctx: context.Context) -> None:
    """Every way the experiments consume captured sites."""
    ctx.run(RECIPES, e2e=False)                       # fp8, fp16-vs-bf16, range-vs-precision
    ctx.replay(RECIPES, where=lambda n: site_kind(n) == "linear")          # practice
    activations.run(ctx)
    accumulation.run(ctx)
    histograms.run(ctx)
    deepseek.gpt2(ctx, deepseek.Sizes((13,), (), 0, rows=4, cols=8), workers=1)


@pytest.mark.parametrize("layers", [1, 3])
def test_sites_alive_at_once_do_not_grow_with_depth(tmp_path: Path, layers: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = _context(tmp_path, layers)
    alive = AliveSites(monkeypatch)
    _consume_every_way(ctx)
    assert alive.most == MOST_ALIVE
    assert len(alive.alive) == 0


def test_holding_every_capture_is_what_the_counter_catches(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The counter sees a capture that keeps its sites: 8 per block plus ln_f and lm_head."""
    ctx = _context(tmp_path, 3)
    alive = AliveSites(monkeypatch)
    sites, _ = capture(ctx.model, ctx.wins[:1, :-1])
    assert alive.most == len(sites) == 3 * 8 + 2


def test_site_names_and_kinds_are_what_a_capture_records(tmp_path: Path) -> None:
    ctx = _context(tmp_path, 3)
    sites, _ = capture(ctx.model, ctx.wins[:1, :-1])
    assert list(sites) == site_names(ctx.model.config) == ctx.site_names
    assert {n: s.kind for n, s in sites.items()} == {n: site_kind(n) for n in sites}


def test_streamed_replay_is_the_held_replay(tmp_path: Path) -> None:
    """Replaying streamed sites gives the statistics of replaying the held, subsampled sites."""
    from fpsim_experiments import replay

    ctx = _context(tmp_path, 3)
    sites, _ = capture(ctx.model, ctx.wins[: SIZES.capture_windows, :-1])
    gen, emulation_gen = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    small = {n: s.subsample(SIZES.rows, SIZES.cols, gen) for n, s in sites.items()}
    tiny = {n: s.subsample(SIZES.emulation_rows, SIZES.emulation_cols, emulation_gen)
            for n, s in sites.items()}
    want = [replay.replay(tiny if r.emulated else small, r) for r in RECIPES]
    assert json.dumps(ctx.replay(RECIPES)) == json.dumps(want)     # NaN compares equal here
