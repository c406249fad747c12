"""scaled_quantize in chunks (issue #11): scales from a reduction over the whole tensor, then
quantization piece by piece into the outputs; every result bit-identical to one piece."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fpsim import scaling
from fpsim.scaling import scaled_quantize

torch = pytest.importorskip("torch")

WHOLE = 1 << 40          # a chunk size no test array reaches: one piece, the unchunked result
SIZES = (1, 5, 7, 37, 64, 111)


def special_rows(shape=(9, 37), seed=0):
    """float32 data whose rows (along the last axis) hold the cases that matter: a NaN, an inf,
    -inf, zeros, negative zeros, subnormals, float32's largest values, format ties, and the
    largest magnitude in the last element and in the first; the rest random over many binades."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 2.0 ** rng.integers(-20, 20, shape)).astype(np.float32)
    x = x.reshape(-1, shape[-1])
    x[0, 5] = np.nan
    x[1, -1] = np.inf
    x[2, 0] = -np.inf
    x[3] = 0.0
    x[4] = -0.0
    x[5, ::2] = np.float32(1e-45) * np.arange(1, x[5, ::2].size + 1)        # subnormals
    x[6, :3] = [np.finfo(np.float32).max, -np.finfo(np.float32).max, 1.0]
    x[7] = np.float32(448.0) * (np.arange(x.shape[1]) % 5 - 2) / np.float32(8.0)  # ties, -0
    x[7, -1] = -1e6                                        # amax in the last element
    x[8, 0] = 3e7                                          # amax in the first
    return x.reshape(shape)


def bits(a):
    """Exact bit patterns (NaN payloads included) of an array or tensor, as NumPy."""
    a = a.numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
    return a.view(np.dtype(f"u{a.dtype.itemsize}")) if a.dtype.kind == "f" else a


def quantize_with_chunk(monkeypatch, size, x, fmt, **kw):
    monkeypatch.setenv("FPSIM_THREADS", "1")           # pieces of exactly `size` elements
    monkeypatch.setattr(scaling, "CHUNK", size)
    return scaled_quantize(x, fmt, **kw)


def assert_same(a, b):
    for field in ("values", "codes", "scales", "zero_points"):
        u, v = getattr(a, field), getattr(b, field)
        assert (u is None) == (v is None), field
        if u is not None:
            assert type(u) is type(v) and u.dtype == v.dtype and tuple(u.shape) == tuple(v.shape)
            assert np.array_equal(bits(u), bits(v)), field


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 12), st.integers(0, 40), st.integers(1, 60))
def test_chunks_cover_every_element_once(groups, length, size):
    seen = np.zeros((groups, length), int)
    parts = scaling._chunks(groups, length, size)
    for r, c in parts:
        seen[r, c] += 1
        assert seen[r, c].size <= size or groups * length == 0
    assert (seen == 1).all()
    assert len(parts) >= 1


@pytest.mark.parametrize("fmt, symmetric", [("e4m3", True), ("e5m2", True), ("e2m1", True),
                                            ("fp16", True), ("e9m2", True), ("int8", True),
                                            ("int8", False), ("int4", False)])
@pytest.mark.parametrize("granularity, axis", [("tensor", None), ("channel", 0), ("channel", 2),
                                               ("channel", -2), (("block", 8), -1),
                                               (("block", 5), 1)])
def test_chunked_equals_whole_numpy_and_torch(monkeypatch, fmt, symmetric, granularity, axis):
    """Every chunk size, on NumPy float32/float64 and torch float32/float64 input, with rows of
    NaN, inf, zeros and -0 and lengths that no chunk size divides."""
    x32 = special_rows((3, 3, 37))
    inputs = [x32, x32.astype(np.float64) * np.pi, torch.from_numpy(x32),
              torch.from_numpy(x32.astype(np.float64))]
    kw = dict(granularity=granularity, axis=axis, symmetric=symmetric)
    for x in inputs:
        whole = quantize_with_chunk(monkeypatch, WHOLE, x, fmt, **kw)
        for size in SIZES:
            assert_same(quantize_with_chunk(monkeypatch, size, x, fmt, **kw), whole)


