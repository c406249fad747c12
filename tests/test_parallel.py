"""Large casts and MX quantization split over threads give the single-thread bits."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fpsim
import fpsim.mx as mx
from fpsim import parallel

N = 3 * parallel.GRAIN + 12345            # several pieces and a ragged end


def _data(dtype) -> np.ndarray:
    rng = np.random.default_rng(7)
    x = rng.standard_normal(N) * np.exp2(rng.integers(-30, 30, N))
    x[::997] = np.nan
    x[1::1009] = np.inf
    x[2::1013] = -0.0
    x[3::1019] = 1e-42                     # float32 subnormal
    x[4::1021] = 1e300                     # beyond float32 and every small format
    with np.errstate(over="ignore"):
        return x.astype(dtype)


@pytest.mark.parametrize("n", [0, 1, parallel.GRAIN, 2 * parallel.GRAIN - 1, N])
def test_pieces_cover_the_range_in_order(monkeypatch, n):
    monkeypatch.setenv("FPSIM_THREADS", "3")
    parts = parallel.pieces(n)
    assert parts[0][0] == 0 and parts[-1][1] == n and len(parts) <= 3
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
    assert all(hi - lo >= parallel.GRAIN for lo, hi in parts) or len(parts) == 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fmt", ["bf16", "fp16", "e4m3", "e5m2", "e2m1", "int8"])
def test_threaded_casts_are_bit_identical(monkeypatch, dtype, fmt):
    x = _data(dtype)
    out = {}
    for threads in ("1", "3"):
        monkeypatch.setenv("FPSIM_THREADS", threads)
        with warnings.catch_warnings():
            warnings.simplefilter("error")           # nothing escapes from the workers either
            out[threads] = (fpsim.encode(x, fmt, saturate=True, on_nan="zero"),
                            fpsim.quantize(x, fmt).view(np.uint8))
    assert np.array_equal(out["1"][0], out["3"][0])
    assert np.array_equal(out["1"][1], out["3"][1])


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "mxfp4", "nvfp4"])
def test_threaded_mx_is_bit_identical(monkeypatch, name):
    x = _data(np.float32)[: (N // 64) * 64].reshape(-1, 64)
    got = {}
    for threads in ("1", "3"):
        monkeypatch.setenv("FPSIM_THREADS", threads)
        a = mx.quantize(x, name)
        got[threads] = (a.scales, a.codes)
    assert np.array_equal(got["1"][0], got["3"][0]) and np.array_equal(got["1"][1], got["3"][1])
