"""The per-site capture's hook on the plain-torch GPT-2, through fpsim.emulate's interception
(the end-to-end runs use ``fpsim.emulate`` itself: ``fpsim_experiments.endtoend.RecipeRun``).

An ``ops`` object provides ``linear``, ``matmul``, ``layernorm`` and ``softmax`` taking the site
name first (``TorchOps`` is plain torch; the capture, ``fpsim_experiments.capture.CaptureOps``,
records each site's operands).  ``forward`` runs the model with ``OpsMode`` active: the
``TorchFunctionMode`` and module-path hooks of ``fpsim.emulate`` catch each op, and instead
of a recipe the site's ``ops`` method computes it, under the experiments' site names
(``site_name``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fpsim.emulation.context import Emulation
from fpsim.emulation.intercept import Interceptor, Native
from fpsim.emulation.recipe import Rules

from .model import site_name


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


class OpsMode(Interceptor):
    """fpsim.emulate's interception with each site computed by ``ops`` under its GPT-2 name."""

    guard_grad = False                    # ops compute differentiably (fpsim_experiments.training)

    def __init__(self, ops: Any) -> None:
        super().__init__(Emulation(Rules(default=None), capture=False))
        self.ops = ops

    def product(self, kind: str, op: str, a: Tensor, b: Tensor, bias: Tensor | None,
                native: Native) -> Tensor:
        name = site_name(self.site(kind, op, self.owner(b, a))[0])
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