@pytest.mark.parametrize("scale_dtype, margin", [("e8m0", 0), ("fp32", 3), ("e8m0", -2)])
def test_chunked_scale_options(monkeypatch, scale_dtype, margin):
    x = special_rows((9, 37), seed=1)
    for granularity, axis in [("tensor", None), ("channel", 0), (("block", 4), -1)]:
        kw = dict(granularity=granularity, axis=axis, scale_dtype=scale_dtype, margin=margin)
        whole = quantize_with_chunk(monkeypatch, WHOLE, x, "e4m3", **kw)
        for size in SIZES:
            assert_same(quantize_with_chunk(monkeypatch, size, x, "e4m3", **kw), whole)


@pytest.mark.parametrize("shape", [(0,), (0, 5), (4, 0), (1,), ()])
def test_chunked_empty_and_tiny(monkeypatch, shape):
    x = np.full(shape, 2.5, np.float32)
    for granularity in ["tensor", "channel"] if shape and shape[0] else ["tensor"]:
        whole = quantize_with_chunk(monkeypatch, WHOLE, x, "e4m3", granularity=granularity)
        assert_same(quantize_with_chunk(monkeypatch, 1, x, "e4m3", granularity=granularity),
                    whole)


def test_amax_anywhere_reaches_the_scale(monkeypatch):
    """The reduction sees every piece: a single large element, wherever it lies, sets the
    tensor's scale under every chunk size (a piece left out of the reduction would not)."""
    for i in range(0, 101, 7):
        x = np.ones(101, np.float32)
        x[i] = -1000.0
        whole = quantize_with_chunk(monkeypatch, WHOLE, x, "e4m3")
        for size in SIZES:
            r = quantize_with_chunk(monkeypatch, size, x, "e4m3")
            assert r.scales == np.float32(np.float32(1000.0) / np.float32(448.0))
            assert_same(r, whole)


@pytest.mark.parametrize("fmt", ["e4m3", "int8"])
def test_stochastic_rounding_is_not_chunked(monkeypatch, fmt):
    """Stochastic rounding draws the whole tensor's random bits at once: same bits as unchunked
    for a seed (NumPy and torch)."""
    x = special_rows((9, 37), seed=2)
    for data, seed in [(x, 3), (torch.from_numpy(x), 3)]:
        kw = dict(granularity="channel", rounding="stochastic", seed=seed)
        whole = quantize_with_chunk(monkeypatch, WHOLE, data, fmt, **kw)
        assert_same(quantize_with_chunk(monkeypatch, 5, data, fmt, **kw), whole)


def test_default_chunk_bounds_temporaries():
    """A tensor several chunks long is split (the default is not 'whole'), in pieces each large
    enough for fpsim.parallel to split over two threads."""
    from fpsim import parallel

    assert scaling.CHUNK >= 2 * parallel.GRAIN
    assert len(scaling._chunks(1, 3 * scaling.CHUNK + 1, scaling.CHUNK)) == 4
    assert len(scaling._chunks(4 * scaling.CHUNK // 768 + 1, 768, scaling.CHUNK)) == 5


@pytest.mark.parametrize("fmt, granularity, symmetric", [("e4m3", "tensor", True),
                                                         ("int8", "channel", False),
                                                         ("e2m1", ("block", 32), True)])
def test_memory_beyond_the_outputs_is_a_few_chunks(monkeypatch, fmt, granularity, symmetric):
    """NumPy's allocations during a call (tracemalloc): the outputs plus temporaries of a few
    chunks and per-group columns (scales), under a quarter of the input, not the several
    full-size copies of the unchunked computation (3-4 times the input; issue #11)."""
    import tracemalloc

    monkeypatch.setenv("FPSIM_THREADS", "1")
    monkeypatch.setattr(scaling, "CHUNK", 1 << 14)
    x = np.random.default_rng(3).standard_normal((1024, 4096)).astype(np.float32)
    kw = dict(granularity=granularity, symmetric=symmetric)
    scaled_quantize(x[:2], fmt, **kw)                   # lookup tables and caches built first
    tracemalloc.start()
    try:
        r = scaled_quantize(x, fmt, **kw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    extra = peak - r.values.nbytes - r.codes.nbytes
    assert extra < x.nbytes / 4, f"{extra / 2**20:.1f} MiB beyond the outputs"
