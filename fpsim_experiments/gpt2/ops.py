"""The experiments' per-site arithmetic on the plain-torch GPT-2, through fpsim.emulate's
interception.

An ``ops`` object provides ``linear``, ``matmul``, ``layernorm`` and ``softmax`` taking the site
name first (``TorchOps`` is plain torch; the replay, end-to-end, capture and training
experiments bring their own).  ``forward`` runs the model with ``OpsMode`` active: the
``TorchFunctionMode`` and module-path hooks of ``fpsim.emulate`` catch each op, and instead
of a recipe the site's ``ops`` method computes it, under the experiments' site names
(``site_name``).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fpsim.emulation.context import Emulation
from fpsim.emulation.intercept import Interceptor, Native
from fpsim.emulation.recipe import Rules

#: The ops of an attention module, in call order, by their experiment names.
ATTENTION_OPS = {"matmul": "qk", "softmax": "softmax", "matmul#2": "av"}
BLOCK_PATHS = ("ln_1", "ln_2", "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")


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


def site_name(site: str) -> str:
    """The experiments' name of an intercepted site of ``fpsim_experiments.gpt2.model.GPT2``
    (``"transformer.h.0.attn:matmul#2"`` -> ``"h0.attn.av"``)."""
    path, _, op = site.partition(":")
    if site == ":linear":
        return "lm_head"
    if site == "transformer.ln_f:layer_norm":
        return "ln_f"
    m = re.fullmatch(r"transformer\.h\.(\d+)\.(.+)", path)
    if m:
        i, rest = m.groups()
        if rest == "attn" and op in ATTENTION_OPS:
            return f"h{i}.attn.{ATTENTION_OPS[op]}"
        if rest in BLOCK_PATHS:
            return f"h{i}.{rest}"
    raise ValueError(f"{site}: not a site of fpsim_experiments.gpt2.model.GPT2 (has the model "
                     "changed? update fpsim_experiments.gpt2.ops.site_name)")


class OpsMode(Interceptor):
    """fpsim.emulate's interception with each site computed by ``ops`` under its GPT-2 name."""

    guard_grad = False                    # ops compute differentiably (fpsim_experiments.training)

    def __init__(self, ops: Any) -> None:
        super().__init__(Emulation(Rules(default=None), capture=False))
        self.ops = ops

    def product(self, kind: str, op: str, a: Tensor, b: Tensor, bias: Tensor | None,
                native: Native) -> Tensor:
        name = site_name(self.site(kind, op)[0])
        if kind == "matmul":
            return self.ops.matmul(name, a, b)
        return self.ops.linear(name, a, b, bias)

    def layer_norm(self, native: Native, input: Tensor, normalized_shape: Any,
                   weight: Tensor | None = None, bias: Tensor | None = None,
                   eps: float = 1e-5) -> Any:
        name = site_name(self.site("norm", "layer_norm")[0])
        return self.ops.layernorm(name, input, weight, bias, eps)

    def softmax(self, native: Native, input: Tensor, dim: int | None = None, *args: Any,
                **kwargs: Any) -> Any:
        name = site_name(self.site("attention", "softmax")[0])
        return self.ops.softmax(name, input)


@contextlib.contextmanager
def routed(ops: Any) -> Iterator[None]:
    """A context in which GPT-2 forward passes compute every site with ``ops``."""
    mode = OpsMode(ops)
    mode.start()
    try:
        yield
    finally:
        mode.stop()


def forward(model: nn.Module, idx: Tensor, ops: Any = None) -> Tensor:
    """``model(idx)`` with every site computed by ``ops`` (None: plain torch)."""
    if ops is None:
        return model(idx)
    with routed(ops):
        return model(idx)
