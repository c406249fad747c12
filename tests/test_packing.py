"""Bit packing: exhaustive FP4 and FP6 round trips, layout against a bit-stream reference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fpsim.packing import pack_codes, packed_size, unpack_codes

torch = pytest.importorskip("torch")


def reference_pack(codes, bits):
    """The spec's layout, literally: code i at bits [bits*i, bits*i + bits) of one LE integer."""
    stream = sum(int(c) << (bits * i) for i, c in enumerate(codes))
    return stream.to_bytes(packed_size(len(codes), bits), "little")


def test_fp4_every_pair_and_every_byte():
    lo, hi = np.meshgrid(np.arange(16), np.arange(16), indexing="ij")
    pairs = np.stack([lo.ravel(), hi.ravel()], axis=1).astype(np.uint8)   # (c0, c1)
    packed = pack_codes(pairs, 4)
    assert packed.dtype == np.uint8 and packed.shape == (256,)
    assert np.array_equal(packed, (pairs[:, 0] | (pairs[:, 1] << 4)).astype(np.uint8))
    every_byte = np.arange(256, dtype=np.uint8)
    codes = unpack_codes(every_byte, 4, 512)
    assert np.array_equal(codes[0::2], every_byte & 0xF)     # first element: low nibble
    assert np.array_equal(codes[1::2], every_byte >> 4)
    assert np.array_equal(pack_codes(codes, 4), every_byte)


@pytest.mark.slow
def test_fp6_all_64_to_the_4_groups():
    """Every 4-code group: group g = c0 + 64 c1 + 4096 c2 + 262144 c3 packs to g's 3 LE bytes."""
    g = np.arange(1 << 24, dtype=np.uint32)
    codes = np.stack([(g >> (6 * i)) & 63 for i in range(4)], axis=1).astype(np.uint8)
    packed = pack_codes(codes, 6)
    expected = np.stack([(g >> (8 * k)) & 0xFF for k in range(3)], axis=1).astype(np.uint8)
    assert np.array_equal(packed, expected.reshape(-1))
    assert np.array_equal(unpack_codes(packed, 6, codes.size), codes.reshape(-1))


def test_eight_bit_codes_are_the_bytes():
    codes = np.arange(256, dtype=np.uint8)
    assert np.array_equal(pack_codes(codes, 8), codes)
    assert np.array_equal(unpack_codes(codes, 8, 256), codes)


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("count", [0, 1, 2, 3, 5, 7, 9, 31, 33, 100])
def test_every_width_matches_the_bit_stream(bits, count):
    codes = np.random.default_rng(bits * 1000 + count).integers(0, 1 << bits, count)
    packed = pack_codes(codes.astype(np.uint8), bits)
    assert bytes(packed) == reference_pack(codes, bits)
    assert np.array_equal(unpack_codes(packed, bits, count), codes)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8).flatmap(
    lambda b: st.tuples(st.just(b), st.lists(st.integers(0, (1 << b) - 1), max_size=70))))
def test_round_trip_property(case):
    bits, codes = case
    packed = pack_codes(np.array(codes, dtype=np.uint8), bits)
    assert bytes(packed) == reference_pack(codes, bits)
    assert unpack_codes(packed, bits, len(codes)).tolist() == codes


@pytest.mark.parametrize("bits", [4, 6, 8, 3])
def test_torch_gives_the_same_bytes(bits):
    codes = np.random.default_rng(bits).integers(0, 1 << bits, 1001).astype(np.uint8)
    t = torch.from_numpy(codes)
    packed = pack_codes(t, bits)
    assert isinstance(packed, torch.Tensor) and packed.dtype == torch.uint8
    assert np.array_equal(packed.numpy(), pack_codes(codes, bits))
    back = unpack_codes(packed, bits, codes.size)
    assert isinstance(back, torch.Tensor) and np.array_equal(back.numpy(), codes)


def test_unpack_accepts_bytes_and_ignores_trailing_bytes():
    assert unpack_codes(b"\x21\x43\xff", 4, 4).tolist() == [1, 2, 3, 4]


def test_packing_a_2d_array_flattens_in_c_order():
    codes = np.array([[1, 2], [3, 4]], dtype=np.uint8)
    assert pack_codes(codes, 4).tolist() == [0x21, 0x43]


@pytest.mark.parametrize("call, match", [
    (lambda: pack_codes(np.array([16]), 4), r"out of range for 4-bit.*\[0, 15\]"),
    (lambda: pack_codes(np.array([-1]), 4), "out of range"),
    (lambda: pack_codes(torch.tensor([64]), 6), r"\[0, 63\]"),
    (lambda: pack_codes(np.array([1.0]), 4), "integers"),
    (lambda: pack_codes(np.array([1]), 9), "1 to 8 bits"),
    (lambda: pack_codes(np.array([1]), 0), "1 to 8 bits"),
    (lambda: unpack_codes(np.zeros(2, np.uint8), 6, 3), "fewer than 3 codes"),
    (lambda: unpack_codes(np.zeros(2, np.uint8), 6, -1), "count"),
    (lambda: unpack_codes(np.zeros(2, np.int32), 8, 1), "uint8"),
])
def test_bad_input_is_named(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()
