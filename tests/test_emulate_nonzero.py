"""SiteStats.nonzero: the operands' nonzero elements, the base of a flushed share that does not
count the zeros an upstream flush left (the training experiment's per-GEMM share)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import fpsim
from fpsim.emulation import Recipe
from fpsim.emulation.casts import Backward, Cast


def test_nonzero_counts_the_operands_and_the_gradient_of_each_backward_gemm():
    x = torch.tensor([[1.0, 0.0, 3.0, 0.0], [0.0, 0.0, 1e-30, 2.0]], requires_grad=True)
    w = torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0], [1.0, 1.0]], requires_grad=True)
    recipe = Recipe("e4m3", name="fp8", backward=Backward(grad=Cast("e4m3", "none")))
    with fpsim.emulate(recipe, capture=True) as em:
        y = x @ w
        y.backward(torch.tensor([[1.0, 0.0], [1e-30, 4.0]]))
    forward = next(st for st in em.sites.values() if st.kind == "matmul")
    assert (forward.elements, forward.nonzero, forward.flushed) == (16, 4 + 5, 1)   # 1e-30 flushes
    dgrad = next(st for st in em.sites.values() if st.kind == "dgrad")
    assert (dgrad.elements, dgrad.nonzero, dgrad.flushed) == (4, 3, 1)
