"""A ``fpsim.emulation.casts.Cast`` applied to a torch tensor, along a GEMM's reduction axis.

fpsim's scalings (``none``, ``tensor``, ``channel``, ``block``, ``tile``) are
``fpsim.emulation.sites.quantize_operand``'s; this module adds the ones training recipes
use.  ``tensorwise`` / ``rowwise`` / ``delayed`` follow torchao's float8 training
(``torchao.float8``, 0.18.0) and Transformer Engine: amax in the tensor's dtype (FP32), scale
``fp32(fmax / max(amax, 1e-12))`` computed in FP64 (optionally rounded down to a power of two:
``exp2(floor(log2(scale)))``), codes ``cast(fp32(x * scale))`` saturated at ``fmax``, values
``fp32(code / scale)`` (torchao's emulated GEMM divides each operand by its scale).  Delayed
scaling (TE ``DelayedScaling``) takes the scale from ``AmaxHistory`` instead of the
tensor: ``fp32(fmax / max(history)) / 2^margin``, kept from the previous call when that
history holds only zeros or non-finite values; 1 before any history.  ``block2d`` is NVFP4's
16 x 16 weight blocks (one E4M3 scale per 256 elements under the FP32 tensor scale), so a
weight has the same values in the forward and the input-gradient GEMM.  ``tile`` / ``tile2d``
are DeepSeek-V3's 1 x 128 and 128 x 128 amax tiles.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from .. import mx
from ..convert import quantize
from ..formats import get_format
from ..rounding import STOCHASTIC
from .casts import Cast
from .sites import generator, quantize_cast, rounding_limit

_EPS = 1e-12            # torchao's floor on amax (float8_utils.EPS)
_BLOCK2D = 16           # NVFP4 weight blocks: 16 x 16


class AmaxHistory:
    """Transformer Engine's delayed-scaling state of one tensor of one site: the amaxes of its
    last ``length`` calls and the scale the next call uses (``margin`` binades below
    ``fmax / max(history)``)."""

    def __init__(self, fmax: float, length: int, margin: int) -> None:
        self.fmax, self.length, self.margin = fmax, length, margin
        self.history: list[float] = []
        self.scale = 1.0

    def use(self, amax: float) -> float:
        """The scale for this call (from earlier calls only); then ``amax`` joins the history."""
        scale = self.scale
        self.history = (self.history + [amax])[-self.length:]
        top = max(self.history)
        if math.isfinite(top) and top > 0:
            s = torch.tensor(self.fmax, dtype=torch.float32) / torch.tensor(top, dtype=torch.float32)
            s = float(s / 2.0 ** self.margin)
            # an amax so small that the scale overflows FP32: its largest value (TE's rule)
            self.scale = s if math.isfinite(s) else float(torch.finfo(torch.float32).max)
        return scale

    def state(self) -> dict[str, Any]:
        """The history (oldest first) and the next scale, for inspection."""
        return {"history": list(self.history), "scale": self.scale}


def cast(x: Tensor, c: Cast, axis: int, *, history: AmaxHistory | None = None,
         scale: Any = None) -> tuple[Tensor, Any, Tensor | None]:
    """``x`` quantized by ``c`` reducing along ``axis``: (values in ``x``'s dtype, the
    magnitude from which an element saturates or overflows, the FP32 scale tensor of a
    ``tensorwise`` / ``rowwise`` / ``delayed`` cast, else None).

    ``delayed`` needs ``history`` (the site's ``AmaxHistory``) or an explicit ``scale``
    (a backward GEMM reusing its forward's); other scalings ignore ``scale``.
    """
    seed = generator(x.device) if c.rounding in STOCHASTIC else None
    if c.scaling in ("tensorwise", "rowwise", "delayed"):
        return _multiplied(x, c, axis, history, scale, seed)
    if c.scaling == "block2d":
        return _block2d(x, c, seed), math.inf, None
    q, limit = quantize_cast(x, c, axis, seed)       # fpsim's own scalings
    return q, limit, None


def _multiplied(x: Tensor, c: Cast, axis: int, history: AmaxHistory | None,
                scale: Any, seed: Any) -> tuple[Tensor, Any, Tensor]:
    """TE / torchao scaled cast: codes of ``x * scale``, values ``code / scale`` (FP32)."""
    f = get_format(c.fmt)
    x32 = x.to(torch.float32)
    if c.scaling == "delayed":
        if scale is None:
            if history is None:
                raise ValueError("delayed scaling needs the site's amax history: run it inside "
                                 "fpsim.emulate, which keeps one per site and tensor")
            amax = float(x32.abs().max()) if x32.numel() else 0.0
            scale = history.use(amax)
        s = torch.tensor(float(scale), dtype=torch.float32, device=x.device)
    else:
        a = x32.abs()
        amax = a.amax(dim=axis, keepdim=True) if c.scaling == "rowwise" else a.max()
        s = (f.max / torch.clamp(amax.double(), min=_EPS)).to(torch.float32)
        if c.pow2:
            s = torch.exp2(torch.floor(torch.log2(s)))
    codes = quantize(x32 * s, f, rounding=c.rounding, saturate=True, srbits=c.srbits, seed=seed)
    return (codes / s).to(x.dtype), rounding_limit(f) / s.double(), s


def _block2d(x: Tensor, c: Cast, seed: Any) -> Tensor:
    """NVFP4 with one block scale per 16 x 16 tile of the last two axes (zero-padded)."""
    n = _BLOCK2D
    *lead, r, k = x.shape
    pr, pk = -r % n, -k % n
    p = torch.nn.functional.pad(x, (0, pk, 0, pr))
    R, K = (r + pr) // n, (k + pk) // n
    tiles = p.reshape(*lead, R, n, K, n).movedim(-3, -2).reshape(*lead, R, K, n * n)
    arr = mx.quantize(tiles, c.fmt, axis=-1, block_size=n * n, rounding=c.rounding,
                      srbits=c.srbits, seed=seed)
    q = arr.dequantize(x.dtype).reshape(*lead, R, K, n, n).movedim(-2, -3)
    return q.reshape(p.shape)[..., :r, :k]

