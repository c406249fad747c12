"""MX throughput: fpsim.mx.quantize (+ pack) from float32 beside fpsim's scalar cast.

For each block format, times MX quantization of 2^24 float32 values (scales, element codes) and
the same followed by ``pack()``, next to the scalar cast to the element format
(``fpsim.encode(x, elem, saturate=True)``) measured in the same run, interleaved, best of
--repeat.  The ratio column (MX time / scalar-cast time) is the number to read: the machine is
shared and noisy.  Also reports the peak extra memory of the MX quantize as a multiple of the
input (tracemalloc) and, for information, the torch CPU path.  Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import numpy as np

import fpsim
import fpsim.mx as mx
from timing import best_times, peak_extra_memory

FORMATS = ["mxfp8_e4m3", "mxfp4", "mxfp6_e2m3", "nvfp4"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log2n", type=int, default=24)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-torch", action="store_true", help="skip the torch rows")
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "mx_throughput.json"))
    args = ap.parse_args()
    n = 1 << args.log2n
    x = np.random.default_rng(0).standard_normal((n // 4096, 4096)).astype(np.float32)
    tx = None
    if not args.no_torch:
        try:
            import torch

            torch.set_num_threads(os.cpu_count() or 1)
            tx = torch.from_numpy(x)
        except ImportError:
            pass

    rows = []
    for name in FORMATS:
        elem = mx.get_mx_format(name).elem
        fns = {"scalar cast": lambda: fpsim.encode(x, elem, saturate=True),
               "mx quantize": lambda: mx.quantize(x, name),
               "mx quantize+pack": lambda: mx.quantize(x, name).pack()}
        if tx is not None:
            fns["mx torch quantize+pack"] = lambda: mx.quantize(tx, name).pack()
        t = best_times(fns, args.repeat)
        r = {"format": name, "element": elem.name}
        r.update({f"{k} Melem/s": n / v / 1e6 for k, v in t.items()})
        r["ratio quantize/scalar"] = t["mx quantize"] / t["scalar cast"]
        r["ratio quantize+pack/scalar"] = t["mx quantize+pack"] / t["scalar cast"]
        r["quantize peak mem x input"] = peak_extra_memory(lambda: mx.quantize(x, name)) / x.nbytes
        rows.append(r)

    keys = [k for k in rows[0] if k not in ("format", "element")]
    print(f"{'format':12s} " + " ".join(f"{k:>26s}" for k in keys))
    for r in rows:
        print(f"{r['format']:12s} " + " ".join(f"{r.get(k, float('nan')):26.2f}" for k in keys))
    out = {"n": n, "repeat": args.repeat, "machine": platform.machine(),
           "cpus": os.cpu_count(), "numpy": np.__version__, "rows": rows,
           "note": "ratio = MX time / scalar cast time, same run; goal <= 2 and >= 50 Melem/s"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
