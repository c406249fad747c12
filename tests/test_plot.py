"""The figures: rendered with Agg, checked for their content against independent counts."""

from __future__ import annotations

import io
import math
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import fpsim

pytest.importorskip("matplotlib")
from matplotlib.collections import LineCollection, PolyCollection  # noqa: E402
from matplotlib.patches import StepPatch  # noqa: E402

from fpsim import plot  # noqa: E402

E4M3_MAX, E4M3_MIN_SUB = 448.0, 2.0**-9


def render(fig) -> None:
    """Draw to PNG, as the gallery does (fails on any drawing error)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=40)
    assert buf.getvalue()[:4] == b"\x89PNG"


def sample() -> np.ndarray:
    """Values mostly inside FP8 E4M3's range, with known overflows and underflows."""
    rng = np.random.default_rng(1)
    body = rng.normal(0, 4, 3000).astype(np.float32)
    big = np.array([500, -1000, 3e4], dtype=np.float32)                # beyond 448
    tiny = np.array([1e-4, -3e-4, 5e-4, 2e-3], dtype=np.float32)       # 3 below 2^-10, 1 above
    return np.concatenate([body, big, tiny])


def e4m3_counts(x: np.ndarray) -> tuple[int, int]:
    """Overflow and underflow counts for E4M3 without fpsim: range test and ml_dtypes' cast."""
    over = int((np.abs(x) > E4M3_MAX).sum())
    cast = x.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    under = int(((x != 0) & (cast == 0)).sum())
    return over, under


def test_error_histogram_counts_and_labels():
    x = sample()
    over, under = e4m3_counts(x)
    assert over == 3 and under >= 3
    fig = plot.error_histogram(x, ["e4m3", "bf16"])
    render(fig)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and "relative error" in ax.get_xlabel()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend[0].startswith("fp8_e4m3fn:")
    assert f"{over} overflow" in legend[0] and f"{under} underflow" in legend[0]
    assert legend[1].startswith("bf16:") and "0 overflow, 0 underflow" in legend[1]
    steps = [p for p in ax.patches if isinstance(p, StepPatch)]
    inrange = np.abs(x) <= E4M3_MAX
    ref = x.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    inexact = int((inrange & (ref != x)).sum())
    assert steps[0].get_data().values.sum() == inexact
    exact = int((inrange & (ref == x)).sum())
    assert f"{exact} exact" in legend[0]


def test_error_histogram_absolute():
    fig = plot.error_histogram(np.array([0.1, 0.2, 0.3]), "bf16", relative=False)
    assert "absolute error" in fig.axes[0].get_xlabel()


def test_number_line_marks_every_value():
    fig = plot.number_line("e4m3")
    render(fig)
    ax = fig.axes[0]
    everything = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    positive = everything[np.isfinite(everything) & (everything > 0)]
    sub = int((positive < 2.0**-6).sum())
    assert (sub, positive.size - sub) == (7, 119)
    lines = [c for c in ax.collections if isinstance(c, LineCollection)]
    ticks = sorted(seg[0][0] for c in lines for seg in c.get_segments())
    np.testing.assert_array_equal(ticks, np.sort(positive))
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [f"subnormal: {sub}", f"normal: {positive.size - sub}"]
    assert ax.get_xscale() == "log" and "126 positive" in ax.get_title()


def test_number_line_refuses_wide_formats():
    with pytest.raises(ValueError, match="at most 16 bits"):
        plot.number_line("fp32")


def test_range_precision_points_and_shared_labels():
    fig = plot.range_precision(["fp16", "e4m3", "e4m3fnuz", "e2m1"])
    render(fig)
    ax = fig.axes[0]
    points = ax.collections[0].get_offsets()
    np.testing.assert_allclose(points[0], [math.log2(65504) + 24, 2.0**-10])
    np.testing.assert_allclose(points[3], [math.log2(6) + 1, 0.5])
    labels = sorted(t.get_text() for t in ax.texts)
    assert labels == ["fp16", "fp4_e2m1", "fp8_e4m3fn\nfp8_e4m3fnuz"]
    assert "binades" in ax.get_xlabel() and "epsilon" in ax.get_ylabel()
    floats = [f for f in fpsim.FORMATS.values() if not f.is_int and f.name != "fp64"]
    assert len(floats) >= 14  # every named float but fp64, by default
    assert len(plot.range_precision().axes[0].collections[0].get_offsets()) == len(floats)


def test_value_coverage_counts_and_ranges():
    x = sample()
    over, under = e4m3_counts(x)
    fig = plot.value_coverage(x, ["e4m3", "fp16"])
    render(fig)
    top, bottom = fig.axes
    hist = [p for p in top.patches if isinstance(p, StepPatch)][0]
    assert hist.get_data().values.sum() == int((x != 0).sum())
    labels = [t.get_text() for t in bottom.get_yticklabels()]
    assert labels == [f"fp8_e4m3fn: {over} overflow, {under} flush to 0",
                      "fp16: 0 overflow, 0 flush to 0"]
    bars = [c for c in bottom.collections if isinstance(c, PolyCollection)]
    xs = [sorted({float(v) for v in c.get_paths()[0].vertices[:, 0]}) for c in bars[:2]]
    np.testing.assert_allclose(xs, [[-9.0, -6.0], [-6.0, math.log2(448)]])
    assert "log2 |x|" in bottom.get_xlabel()


@pytest.mark.parametrize("call, match", [
    (lambda: plot.error_histogram([], "bf16"), "non-empty array of real numbers.* 0 elements"),
    (lambda: plot.error_histogram(["a"], "bf16"), "array of real numbers, got <U1"),
    (lambda: plot.value_coverage([1.0], []), r"no formats given: pass one or more format names"),
    (lambda: plot.error_histogram([1.0], "fp7"), "unknown format 'fp7'. Did you mean 'fp4'"),
])
def test_bad_input_is_a_clear_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_importing_plot_and_nn_does_not_import_matplotlib_or_torch():
    code = ("import sys, fpsim, fpsim.plot, fpsim.nn; "
            "print(sorted(m for m in ('matplotlib', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_without_matplotlib_the_error_names_the_extra(monkeypatch):
    """A missing matplotlib is an ImportError naming what to install, not a bare
    ModuleNotFoundError."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r'pip install "fpsim\[plot\]"'):
        plot.number_line("e2m1")
