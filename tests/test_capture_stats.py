"""capture=True's own statistics (fpsim.emulation.intercept: ``record``): operands' largest
finite magnitude and non-zeros without masked copies, a parameter scanned once until it
changes, and the error energy of the results in one compiled pass, each against the masked
definition it replaces."""

from __future__ import annotations

import math
from unittest import mock

import pytest

torch = pytest.importorskip("torch")

import fpsim  # noqa: E402
from fpsim import Recipe, Rule, Rules  # noqa: E402
from fpsim.arith import compiled  # noqa: E402
from fpsim.emulation import intercept  # noqa: E402


def masked_energy(y, ref):
    """The definition: over outputs finite in both, sum ref^2 and (y - ref)^2; the count of
    y inf/NaN where ref is finite."""
    yd, rd = y.double().reshape(-1), ref.double().reshape(-1)
    fr, fy = torch.isfinite(rd), torch.isfinite(yd)
    both = fr & fy
    return (int((fr & ~fy).sum()), float((rd[both] ** 2).sum()),
            float(((yd[both] - rd[both]) ** 2).sum()))


def operands(n: int, dtype, special: str):
    """Results near a reference; ``special``: "y" puts inf and NaN in the results, "both" in
    the reference too."""
    g = torch.Generator().manual_seed(n)
    ref = torch.randn(n, generator=g, dtype=torch.float64) * 3
    y = (ref + torch.randn(n, generator=g, dtype=torch.float64) * 1e-3).to(dtype)
    if special and n:
        y[::7] = math.inf
        y[3::11] = math.nan
    if special == "both" and n:
        ref[::5] = -math.inf
        ref[2::13] = math.nan
    return y, ref


