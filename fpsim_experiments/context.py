"""What every experiment shares: the model, held-out windows, captured sites and FP32 references.

Built once per command line (``fpsim experiment all`` shares it between experiments).  The
end-to-end metrics use ``Sizes.tokens`` held-out tokens.  The sites are captured on the first
``Sizes.capture_windows`` windows and *streamed*, never held together: ``Context.stream``
runs the capture's forward pass and hands each site over as a ``Captured`` (the whole
site for activation statistics, ``sites``: the subsample for the per-site replay, and
``emulation``: a smaller one for recipes whose accumulator ``fpsim.matmul`` emulates one
addition at a time, with their FP64 references), which the consumer uses and drops before the
next one.  Memory is one site's operands plus the model, whatever the depth.  The trade-off:
every experiment that replays sites runs that forward pass again (``all`` shares the model,
the windows and the reference logits, not the captured operands); it is deterministic, so the
sites are the same bits every time, and it costs one reference forward pass of
``capture_windows`` windows, a few seconds at GPT-2 124M's size.

Everything lives on one device (``build(device=...)``): on CUDA the model, the windows, the
captures, the references and every replay stay on the GPU, and fpsim's ``"auto"`` engine choice
runs the emulation there (Triton kernels for FP32 casts and MX blocks, the torch engine for the
rest), which gives the CPU's bits on the same operands.  The model's own FP32 GELU (torch's tanh
and pow) and float64 BLAS/libm calls are the device's and may differ from the CPU's in the last
bit.  Tensors become NumPy only where numbers are reported.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from . import bootstrap, endtoend, replay
from .capture import Site, stream
from .gpt2.checkpoint import SYNTHETIC_KEY, load_gpt2, resolve_checkpoint
from .gpt2.data import heldout_bytes, heldout_text, windows
from .gpt2.model import GPT2, site_names, site_order
from .gpt2.tokenizer import load_bpe
from .progress import bar as progress_bar
from .recipes import FP32, FP64, Recipe
from .report import versions
from .sweep import runs as e2e_runs

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = REPO / "fpsim_experiments" / "gpt2" / "tiny"
BLOCK = 256  # tokens per window (at most the model's n_positions)


@dataclass(frozen=True)
class Sizes:
    """How much data: end-to-end tokens, captured windows, and site subsamples (None: whole)."""

    tokens: int
    capture_windows: int
    rows: int | None
    cols: int | None
    emulation_rows: int
    emulation_cols: int


#: ``tokens`` that takes every held-out window (more than any text holds): the default.
ALL_TOKENS = 2**62
#: Held-out tokens of the experiments that train or load other models (``model-seeds``,
#: ``any-model``), where every window would multiply an already long run.
SUBSET_TOKENS = 8192
FULL = Sizes(
    tokens=ALL_TOKENS, capture_windows=4, rows=None, cols=None, emulation_rows=64,
    emulation_cols=64
)
SUBSET = dataclasses.replace(FULL, tokens=SUBSET_TOKENS)
QUICK = Sizes(tokens=512, capture_windows=1, rows=64, cols=128, emulation_rows=8, emulation_cols=16)


def heldout_tokens(model: GPT2, checkpoint: Path) -> Tensor:
    """Held-out text as token ids: bytes for a 256-token vocabulary, else the checkpoint's BPE."""
    if model.config.vocab_size == 256:
        return heldout_bytes()
    return torch.tensor(load_bpe(checkpoint).encode(heldout_text()).ids, dtype=torch.long)


def display_name(model: str | Path) -> str:
    """``model`` as given, or relative to the repository when it is a path inside it."""
    p = Path(model).resolve()
    return str(p.relative_to(REPO)) if p.exists() and p.is_relative_to(REPO) else str(model)


def synthetic_note(checkpoint: Path) -> str | None:
    """The description a synthetic checkpoint carries in ``config.json`` (key
    ``fpsim_synthetic``, e.g. written by ``fpsim_experiments.gpt2.massive``), else None: reports print
    it so that numbers from a stress model are never read as a trained model's."""
    note = json.loads((checkpoint / "config.json").read_text()).get(SYNTHETIC_KEY)
    return str(note) if note else None


def _subsample(site: Site, rows: int | None, cols: int | None, gen: torch.Generator) -> Site:
    """``site`` subsampled to ``rows`` x ``cols`` (``cols`` None: ``rows``), or whole when
    ``rows`` is None."""
    return site if rows is None else site.subsample(rows, cols or rows, gen)


