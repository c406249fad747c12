"""Bit packing of sub-byte codes into bytes: one little-endian bit stream.

Code ``i`` of a ``bits``-wide stream occupies bits ``bits*i .. bits*i + bits - 1`` of the stream,
and byte ``k`` holds stream bits ``8k .. 8k + 7`` (bit 0 is the least significant).  This single
rule gives the layouts hardware and torchao use:

* FP4 (4 bits): two codes per byte, the first in the low nibble (``torch.float4_e2m1fn_x2``);
* FP6 (6 bits): four codes in three bytes; code ``i`` of a group is bits ``6i .. 6i+5`` of the
  24-bit little-endian integer the three bytes spell;
* FP8 / INT8 (8 bits): one code per byte, unchanged.

A final partial byte is padded with zero bits.  NumPy arrays give NumPy arrays, torch tensors give
torch tensors on the same device.  A long stream can be packed from pieces into one output
(``pack_pieces``) and read back a range at a time (``unpack_range``), with temporaries
the size of a piece.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np

from .backend import code_dtype, is_torch, ops_for, to_uint8


def packed_size(count: int, bits: int) -> int:
    """Bytes that ``count`` codes of ``bits`` bits occupy."""
    return (count * _check_bits(bits) + 7) // 8


def _check_bits(bits: int) -> int:
    if not isinstance(bits, (int, np.integer)) or isinstance(bits, bool) or not 1 <= bits <= 8:
        raise ValueError(f"bits={bits!r}: packing handles codes of 1 to 8 bits "
                         "(4 for FP4, 6 for FP6, 8 for FP8/INT8)")
    return int(bits)


def _group(bits: int) -> tuple[int, int]:
    """(codes, bytes) of the smallest whole-byte group: lcm(bits, 8) bits."""
    width = math.lcm(bits, 8)
    return width // bits, width // 8


def pack_codes(codes: Any, bits: int) -> Any:
    """Pack the codes of ``codes`` (flattened in C order) into a 1-D uint8 byte stream."""
    bits = _check_bits(bits)
    return _pack_flat(_flat_uint8(codes, bits), bits)


def pack_pieces(parts: Iterable[Any], bits: int, out: Any) -> Any:
    """``pack_codes`` of the concatenation of ``parts`` (each flattened in C order) written
    into ``out``, a 1-D uint8 array of exactly the packed size: one piece's temporaries at a
    time.  A group of codes split between two parts is carried over to the next."""
    bits = _check_bits(bits)
    n_codes = _group(bits)[0]
    at, carry = 0, None
    for part in parts:
        flat = _flat_uint8(part, bits)
        if carry is not None and carry.shape[0]:
            flat = _cat([carry, flat])
        whole = flat.shape[0] - flat.shape[0] % n_codes
        packed = _pack_flat(flat[:whole], bits)
        out[at:at + packed.shape[0]] = packed
        at, carry = at + packed.shape[0], flat[whole:]
    if carry is not None and carry.shape[0]:
        packed = _pack_flat(carry, bits)
        out[at:at + packed.shape[0]] = packed
        at += packed.shape[0]
    if at != out.shape[0]:
        raise ValueError(f"{at} bytes packed into an output of {out.shape[0]}")
    return out


def _pack_flat(flat: Any, bits: int) -> Any:
    """Pack checked uint8 codes (1-D)."""
    n_codes, n_bytes = _group(bits)
    count = flat.shape[0]
    groups = -(-count // n_codes)
    padded = _pad_to(flat, groups * n_codes).reshape(groups, n_codes)
    ops, lanes = ops_for(flat), code_dtype(n_bytes * 8, torch=is_torch(flat))
    acc = ops.astype(padded[:, 0], lanes)
    for j in range(1, n_codes):
        acc = acc | (ops.astype(padded[:, j], lanes) << (bits * j))
    if n_bytes == 1:
        out = to_uint8(acc)
    else:
        parts = [to_uint8((acc >> (8 * k)) & 0xFF) for k in range(n_bytes)]
        out = _stack(parts).reshape(-1)
    return out[:packed_size(count, bits)]


def unpack_range(buf: Any, bits: int, lo: int, hi: int) -> Any:
    """Codes ``lo .. hi`` of the byte stream ``buf``, as ``unpack_codes`` gives them,
    reading only the bytes of the groups they lie in."""
    n_codes, n_bytes = _group(_check_bits(bits))
    first = lo // n_codes
    flat = _flat_bytes(buf)[first * n_bytes:]
    return unpack_codes(flat, bits, hi - first * n_codes)[lo - first * n_codes:]


def unpack_codes(buf: Any, bits: int, count: int) -> Any:
    """The first ``count`` codes of the byte stream ``buf``, as a 1-D uint8 array."""
    bits = _check_bits(bits)
    if not isinstance(count, (int, np.integer)) or count < 0:
        raise ValueError(f"count={count!r}: pass the number of codes to unpack (>= 0)")
    flat = _flat_bytes(buf)
    need = packed_size(int(count), bits)
    if flat.shape[0] < need:
        raise ValueError(f"{flat.shape[0]} bytes hold fewer than {count} codes of {bits} bits "
                         f"({need} bytes needed)")
    n_codes, n_bytes = _group(bits)
    groups = -(-int(count) // n_codes)
    grouped = _pad_to(flat[:need], groups * n_bytes).reshape(groups, n_bytes)
    ops, lanes = ops_for(flat), code_dtype(n_bytes * 8, torch=is_torch(flat))
    acc = ops.astype(grouped[:, 0], lanes)
    for k in range(1, n_bytes):
        acc = acc | (ops.astype(grouped[:, k], lanes) << (8 * k))
    mask = (1 << bits) - 1
    parts = [to_uint8((acc >> (bits * j)) & mask) for j in range(n_codes)]
    return _stack(parts).reshape(-1)[:int(count)]


# --------------------------------------------------------------------------------------------
# NumPy / torch helpers
# --------------------------------------------------------------------------------------------
def _flat_uint8(codes: Any, bits: int) -> Any:
    if is_torch(codes):
        import torch

        if codes.dtype.is_floating_point or codes.dtype == torch.bool or codes.is_complex():
            raise TypeError(f"codes must be an integer tensor, got {codes.dtype}")
        flat = codes.reshape(-1)
        bad = bool(flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= (1 << bits)))
        flat = flat.to(torch.uint8)
    else:
        flat = np.asarray(codes).reshape(-1)
        if flat.dtype.kind not in "iu":
            raise TypeError(f"codes must be integers, got dtype {flat.dtype}")
        bad = bool(flat.size and (int(flat.min()) < 0 or int(flat.max()) >= (1 << bits)))
        flat = flat.astype(np.uint8, copy=False)
    if bad:
        raise ValueError(f"codes out of range for {bits}-bit packing: each must lie in "
                         f"[0, {(1 << bits) - 1}]")
    return flat


def _flat_bytes(buf: Any) -> Any:
    if is_torch(buf):
        import torch

        if buf.dtype != torch.uint8:
            raise TypeError(f"packed bytes must be a uint8 tensor, got {buf.dtype}")
        return buf.reshape(-1)
    if isinstance(buf, (bytes, bytearray, memoryview)):
        return np.frombuffer(buf, dtype=np.uint8)
    arr = np.asarray(buf)
    if arr.dtype != np.uint8:
        raise TypeError(f"packed bytes must be uint8, got dtype {arr.dtype}")
    return arr.reshape(-1)


def _pad_to(flat: Any, n: int) -> Any:
    extra = n - flat.shape[0]
    if extra == 0:
        return flat
    return _cat([flat, flat.new_zeros(extra) if is_torch(flat) else np.zeros(extra, flat.dtype)])


def _cat(parts: list) -> Any:
    if is_torch(parts[0]):
        import torch

        return torch.cat(parts)
    return np.concatenate(parts)


def _stack(parts: list) -> Any:
    if is_torch(parts[0]):
        import torch

        return torch.stack(parts, dim=1)
    return np.stack(parts, axis=1)