def close(got, want):
    """Sums of non-negative float64 terms in another order: within n ulps of each other."""
    assert got[0] == want[0]
    for g, w in zip(got[1:], want[1:]):
        assert g == pytest.approx(w, rel=1e-12, abs=0.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("special", ["", "y", "both"])
@pytest.mark.parametrize("n", [0, 5, 8, 1001])
def test_error_energy_is_the_masked_definition(n, dtype, special):
    """The compiled pass, the torch route (no numba) and the masked sums agree: the counts
    exactly, the sums to the rounding of a different order."""
    y, ref = operands(n, dtype, special)
    want = masked_energy(y, ref)
    close(intercept.error_energy(y, ref), want)
    with mock.patch.object(compiled, "available", lambda: False):
        close(intercept.error_energy(y, ref), want)
    if special and n > 7:
        assert want[0] > 0 and math.isfinite(want[1]) and math.isfinite(want[2])


def test_operand_scan_takes_the_largest_finite_magnitude():
    x = torch.tensor([[0.0, -7.5, 2.0], [math.inf, 0.0, math.nan]])
    assert intercept.operand_scan(x) == (7.5, 4)
    assert intercept.operand_scan(torch.tensor([-2.0, 1.0])) == (2.0, 2)
    assert intercept.operand_scan(torch.tensor([math.nan, -math.inf])) == (0.0, 2)
    assert intercept.operand_scan(torch.zeros(0)) == (0.0, 0)


def test_a_weight_is_scanned_again_after_it_changes():
    """The scan of a parameter is kept until an in-place update bumps its version."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 3, bias=False)
    x = torch.randn(4, 6)
    rules = Rules([Rule(Recipe(name="e4m3", inputs="e4m3", scaling="tensor"), kind="linear")],
                  default=None)

    with torch.no_grad(), fpsim.emulate(rules, capture=True) as em:
        lin(x)
        with torch.no_grad():
            lin.weight.mul_(100.0)
        lin(x)
    st = next(iter(em.sites.values()))
    assert st.calls == 2
    assert st.amax == float(lin.weight.detach().abs().max())
    assert st.nonzero == 2 * (int(torch.count_nonzero(x)) + lin.weight.numel())


def edge_values(dtype) -> torch.Tensor:
    """Signed zeros, the least subnormal and normal, ones, the largest finite value and the next
    values above it in float64, inf and NaN, of ``dtype``."""
    fi = torch.finfo(dtype)
    top = float(fi.max)
    tiny = float(fi.smallest_normal)
    sub = tiny * float(fi.eps)                  # the least subnormal (float64 and below)
    vals = [0.0, -0.0, sub, -sub, tiny, -tiny, 1.0, -1.5, top, -top, math.inf, -math.inf,
            math.nan, 3.0, 448.0, 464.0, -480.0, 1e-9]
    return torch.tensor(vals, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("numba", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_count_nonfinite_equals_isfinite(dtype, numba):
    """capture="counts"' count of inf and NaN results, in the compiled pass over the bits and
    without numba, against torch.isfinite: every edge value of the dtype (NaN of both signs,
    the largest finite values beside inf), contiguous and strided."""
    if numba and not compiled.available():
        pytest.skip("numba is not installed")
    base = torch.cat([edge_values(dtype), -edge_values(dtype)[-6:]])
    x = base.repeat(3).reshape(3, -1)
    want = int((~torch.isfinite(x)).sum())
    with mock.patch.object(compiled, "available", lambda: numba):
        assert intercept.count_nonfinite(x) == want == 12
        assert intercept.count_nonfinite(x.t()) == want
        assert intercept.count_nonfinite(x[:, :10]) == 0         # up to the largest finite


def by_numpy(x, q, limit):
    """The counts' definition in NumPy float64, on the values (not the bits)."""
    import numpy as np

    xd, qd = x.double().numpy(), q.double().numpy()
    lim = limit.double().numpy() if isinstance(limit, torch.Tensor) else limit
    fx, fq = np.isfinite(xd), np.isfinite(qd)
    with np.errstate(invalid="ignore"):
        return {"elements": xd.size, "overflow": int((fx & ~fq).sum()),
                "saturated": int((fx & fq & (np.abs(xd) >= lim)).sum()),
                "flushed": int((fx & (xd != 0) & (qd == 0)).sum())}


@pytest.mark.parametrize("numba", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_operand_counts_equal_numpy_on_edge_values(dtype, numba):
    """operand_events' counts and operand_scan's amax and non-zeros, in the compiled pass over
    the bits and without numba, equal NumPy's on the values: every edge value of the dtype
    against quantizations that keep it, flush it, saturate it or overflow it, under scalar
    limits at and between the dtype's values (a Python float, a 0-dim and a one-element tensor,
    inf, 0) and a per-row tensor limit."""
    import numpy as np

    from fpsim.emulation.sites import operand_events

    if numba and not compiled.available():
        pytest.skip("numba is not installed")
    base = edge_values(dtype)
    n = base.numel()
    x = base.repeat(5).reshape(5, n)
    g = torch.Generator().manual_seed(3)
    fate = torch.randint(0, 5, x.shape, generator=g)
    q = torch.where(fate == 1, 0.0, x)
    q = torch.where(fate == 2, torch.tensor(math.inf, dtype=dtype), q)
    q = torch.where(fate == 3, torch.tensor(math.nan, dtype=dtype), q)
    q = torch.where(fate == 4, x.clamp(-448, 448), q)
    limits = [448.0, 448.5, 464.0, float(torch.finfo(dtype).max), math.inf, 0.0, 1e-9,
              torch.tensor(464.0, dtype=torch.float64), torch.full((1, 1), 3.0),
              torch.tensor([[448.0], [1.0], [math.inf], [0.0], [1e300]], dtype=torch.float64)]
    finite = np.isfinite(x.double().numpy())
    want_scan = (float(np.abs(x.double().numpy()[finite]).max()),
                 int((x.double().numpy() != 0).sum()))
    with mock.patch.object(compiled, "available", lambda: numba):
        for limit in limits:
            assert operand_events(x, q, limit) == by_numpy(x, q, limit), limit
        assert intercept.operand_scan(x) == want_scan
        assert intercept.operand_scan(x.t()) == want_scan          # strided
    got = by_numpy(x, q, 448.0)
    assert got["overflow"] and got["saturated"] and got["flushed"]
