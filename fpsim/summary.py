"""What quantization did to an array: error, overflow, underflow and SNR in one small record."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .backend import is_torch
from .formats import Format, get_format


@dataclass(frozen=True)
class ErrorSummary:
    """Error statistics of ``q`` (``x`` quantized to ``fmt``); see [``summarize``][]."""

    count: int           # elements
    nonfinite_in: int    # NaN or inf inputs
    nonfinite_out: int   # NaN or inf results
    overflow: int        # finite inputs outside [fmt.min, fmt.max] (0 for unsigned formats)
    underflow: int       # finite non-zero inputs whose result is zero
    max_abs: float       # largest |q - x| over finite pairs (nan when there are none)
    max_rel: float       # largest |q - x| / |x| over finite pairs with x != 0
    snr_db: float        # 10 log10(sum x^2 / sum (q - x)^2) over finite pairs; inf when exact

    def lines(self) -> list[str]:
        """Human-readable lines, one statistic each."""
        return [
            f"elements       {self.count}",
            f"max abs error  {_num(self.max_abs)}",
            f"max rel error  {_num(self.max_rel)}  (finite, non-zero inputs with finite results)",
            f"overflow       {self.overflow}  (finite inputs beyond the largest finite value)",
            f"underflow      {self.underflow}  (non-zero inputs that became zero)",
            f"non-finite     {self.nonfinite_in} in, {self.nonfinite_out} out",
            f"SNR            {_num(self.snr_db, '.2f')} dB",
        ]


def _num(v: float, spec: str = ".6g") -> str:
    return "-" if math.isnan(v) else format(v, spec)


def out_of_range(x: np.ndarray, fmt: Format) -> np.ndarray:
    """Mask of finite values outside the format's finite range [min, max] (below 0 if unsigned)."""
    lo = fmt.min if fmt.signed else 0.0
    return np.isfinite(x) & ((x > fmt.max) | (x < lo))


def summarize(x: Any, q: Any, fmt: str | Format) -> ErrorSummary:
    """Error statistics of ``q``, the quantized copy of ``x`` in ``fmt``: how many values
    overflowed, flushed to zero or became NaN/inf, the largest absolute and relative errors,
    and the SNR in dB (an [``ErrorSummary``][]; ``.lines()`` prints it as ``fpsim quantize``
    does).  Works on anything array-like, NumPy or torch (moved to float64 on the CPU).

    >>> import numpy as np, fpsim
    >>> x = np.array([0.1, 1000.0, 1e-5, -2.0], np.float32)
    >>> s = fpsim.summarize(x, fpsim.quantize(x, "e4m3", saturate=True), "e4m3")
    >>> s.overflow, s.underflow, s.max_abs
    (1, 1, 552.0)
    """
    fmt = get_format(fmt)
    x, q = (np.asarray(_cpu(a), dtype=np.float64).reshape(-1) for a in (x, q))
    if x.shape != q.shape:
        raise ValueError(f"x has {x.size} elements but q has {q.size}: pass the quantized copy "
                         "of x")
    fin_x, fin_q = np.isfinite(x), np.isfinite(q)
    both = fin_x & fin_q
    xs, err = x[both], np.abs(q[both] - x[both])
    nz = xs != 0
    max_abs = float(err.max()) if err.size else math.nan
    max_rel = float((err[nz] / np.abs(xs[nz])).max()) if nz.any() else math.nan
    return ErrorSummary(
        count=int(x.size),
        nonfinite_in=int((~fin_x).sum()),
        nonfinite_out=int((~fin_q).sum()),
        overflow=int(out_of_range(x, fmt).sum()),
        underflow=int((fin_x & (x != 0) & (q == 0)).sum()),
        max_abs=max_abs,
        max_rel=max_rel,
        snr_db=_snr_db(xs, err),
    )


def _cpu(a: Any) -> Any:
    """A torch tensor detached and on the CPU (float64 for NumPy); anything else as it is."""
    return a.detach().cpu().double() if is_torch(a) else a


def _snr_db(x: np.ndarray, err: np.ndarray) -> float:
    """Signal-to-noise ratio in dB, scaled first so that squares cannot overflow."""
    if not x.size:
        return math.nan
    scale = max(float(np.abs(x).max()), float(err.max()))
    if scale == 0 or float(err.max()) == 0:
        return math.inf
    signal = float(np.sum((x / scale) ** 2))
    noise = float(np.sum((err / scale) ** 2))
    return 10 * math.log10(signal / noise) if signal else -math.inf
