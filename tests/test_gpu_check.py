"""benchmarks/gpu_check.py runs end to end in the Triton interpreter (its --dry-run), so the one
prepared GPU script is known to work before a GPU is at hand; and every committed hardware
capture of tensor-core outputs is replayed through fpsim on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fpsim

pytest.importorskip("torch")
pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parent.parent


def test_dry_run_checks_every_section(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--dry-run",
                          "--out-dir", str(tmp_path), "--fixture-dir", str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check_dry_run.json").read_text())
    assert report["bitexact"]["total_mismatches"] == 0
    assert set(report["bitexact"]["casts"]) == {"fp8_e4m3fn", "fp4_e2m1", "bf16", "int8"}
    assert all(v["mismatches"] == 0 for v in report["emulation"]["matmul"].values())
    assert len(report["emulation"]["matmul"]) == 6
    assert {r["group"] for r in report["bandwidth"]} >= {"copy", "torch", "kernels", "mx"}
    assert not any("error" in r for r in report["bandwidth"])
    rows = {r["recipe"]: r for r in report["model"]}
    assert len(rows) == 7 and rows["native FP32 (no emulation)"]["ratio"] == 1
    assert all(r["forward_s"] > 0 for r in rows.values())
    speed = report["tensor_core_speed"]
    assert [r["engine"] for r in speed["rows"]] == (["native torch.matmul float32"]
                                                   + ["fpsim torch"] * 5)
    assert all(r["mac_per_s"] > 0 for r in speed["rows"])
    assert [r["recipe"] for r in speed["model"]] == ["native FP32 (no emulation)",
                                                     "deepseek-v3 preset, linear layers"]
    capture = np.load(tmp_path / "tensor_cores_dry_run.npz")
    # the dry run's "device" is CPU torch, whose FP32 GEMM of exact products the fp32 sequential
    # model reproduces here: the fixture's layout round-trips through the comparison
    for key in ("fp16_k32", "bf16_k256"):
        a, b = capture[f"{key}_a"].view(np.float32), capture[f"{key}_b"].view(np.float32)
        d = capture[f"{key}_d"].view(np.float32)
        out = str(capture[f"{key}_d_format"])
        got = fpsim.matmul(a, b, accum="fp32", output=None if out == "fp32" else out)
        assert np.array_equal(np.asarray(got, np.float32).view(np.uint32), d.view(np.uint32))


HARDWARE = sorted(p for p in (ROOT / "tests" / "fixtures").glob("tensor_cores_*.npz")
                  if "dry_run" not in p.name)


def _hardware_capture_matches_a_preset(path: Path) -> None:
    """Real GPU outputs (captured by gpu_check.py) against the tensor_core preset of the GPU."""
    capture = np.load(path)
    meta = json.loads(str(capture["meta"]))
    keys = sorted({k.rsplit("_", 1)[0] for k in capture.files if k.endswith("_d")})
    presets = {"fp16": "hopper_fp16", "bf16": "hopper_bf16", "fp8": "hopper_fp8"}
    for key in keys:
        kind = key.split("_")[0]
        a, b = capture[f"{key}_a"].view(np.float32), capture[f"{key}_b"].view(np.float32)
        d = capture[f"{key}_d"].view(np.uint32)
        out = str(capture[f"{key}_d_format"])
        inputs = "fp8_e4m3fn" if kind == "fp8" else kind
        got = fpsim.matmul(a, b, inputs=inputs, order="tensor_core", tensor_core=presets[kind],
                           output=None if out == "fp32" else out)
        assert np.array_equal(np.asarray(got, np.float32).view(np.uint32), d), (meta, key)


if HARDWARE:  # defined only once a capture is committed: no test that can only skip
    test_hardware_capture_matches_a_preset = pytest.mark.parametrize(
        "path", HARDWARE, ids=lambda p: p.stem)(_hardware_capture_matches_a_preset)
