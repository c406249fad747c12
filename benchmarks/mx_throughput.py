"""MX throughput: fpsim.mx.quantize + pack from float32 beside torchao's MX/NVFP4 quantizers.

For each block format, times MX quantization of 2^24 float32 values followed by ``pack()``
(scales and packed element bytes, what torchao's ``to_mx``/``nvfp4_quantize`` return on CPU),
next to torchao (the peer, when installed) and fpsim's scalar cast to the element format
(``fpsim.encode(x, elem, saturate=True)``), measured in the same run, interleaved, best of
--repeat.  The headline is the ratio fpsim / torchao throughput (> 1: fpsim is faster): the
machine is shared and noisy, absolute numbers are not comparable between runs.  Also reports
the peak extra memory of the MX quantize as a multiple of the input (tracemalloc) and the machine
with its load average.  Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

import fpsim
import fpsim.mx as mx
from timing import best_times, machine, peak_extra_memory

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

    peers = _torchao_peers(tx) if tx is not None else {}
    meta = machine()
    rows = []
    for name in FORMATS:
        elem = mx.get_mx_format(name).elem
        fns = {"scalar cast": lambda: fpsim.encode(x, elem, saturate=True),
               "mx quantize": lambda: mx.quantize(x, name),
               "mx quantize+pack": lambda: mx.quantize(x, name).pack()}
        if tx is not None:
            fns["mx torch quantize+pack"] = lambda: mx.quantize(tx, name).pack()
        if name in peers:
            fns["torchao"] = peers[name]
        t = best_times(fns, args.repeat)
        r = {"format": name, "element": elem.name}
        r.update({f"{k} Melem/s": n / v / 1e6 for k, v in t.items()})
        r["ratio quantize/scalar"] = t["mx quantize"] / t["scalar cast"]
        r["ratio quantize+pack/scalar"] = t["mx quantize+pack"] / t["scalar cast"]
        if "torchao" in t:
            r["fpsim / torchao (throughput)"] = t["torchao"] / t["mx quantize+pack"]
        r["quantize peak mem x input"] = peak_extra_memory(lambda: mx.quantize(x, name)) / x.nbytes
        rows.append(r)

    keys = [k for k in rows[0] if k not in ("format", "element")]
    print(f"{'format':12s} " + " ".join(f"{k:>26s}" for k in keys))
    for r in rows:
        print(f"{r['format']:12s} " + " ".join(f"{r.get(k, float('nan')):26.2f}" for k in keys))
    out = {"n": n, "repeat": args.repeat, "machine": meta, "numpy": np.__version__,
           "torchao": _version("torchao"), "rows": rows,
           "note": "headline: fpsim / torchao throughput, same run, interleaved (> 1: faster)"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


def _version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001
        return None


def _torchao_peers(tx) -> dict:
    """torchao's CPU quantizers for the same blocks (32 for MX, 16 for NVFP4), if installed."""
    try:
        import torch
        from torchao.prototype.mx_formats.constants import DTYPE_FP6_E2M3
        from torchao.prototype.mx_formats.mx_tensor import to_mx
        from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize
    except ImportError:
        return {}
    return {"mxfp8_e4m3": lambda: to_mx(tx, torch.float8_e4m3fn, 32),
            "mxfp4": lambda: to_mx(tx, torch.float4_e2m1fn_x2, 32),
            "mxfp6_e2m3": lambda: to_mx(tx, DTYPE_FP6_E2M3, 32),
            "nvfp4": lambda: nvfp4_quantize(tx, 16)}


if __name__ == "__main__":
    main()
