"""English text corpus from CPython's ``pydoc_data.topics`` with a deterministic topic split.

Every CPython install ships these help topics, so the experiments need no download.
Every 10th topic (sorted by name) is held out, so evaluation text is unseen prose
rather than windows interleaved with training text. Contents depend on the Python
version; record ``sys.version`` with results.
"""

from __future__ import annotations

import torch
from pydoc_data.topics import topics
from torch import Tensor

from .tokenizer import encode_bytes

HELDOUT_EVERY = 10


def split_topics() -> tuple[list[str], list[str]]:
    """(train, held-out) topic names; held-out is every ``HELDOUT_EVERY``-th sorted name."""
    keys = sorted(topics)
    held = keys[::HELDOUT_EVERY]
    return [k for k in keys if k not in held], held


def _text(keys: list[str]) -> str:
    return "\n\n".join(topics[k] for k in keys)


def train_bytes() -> Tensor:
    """Training text as a 1-D int64 byte tensor."""
    return encode_bytes(_text(split_topics()[0]))


def heldout_text() -> str:
    """The held-out topics' text (tokenized as bytes here, or with a checkpoint's BPE)."""
    return _text(split_topics()[1])


def heldout_bytes() -> Tensor:
    """Held-out text as a 1-D int64 byte tensor."""
    return encode_bytes(heldout_text())


def windows(data: Tensor, block_size: int, limit: int | None = None) -> Tensor:
    """Non-overlapping ``[N, block_size + 1]`` windows (inputs plus next-token targets), at most
    ``limit``."""
    n = (data.numel() - 1) // block_size
    n = n if limit is None else min(n, limit)
    idx = torch.arange(n)[:, None] * block_size + torch.arange(block_size + 1)
    return data[idx]


def random_windows(data: Tensor, block_size: int, n: int, gen: torch.Generator) -> Tensor:
    """``n`` windows ``[n, block_size + 1]`` at uniformly random offsets drawn from ``gen``."""
    start = torch.randint(data.numel() - block_size - 1, (n,), generator=gen)
    return data[start[:, None] + torch.arange(block_size + 1)]


def window_topics(block_size: int, n: int | None = None) -> list[str]:
    """The held-out topic of each of the first ``n`` byte-level ``windows`` of
    ``block_size`` tokens: the topic that holds most of the window's bytes (the separators
    between topics count for the topic before them).  The clusters of the topic bootstrap."""
    owner: list[str] = []
    for k in split_topics()[1]:
        owner += [k] * (len(topics[k].encode("utf-8")) + 2)
    owner = owner[: heldout_bytes().numel()]
    count = (len(owner) - 1) // block_size
    count = count if n is None else min(n, count)
    out = []
    for w in range(count):
        span = owner[w * block_size: (w + 1) * block_size + 1]
        out.append(max(dict.fromkeys(span), key=span.count))
    return out
