"""Shared test set-up: Triton runs through its interpreter where no GPU is present, and MKL
sums in one order on every CPU (``fpsim_experiments.REPRODUCIBLE_BLAS``)."""

import os

# sets MKL_CBWR before the first BLAS call: MKL otherwise picks its kernels (hence its
# summation order) by CPU, and the committed numbers and torchao's bits hold only in its
# CPU-independent order
import fpsim_experiments  # noqa: E402,F401


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


if not _has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")
