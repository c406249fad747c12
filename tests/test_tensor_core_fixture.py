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


def test_fixture_covers_every_preset():
    assert set(META) == set(TENSOR_CORES)


def _inputs(name: str) -> tuple[np.ndarray, ...]:
    return tuple(FIXTURE[f"{name}.{k}"].view(np.float32) for k in "abc")


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("name", sorted(META))
def test_preset_matches_mma_sim(name, backend):
    a, b, c = _inputs(name)
    if backend == "torch":
        torch = pytest.importorskip("torch")
        a, b, c = (torch.from_numpy(x) for x in (a, b, c))
    got = fpsim.matmul(a, b, c=c, inputs=tuple(META[name]["inputs"]), order="tensor_core",
                       tensor_core=name, backend=backend)
    got = np.asarray(got)
    want = FIXTURE[f"{name}.d"]
    if want.dtype == np.uint16:
        got = got.astype(np.float16)
    got = got.view(want.dtype)
    bad = np.argwhere(got != want)
    assert bad.size == 0, (f"{len(bad)} of {want.size} differ, first at {tuple(bad[0])}: "
                           f"fpsim {got[tuple(bad[0])]:#x}, MMA-Sim {want[tuple(bad[0])]:#x}")
