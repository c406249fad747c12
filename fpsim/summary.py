"""What quantization did to an array: error, overflow, underflow and SNR in one small record."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .formats import Format, get_format


@dataclass(frozen=True)
class ErrorSummary:
    """Error statistics of ``q`` (``x`` quantized to ``fmt``); see :func:`summarize`."""

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
    """Compare the input ``x`` with its quantized copy ``q`` (arrays or anything array-like)."""
    fmt = get_format(fmt)
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    q = np.asarray(q, dtype=np.float64).reshape(-1)
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
