"""Next-token cross-entropy of a GPT-2 on byte/token windows."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .model import GPT2


@torch.no_grad()
def window_loss(model: GPT2, wins: Tensor, batch_size: int = 16) -> float:
    """Mean loss in nats/token over windows ``[N, T+1]`` (every position scored, short contexts
    included)."""
    total, count = 0.0, 0
    for chunk in wins.split(batch_size):
        logits = model(chunk[:, :-1])
        total += F.cross_entropy(
            logits.flatten(0, 1).double(), chunk[:, 1:].flatten(), reduction="sum"
        ).item()
        count += chunk[:, 1:].numel()
    return total / count
