"""The interface every model of the study implements, and the per-unit metrics they share.

A metric is scored unit by unit as a numerator and a denominator (KL summed over a window's
positions and its position count; word errors and reference words; 1 - cos and 1), so a value
is ``sum(num) / sum(den)`` and the bootstrap resamples units (:func:`..bootstrap.sums_ratio`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

Scores = dict[str, tuple[list[float], list[float]]]     # metric -> (num per unit, den per unit)


class Adapter:
    """A model of the study.

    ``name``: how reports call it; ``unit``: the independent unit its inputs come in;
    ``metrics``: metric -> what it is (the first is the one comparisons use; every metric is
    lower-is-better); ``sizes``: units of a ``--quick`` and of a full run; ``source``: what
    ``models.get`` made it from (None: made otherwise); ``piece``: units that ``run`` and
    ``score`` take this many at a time with the same results as all at once (a multiple
    of the model's batch, so every batch is the same; a study then holds one piece's outputs,
    not every unit's), or None (a metric that compares units with each other).
    """

    source: str | None = None
    name: str = ""
    unit: str = ""
    metrics: ClassVar[dict[str, str]] = {}
    sizes: ClassVar[dict[str, int]] = {}
    piece: int | None = None

    def build(self) -> Any:
        """The FP32 model in eval mode (a new one each call; :meth:`model` keeps one)."""
        raise NotImplementedError

    def model(self) -> Any:
        """The FP32 model of :meth:`build`, built once."""
        if getattr(self, "_model", None) is None:
            self._model = self.build()
        return self._model

    def inputs(self, n: int) -> list[Any]:
        """``n`` inputs (for Whisper: ``n`` sentences, packed into clips), deterministic."""
        raise NotImplementedError

    def describe(self, units: list[Any]) -> dict[str, Any]:
        """What the inputs are, for the report (counts, tokens, seconds...)."""
        return {"units": len(units)}

    def run(self, model: Any, units: list[Any], ref: list[Any] | None = None) -> list[Any]:
        """The model's outputs per unit (``ref``: the FP32 reference's outputs, for models
        whose run depends on them, e.g. Whisper's teacher forcing on the FP32 transcript)."""
        raise NotImplementedError

    def score(self, units: list[Any], ref: list[Any], out: list[Any]) -> Scores:
        """Every metric of :attr:`metrics`, per unit, of ``out`` against ``ref``."""
        raise NotImplementedError

    def trace(self, model: Any, units: list[Any], ref: list[Any]) -> None:
        """What the study's capture pass runs (default: :meth:`run`)."""
        self.run(model, units, ref)


LOGIT_METRICS = {"kl": "KL(FP32 ‖ format) of the next-token distribution, nats per position",
                 "top1_changed": "share of positions whose top-1 token differs from FP32's"}


def logit_scores(ref: list[Tensor], out: list[Tensor]) -> Scores:
    """KL(ref ‖ out) summed over each unit's positions (float64) and the positions whose
    argmax differs, each over the unit's positions (inf/NaN logits give a NaN KL)."""
    kl, miss, pos = [], [], []
    for r, z in zip(ref, out, strict=True):
        r, z = r.double().reshape(-1, r.shape[-1]), z.double().reshape(-1, z.shape[-1])
        logp, logq = F.log_softmax(r, -1), F.log_softmax(z, -1)
        # per position, then over the unit: the order of endtoend's per-window sums
        kl.append(float((logp.exp() * (logp - logq)).sum(-1).sum(-1)))
        miss.append(float((z.argmax(-1) != r.argmax(-1)).sum()))
        pos.append(float(r.shape[0]))
    return {"kl": (kl, pos), "top1_changed": (miss, pos)}


EMBEDDING_METRICS = {"one_minus_cos": "1 - cos(FP32 embedding, format embedding), per "
                                      "sentence",
                     "nn": "share of sentences whose nearest neighbour (cosine, among the "
                           "inputs) differs from FP32's"}


def embedding_scores(ref: list[Tensor], out: list[Tensor]) -> Scores:
    """1 - cos against FP32 per unit, and whether its nearest other unit by cosine changed."""
    r, z = torch.stack(ref).double(), torch.stack(out).double()
    cos = F.cosine_similarity(r, z, dim=-1)
    ones = [1.0] * len(ref)

    def nearest(e: Tensor) -> Tensor:
        e = F.normalize(e, dim=-1)
        sim = e @ e.T
        sim.fill_diagonal_(-torch.inf)
        return sim.nan_to_num(nan=-torch.inf).argmax(-1)

    changed = (nearest(r) != nearest(z)) | ~torch.isfinite(z).all(-1)
    return {"one_minus_cos": ([float(1 - c) for c in cos], ones),
            "nn": ([float(c) for c in changed], ones)}


def pieces(adapter: Adapter, n: int) -> list[slice]:
    """The slices of ``n`` units that ``adapter`` runs and scores apart (``Adapter.piece``).

    >>> pieces(Adapter(), 3)
    [slice(0, 3, None)]
    """
    step = adapter.piece or max(n, 1)
    return [slice(lo, lo + step) for lo in range(0, n, step)]


def batches(items: list[Any], size: int) -> list[list[Any]]:
    """``items`` in consecutive batches of ``size``."""
    return [items[i:i + size] for i in range(0, len(items), size)]


def mean_pool(hidden: Tensor, mask: Tensor) -> Tensor:
    """sentence-transformers' pooling: the attention-mask-weighted mean of the last hidden
    states (in torch, as sentence-transformers computes it).  Its L2 normalisation
    (``F.normalize(mean_pool(...), dim=1)`` is ``SentenceTransformer.encode``) is left out: the
    metrics are cosines, which it does not change, and under :func:`fpsim.emulate` a norm
    would count as a product not emulated."""
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
