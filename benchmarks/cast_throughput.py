"""Cast throughput: fpsim.quantize / fpsim.encode from float32 beside ml_dtypes and torch.

Prints a table of elements per second (best of --repeat runs) and writes JSON.  Every row is
measured in the same run as its peers, so read the ratios, not the absolute numbers: these
machines are shared and noisy.  Also reports fpsim's peak extra memory (tracemalloc) as a multiple
of the input size.  torch rows: a CPU tensor through fpsim's default driver (the NumPy one,
zero-copy), and fpsim's torch-op path (what CUDA tensors run) eager and under torch.compile.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import ml_dtypes
import numpy as np

import fpsim
from timing import best_times, peak_extra_memory

FORMATS = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16, "e4m3": ml_dtypes.float8_e4m3fn,
           "e5m2": ml_dtypes.float8_e5m2, "e2m3": ml_dtypes.float6_e2m3fn,
           "e2m1": ml_dtypes.float4_e2m1fn}
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "e4m3": "float8_e4m3fn",
                "e5m2": "float8_e5m2"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log2n", type=int, default=24)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile rows")
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "cast_throughput.json"))
    args = ap.parse_args()
    n = 1 << args.log2n
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    rows = []
    try:
        import torch
        torch.set_num_threads(os.cpu_count() or 1)
        tx = torch.from_numpy(x)
    except ImportError:
        torch = None

    for name, md in FORMATS.items():
        sat = name in ("e4m3",)  # torch saturates e4m3fn
        fns = {"ml_dtypes": lambda: x.astype(md),
               "fpsim.quantize": lambda: fpsim.quantize(x, name),
               "fpsim.encode": lambda: fpsim.encode(x, name)}
        compiled_exact = None
        if torch is not None:
            if name in TORCH_DTYPES:
                tdt = getattr(torch, TORCH_DTYPES[name])
                fns["torch .to()"] = lambda: tx.to(tdt)
            fns["fpsim tensor (auto)"] = lambda: fpsim.quantize(tx, name, saturate=sat)
            fns["fpsim torch ops eager"] = lambda: fpsim.quantize(tx, name, saturate=sat,
                                                                  backend="torch")
            if not args.no_compile:
                compiled = torch.compile(
                    lambda t: fpsim.quantize(t, name, saturate=sat, backend="torch"), dynamic=False)
                fns["fpsim torch ops compiled"] = lambda: compiled(tx)
                same = compiled(tx).numpy().view(np.uint32) == \
                    fpsim.quantize(x, name, saturate=sat).view(np.uint32)
                compiled_exact = bool(same.all())
        r = {"format": name, **{k: n / t for k, t in best_times(fns, args.repeat).items()}}
        r["compiled bit-identical to numpy"] = compiled_exact
        r["encode_peak_mem_x_input"] = peak_extra_memory(lambda: fpsim.encode(x, name)) / x.nbytes
        r["quantize_peak_mem_x_input"] = peak_extra_memory(lambda: fpsim.quantize(x, name)) / x.nbytes
        r["encode / ml_dtypes"] = r["fpsim.encode"] / r["ml_dtypes"]
        rows.append(r)
        print(name, {k: (round(v / 1e6, 1) if isinstance(v, float) and v > 1e3 else
                         round(v, 2) if isinstance(v, float) else v) for k, v in r.items()},
              flush=True)

    cols = ["ml_dtypes", "fpsim.quantize", "fpsim.encode", "torch .to()", "fpsim tensor (auto)",
            "fpsim torch ops eager", "fpsim torch ops compiled"]
    print(f"\nfloat32 -> format, {n:,} elements, M elements/s (best of {args.repeat})")
    print(f"{'format':8}" + "".join(f"{c:>26}" for c in cols) + f"{'encode/ml_dtypes':>18}{'mem x in':>10}")
    for r in rows:
        cells = "".join(f"{r[c] / 1e6:26.1f}" if c in r else f"{'-':>26}" for c in cols)
        print(f"{r['format']:8}{cells}{r['encode / ml_dtypes']:18.2f}"
              f"{max(r['encode_peak_mem_x_input'], r['quantize_peak_mem_x_input']):10.2f}")
    meta = {"elements": n, "repeat": args.repeat, "cpu_count": os.cpu_count(),
            "machine": platform.machine(), "numpy": np.__version__,
            "ml_dtypes": ml_dtypes.__version__, "torch": getattr(torch, "__version__", None),
            "unit": "elements per second"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print("torch.compile output bit-identical to the NumPy driver:",
          {r["format"]: r["compiled bit-identical to numpy"] for r in rows})
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
