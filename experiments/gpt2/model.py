"""Compact GPT-2 whose every dot-product site goes through a replaceable ``ops`` object.

The parameter layout and arithmetic follow Hugging Face's ``GPT2LMHeadModel``
(pre-LayerNorm blocks, Conv1D weights stored as ``[in, out]``, tanh GELU,
learned position embeddings, ``lm_head`` tied to ``wte``), so HF checkpoints load
unchanged. Routing all matrix products and LayerNorms through ``ops`` lets a
replay module capture operands and substitute emulated arithmetic per site.

Site names (``i`` is the block index)::

    h{i}.ln_1  h{i}.attn.c_attn  h{i}.attn.qk  h{i}.attn.av  h{i}.attn.c_proj
    h{i}.ln_2  h{i}.mlp.c_fc     h{i}.mlp.c_proj   ln_f   lm_head
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class GPT2Config:
    """Architecture hyper-parameters, named as in HF ``config.json``."""

    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 256
    n_positions: int = 256
    vocab_size: int = 256
    layer_norm_epsilon: float = 1e-5

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "GPT2Config":
        """Build from a HF GPT-2 ``config.json`` dict, rejecting variants this model does not
        compute."""
        act = d.get("activation_function", "gelu_new")
        if act != "gelu_new":
            raise ValueError(
                f"unsupported activation_function {act!r}; only 'gelu_new' (tanh GELU)"
            )
        if d.get("scale_attn_by_inverse_layer_idx", False):
            raise ValueError("scale_attn_by_inverse_layer_idx=True is not supported")
        return cls(**{k: d[k] for k in asdict(cls()) if k in d})

    def to_hf_dict(self) -> dict[str, Any]:
        """HF-compatible ``config.json`` content."""
        return {
            "model_type": "gpt2",
            "architectures": ["GPT2LMHeadModel"],
            "activation_function": "gelu_new",
            "n_ctx": self.n_positions,
            **asdict(self),
        }


#: The dot-product sites of one block, in the order the forward pass calls them.
BLOCK_SITES = (
    "ln_1",
    "attn.c_attn",
    "attn.qk",
    "attn.av",
    "attn.c_proj",
    "ln_2",
    "mlp.c_fc",
    "mlp.c_proj",
)


def site_order(name: str) -> tuple[int, int]:
    """Sort key putting site names in forward-pass order: blocks first, then ln_f, lm_head."""
    if name in ("ln_f", "lm_head"):
        return (1 << 30, ("ln_f", "lm_head").index(name))
    block, site = name[1:].split(".", 1)
    return (int(block), BLOCK_SITES.index(site))


class TorchOps:
    """Default arithmetic: plain torch ops in the tensors' own dtype.

    A replacement must provide the same four methods; ``name`` identifies the site.
    """

    def linear(self, name: str, x: Tensor, W: Tensor, b: Tensor | None) -> Tensor:
        """Conv1D semantics: ``x @ W + b`` with ``W`` shaped ``[in, out]``; ``b`` may be None.

        Uses ``addmm`` with the bias, as HF's Conv1D does, so FP32 results match HF.
        """
        if b is None:
            return x @ W
        return torch.addmm(b, x.reshape(-1, x.shape[-1]), W).view(*x.shape[:-1], W.shape[1])

    def matmul(self, name: str, a: Tensor, b: Tensor) -> Tensor:
        """Batched ``a @ b`` (attention scores ``q @ k^T`` and ``probs @ v``)."""
        return a @ b

    def layernorm(self, name: str, x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
        """LayerNorm over the last dimension (biased variance, as torch/HF)."""
        return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)

    def softmax(self, name: str, x: Tensor) -> Tensor:
        """Softmax of the masked attention scores over the last dimension (``name``:
        ``*.softmax``)."""
        return torch.softmax(x, dim=-1)


def gelu_new(x: Tensor) -> Tensor:
    """HF ``gelu_new``: tanh approximation of GELU, written exactly as HF does."""
    return (
        0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    )


class Conv1D(nn.Module):
    """Parameter holder in HF Conv1D layout: ``weight`` is ``[in, out]``."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))


class Attention(nn.Module):
    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = Conv1D(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = Conv1D(cfg.n_embd, cfg.n_embd)

    def forward(self, x: Tensor, ops: Any, prefix: str) -> Tensor:
        B, T, C = x.shape
        hd = C // self.n_head
        qkv = ops.linear(f"{prefix}.c_attn", x, self.c_attn.weight, self.c_attn.bias)
        q, k, v = (t.view(B, T, self.n_head, hd).transpose(1, 2) for t in qkv.split(C, dim=2))
        scores = ops.matmul(f"{prefix}.qk", q, k.transpose(-1, -2)) / math.sqrt(hd)
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(causal, torch.finfo(scores.dtype).min)
        probs = ops.softmax(f"{prefix}.softmax", scores)
        y = ops.matmul(f"{prefix}.av", probs, v).transpose(1, 2).reshape(B, T, C)
        return ops.linear(f"{prefix}.c_proj", y, self.c_proj.weight, self.c_proj.bias)


class MLP(nn.Module):
    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.c_fc = Conv1D(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = Conv1D(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x: Tensor, ops: Any, prefix: str) -> Tensor:
        h = gelu_new(ops.linear(f"{prefix}.c_fc", x, self.c_fc.weight, self.c_fc.bias))
        return ops.linear(f"{prefix}.c_proj", h, self.c_proj.weight, self.c_proj.bias)


class Block(nn.Module):
    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.eps = cfg.layer_norm_epsilon
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=self.eps)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=self.eps)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor, ops: Any, prefix: str) -> Tensor:
        x = x + self.attn(
            ops.layernorm(f"{prefix}.ln_1", x, self.ln_1.weight, self.ln_1.bias, self.eps),
            ops,
            f"{prefix}.attn",
        )
        return x + self.mlp(
            ops.layernorm(f"{prefix}.ln_2", x, self.ln_2.weight, self.ln_2.bias, self.eps),
            ops,
            f"{prefix}.mlp",
        )


class GPT2(nn.Module):
    """GPT-2 LM; ``state_dict`` keys equal HF's ``transformer.*`` keys (lm_head tied, not
    stored)."""

    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.config = cfg
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
                wpe=nn.Embedding(cfg.n_positions, cfg.n_embd),
                h=nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer)),
                ln_f=nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon),
            )
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """HF GPT-2 initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2 n_layer)."""
        for module in self.modules():
            if isinstance(module, nn.LayerNorm):
                module.reset_parameters()
        for name, p in self.named_parameters():
            if name.endswith("bias") and "ln_" not in name:
                nn.init.zeros_(p)
            elif p.dim() == 2:
                std = (
                    0.02 / math.sqrt(2 * self.config.n_layer)
                    if name.endswith("c_proj.weight")
                    else 0.02
                )
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx: Tensor, ops: Any = None) -> Tensor:
        """Logits ``[B, T, vocab]`` for token ids ``idx`` ``[B, T]``, computed with ``ops``
        (default FP32/FP64 torch)."""
        ops = TorchOps() if ops is None else ops
        T = idx.shape[1]
        if T > self.config.n_positions:
            raise ValueError(f"sequence length {T} exceeds n_positions={self.config.n_positions}")
        tr = self.transformer
        x = tr.wte(idx) + tr.wpe(torch.arange(T, device=idx.device))
        for i, block in enumerate(tr.h):
            x = block(x, ops, f"h{i}")
        x = ops.layernorm("ln_f", x, tr.ln_f.weight, tr.ln_f.bias, self.config.layer_norm_epsilon)
        return ops.linear("lm_head", x, tr.wte.weight.t(), None)
