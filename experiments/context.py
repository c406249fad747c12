"""What every experiment shares: the model, held-out windows, captured sites and FP32 references.

Built once per command line (``fpsim experiment all`` shares it between experiments).  The
end-to-end metrics use ``Sizes.tokens`` held-out tokens.  The sites are captured on the first
``Sizes.capture_windows`` windows; ``full_sites`` keeps them whole (activation statistics),
``sites`` may subsample them for the per-site replay, and ``emulation_sites`` subsamples them
further for recipes whose accumulator :func:`fpsim.matmul` emulates one addition at a time.

Everything lives on one device (``build(device=...)``): on CUDA the model, the windows, the
captures, the references and every replay stay on the GPU, and fpsim's ``"auto"`` engine choice
runs the emulation there (Triton kernels for FP32 casts and MX blocks, the torch engine for the
rest), which gives the CPU's bits on the same operands.  The model's own FP32 GELU (torch's tanh
and pow) and float64 BLAS/libm calls are the device's and may differ from the CPU's in the last
bit.  Tensors become NumPy only where numbers are reported.
"""

from __future__ import annotations

import copy
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from . import bootstrap, endtoend, replay
from .capture import Site, capture
from .gpt2.checkpoint import SYNTHETIC_KEY, load_gpt2, resolve_checkpoint
from .gpt2.data import heldout_bytes, heldout_text, windows
from .gpt2.model import GPT2, site_order
from .gpt2.tokenizer import load_bpe
from .recipes import FP32, FP64, Recipe
from .report import versions

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = REPO / "experiments" / "gpt2" / "tiny"
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


FULL = Sizes(
    tokens=8192, capture_windows=4, rows=None, cols=None, emulation_rows=64, emulation_cols=64
)
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
    ``fpsim_synthetic``, e.g. written by :mod:`experiments.gpt2.massive`), else None: reports print
    it so that numbers from a stress model are never read as a trained model's."""
    note = json.loads((checkpoint / "config.json").read_text()).get(SYNTHETIC_KEY)
    return str(note) if note else None


def _subsample(
    sites: dict[str, Site], rows: int | None, cols: int | None, seed: int
) -> dict[str, Site]:
    if rows is None:
        return sites
    gen = torch.Generator().manual_seed(seed)
    return {n: s.subsample(rows, cols or rows, gen) for n, s in sites.items()}


@dataclass
class Context:
    """Model, data, captured sites and references shared by the experiments."""

    model: GPT2
    model_name: str
    wins: Tensor
    full_sites: dict[str, Site]
    sizes: Sizes
    quick: bool
    seed: int = 0
    batch_size: int = 8
    synthetic: str | None = None
    sites: dict[str, Site] = field(init=False)
    emulation_sites: dict[str, Site] = field(init=False)
    ref_logits: list[Tensor] = field(init=False)

    @property
    def device(self) -> torch.device:
        """Where the model, the windows and the captured sites live."""
        return self.wins.device

    def __post_init__(self) -> None:
        s = self.sizes
        self.sites = _subsample(self.full_sites, s.rows, s.cols, self.seed)
        self.emulation_sites = _subsample(
            self.full_sites, s.emulation_rows, s.emulation_cols, self.seed
        )
        self._refs = {
            id(self.sites): replay.references(self.sites),
            id(self.emulation_sites): replay.references(self.emulation_sites),
        }
        self.ref_logits = endtoend.logits(self.model, self.wins, batch_size=self.batch_size)

    @property
    def tokens(self) -> int:
        return self.wins.shape[0] * (self.wins.shape[1] - 1)

    def refs(self, sites: dict[str, Site]) -> dict[str, Tensor]:
        """FP64 references of ``sites`` (``sites`` or ``emulation_sites``)."""
        return self._refs[id(sites)]

    def end_to_end(self, recipe: Recipe | dict[str, Recipe]) -> dict[str, Any]:
        """End-to-end metrics of ``recipe`` against the FP32 reference, with bootstrap CIs.

        Loss, perplexity, KL, KL over finite positions, top-1 agreement (each with ``ci``), the
        sites with inf/NaN outputs and, per site, operand elements overflowed/saturated/flushed.
        """
        return self.end_to_end_ops(endtoend.RecipeOps(recipe))

    def end_to_end_ops(self, ops: endtoend.RecipeOps) -> dict[str, Any]:
        """:meth:`end_to_end` with a ready ops object (e.g. one that keeps state between calls)."""
        metrics = endtoend.compare(self.model, self.wins, self.ref_logits, ops, self.batch_size)
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

    def replay(self, recipe: Recipe) -> dict[str, dict]:
        """Per-site statistics of ``recipe`` (on ``emulation_sites`` when its accumulator is
        emulated)."""
        sites = self.emulation_sites if recipe.emulated else self.sites
        return replay.replay(sites, recipe, self.refs(sites), cache={})

    def run(self, recipe: Recipe, e2e: bool = True) -> dict[str, Any]:
        """The recipe, its per-site statistics, their summary and (if ``e2e``) its end-to-end
        metrics."""
        sites = self.replay(recipe)
        out = {"recipe": recipe.to_json(), "summary": replay.summary(sites), "sites": sites}
        return {**out, "e2e": self.end_to_end(recipe)} if e2e else out

    @functools.cached_property
    def baseline(self) -> dict[str, dict[str, float]]:
        """End to end: the FP32 recipe, and the model run entirely in FP64 (against the
        reference)."""
        m64 = copy.deepcopy(self.model).double()
        fp64 = endtoend.compare(
            m64, self.wins, self.ref_logits, endtoend.RecipeOps(FP64), self.batch_size
        )
        return {"fp32": self.end_to_end(FP32), "fp64": fp64}

    def meta(self) -> dict[str, Any]:
        """What the numbers were measured on."""

        def rows(sites: dict[str, Site]) -> int:
            site = sites["lm_head"]
            return int(site.a.reshape(-1, site.reduction).shape[0])

        return {
            "model": self.model_name,
            "config": self.model.config.to_hf_dict(),
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "tokens": self.tokens,
            "window": self.wins.shape[1] - 1,
            "capture_tokens": rows(self.full_sites),
            "replay_rows": rows(self.sites),
            "emulation_rows": rows(self.emulation_sites),
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
    """Load the model and held-out data onto ``device``, capture the sites and compute the
    references there."""
    checkpoint = resolve_checkpoint(model)
    net = load_gpt2(checkpoint, torch.float32).to(device)
    block = min(BLOCK, net.config.n_positions)
    wins = windows(heldout_tokens(net, checkpoint), block, max(1, sizes.tokens // block))
    wins = wins.to(device)
    sites, _ = capture(net, wins[: sizes.capture_windows, :-1])
    batch = (
        8 if net.config.vocab_size <= 4096 else 1
    )  # a GPT-2 vocabulary makes float64 logits large
    note = synthetic_note(checkpoint)
    name = display_name(model) + (" [SYNTHETIC]" if note else "")
    return Context(net, name, wins, sites, sizes, quick, seed, batch, note)
