"""What a worker computes: a shard's FP32 reference logits, and one task's metrics against them.

A task is one (model, recipe, seed, shard of windows).  Its windows are cut from the held-out
text in batches of ``Sweep.batch`` whatever executor runs it, so a per-tensor scale sees the
same batch everywhere, and every metric is kept per window (``fpsim_experiments.endtoend.
compare_logits``): combined in window order, they are the numbers one pass over all windows
gives.  Models and token ids are loaded once per process and kept (``load``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

import fpsim
from fpsim.emulation.recipe import FP32

from ..endtoend import compare_logits
from ..gpt2.checkpoint import load_gpt2
from ..gpt2.data import heldout_text
from ..gpt2.tokenizer import encode_bytes, load_bpe
from ..report import versions
from .config import Sweep, display


@dataclass(frozen=True)
class Task:
    """One unit of work: ``recipe`` on ``model`` over the held-out windows ``windows`` (indices,
    ``window`` tokens each) drawn for ``seed``; ``shard`` numbers it within (model, seed)."""

    model: str
    recipe: str
    seed: int
    shard: int
    windows: tuple[int, ...]
    window: int

    @property
    def ref_key(self) -> tuple[str, int, int]:
        """The reference logits it is compared with: one per (model, seed, shard)."""
        return (self.model, self.seed, self.shard)

    @property
    def name(self) -> str:
        return f"{display(self.model)} | {self.recipe} | seed {self.seed} | shard {self.shard}"

    @property
    def slug(self) -> str:
        """The readable part of its task file's name."""
        return f"{display(self.model)}-{self.recipe}-s{self.seed}-{self.shard}"


def config(model: str) -> dict[str, Any]:
    """The model directory's config.json."""
    return json.loads((Path(model) / "config.json").read_text())


def positions(model: str) -> int | None:
    """How many tokens the model takes (None: its config does not say)."""
    cfg = config(model)
    return cfg.get("n_positions") or cfg.get("max_position_embeddings")


@functools.lru_cache(maxsize=8)
def token_ids(model: str, text: str | None) -> Tensor:
    """The held-out text (a file, None: fpsim's held-out text) as ``model``'s token ids: bytes
    for a 256-token vocabulary, else the directory's tokenizer.json."""
    body = heldout_text() if text is None else Path(text).read_text(encoding="utf-8")
    vocab = config(model).get("vocab_size")
    if (Path(model) / "tokenizer.json").is_file():
        ids = torch.tensor(load_bpe(model).encode(body).ids, dtype=torch.long)
    elif vocab == 256:
        ids = encode_bytes(body)
    else:
        raise ValueError(f"model {display(model)}: no tokenizer.json and its vocabulary "
                         f"({vocab}) is not the 256 bytes; save the tokenizer beside the model")
    if vocab is not None and ids.numel() and int(ids.max()) >= vocab:
        raise ValueError(f"model {display(model)}: tokenizer.json gives token id "
                         f"{int(ids.max())} but the vocabulary has {vocab}; save the model's "
                         "own tokenizer")
    return ids


def draw_windows(available: int, wanted: int, seed: int) -> list[int]:
    """``wanted`` of ``available`` non-overlapping windows, drawn without replacement by a
    torch generator seeded with ``seed`` (the same picks on any machine), in text order."""
    order = torch.randperm(available, generator=torch.Generator().manual_seed(seed))
    return sorted(order[:wanted].tolist())


def cut(ids: Tensor, window: int, indices: tuple[int, ...]) -> Tensor:
    """Windows ``[len(indices), window + 1]`` (inputs plus next-token targets) of ``ids``."""
    idx = torch.tensor(indices)[:, None] * window + torch.arange(window + 1)
    return ids[idx]


@functools.lru_cache(maxsize=2)
def load(model: str, device: str) -> Any:
    """The FP32 model in ``model`` on ``device``, eval mode: fpsim's GPT-2 for ``gpt2``
    checkpoints, else transformers' causal LM (loaded once per process)."""
    if config(model).get("model_type") == "gpt2":
        return load_gpt2(model, torch.float32).to(device)
    try:
        import transformers
    except ImportError:
        raise ValueError(f"model {display(model)} needs transformers (pip install "
                         "transformers)") from None
    return transformers.AutoModelForCausalLM.from_pretrained(
        model, local_files_only=True, dtype=torch.float32).to(device).eval()


def _logits(net: Any, x: Tensor) -> Tensor:
    out = net(x)
    return (out if isinstance(out, Tensor) else out.logits).float().cpu()


@torch.no_grad()
def _forward(sweep: Sweep, task: Task, rules: Any, device: str,
             capture: bool = False) -> tuple[Tensor, list[Tensor], Any]:
    net = load(task.model, device)
    wins = cut(token_ids(task.model, sweep.text), task.window, task.windows)
    with fpsim.emulate(rules, capture=capture) as em:
        outs = [_logits(net, chunk[:, :-1].to(device)) for chunk in wins.split(sweep.batch)]
    return wins, outs, em


def reference(sweep: Sweep, task: Task, device: str = "cpu") -> np.ndarray:
    """FP32 reference logits ``[windows, window, vocab]`` (float32) of ``task``'s windows: every
    dot product in FP64 rounded once to FP32, so the bits do not depend on threads or batch."""
    return torch.cat(_forward(sweep, task, FP32, device)[1]).numpy()


def compute(sweep: Sweep, task: Task, ref: np.ndarray, device: str = "cpu") -> dict[str, Any]:
    """``task``'s recipe against the reference logits ``ref``: per-window sums of loss, KL,
    top-1, finite positions (``windows``), the per-site statistics summed over the task's
    batches (``sites``, with ``capture``), what computed them (``versions``) and how long it
    took (``seconds``, without the reference)."""
    start = time.perf_counter()
    wins, outs, em = _forward(sweep, task, sweep.recipes[task.recipe], device, sweep.capture)
    ref_batches = list(torch.from_numpy(np.array(ref)).split(sweep.batch))
    e2e = compare_logits(wins, ref_batches, outs, sweep.batch)
    sites = [dataclasses.asdict(s) for s in em.sites.values()] if sweep.capture else None
    return {"windows": e2e["windows"], "sites": sites, "versions": versions(),
            "seconds": round(time.perf_counter() - start, 3)}


@dataclass(frozen=True)
class SweepWork:
    """What an executor runs for ``sweep``'s tasks (``reference``, ``compute``)."""

    sweep: Sweep

    def reference(self, task: Task, device: str) -> np.ndarray:
        return reference(self.sweep, task, device)

    def compute(self, task: Task, ref: np.ndarray, device: str) -> dict[str, Any]:
        return compute(self.sweep, task, ref, device)
