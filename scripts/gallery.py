"""Write the README's figures to docs/figures/ (deterministic data; about 5 s on one core).

Run from the repository root:  python scripts/gallery.py [OUT_DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from fpsim import plot

FORMATS = ["bf16", "fp16", "e4m3", "e5m2", "e2m1"]


def data(n: int = 50_000) -> tuple[np.ndarray, np.ndarray]:
    """Stand-ins for a network's tensors: heavy-tailed activations and small Gaussian weights."""
    rng = np.random.default_rng(0)
    activations = (rng.standard_t(3, n) * 0.5).astype(np.float32)
    weights = rng.normal(0.0, 0.02, n).astype(np.float32)
    return activations, weights


def main(out: str = "docs/figures") -> None:
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    activations, weights = data()
    figures = {
        "error_histogram.png": plot.error_histogram(activations, FORMATS),
        "number_line_e4m3.png": plot.number_line("e4m3"),
        "number_line_e2m1.png": plot.number_line("e2m1"),
        "range_precision.png": plot.range_precision(),
        "value_coverage.png": plot.value_coverage(weights, FORMATS),
    }
    for name, fig in figures.items():
        fig.savefig(folder / name, dpi=90)
        print(folder / name)


if __name__ == "__main__":
    main(*sys.argv[1:])
