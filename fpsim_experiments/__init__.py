"""GPT-2 experiments behind ``fpsim experiment`` (installed with fpsim, tiny checkpoint included).

They need the ``experiments`` extra (torch, matplotlib, safetensors, tqdm); the core package
``fpsim`` never imports them.

Importing this package sets ``MKL_CBWR`` (unless it is set already) to
:data:`REPRODUCIBLE_BLAS`: torch's CPU matmuls go through Intel MKL, which otherwise picks its
kernels by CPU (AVX-512 ones on an Intel Xeon, generic ones on an AMD EPYC), and with them the
order of a GEMM's sums.  FP64 sums of operands that span a wide exponent range (e5m6, e5m10,
FP32) are not exact, so their FP32 rounding, and through the next cast whole runs, then depend
on the CPU: unpinned, an Intel Xeon moved the tiny GPT-2's per-window KL by up to 5% (e5m10
per tensor) against the committed numbers, which it reproduces exactly when pinned.  MKL reads
the variable at its first call: import this package before any torch matmul.
"""

import os

#: MKL's conditional numerical reproducibility branch the experiments run under
REPRODUCIBLE_BLAS = "COMPATIBLE"
os.environ.setdefault("MKL_CBWR", REPRODUCIBLE_BLAS)
