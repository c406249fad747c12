"""Any local Hugging Face directory as a study model: a causal LM (windows of prose,
next-token KL), an encoder (sentences, mean-pooled embeddings: 1 - cos and nearest
neighbours) or an encoder-decoder (sentences, teacher-forced on the sentence itself:
next-token KL).  Text is tokenized with the directory's ``tokenizer.json`` (or as bytes when
the vocabulary is the 256 bytes).

>>> a = hf_adapter("path/to/dir"); a.kind
'causal'
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor

from .. import texts
from ..anymodel import context_length
from .base import (
    EMBEDDING_METRICS,
    LOGIT_METRICS,
    Adapter,
    Scores,
    batches,
    embedding_scores,
    logit_scores,
    mean_pool,
)
from .lm import WindowLM

BATCH = 16
MAX_TOKENS = 256     # tokens of a sentence at most (sentence-transformers' MiniLM limit)


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise SystemExit("a Hugging Face model needs transformers (pip install transformers, "
                         "or fpsim[models])") from None
    return transformers


class Tokens:
    """The directory's tokenizer.json, or bytes for a 256-token vocabulary."""

    def __init__(self, d: Path, vocab: int) -> None:
        self.tok = None
        if (d / "tokenizer.json").is_file():
            from tokenizers import Tokenizer
            self.tok = Tokenizer.from_file(str(d / "tokenizer.json"))
            self.tok.no_padding()
            self.tok.no_truncation()
        elif vocab != 256:
            raise SystemExit(f"{d} has no tokenizer.json and its vocabulary ({vocab}) is not the "
                             "256 bytes; save the tokenizer beside the model")
        self.vocab, self.d = vocab, d

    def __call__(self, text: str) -> list[int]:
        ids = list(text.encode()) if self.tok is None else self.tok.encode(text).ids
        if ids and max(ids) >= self.vocab:
            raise SystemExit(f"{self.d}/tokenizer.json gives token id {max(ids)} but the model's "
                             f"vocabulary has {self.vocab}; save the model's own tokenizer")
        return ids


class HFModel(Adapter):
    """What the three kinds share: the directory, its config and tokenizer."""

    kind = ""
    auto = ""

    def __init__(self, d: Path, name: str | None = None) -> None:
        self.dir, self.name = d, name or str(d)
        self.config = json.loads((d / "config.json").read_text())
        self.tokens = Tokens(d, int(self.config.get("vocab_size", 0)))

    def build(self) -> Any:
        auto = getattr(_transformers(), self.auto)
        return auto.from_pretrained(self.dir, local_files_only=True, dtype=torch.float32).eval()


class CausalLM(HFModel, WindowLM):
    """A causal LM on windows of the prose of :mod:`..texts`."""

    kind, auto = "causal", "AutoModelForCausalLM"

    def token_ids(self, model: Any) -> Tensor:
        self.block = context_length(model)
        return torch.tensor(self.tokens(" ".join(texts.all_sentences())), dtype=torch.long)


class Sentences(HFModel):
    """A model run on sentences, padded per batch with an attention mask."""

    unit = "sentence"
    sizes: ClassVar[dict[str, int]] = {"quick": 8, "full": 256}

    def limit(self) -> int:
        positions = self.config.get("max_position_embeddings") or MAX_TOKENS
        return min(MAX_TOKENS, positions)

    def inputs(self, n: int) -> list[tuple[str, list[int]]]:
        return [(s, self.tokens(s)[:self.limit()]) for s in texts.sentences(n)]

    def describe(self, units: list[Any]) -> dict[str, Any]:
        return {"units": len(units), "tokens": sum(len(ids) for _, ids in units)}

    def padded(self, rows: list[list[int]]) -> tuple[Tensor, Tensor]:
        pad = self.config.get("pad_token_id") or 0
        width = max(map(len, rows))
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r)], mask[i, :len(r)] = torch.tensor(r, dtype=torch.long), 1
        return ids, mask


class Encoder(Sentences):
    """An encoder: sentence embeddings by sentence-transformers' mean pooling."""

    kind, auto = "encoder", "AutoModel"
    metrics: ClassVar[dict[str, str]] = EMBEDDING_METRICS

    @torch.no_grad()
    def run(self, model: Any, units: list[Any], ref: list[Any] | None = None) -> list[Tensor]:
        out: list[Tensor] = []
        for chunk in batches(units, BATCH):
            ids, mask = self.padded([r for _, r in chunk])
            hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
            out += list(mean_pool(hidden, mask))
        return out

    def score(self, units: list[Any], ref: list[Tensor], out: list[Tensor]) -> Scores:
        return embedding_scores(ref, out)


class Seq2Seq(Sentences):
    """An encoder-decoder, teacher-forced on each sentence itself."""

    kind, auto = "seq2seq", "AutoModelForSeq2SeqLM"
    metrics: ClassVar[dict[str, str]] = LOGIT_METRICS

    @torch.no_grad()
    def run(self, model: Any, units: list[Any], ref: list[Any] | None = None) -> list[Tensor]:
        start = model.config.decoder_start_token_id or 0
        out: list[Tensor] = []
        for chunk in batches(units, BATCH):
            rows = [r for _, r in chunk]
            ids, mask = self.padded(rows)
            dec, _ = self.padded([[start, *r[:-1]] for r in rows])
            logits = model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
            out += [logits[i, :len(r)] for i, r in enumerate(rows)]
        return out

    def score(self, units: list[Any], ref: list[Tensor], out: list[Tensor]) -> Scores:
        return logit_scores(ref, out)


def hf_adapter(d: str | Path, name: str | None = None) -> HFModel:
    """The adapter of the Hugging Face directory ``d``, by its config: encoder-decoder when
    ``is_encoder_decoder``, causal LM when an architecture ends in ``ForCausalLM`` /
    ``LMHeadModel``, else an encoder."""
    d = Path(d).expanduser()
    cfg = json.loads((d / "config.json").read_text())
    arch = " ".join(cfg.get("architectures") or [])
    if cfg.get("is_encoder_decoder"):
        return Seq2Seq(d, name)
    if "ForCausalLM" in arch or "LMHeadModel" in arch:
        return CausalLM(d, name)
    return Encoder(d, name)
