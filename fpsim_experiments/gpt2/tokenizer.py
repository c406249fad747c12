"""Tokenizers: byte-level for the tiny model; GPT-2 BPE only when available offline.

The tiny model's vocabulary is the 256 byte values (token id = byte value of the
UTF-8 text), so it needs no vocabulary file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor


def encode_bytes(text: str) -> Tensor:
    """UTF-8 bytes of ``text`` as a 1-D int64 tensor of token ids in [0, 256)."""
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def decode_bytes(ids: Tensor) -> str:
    """Inverse of ``encode_bytes``; invalid UTF-8 (e.g. sampled bytes) is replaced, not
    raised."""
    return bytes(int(i) for i in ids.flatten()).decode("utf-8", errors="replace")


def load_bpe(checkpoint_dir: str | os.PathLike) -> Any:
    """GPT-2 BPE ``tokenizers.Tokenizer`` from ``tokenizer.json`` in the checkpoint directory.

    Optional: raises ImportError/FileNotFoundError when unavailable, in which case
    callers should pass pre-tokenized ids to the model instead.
    """
    path = Path(checkpoint_dir) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; pass pre-tokenized GPT-2 ids instead")
    try:
        from tokenizers import Tokenizer
    except ImportError as e:
        raise ImportError(
            "the 'tokenizers' package is not installed; pass pre-tokenized GPT-2 ids instead"
        ) from e
    return Tokenizer.from_file(str(path))


def train_byte_bpe(texts: list[str], vocab_size: int, special_tokens: tuple[str, ...] = ()) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` (GPT-2's scheme) trained on ``texts``: small
    checkpoints made locally for tests and benchmarks get a real ``tokenizer.json`` this way."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    unk = special_tokens[0] if special_tokens else None
    tok = Tokenizer(models.BPE(unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  special_tokens=list(special_tokens),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok
