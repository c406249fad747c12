"""Input sets that hit every edge of a target format: all grid points, every midpoint, its
float32 neighbours, the overflow and underflow boundaries, and many random bit patterns."""

from __future__ import annotations

import numpy as np

import fpsim


def float32_probe(fmt, n_random: int = 1_000_000, seed: int = 0) -> np.ndarray:
    fmt = fpsim.get_format(fmt)
    rng = np.random.default_rng(seed)
    parts = [rng.integers(0, 2**32, size=n_random, dtype=np.uint64).astype(np.uint32).view(np.float32)]
    with np.errstate(over="ignore"):
        if fmt.bits <= 16:
            v = fpsim.values(fmt)
            mids = (v[1:] + v[:-1]) / 2
            edges = np.array([fmt.max + (fmt.max - v[-2]) / 2, fmt.min_subnormal / 2,
                              fmt.min_normal, fmt.max * 2, fmt.max, fmt.min_subnormal / 4])
            grid = np.concatenate([v, mids, edges]).astype(np.float32)
            grid = np.concatenate([grid, -grid])
            parts += [grid, np.nextafter(grid, np.float32(np.inf)),
                      np.nextafter(grid, np.float32(-np.inf))]
        specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 3.4028235e38,
                             1e-45, -1e-45, 1.1754942e-38], dtype=np.float32)
        parts.append(specials)
    return np.concatenate(parts)


def all_16bit(dtype) -> np.ndarray:
    """Every bit pattern of a 16-bit float dtype."""
    return np.arange(1 << 16, dtype=np.uint16).view(dtype)
