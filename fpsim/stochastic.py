"""Stochastic rounding's two options, checked once for every entry point that rounds.

``srbits=n``: how many random bits meet the dropped bits (None: all of them, exact stochastic
rounding); ``random_bits=``: the caller's own bits, an integer array of the input's shape with
values in [0, 2^n), so that a result is a pure function of (input, random bits) on every
backend.  The rule of each stochastic mode is ``fpsim.rounding.stochastic_bias``;
``VARIANTS`` names each after the P3109 draft and gfloat (docs/stochastic.md).
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from .backend import is_torch
from .rounding import STOCHASTIC

#: The most random bits a stochastic mode takes: float32 lanes keep the top 30 dropped bits
#: (the rest as a sticky bit), and StochasticC / odd look two bits below the n random ones.
MAX_SRBITS = 28

#: mode -> (the P3109 draft's name, gfloat's RoundMode name, the rule with n random bits r and
#: the dropped fraction f of an ulp).  gfloat's own "Stochastic" is StochasticC.
VARIANTS = {
    "stochastic": ("StochasticA", "StochasticFastest", "floor(f 2^n) + r >= 2^n"),
    "stochastic_b": ("StochasticB", "StochasticFast", "floor(f 2^(n+1)) + 2r + 1 >= 2^(n+1)"),
    "stochastic_c": ("StochasticC", "Stochastic", "roundTiesToEven(f 2^n) + r >= 2^n"),
    "stochastic_odd": (None, "StochasticOdd", "roundTiesToOdd(f 2^n) + r >= 2^n"),
}


def check_srbits(srbits: Any, rounding: str) -> int | None:
    """``srbits`` as an int in [1, MAX_SRBITS], or None; only with a stochastic ``rounding``."""
    if srbits is None:
        return None
    if isinstance(srbits, bool) or not isinstance(srbits, numbers.Integral) \
            or not 1 <= srbits <= MAX_SRBITS:
        raise ValueError(f"srbits={srbits!r}: the number of random bits is a whole number from 1 "
                         f"to {MAX_SRBITS} (None: every dropped bit)")
    if rounding not in STOCHASTIC:
        raise ValueError(f"srbits={srbits} with rounding={rounding!r}: random bits go with a "
                         f"stochastic mode ({', '.join(STOCHASTIC)})")
    return int(srbits)


def check_random_bits(random_bits: Any, x: Any, rounding: str, srbits: int | None,
                      seed: Any, shape: tuple | None = None, layout: str | None = None) -> Any:
    """``random_bits`` as an array (NumPy for NumPy or scalar ``x``, a tensor on ``x``'s device
    for a tensor) of ``x``'s shape, every value in [0, 2^srbits); None stays None.  They need a
    stochastic ``rounding`` and ``srbits`` (how many bits each holds), and no ``seed``.
    ``shape`` and ``layout`` (what the error says it is): the shape they need when it is not
    ``x``'s (matmul: one value per rounding of each output)."""
    if random_bits is None:
        return None
    if rounding not in STOCHASTIC:
        raise ValueError(f"random_bits with rounding={rounding!r}: random bits go with a "
                         f"stochastic mode ({', '.join(STOCHASTIC)})")
    if srbits is None:
        raise ValueError("random_bits needs srbits=: how many random bits each value holds")
    if seed is not None:
        raise ValueError("pass random_bits or seed, not both: the random bits are given")
    if is_torch(random_bits) and (not is_torch(x) or _unsigned(random_bits)):
        random_bits = random_bits.cpu().numpy()     # torch has no min/max for uint16..uint64
    if is_torch(random_bits):                       # a tensor's bits stay on its device
        import torch

        r = random_bits.to(x.device)
        bad = r.is_floating_point() or r.is_complex() or r.dtype == torch.bool
    else:
        r = np.asarray(random_bits)
        bad = r.dtype.kind not in "iu"
    if bad:
        raise TypeError(f"random_bits must be integers, got dtype {r.dtype}")
    if shape is None:
        shape = tuple(x.shape) if is_torch(x) else np.shape(x)
        layout = f"the input's shape {shape}, one value per element"
    if tuple(r.shape) != tuple(shape):
        raise ValueError(f"random_bits has shape {tuple(r.shape)}; it needs {layout}")
    if r.numel() if is_torch(r) else r.size:
        lo, hi = int(r.min()), int(r.max())
        if lo < 0 or hi >= 1 << srbits:
            raise ValueError(f"random_bits hold {lo}..{hi}: with srbits={srbits} each lies in "
                             f"[0, {(1 << srbits) - 1}]")
    if is_torch(x) and not is_torch(r):
        import torch

        r = torch.as_tensor(r.astype(np.int64) if r.dtype.kind == "u" else r, device=x.device)
    return r


