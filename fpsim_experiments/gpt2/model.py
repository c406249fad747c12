"""Compact GPT-2 in plain torch.

The parameter layout and arithmetic follow Hugging Face's ``GPT2LMHeadModel``
(pre-LayerNorm blocks, Conv1D weights stored as ``[in, out]``, tanh GELU,
learned position embeddings, ``lm_head`` tied to ``wte``), so HF checkpoints load
unchanged.  The experiments run it under ``fpsim.emulate``, and name its dot-product sites
(``site_name``; ``i`` is the block index)::

    h{i}.ln_1  h{i}.attn.c_attn  h{i}.attn.qk  h{i}.attn.av  h{i}.attn.c_proj
    h{i}.ln_2  h{i}.mlp.c_fc     h{i}.mlp.c_proj   ln_f   lm_head
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator
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


def site_names(cfg: GPT2Config) -> list[str]:
    """Every site of a model of shape ``cfg``, in forward-pass order (what a capture yields),
    known without running the model."""
    return [f"h{i}.{s}" for i in range(cfg.n_layer) for s in BLOCK_SITES] + ["ln_f", "lm_head"]


def site_kind(name: str) -> str:
    """The kind of site ``name`` (``layernorm``, ``matmul`` or ``linear``), as its capture
    records it (``fpsim_experiments.capture.Site``)."""
    if name == "ln_f" or name.endswith((".ln_1", ".ln_2")):
        return "layernorm"
    return "matmul" if name.endswith((".qk", ".av")) else "linear"


def site_order(name: str) -> tuple[int, int]:
    """Sort key putting site names in forward-pass order: blocks first, then ln_f, lm_head."""
    if name in ("ln_f", "lm_head"):
        return (1 << 30, ("ln_f", "lm_head").index(name))
    block, site = name[1:].split(".", 1)
    return (int(block), BLOCK_SITES.index(site))


#: The ops of an attention module, in call order, by their experiment names (eager; sdpa)
ATTENTION_OPS = {"matmul": "qk", "softmax": "softmax", "matmul#2": "av", "qk": "qk", "pv": "av"}
ATTENTION_IMPLEMENTATIONS = ("eager", "sdpa")
#: fpsim.emulate's module path and op kind of the sites outside the blocks
OUTER_SITES = {"ln_f": ("transformer.ln_f", "norm"), "lm_head": ("transformer.wte", "linear")}


def site_name(site: str) -> str:
    """The experiments' name of a site of ``GPT2`` as ``fpsim.emulate`` names it
    (``"transformer.h.0.attn:matmul#2"`` -> ``"h0.attn.av"``).

    >>> site_name("transformer.h.3.mlp.c_fc:linear"), site_name("transformer.wte:linear")
    ('h3.mlp.c_fc', 'lm_head')
    """
    path, _, op = site.partition(":")
    for name, (p, _kind) in OUTER_SITES.items():
        if path == p:
            return name
    m = re.fullmatch(r"transformer\.h\.(\d+)\.(.+)", path)
    if m:
        i, rest = m.groups()
        if rest == "attn" and op in ATTENTION_OPS:
            return f"h{i}.attn.{ATTENTION_OPS[op]}"
        if rest in BLOCK_SITES:
            return f"h{i}.{rest}"
    raise ValueError(f"{site}: not a site of fpsim_experiments.gpt2.model.GPT2 (has the model "
                     "changed? update fpsim_experiments.gpt2.model.site_name)")


def site_path(name: str) -> tuple[str, str]:
    """``fpsim.emulate``'s module path and op kind of the site the experiments call ``name``
    (what a ``fpsim.Rule`` selecting it names; ``qk`` and ``av`` share their module's).

    >>> site_path("h1.attn.av"), site_path("h0.ln_2")
    (('transformer.h.1.attn', 'matmul'), ('transformer.h.0.ln_2', 'norm'))
    """
    if name in OUTER_SITES:
        return OUTER_SITES[name]
    block, site = name[1:].split(".", 1)
    path = f"transformer.h.{block}.{'attn' if site in ('attn.qk', 'attn.av') else site}"
    return path, {"layernorm": "norm"}.get(site_kind(name), site_kind(name))


@contextlib.contextmanager
def implementation(model: nn.Module, name: str) -> Iterator[None]:
    """Every attention of ``model`` computed as ``name`` says (``"eager"`` or ``"sdpa"``, see
    ``Attention``) inside the block, as before after it."""
    if name not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(f"attention implementation {name!r}: one of {ATTENTION_IMPLEMENTATIONS}")
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    before = [m.implementation for m in layers]
    for m in layers:
        m.implementation = name
    try:
        yield
    finally:
        for m, b in zip(layers, before):
            m.implementation = b


def gelu_new(x: Tensor) -> Tensor:
    """HF ``gelu_new``: tanh approximation of GELU, written exactly as HF does."""
    return (
        0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    )


class Conv1D(nn.Module):
    """HF Conv1D: ``x @ weight + bias`` with ``weight`` stored ``[in, out]``.

    ``F.linear`` of the transposed weight is HF's ``addmm`` on the flattened input, bit for bit.
    """

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight.t(), self.bias)


class Attention(nn.Module):
    """Causal self-attention, written out (``implementation`` ``"eager"``: ``probs @ v`` sums
    over every key, masked ones at probability 0) or as one causal kernel call
    (``"sdpa"``: ``F.scaled_dot_product_attention(is_causal=True)``, which
    ``fpsim.emulate`` computes skipping the masked keys); see ``implementation``."""

    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = Conv1D(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = Conv1D(cfg.n_embd, cfg.n_embd)
        self.implementation = "eager"

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        hd = C // self.n_head
        qkv = self.c_attn(x)
        q, k, v = (t.view(B, T, self.n_head, hd).transpose(1, 2) for t in qkv.split(C, dim=2))
        if self.implementation == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(causal, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, dim=-1)
        y = (probs @ v).transpose(1, 2).reshape(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.c_fc = Conv1D(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = Conv1D(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x: Tensor) -> Tensor:
        return self.c_proj(gelu_new(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


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

    def forward(self, idx: Tensor) -> Tensor:
        """Logits ``[B, T, vocab]`` for token ids ``idx`` ``[B, T]``."""
        T = idx.shape[1]
        if T > self.config.n_positions:
            raise ValueError(f"sequence length {T} exceeds n_positions={self.config.n_positions}")
        tr = self.transformer
        x = tr.wte(idx) + tr.wpe(torch.arange(T, device=idx.device))
        for block in tr.h:
            x = block(x)
        return F.linear(tr.ln_f(x), tr.wte.weight)
