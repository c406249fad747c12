"""Under ``fpsim.emulate`` CPU tensors take the compiled (Numba) engine of ``fpsim.matmul``
where it applies, with the bits of the engines it replaces (NumPy's, and torch's), NaN and inf
operands included; where it does not apply the other engines run."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("numba", reason="the compiled engine needs numba (pip install fpsim[fast])")

import fpsim  # noqa: E402
from fpsim import Recipe  # noqa: E402
from fpsim.arith import jit  # noqa: E402

ACCUMS = ("fp16", "bf16", "fp8_e5m2", "fp8_e4m3fnuz")
ORDERS = ("sequential", "fma", "chunked", "pairwise")
MODES = ("rne", "rna", "rtz", "rup", "rdown", "rto")


def layer_and_input(specials: bool) -> tuple[torch.nn.Linear, torch.Tensor]:
    """A 7 -> 5 linear layer with bias and a (2, 3, 7) input; with ``specials`` some operands
    are NaN or inf of either sign (inf * 0 and inf - inf meet in some sums; two rows and three
    columns stay finite)."""
    g = torch.Generator().manual_seed(3)
    layer = torch.nn.Linear(7, 5)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(5, 7, generator=g) * 4)
    x = torch.randn(2, 3, 7, generator=g) * 4
    if specials:
        x[0, 0, 1], x[0, 1, 2], x[1, 2, 0], x[1, 0, 5] = np.nan, np.inf, -np.inf, 0.0
        with torch.no_grad():
            layer.weight[1, 2], layer.weight[3, 1] = -np.inf, np.nan
    return layer, x


def run(layer: torch.nn.Module, x: torch.Tensor, recipe: Recipe,
        monkeypatch: pytest.MonkeyPatch, compiled: bool) -> tuple[torch.Tensor, int]:
    """The layer's output under ``recipe`` and how many products the compiled engine ran
    (``compiled=False``: as if numba were not installed)."""
    calls = []
    real = jit.run
    with monkeypatch.context() as m:
        m.setattr(jit, "run", lambda *a: calls.append(1) or real(*a))
        m.setattr(jit, "available", lambda: compiled)
        with torch.no_grad(), fpsim.emulate(recipe):
            y = layer(x)
    return y, len(calls)


def codes(t: torch.Tensor) -> np.ndarray:
    """Bit patterns, with the sign of NaN cleared: IEEE 754 leaves the sign of a NaN made from
    two NaNs open, and NumPy's own loops pick either (see test_jit_matmul.assert_same)."""
    u = t.detach().numpy().view(np.uint32).copy()
    u[np.isnan(t.numpy())] &= np.uint32(0x7FFFFFFF)
    return u


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("accum", ACCUMS)
def test_compiled_engine_gives_the_other_engines_bits(accum, order, mode, monkeypatch):
    layer, x = layer_and_input(specials=True)
    assert torch.isfinite(layer(x)[0, 2]).any()
    recipe = Recipe("r", "e4m3", accum=accum, order=order, rounding=mode,
                    chunk=3 if order == "chunked" else None)
    fast, n_fast = run(layer, x, recipe, monkeypatch, compiled=True)
    slow, n_slow = run(layer, x, recipe, monkeypatch, compiled=False)
    assert (n_fast, n_slow) == (1, 0)
    np.testing.assert_array_equal(codes(fast), codes(slow))
    # the torch engine on the same quantized operands
    qx, qw = (fpsim.quantize(t.detach(), "e4m3", rounding=mode) for t in (x, layer.weight))
    ref = fpsim.matmul(qx, qw.t(), accum=accum, order=order, rounding=mode, backend="torch",
                       chunk=recipe.chunk).float() + layer.bias.detach()
    np.testing.assert_array_equal(codes(fast), codes(ref))


@pytest.mark.parametrize("recipe, dtype, why", [
    (Recipe("sr", "e4m3", accum="fp16", rounding="stochastic"), torch.float32, "stochastic"),
    (Recipe("tc", "e4m3", order="tensor_core", tensor_core="hopper_fp8"), torch.float32,
     "tensor-core model"),
    (Recipe("f64", "e4m3", accum="fp16"), torch.float64, "float64 products (product='fp64')"),
])
def test_fallback_where_the_compiled_engine_does_not_apply(recipe, dtype, why, monkeypatch):
    layer, x = layer_and_input(False)
    layer, x = layer.to(dtype), x.to(dtype)
    if recipe.rounding == "stochastic":
        torch.manual_seed(0)
    y, n = run(layer, x, recipe, monkeypatch, compiled=True)
    assert n == 0, why
    assert torch.isfinite(y).all()


def test_capture_takes_the_engine_with_statistics(monkeypatch):
    """capture=True asks fpsim.matmul for statistics, which the compiled engine does not keep."""
    layer, x = layer_and_input(False)
    calls = []
    real = jit.run
    monkeypatch.setattr(jit, "run", lambda *a: calls.append(1) or real(*a))
    with torch.no_grad(), fpsim.emulate(Recipe("r", "e4m3", accum="fp16"), capture=True) as em:
        layer(x)
    assert calls == [] and em.table()[0]["swamped"] is not None