def _unsigned(t: Any) -> bool:
    """A torch tensor of unsigned integers wider than a byte."""
    return str(t.dtype) in ("torch.uint16", "torch.uint32", "torch.uint64")


#: PTX ``cvt.rs``: which bits of the 32-bit ``rbits`` each value of a packed conversion uses,
#: as (shift, width) for ``a`` then ``b``, where the PTX ISA's text says so.  The x4 forms
#: (FP8/FP6/FP4) are absent: the text gives only which half (or bytes) serve a pair of values,
#: not which bits go to each value (docs/stochastic.md, "Hardware").
PTX_RBITS = {"f16x2": ((16, 13), (0, 13)), "bf16x2": ((16, 16), (0, 16))}
_PTX_UNSAID = ("e4m3x4", "e5m2x4", "e2m3x4", "e3m2x4", "e2m1x4")


def ptx_random_bits(rbits: Any, conversion: str) -> np.ndarray:
    """The random bits each value of ``cvt.rs.<conversion>.f32 d, a, b, rbits`` uses, shaped
    ``rbits.shape + (2,)`` (``a``, then ``b``), to pass as ``random_bits`` with ``srbits`` the
    width (13 for f16x2: the 13 low bits of each 16-bit half; 16 for bf16x2: each half).

    >>> import numpy as np, fpsim
    >>> from fpsim.stochastic import ptx_random_bits
    >>> r = ptx_random_bits(np.uint32(0xE001_1FFF), "f16x2")    # a: 0x0001, b: 0x1FFF
    >>> r.tolist()
    [1, 8191]
    >>> x = np.float32([1 + 2**-23, 1 + 2**-23])                # 1 + 1/8192 of an fp16 ulp
    >>> fpsim.quantize(x, "fp16", rounding="stochastic", srbits=13, random_bits=r).tolist()
    [1.0, 1.0009765625]
    """
    if conversion in _PTX_UNSAID:
        raise ValueError(f"cvt.rs.{conversion}: the PTX ISA's text does not say which bits of "
                         "rbits each value uses (only which half or bytes serve a pair); split "
                         "rbits yourself and pass random_bits with srbits=8")
    if conversion not in PTX_RBITS:
        raise ValueError(f"unknown conversion {conversion!r}: choose one of "
                         f"{', '.join(PTX_RBITS)} (or the x4 forms {', '.join(_PTX_UNSAID)})")
    r = np.asarray(rbits.cpu() if is_torch(rbits) else rbits)
    if r.dtype.kind not in "iu":
        raise TypeError(f"rbits must be integers (a .b32 register), got dtype {r.dtype}")
    if r.size and (int(r.min()) < 0 or int(r.max()) >= 1 << 32):
        raise ValueError(f"rbits hold {int(r.min())}..{int(r.max())}: a .b32 register holds "
                         "0..2^32 - 1")
    r = r.astype(np.int64)
    lanes = [(r >> shift) & ((1 << width) - 1) for shift, width in PTX_RBITS[conversion]]
    return np.stack(lanes, axis=-1)
