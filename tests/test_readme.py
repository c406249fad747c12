"""The README's Python tour runs, and its comments state what the code returns."""

import re
from pathlib import Path

import numpy as np

import fpsim

README = Path(__file__).resolve().parents[1] / "README.md"


def test_tour_runs(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "the README has a Python tour"
    monkeypatch.chdir(tmp_path)
    for code in blocks:
        if "model(" in code:  # the fake-quantization sketch needs a model of the reader's own
            continue
        exec(compile(code, "README.md", "exec"), {})
    assert (tmp_path / "errors.png").stat().st_size > 1000


def test_tour_comments_are_true():
    assert fpsim.quantize(np.float32(0.1), "bf16") == 0.10009765625  # exact bf16 value
    assert fpsim.quantize(np.float32(0.1), "bf16").dtype == np.float32
    assert fpsim.encode([448.0, 500.0], "e4m3").tolist() == [126, 127]
    assert fpsim.encode([500.0], "e4m3", saturate=True).tolist() == [126]
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    scales, elements = fpsim.mx.quantize(x, "mxfp4").pack()
    assert (scales.size, elements.size) == (8, 128)
    ones = np.ones((1, 4096), np.float16)
    y, stats = fpsim.matmul(ones, ones.T, accum="fp16", return_stats=True)
    assert y.tolist() == [[2048.0]] and stats.swamped.tolist() == [[2048]]
