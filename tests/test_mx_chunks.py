"""Block formats in pieces: quantize, pack, unpack and dequantize read and write runs of whole
blocks (fpsim.blocks.pieces) into preallocated outputs; every result is bit-identical to one
piece (the whole array at once), and the memory beyond the outputs is a few pieces."""

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fpsim import blocks, mx, parallel

torch = pytest.importorskip("torch")

WHOLE = 1 << 40          # a piece size no test array reaches: one piece, the unpieced result
SIZES = (1, 7, 32, 37, 100)
FORMATS = list(mx.BLOCK_FORMATS)
F32_MAX = np.finfo(np.float32).max


def special(shape, seed=0):
    """float32 data with every case that matters, placed so that blocks of 16 and 32 (and of
    5) along either axis meet them: NaN, ±inf, ±0, subnormals, float32's largest values (max-
    magnitude blocks), E2M1/E4M3 ties, all-zero rows and columns (all-zero blocks), the rest
    random over many binades."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 2.0 ** rng.integers(-30, 30, shape)).astype(np.float32)
    flat = x.reshape(-1)
    flat[3::97] = np.nan
    flat[5::101] = np.inf
    flat[7::103] = -np.inf
    flat[11::89] = -0.0
    flat[17::79] = np.float32(1e-45) * 3
    flat[19::173] = F32_MAX
    flat[23::179] = -F32_MAX
    flat[29::61] = np.float32(0.75) * 2.0 ** rng.integers(-3, 3)       # ties of fp4 and fp8
    x2 = x.reshape(-1, shape[-1])
    x2[1] = 0.0                                          # an all-zero row ...
    x2[:, 1] = 0.0                                       # ... and column
    x2[2] = F32_MAX * np.sign(x2[2] + 0.5)                # a row of max magnitudes
    return x


def to_numpy(a):
    """Exact bits (NaN payloads included) of an array or tensor, as NumPy."""
    a = a.numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
    return a.view(np.dtype(f"u{a.dtype.itemsize}")) if a.dtype.kind == "f" else a


def results(x, fmt, **kw):
    """Every output: codes, scales, tensor scale, packed bytes, dequantized float32/float64
    values, and the codes and scales unpacked again."""
    q = mx.quantize(x, fmt, **kw)
    scales, elements = q.pack()
    back = mx.BlockArray.unpack(scales, elements, fmt, q.shape, axis=q.axis,
                                block_size=q.block_size, tensor_scale=q.tensor_scale)
    out = {"codes": q.codes, "scales": q.scales, "packed scales": scales,
           "packed elements": elements, "unpacked codes": back.codes,
           "unpacked scales": back.scales,
           "float32": mx.dequantize(q), "float64": mx.dequantize(q, np.float64),
           "tensor scale": np.array(-1.0 if q.tensor_scale is None else q.tensor_scale)}
    for v in out.values():
        assert isinstance(v, np.ndarray) or type(v) is type(x)
    return {k: (str(v.dtype), tuple(v.shape), to_numpy(v)) for k, v in out.items()}


def in_pieces(monkeypatch, size, threads=1):
    monkeypatch.setenv("FPSIM_THREADS", str(threads))
    monkeypatch.setattr(mx, "CHUNK", size)
    monkeypatch.setattr(mx, "TORCH_CHUNK", size)


def assert_same(got, want):
    assert got.keys() == want.keys()
    for k in want:
        assert got[k][:2] == want[k][:2], k
        assert np.array_equal(got[k][2], want[k][2]), k


def inputs(shape, seed=0):
    x = special(shape, seed)
    return [x, x.astype(np.float64) * np.pi, torch.from_numpy(x),
            torch.from_numpy(x.astype(np.float64) * np.pi)]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape, axis", [((9, 70), -1), ((70, 9), 0), ((3, 37, 4), 1),
                                         ((2, 3, 33), -1)])
def test_pieces_equal_one_piece(monkeypatch, fmt, shape, axis):
    """Every piece size, NumPy and torch, float32 and float64, along the last, first and a middle
    axis, with axis lengths that neither the block nor any piece size divides."""
    for x in inputs(shape):
        in_pieces(monkeypatch, WHOLE)
        whole = results(x, fmt, axis=axis)
        for size in SIZES:
            in_pieces(monkeypatch, size)
            assert_same(results(x, fmt, axis=axis), whole)


@pytest.mark.parametrize("fmt", ["mxfp6_e3m2", "mxfp4", "nvfp4", "mxint8"])
@pytest.mark.parametrize("block_size", [1, 3, 5])
def test_pieces_with_odd_block_sizes(monkeypatch, fmt, block_size):
    """Blocks whose codes do not fill whole bytes (FP6: 4 codes in 3 bytes, FP4: 2 in 1): a
    piece boundary falls inside a packed group, which is carried over to the next piece."""
    for x in inputs((6, 23), seed=1):
        for axis in (-1, 0):
            in_pieces(monkeypatch, WHOLE)
            whole = results(x, fmt, axis=axis, block_size=block_size)
            for size in (1, 2, 7, 11):
                in_pieces(monkeypatch, size)
                assert_same(results(x, fmt, axis=axis, block_size=block_size), whole)


@pytest.mark.parametrize("rounding, scale_rounding", [("rtz", "ceil"), ("rup", "even"),
                                                      ("rdown", "ceil_amax"), ("rto", None)])
def test_pieces_under_every_rule(monkeypatch, rounding, scale_rounding):
    for fmt in ("mxfp8_e4m3", "mxfp4", "mxint8"):
        for x in inputs((5, 64), seed=2):
            for axis in (-1, 0):
                kw = dict(axis=axis, rounding=rounding, scale_rounding=scale_rounding)
                in_pieces(monkeypatch, WHOLE)
                whole = results(x, fmt, **kw)
                in_pieces(monkeypatch, 37)
                assert_same(results(x, fmt, **kw), whole)


@pytest.mark.parametrize("fmt", ["mxfp8_e5m2", "nvfp4"])
def test_stochastic_rounding_in_pieces(monkeypatch, fmt):
    """NumPy draws the random bits piece after piece from one generator, in row order: the
    bits of one piece.  torch draws them in one call (one piece)."""
    x = special((8, 50), seed=3)
    for data in (x, torch.from_numpy(x)):
        for axis in (-1, 0):
            kw = dict(axis=axis, rounding="stochastic", seed=5)
            in_pieces(monkeypatch, WHOLE)
            whole = results(data, fmt, **kw)
            for size in (1, 40):
                in_pieces(monkeypatch, size)
                assert_same(results(data, fmt, **kw), whole)


def test_threads_give_the_same_bits(monkeypatch):
    """Pieces spread over two threads (fpsim.parallel) write the same outputs."""
    monkeypatch.setattr(parallel, "GRAIN", 64)
    x = special((40, 300), seed=4)
    for fmt in ("mxfp6_e2m3", "nvfp4"):
        for axis in (-1, 0):
            in_pieces(monkeypatch, WHOLE)
            whole = results(x, fmt, axis=axis)
            in_pieces(monkeypatch, 64, threads=2)
            assert_same(results(x, fmt, axis=axis), whole)


def test_nvfp4_tensor_amax_anywhere(monkeypatch):
    """NVFP4's tensor scale is the max over every piece: one large element sets it wherever it
    lies (a piece left out of the reduction would not see it)."""
    for i in range(0, 200, 13):
        x = np.ones((4, 50), np.float32)
        x.reshape(-1)[i] = -1000.0
        for size in (1, 16, 33):
            in_pieces(monkeypatch, size)
            q = mx.quantize(x, "nvfp4", axis=0)
            assert q.tensor_scale == float(np.float32(1000.0) / np.float32(448 * 6))


@pytest.mark.parametrize("shape", [(0,), (0, 5), (5, 0), (1,), (3, 1, 0)])
def test_empty_and_tiny(monkeypatch, shape):
    x = np.full(shape, 2.5, np.float32)
    for fmt in ("mxfp4", "nvfp4"):
        for data in (x, torch.from_numpy(x)):
            in_pieces(monkeypatch, WHOLE)
            whole = results(data, fmt, axis=0)
            in_pieces(monkeypatch, 1)
            assert_same(results(data, fmt, axis=0), whole)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=4), st.data(), st.integers(1, 9),
       st.integers(1, 80))
def test_pieces_cover_every_block_once_in_row_order(dims, data, block_size, size):
    axis = data.draw(st.integers(0, len(dims) - 1))
    lay = blocks.layout(tuple(dims), axis, block_size, pad=True)
    parts = blocks.pieces(lay, size)
    assert sum(p.rows for p in parts) == lay.rows
    first = 0
    for p in parts:
        assert p.first == first and 1 <= p.rows
        assert p.rows * block_size <= max(size, block_size)
        first += p.rows
    # gather of a numbered array gives exactly to_rows' rows
    x = np.arange(1, int(np.prod(dims)) + 1, dtype=np.float64).reshape(dims)
    rows = blocks.to_rows(x, lay)
    x3 = blocks.grouped(x, lay)
    for p in parts:
        assert np.array_equal(blocks.gather(x3, lay, p), rows[p.first:p.first + p.rows])


# --------------------------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------------------------
def peak_beyond(fn, outputs_of):
    """NumPy's allocations during ``fn()`` (tracemalloc) beyond the bytes of its outputs."""
    tracemalloc.start()
    try:
        out = fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak - sum(a.nbytes for a in outputs_of(out))


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp6_e3m2", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("shape, axis", [((1024, 4096), 0), ((1024, 4097), -1)])
def test_memory_beyond_the_outputs_is_a_few_pieces(monkeypatch, fmt, shape, axis):
    """quantize, pack, dequantize and unpack of a 16 MiB float32 operand allocate their outputs
    plus a few pieces: under an eighth of the input, not the full-size copies (the padded or
    transposed input, int64 gathers, the values before the product) of the whole-array code
    (1.5x the input beyond the outputs for quantize, 1x for dequantize)."""
    in_pieces(monkeypatch, 1 << 14)
    x = np.random.default_rng(6).standard_normal(shape).astype(np.float32)
    small = mx.quantize(x[:64, :64], fmt, axis=axis)      # tables and caches built first
    mx.dequantize(small)
    mx.BlockArray.unpack(*small.pack(), fmt, small.shape, axis=axis,
                         tensor_scale=small.tensor_scale)
    limit = x.nbytes / 8
    q = mx.quantize(x, fmt, axis=axis)
    steps = {"quantize": (lambda: mx.quantize(x, fmt, axis=axis),
                          lambda r: (r.codes, r.scales)),
             "pack": (q.pack, lambda r: r),
             "dequantize": (lambda: mx.dequantize(q), lambda r: (r,))}
    packed = q.pack()
    steps["unpack"] = (lambda: mx.BlockArray.unpack(*packed, fmt, q.shape, axis=axis,
                                                    tensor_scale=q.tensor_scale),
                       lambda r: (r.codes, r.scales))
    for name, (fn, outputs_of) in steps.items():
        extra = peak_beyond(fn, outputs_of)
        assert extra < limit, f"{name}: {extra / 2**20:.1f} MiB beyond the outputs"


