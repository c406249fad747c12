"""A reader of CTranslate2's ``model.bin`` (binary version 6), NumPy only.

Layout (little-endian): uint32 version; the spec name (uint16 length, bytes with a trailing
NUL); uint32 revision; uint32 number of variables, each a name (uint16 length + bytes), uint8
rank, rank x uint32 dims, uint8 dtype id (:data:`DTYPES`), uint32 byte count and the data;
then uint32 number of aliases, each two names (alias, target).  Scalar variables hold the
model's settings (``decoder/num_heads``...).

>>> spec = read("model.bin"); spec.name, spec.variables["decoder/num_heads"]
('WhisperSpec', array(6, dtype=int8))
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

VERSION = 6
#: dtype id -> NumPy dtype (5, bfloat16, is read as its uint16 bits)
DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: np.uint16}


@dataclass(frozen=True)
class Spec:
    """A model.bin's spec name, revision, variables (aliases resolved to their target's
    array) and the aliases themselves (alias -> target)."""

    name: str
    revision: int
    variables: dict[str, np.ndarray]
    aliases: dict[str, str]


class _Cursor:
    def __init__(self, data: bytes, path: Path) -> None:
        self.data, self.pos, self.path = data, 0, path

    def need(self, size: int) -> None:
        if self.pos + size > len(self.data):
            raise ValueError(f"{self.path}: truncated at byte {self.pos} (CTranslate2 model.bin)")

    def take(self, fmt: str) -> tuple:
        self.need(struct.calcsize(fmt))
        out = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return out

    def string(self) -> str:
        (n,) = self.take("<H")
        self.need(n)
        raw = self.data[self.pos:self.pos + n]
        self.pos += n
        return raw.rstrip(b"\0").decode("utf-8")


def read(path: str | Path) -> Spec:
    """Every variable of the CTranslate2 model file ``path`` (binary version 6)."""
    path = Path(path)
    cur = _Cursor(path.read_bytes(), path)
    (version,) = cur.take("<I")
    if version != VERSION:
        raise ValueError(f"{path}: CTranslate2 binary version {version}; this reader reads "
                         f"version {VERSION}")
    name = cur.string()
    (revision,) = cur.take("<I")
    (count,) = cur.take("<I")
    variables: dict[str, np.ndarray] = {}
    for _ in range(count):
        var = cur.string()
        (rank,) = cur.take("<B")
        dims = cur.take(f"<{rank}I") if rank else ()
        dtype_id, nbytes = cur.take("<BI")
        if dtype_id not in DTYPES:
            raise ValueError(f"{path}: variable {var} has unknown dtype id {dtype_id}")
        dtype = np.dtype(DTYPES[dtype_id])
        if nbytes != dtype.itemsize * int(np.prod(dims, dtype=np.int64)):
            raise ValueError(f"{path}: variable {var}: {nbytes} bytes for dims {dims}")
        cur.need(nbytes)
        variables[var] = np.frombuffer(cur.data, dtype, count=nbytes // dtype.itemsize,
                                       offset=cur.pos).reshape(dims)
        cur.pos += nbytes
    (n_alias,) = cur.take("<I")
    aliases = {}
    for _ in range(n_alias):
        alias, target = cur.string(), cur.string()
        if target not in variables:
            raise ValueError(f"{path}: alias {alias} names {target}, which is not a variable")
        aliases[alias] = target
        variables[alias] = variables[target]
    if cur.pos != len(cur.data):
        raise ValueError(f"{path}: {len(cur.data) - cur.pos} bytes after the aliases")
    return Spec(name, revision, variables, aliases)
