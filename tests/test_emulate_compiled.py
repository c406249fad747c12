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
from fpsim.arith import compiled as arith_compiled  # noqa: E402
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
        m.setattr(arith_compiled, "available", lambda: compiled)
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
@pytest.mark.filterwarnings("ignore:numba is not installed:RuntimeWarning")  # hidden on purpose
def test_compiled_engine_gives_the_other_engines_bits(accum, order, mode, monkeypatch):
    layer, x = layer_and_input(specials=True)
    assert torch.isfinite(layer(x)[0, 2]).any()
    recipe = Recipe("e4m3", accum=accum, order=order, rounding=mode,
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
    (Recipe("e4m3", accum="fp16", rounding="stochastic"), torch.float32, "stochastic"),
    (Recipe("e4m3", order="tensor_core", tensor_core="hopper_fp64"), torch.float32,
     "FP64 tensor-core model"),
    (Recipe("e4m3", accum="fp16"), torch.float64, "float64 products (product='fp64')"),
])
def test_fallback_where_the_compiled_engine_does_not_apply(recipe, dtype, why, monkeypatch):
    layer, x = layer_and_input(False)
    layer, x = layer.to(dtype), x.to(dtype)
    if recipe.rounding == "stochastic":
        torch.manual_seed(0)
    y, n = run(layer, x, recipe, monkeypatch, compiled=True)
    assert n == 0, why
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("recipe", [
    Recipe("e4m3", accum="fp16"),
    Recipe("e4m3", order="tensor_core", tensor_core="hopper_fp8", chunk=128)], ids=str)
def test_capture_keeps_the_compiled_engine(recipe, monkeypatch):
    """capture=True asks fpsim.matmul for statistics, which the compiled engine keeps: the same
    outputs and site table as the NumPy engine's."""
    layer, x = layer_and_input(False)
    calls = []
    real = jit.run
    monkeypatch.setattr(jit, "run", lambda *a: calls.append(1) or real(*a))
    with torch.no_grad(), fpsim.emulate(recipe, capture=True) as em:
        y = layer(x)
    assert calls == [1] and em.table()[0]["swamped"] is not None
    monkeypatch.setattr(arith_compiled, "available", lambda: False)
    monkeypatch.setattr(jit, "_warned", [True])
    with torch.no_grad(), fpsim.emulate(recipe, capture=True) as em_numpy:
        y_numpy = layer(x)
    assert calls == [1]
    np.testing.assert_array_equal(codes(y), codes(y_numpy))
    assert em.table() == em_numpy.table()


# ----------------------------------------------------------------------------------------------
# native FP32 sums: deterministic by default, the host's GEMM on request
# ----------------------------------------------------------------------------------------------
from fpsim.emulation.recipe import NATIVE_SUMS  # noqa: E402

#: every way of summing a native FP32 accumulator but "host" (the host's own GEMM, whose bits
#: depend on the machine, BLAS and thread count by design), which the next test leaves out
REPRODUCIBLE = [s for s in NATIVE_SUMS if s != "host"]


@pytest.mark.parametrize("sums", REPRODUCIBLE)
def test_native_sums_are_the_same_bits_on_any_thread_count(sums):
    g = torch.Generator().manual_seed(5)
    layer = torch.nn.Linear(300, 40)
    x = torch.randn(64, 300, generator=g)
    recipe = Recipe("e4m3", scaling="tensor", native_sums=sums)
    threads = torch.get_num_threads()
    outs = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            with torch.no_grad(), fpsim.emulate(recipe):
                outs.append(layer(x))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    # one rounding of the FP64 sum of the quantized operands' exact products and the bias
    qx, qw = (fpsim.scaled_quantize(t.detach().double(), "e4m3").values.float()
              for t in (x, layer.weight))
    want = torch.addmm(layer.bias.detach().double(), qx.double(), qw.double().T).float()
    assert torch.equal(outs[0], want)


def test_host_sums_are_torchs_own_matmul():
    """native_sums="host": the quantized operands multiplied by torch's own FP32 GEMM (and
    the norms' statistics by torch's own sums), whatever bits that host gives."""
    g = torch.Generator().manual_seed(6)
    layer = torch.nn.Linear(50, 20)
    x = torch.randn(3, 7, 50, generator=g)
    with torch.no_grad(), fpsim.emulate(Recipe("e4m3", native_sums="host")):
        y = layer(x)
        ssq = fpsim.emulation.sites.sum_squares(Recipe(native_sums="host"), x)
    qx, qw = (fpsim.quantize(t.detach(), "e4m3") for t in (x, layer.weight))
    assert torch.equal(y, torch.nn.functional.linear(qx, qw, layer.bias.detach()))
    assert torch.equal(ssq, (x * x).sum(-1))


@pytest.mark.parametrize("kw, match", [
    (dict(native_sums="blas"), "native_sums 'blas' is not one of"),
    (dict(native_sums="host", accum="fp16"), "needs accum='fp32' and order=None"),
    (dict(native_sums="host", order="sequential"), "needs accum='fp32' and order=None")])
def test_native_sums_option_is_checked(kw, match):
    with pytest.raises(ValueError, match=match):
        Recipe("e4m3", **kw)