def test_outputs_are_small_and_contiguous():
    """Codes and scales are uint8 (NumPy and torch), in the input's layout, contiguous."""
    x = special((33, 40))
    for data in (x, torch.from_numpy(x)):
        for axis in (0, 1):
            q = mx.quantize(data, "mxfp8_e4m3", axis=axis)
            for a in (q.codes, q.scales):
                assert str(a.dtype).endswith("uint8")
                assert a.is_contiguous() if isinstance(a, torch.Tensor) else \
                    a.flags.c_contiguous


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8), st.lists(st.integers(0, 13), max_size=6), st.data())
def test_pack_pieces_and_unpack_range_match_the_whole_stream(bits, sizes, data):
    """Packing any split of a code stream into one output gives pack_codes' bytes (groups split
    between parts carried over), and every range unpacks to unpack_codes' codes there."""
    from fpsim.packing import pack_codes, pack_pieces, packed_size, unpack_codes, unpack_range

    rng = np.random.default_rng(len(sizes) * 8 + bits)
    codes = rng.integers(0, 1 << bits, sum(sizes), dtype=np.uint8)
    whole = pack_codes(codes, bits)
    cuts = np.cumsum([0] + sizes)
    for lib in (np, torch):
        wrap = (lambda a: a) if lib is np else torch.from_numpy
        out = wrap(np.full(packed_size(codes.size, bits), 0xAA, np.uint8))
        parts = [wrap(codes[lo:hi]) for lo, hi in zip(cuts[:-1], cuts[1:])]
        assert np.array_equal(to_numpy(pack_pieces(parts, bits, out)), whole)
        lo = data.draw(st.integers(0, codes.size))
        hi = data.draw(st.integers(lo, codes.size))
        got = to_numpy(unpack_range(wrap(whole), bits, lo, hi))
        assert np.array_equal(got, unpack_codes(whole, bits, codes.size)[lo:hi])


@pytest.mark.parametrize("size", [1, 32, 64, 96, 1 << 20])
@pytest.mark.parametrize("torch_in", [False, True])
def test_padding_is_checked_in_every_piece(monkeypatch, size, torch_in):
    """A non-zero padding code is refused wherever it lies, whichever piece holds it (the
    last block of each row holds 5 codes and 27 of padding)."""
    x = np.linspace(-3, 3, 7 * 37, dtype=np.float32).reshape(7, 37)
    arr = mx.quantize(torch.from_numpy(x) if torch_in else x, "mxfp8_e4m3")
    scales, packed = arr.pack()
    in_pieces(monkeypatch, size)
    again = mx.BlockArray.unpack(scales, packed, "mxfp8_e4m3", (7, 37))
    assert np.array_equal(np.asarray(again.codes), np.asarray(arr.codes))
    for row in range(7):
        bad = np.array(np.asarray(packed))                # a writable copy
        bad[row * 64 + 32 + 5 + row] = 1                  # a padding code of row ``row``
        with pytest.raises(ValueError, match="padding of shape"):
            mx.BlockArray.unpack(scales, torch.from_numpy(bad) if torch_in else bad,
                                 "mxfp8_e4m3", (7, 37))
