"""Bridges to the dtypes data is stored in: ml_dtypes' NumPy dtypes and torch's float8/float4.

fpsim works on bit codes (unsigned integers); ml_dtypes arrays and torch ``float8_*`` tensors
hold the same bits under a float dtype.  [``as_dtype``][] encodes with fpsim (any rounding
mode, saturation, seed) and returns the codes *viewed* as the library's dtype; [``codes_of``][]
goes back: the bits of an ml_dtypes array or torch tensor as codes, and the fpsim format they
are in, so ``fpsim.decode(*fpsim.codes_of(a))`` decodes it.  For 8-bit formats (and every
NumPy/ml_dtypes one) both directions are zero-copy views: no bytes move.  torch's 16/32/64-bit
codes are int32/int64 lanes (``fpsim.backend.code_dtype``), so those take one integer cast.

``torch.float4_e2m1fn_x2`` holds two FP4 codes per byte, the first in the low nibble (PyTorch's
definition; pytorch/ao#2939): ``as_dtype(t, "fp4_e2m1")`` packs pairs along the last
dimension (which must be even; shape [..., n/2]) and ``codes_of`` unpacks them (copies).  torch
has no casts to that dtype, so only the layout is checked against it.

Which fpsim encode options reproduce each library's own cast (tested exhaustively over every
float16 and bfloat16 value): ml_dtypes rounds to nearest even without saturating, NaN into a
format without NaN giving 0 (``on_nan="zero"``); torch's cast to ``float8_e4m3fn`` saturates
finite values (``saturate=True``), the other torch float8 casts do not.  torch's cast to
``float8_e8m0fnu`` has rules of its own that no option reproduces: it ignores the sign, sends 0
to 2^-127 and rounds float32 subnormals up to 2^-126, where fpsim and ml_dtypes give NaN for
0 and negative values (E8M0 has neither) and round subnormals to nearest.  Integer dtypes'
casts truncate and wrap (C's rule): fpsim's encode rounds and saturates instead.

>>> import numpy as np, fpsim
>>> a = fpsim.as_dtype(np.array([0.1, 448.0, 500.0], np.float32), "e4m3", saturate=True)
>>> a.dtype, a.view(np.uint8).tolist()
(dtype(float8_e4m3fn), [29, 126, 126])
>>> codes, fmt = fpsim.codes_of(a)           # the same bytes, as uint8 codes
>>> fmt.name, fpsim.decode(codes, fmt).tolist()
('fp8_e4m3fn', [0.1015625, 448.0, 448.0])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .backend import is_torch
from .convert import encode
from .formats import FORMATS, Format, get_format

#: fpsim format -> (ml_dtypes / NumPy dtype name, torch dtype name); None where there is none.
DTYPES: dict[str, tuple[str | None, str | None]] = {
    "fp64": ("float64", "float64"),
    "fp32": ("float32", "float32"),
    "fp16": ("float16", "float16"),
    "bf16": ("bfloat16", "bfloat16"),
    "fp8_e4m3fn": ("float8_e4m3fn", "float8_e4m3fn"),
    "fp8_e5m2": ("float8_e5m2", "float8_e5m2"),
    "fp8_e4m3fnuz": ("float8_e4m3fnuz", "float8_e4m3fnuz"),
    "fp8_e5m2fnuz": ("float8_e5m2fnuz", "float8_e5m2fnuz"),
    "fp8_e4m3b11fnuz": ("float8_e4m3b11fnuz", None),
    "fp8_e4m3": ("float8_e4m3", None),
    "fp8_e3m4": ("float8_e3m4", None),
    "e8m0": ("float8_e8m0fnu", "float8_e8m0fnu"),
    "fp6_e2m3": ("float6_e2m3fn", None),
    "fp6_e3m2": ("float6_e3m2fn", None),
    "fp4_e2m1": ("float4_e2m1fn", "float4_e2m1fn_x2"),
    "int8": ("int8", "int8"),
    "uint8": ("uint8", "uint8"),
    "int4": ("int4", None),
}
_NUMPY_NAMES = ("float64", "float32", "float16", "int8", "uint8")
#: unsigned code dtype of each width, for NumPy and (signed lanes of that width) for torch
_CODE_NUMPY = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_CODE_TORCH = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def dtype_for(fmt: str | Format, library: str = "numpy") -> Any:
    """The NumPy/ml_dtypes dtype (``library="numpy"``) or torch dtype (``"torch"``) that holds
    ``fmt``'s codes; a ValueError naming the libraries that have one when this one has none.

    >>> dtype_for("e4m3"), dtype_for("e8m0", "torch")
    (dtype(float8_e4m3fn), torch.float8_e8m0fnu)
    """
    f = get_format(fmt)
    key = f.name if FORMATS.get(f.name) == f else next(
        (k for k, v in FORMATS.items() if v == f and k in DTYPES), None)
    names = DTYPES.get(key or "", (None, None))
    if library not in ("numpy", "torch"):
        raise ValueError(f"library={library!r}: choose 'numpy' (ml_dtypes) or 'torch'")
    name = names[library == "torch"]
    if name is None:
        have = [lib for lib, n in zip(("numpy", "torch"), names) if n]
        raise ValueError(f"{f.name} has no {library} dtype"
                         + (f" (it has one in {', '.join(have)})" if have else
                            f"; formats with one: {', '.join(DTYPES)}"))
    if library == "torch":
        import torch

        return getattr(torch, name)
    if name in _NUMPY_NAMES:
        return np.dtype(name)
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, name))


def format_of(dtype: Any) -> Format:
    """The fpsim format whose codes a NumPy/ml_dtypes or torch dtype holds.

    >>> format_of(np.float16).name
    'fp16'
    """
    name = _dtype_name(dtype)
    for key, names in DTYPES.items():
        if name in names:
            return FORMATS[key]
    raise ValueError(f"dtype {name} holds no fpsim format; dtypes with one: "
                     f"{', '.join(sorted({n for ns in DTYPES.values() for n in ns if n}))}")


def _dtype_name(dtype: Any) -> str:
    if type(dtype).__module__.startswith("torch"):
        return str(dtype).removeprefix("torch.")
    return np.dtype(dtype).name


def as_dtype(x: Any, fmt: str | Format, **options: Any) -> Any:
    """``x`` encoded to ``fmt`` by fpsim (``options`` as [``fpsim.encode``][]), returned in the
    library's dtype: an ml_dtypes/NumPy array for NumPy input, a torch tensor of
    ``torch.float8_*`` (etc.) for torch input.  A view of the codes, no copy (but torch's wide
    formats, and FP4 pairs packed into ``float4_e2m1fn_x2``: see the module doc).

    >>> import numpy as np, fpsim
    >>> fpsim.as_dtype(np.float32([1.0, 1e9]), "e5m2").tolist()
    [1.0, inf]
    """
    f = get_format(fmt)
    torch_in = is_torch(x)
    dtype = dtype_for(f, "torch" if torch_in else "numpy")
    codes = encode(x, f, **options)
    if not torch_in:
        codes = np.asarray(codes)
        return codes.view(dtype) if codes.dtype.itemsize == dtype.itemsize else \
            codes.astype(_CODE_NUMPY[dtype.itemsize]).view(dtype)
    import torch

    if dtype == torch.float4_e2m1fn_x2:
        return _pack_pairs(codes).view(dtype)
    size = dtype.itemsize
    lanes = getattr(torch, _CODE_TORCH[size])
    return (codes if codes.dtype == lanes else codes.to(lanes)).view(dtype)


def codes_of(a: Any) -> tuple[Any, Format]:
    """``(codes, fmt)``: the bit codes an ml_dtypes/NumPy array or a torch tensor holds (a
    zero-copy unsigned view for NumPy and 8-bit torch dtypes) and the fpsim format they are
    in; ``fpsim.decode(*codes_of(a))`` gives the values.

    >>> import numpy as np, fpsim
    >>> codes, fmt = fpsim.codes_of(np.float16([1.0, -2.0]))
    >>> codes.tolist(), fmt.name
    ([15360, 49152], 'fp16')
    """
    if is_torch(a):
        import torch

        f = format_of(a.dtype)
        if a.dtype == torch.float4_e2m1fn_x2:
            return _unpack_pairs(a.view(torch.uint8)), f
        size = a.element_size()
        lanes = a.view(getattr(torch, _CODE_TORCH[size]))
        if size == 1:
            return lanes, f
        mask = (1 << (8 * size)) - 1      # int16/int32 lanes: their bits, as fpsim's codes
        return (lanes.to(torch.int64) & mask).to(torch.int32 if size < 4 else torch.int64), f
    arr = np.asarray(a)
    f = format_of(arr.dtype)
    return arr.view(_CODE_NUMPY[arr.dtype.itemsize]), f


def _pack_pairs(codes: Any) -> Any:
    """uint8 FP4 codes [..., n] -> bytes [..., n/2], the first of each pair in the low nibble."""
    if codes.dim() == 0 or codes.shape[-1] % 2:
        raise ValueError(f"float4_e2m1fn_x2 holds pairs along the last dimension; shape "
                         f"{tuple(codes.shape)} has an odd (or no) last dimension: pad it")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def _unpack_pairs(packed: Any) -> Any:
    """bytes [..., n/2] -> uint8 FP4 codes [..., n] (inverse of ``_pack_pairs``)."""
    import torch

    return torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(*packed.shape[:-1], -1)
