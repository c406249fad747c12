"""Language models as study models: windows of text, next-token KL and top-1 against FP32.

:class:`TinyGPT2` is the project's tiny byte-level GPT-2 (``fpsim_experiments/gpt2/tiny``) on
its held-out windows, the windows of the range-vs-precision study; :class:`CausalLM` any
Hugging Face causal-LM directory on the prose of :mod:`..texts` tokenized by the directory's
tokenizer.

>>> a = TinyGPT2(); wins = a.inputs(2); len(a.run(a.model(), wins))
2
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor

from .. import context
from ..gpt2.checkpoint import load_gpt2
from ..gpt2.data import windows
from .base import LOGIT_METRICS, Adapter, Scores, batches, logit_scores

BATCH = 8


class WindowLM(Adapter):
    """A causal LM on windows of token ids ``[T + 1]`` (inputs, then the next token)."""

    unit = "window"
    metrics: ClassVar[dict[str, str]] = LOGIT_METRICS
    sizes: ClassVar[dict[str, int]] = {"quick": 4, "full": 64}
    block = context.BLOCK

    def token_ids(self, model: Any) -> Tensor:
        raise NotImplementedError

    def logits(self, model: Any, ids: Tensor) -> Tensor:
        return model(ids).logits

    def inputs(self, n: int) -> list[Tensor]:
        wins = windows(self.token_ids(self.model()), self.block)
        if n > len(wins):
            raise ValueError(f"{self.name}: asked for {n} windows of {self.block} tokens; the "
                             f"text has {len(wins)}")
        return list(wins[:n])

    def describe(self, units: list[Tensor]) -> dict[str, Any]:
        return {"units": len(units), "tokens": sum(len(u) - 1 for u in units),
                "window": self.block}

    @torch.no_grad()
    def run(self, model: Any, units: list[Tensor], ref: list[Any] | None = None) -> list[Tensor]:
        out: list[Tensor] = []
        for chunk in batches(units, BATCH):
            out += list(self.logits(model, torch.stack(chunk)[:, :-1]))
        return out

    def score(self, units: list[Tensor], ref: list[Tensor], out: list[Tensor]) -> Scores:
        return logit_scores(ref, out)


class TinyGPT2(WindowLM):
    """The tiny byte-level GPT-2 the project trained, on its held-out windows."""

    name = "tiny"
    sizes: ClassVar[dict[str, int]] = {"quick": 4, "full": 125}

    def __init__(self, checkpoint: str | Path = context.DEFAULT_MODEL) -> None:
        self.checkpoint = Path(checkpoint)

    def build(self) -> Any:
        return load_gpt2(self.checkpoint, torch.float32).eval()

    def token_ids(self, model: Any) -> Tensor:
        self.block = min(context.BLOCK, model.config.n_positions)
        return context.heldout_tokens(model, self.checkpoint)

    def logits(self, model: Any, ids: Tensor) -> Tensor:
        return model(ids)
