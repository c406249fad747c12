"""Every tensor-core preset against MMA-Sim's own outputs, bit for bit (no MMA-Sim needed).

``tests/data/mmasim_fixture.npz`` is written by ``scripts/mmasim_fixture.py``, which runs
microsoft/MMA-Sim's Python models on adversarial inputs: zeros beside large values, subnormals,
products straddling the alignment cut-off, C cancelling the sum, inf, NaN and overflow.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import fpsim
from fpsim.arith import TENSOR_CORES

FIXTURE = np.load(Path(__file__).parent / "data" / "mmasim_fixture.npz")
META = json.loads(str(FIXTURE["meta"]))


FLOAT = {np.dtype(np.uint16): np.float16, np.dtype(np.uint32): np.float32,
         np.dtype(np.uint64): np.float64}
PLAIN = sorted(k for k, v in META.items() if "mx" not in v)
SCALED = sorted(k for k, v in META.items() if "mx" in v)


def test_fixture_covers_every_preset():
    assert {META[k]["preset"] for k in PLAIN + SCALED} == set(TENSOR_CORES)
    assert {"hopper_tf32:fp32", "cdna3_xf32:fp32"} <= set(PLAIN)    # FP32 operands truncated


def _compare(got: np.ndarray, want: np.ndarray, any_nan: bool = False) -> None:
    """Codes equal; with ``any_nan`` (AMD, whose NaN payloads MMA-Sim does not model) every
    NaN counts as equal to every other."""
    if want.dtype == np.uint16:
        got = got.astype(np.float16)
    floats = FLOAT[want.dtype]
    got = got.view(want.dtype)
    same = got == want
    if any_nan:
        same |= np.isnan(got.view(floats)) & np.isnan(want.view(floats))
    bad = np.argwhere(~same)
    assert bad.size == 0, (f"{len(bad)} of {want.size} differ, first at {tuple(bad[0])}: "
                           f"fpsim {got[tuple(bad[0])]:#x}, MMA-Sim {want[tuple(bad[0])]:#x}")


def _inputs(name: str) -> tuple[np.ndarray, ...]:
    """A, B and C of a preset's cases (float32 codes, float64 for FP64 instructions)."""
    return tuple(FIXTURE[f"{name}.{k}"].view(FLOAT[FIXTURE[f"{name}.{k}"].dtype])
                 for k in "abc")


@pytest.mark.parametrize("backend", ["numpy", "torch", "numba"])
@pytest.mark.parametrize("name", PLAIN)
def test_preset_matches_mma_sim(name, backend):
    a, b, c = _inputs(name)
    preset = META[name]["preset"]
    options = dict(c=c, inputs=tuple(META[name]["inputs"]), order="tensor_core",
                   tensor_core=preset, backend=backend)
    if backend == "numba":
        pytest.importorskip("numba")
        if TENSOR_CORES[preset].accum_format.name == "fp64":
            with pytest.raises(ValueError, match="FP64 fused multiply-adds"):
                fpsim.matmul(a, b, **options)
            return
    if backend == "torch":
        torch = pytest.importorskip("torch")
        a, b, options["c"] = (torch.from_numpy(x) for x in (a, b, c))
        if TENSOR_CORES[preset].accum_format.name == "fp64":
            with pytest.raises(ValueError, match="NumPy backend only"):
                fpsim.matmul(a, b, **options)
            return
    got = fpsim.matmul(a, b, **options)
    _compare(np.asarray(got), FIXTURE[f"{name}.d"], not TENSOR_CORES[preset].canonical_nan)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("entry", SCALED)
def test_block_scaled_preset_matches_mma_sim(entry, backend):
    """MXFP8/MXFP4/NVFP4 operands as fpsim MXArrays through the block-scaled instructions."""
    if backend == "numba":
        pytest.importorskip("numba")
    meta = META[entry]
    (fa, fb), bs = meta["mx"], meta["block_size"]
    x = {k: FIXTURE[f"{entry}.{k}"] for k in ("a", "b", "sa", "sb")}
    ts = 1.0 if fa == "nvfp4" else None
    a = fpsim.mx.MXArray(x["sa"], x["a"], fpsim.mx.get_mx_format(fa), 2, bs, x["a"].shape, ts)
    b = fpsim.mx.MXArray(x["sb"], x["b"], fpsim.mx.get_mx_format(fb), 1, bs, x["b"].shape, ts)
    c = FIXTURE[f"{entry}.c"].view(np.float32)
    got = fpsim.matmul(a, b, c=c, order="tensor_core", tensor_core=meta["preset"],
                       backend=backend)
    _compare(np.asarray(got), FIXTURE[f"{entry}.d"])


def test_block_scaled_operands_are_checked():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((2, 64)), rng.standard_normal((64, 3))
    a, b = fpsim.mx.quantize(x, "mxfp4"), fpsim.mx.quantize(y, "mxfp4", axis=0)
    options = dict(order="tensor_core", tensor_core="blackwell_mxf4nvf4")
    with pytest.raises(ValueError, match="both operands as MXArrays"):
        fpsim.matmul(x, y, **options)
    with pytest.raises(ValueError, match="block-scaled preset"):
        fpsim.matmul(a, b, order="tensor_core", tensor_core="hopper_fp8")
    with pytest.raises(ValueError, match="blocks along K"):
        fpsim.matmul(a, fpsim.mx.quantize(y, "mxfp4"), **options)
    with pytest.raises(ValueError, match="tensor_scale"):
        fpsim.matmul(fpsim.mx.quantize(x, "nvfp4"), fpsim.mx.quantize(y, "nvfp4", axis=0),
                     **options)
    exact = a.dequantize(np.float64) @ b.dequantize(np.float64)    # small sums: exact
    assert np.array_equal(fpsim.matmul(a, b, **options), exact)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit internals on import
def test_compiled_engine_matches_mma_sim():
    """One preset through torch.compile (compiling takes a minute on a CPU)."""
    torch = pytest.importorskip("torch")
    name = "hopper_fp8"
    a, b, c = (torch.from_numpy(x) for x in _inputs(name))
    got = fpsim.matmul(a, b, c=c, inputs=tuple(META[name]["inputs"]), order="tensor_core",
                       tensor_core=name, backend="compiled")
    _compare(got.numpy(), FIXTURE[f"{name}.d"])