class Captured:
    """One captured site as ``Context.stream`` hands it over: whole (``full``), subsampled
    for the replay (``sites``) and for emulated accumulators (``emulation``), and the FP64
    references of both subsamples (computed when first asked for)."""

    def __init__(self, full: Site, sites: Site, emulation: Site) -> None:
        self.full, self.sites, self.emulation = full, sites, emulation

    @property
    def name(self) -> str:
        return self.full.name

    @functools.cached_property
    def ref(self) -> Tensor:
        """``replay.reference`` of ``sites``."""
        return replay.reference(self.sites)

    @functools.cached_property
    def emulation_ref(self) -> Tensor:
        """``replay.reference`` of ``emulation``."""
        return replay.reference(self.emulation)

    def for_recipe(self, recipe: Recipe) -> tuple[Site, Tensor]:
        """The subsample ``recipe`` is replayed on (``emulation`` when its accumulator is
        emulated) and its reference."""
        return (self.emulation, self.emulation_ref) if recipe.emulated else (self.sites, self.ref)


@dataclass
class Context:
    """Model, data and FP32 reference logits shared by the experiments; captured sites are
    streamed (``stream``)."""

    model: GPT2
    model_name: str
    wins: Tensor
    sizes: Sizes
    quick: bool
    seed: int = 0
    batch_size: int = 8
    synthetic: str | None = None
    #: the call of ``build`` that made it, taking ``device`` (None: made otherwise; its
    #: end-to-end runs run in this process only)
    source: Callable[..., Context] | None = None
    #: where its end-to-end runs are computed (``end_to_end_runs``)
    execution: e2e_runs.Execution = field(default_factory=e2e_runs.Execution)

    @property
    def device(self) -> torch.device:
        """Where the model, the windows and the captured sites live."""
        return self.wins.device

    @functools.cached_property
    def ref_logits(self) -> list[Tensor]:
        """The FP32 reference logits of every batch of windows (computed when first needed:
        a worker that is handed them never computes them)."""
        return endtoend.logits(self.model, self.wins, batch_size=self.batch_size)

    @functools.cached_property
    def model64(self) -> GPT2:
        """The model in float64 (the FP64 baseline's)."""
        return copy.deepcopy(self.model).double()

    @property
    def tokens(self) -> int:
        return self.wins.shape[0] * (self.wins.shape[1] - 1)

    @property
    def site_names(self) -> list[str]:
        """The model's sites in forward order: the names ``stream`` hands over."""
        return site_names(self.model.config)

    @property
    def capture_tokens(self) -> int:
        """Token rows of every captured site (the first ``capture_windows`` windows)."""
        return min(self.sizes.capture_windows, self.wins.shape[0]) * (self.wins.shape[1] - 1)

    def stream(self, consume: Callable[[Captured], None]) -> None:
        """Capture the sites and call ``consume`` on each, in forward order, as soon as the
        forward pass has computed it; none is kept here.

        The subsamples are drawn site after site from generators seeded with ``seed`` (one
        for ``sites``, one for ``emulation``), so every pass gives the same picks, on any
        device.
        """
        s = self.sizes
        gen = torch.Generator().manual_seed(self.seed)
        emulation_gen = torch.Generator().manual_seed(self.seed)

        def each(site: Site) -> None:
            consume(Captured(site, _subsample(site, s.rows, s.cols, gen),
                             _subsample(site, s.emulation_rows, s.emulation_cols, emulation_gen)))

        stream(self.model, self.wins[: s.capture_windows, :-1], each)

    def replay(self, recipes: Sequence[Recipe], where: Callable[[str], bool] | None = None,
               desc: str | None = None) -> list[dict[str, dict]]:
        """Per-site statistics of each recipe (on the ``emulation`` subsample when its
        accumulator is emulated), from one capture pass: each site is replayed under every
        recipe, then dropped.  ``where``: which site names to replay (default: all)."""
        out: list[dict[str, dict]] = [{} for _ in recipes]
        bar = progress_bar(len(self.site_names), desc, "site")

        def each(c: Captured) -> None:
            if where is None or where(c.name):
                for recipe, stats in zip(recipes, out):
                    site, ref = c.for_recipe(recipe)
                    stats[c.name] = replay.replay_site(site, recipe, ref)
            bar.update()

        self.stream(each)
        bar.close()
        return out

    def end_to_end_ops(self, ops: endtoend.RecipeRun, ref: list[Tensor] | None = None,
                       model: GPT2 | None = None) -> dict[str, Any]:
        """End-to-end metrics of the run ``ops`` against the FP32 reference (``ref``, default
        ``ref_logits``) with bootstrap CIs, on ``model`` (default: the model).

        Loss, perplexity, KL, KL over finite positions, top-1 agreement (each with ``ci``), the
        sites with inf/NaN outputs and, per site, operand elements overflowed/saturated/flushed.
        """
        ref = self.ref_logits if ref is None else [r.to(self.device) for r in ref]
        metrics = endtoend.compare(self.model if model is None else model, self.wins, ref, ops,
                                   self.batch_size)
        events = {
            n: e
            for n, e in sorted(ops.events.items(), key=lambda kv: site_order(kv[0]))
            if e["elements"]
        }
        return {
            **metrics,
            "ci": bootstrap.intervals(metrics["windows"]),
            "nonfinite_sites": sorted(ops.nonfinite, key=site_order),
            "events": events,
        }

    def end_to_end_runs(self, runs: Sequence[e2e_runs.Run], label: str,
                        desc: str | None = None) -> list[dict[str, Any]]:
        """Every run's result in order (``e2e``: ``end_to_end_ops``; ``overflows``;
        ``seconds``), computed on ``execution`` (this process, a pool or Ray: the same
        numbers), task files under ``label`` (``fpsim_experiments.sweep.runs``)."""
        return e2e_runs.execute(self, runs, label, desc)

    def run(self, recipes: Sequence[Recipe], e2e: Callable[[Recipe], bool] | bool = True,
            desc: str | None = None) -> list[dict[str, Any]]:
        """For each recipe: the recipe, its per-site statistics (``replay``, one capture pass
        for all), their summary and, where ``e2e`` (a flag or a test of the recipe), its
        end-to-end metrics (``end_to_end_runs``)."""
        stats = self.replay(recipes, desc=None if desc is None else f"{desc} replay")
        wanted = [e2e(r) if callable(e2e) else e2e for r in recipes]
        done = iter(self.end_to_end_runs(
            [e2e_runs.recipe_run(r.name, r) for r, w in zip(recipes, wanted) if w], "recipes",
            desc))
        out = []
        for recipe, sites, w in zip(recipes, stats, wanted):
            run = {"recipe": recipe.to_json(), "summary": replay.summary(sites), "sites": sites}
            out.append({**run, "e2e": next(done)["e2e"]} if w else run)
        return out

    @functools.cached_property
    def baseline(self) -> dict[str, dict[str, float]]:
        """End to end: the FP32 recipe, and the model run entirely in FP64 (against the
        reference)."""
        fp32, fp64 = self.end_to_end_runs(
            [e2e_runs.recipe_run("fp32", FP32),
             e2e_runs.Run("fp64", functools.partial(endtoend.RecipeRun, FP64), fp64=True)],
            "baseline")
        return {"fp32": fp32["e2e"], "fp64": fp64["e2e"]}

    def meta(self) -> dict[str, Any]:
        """What the numbers were measured on."""
        s, captured = self.sizes, self.capture_tokens
        return {
            "model": self.model_name,
            "config": self.model.config.to_hf_dict(),
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "tokens": self.tokens,
            "window": self.wins.shape[1] - 1,
            "capture_tokens": captured,
            "replay_rows": captured if s.rows is None else min(s.rows, captured),
            "emulation_rows": min(s.emulation_rows, captured),
            "quick": self.quick,
            **({"synthetic": self.synthetic} if self.synthetic else {}),
            "device": self.device.type,
            **versions(),
        }


def build(
    model: str | Path = DEFAULT_MODEL,
    sizes: Sizes = FULL,
    quick: bool = False,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> Context:
    """Load the model and held-out data onto ``device`` and compute the reference logits there
    (sites are captured when an experiment streams them)."""
    checkpoint = resolve_checkpoint(model)
    net = load_gpt2(checkpoint, torch.float32).to(device)
    block = min(BLOCK, net.config.n_positions)
    wins = windows(heldout_tokens(net, checkpoint), block, max(1, sizes.tokens // block))
    wins = wins.to(device)
    batch = (
        8 if net.config.vocab_size <= 4096 else 1
    )  # a GPT-2 vocabulary makes float64 logits large
    note = synthetic_note(checkpoint)
    name = display_name(model) + (" [SYNTHETIC]" if note else "")
    return Context(net, name, wins, sizes, quick, seed, batch, note,
                   functools.partial(build, str(checkpoint), sizes, quick, seed))
