"""Cast throughput: fpsim.encode / fpsim.quantize beside ml_dtypes, from float32 and float64.

The headline is the ratio to the peer measured in the same run, interleaved, best of --repeat
(> 1: fpsim is faster): encode against ml_dtypes' ``astype`` (NumPy's for fp16), quantize
against ``astype`` there and back.  Absolute numbers vary 2-5x between machines and with load;
the machine and its load average are recorded beside them.  Also: the cost of a 16-element
call, and torch rows (a CPU tensor through fpsim's default NumPy driver, zero-copy; fpsim's
torch-op path, what CUDA tensors run without Triton, eager and under torch.compile, checked bit
for bit) beside torch's own casts.  Note: ml_dtypes converts float64 to bfloat16 through float32
(two roundings: 1 + 2^-8 + 2^-30 becomes 1.0, not 1.0078125); fpsim rounds once.

tf32 has no ml_dtypes type: its peer is NumPy's round-to-nearest-even bit trick on float32 bits,
``(b + 0xFFF + ((b >> 13) & 1)) & ~0x1FFF`` (the code: ``>> 13``), which ignores NaN payloads
(a NaN can turn into inf or carry into the sign), so it does less than fpsim; float64 input goes
through ``astype(float32)`` first (two roundings, like ml_dtypes' bfloat16).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import ml_dtypes
import numpy as np

import fpsim
from timing import best_times, machine

FORMATS = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16, "e4m3": ml_dtypes.float8_e4m3fn,
           "e5m2": ml_dtypes.float8_e5m2, "e2m3": ml_dtypes.float6_e2m3fn,
           "e3m2": ml_dtypes.float6_e3m2fn, "e2m1": ml_dtypes.float4_e2m1fn}
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "e4m3": "float8_e4m3fn",
                "e5m2": "float8_e5m2"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log2n", type=int, default=24)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-torch", action="store_true", help="skip the torch rows")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile rows")
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "cast_throughput.json"))
    args = ap.parse_args()
    meta = machine()
    n = 1 << args.log2n
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    sources = {"float32": x, "float64": x.astype(np.float64)}
    rows = []
    for name, md in [*FORMATS.items(), ("tf32", None)]:
        for src, arr in sources.items():
            if md is None:                            # tf32: the bit-trick peer (see above)
                peer = {"ml_dtypes encode": lambda: _tf32_trick(arr, code=True),
                        "ml_dtypes round trip": lambda: _tf32_trick(arr, code=False)}
            else:
                peer = {"ml_dtypes encode": lambda: arr.astype(md),
                        "ml_dtypes round trip": lambda: arr.astype(md).astype(arr.dtype)}
            fns = {**peer,
                   "fpsim.encode": lambda: fpsim.encode(arr, name),
                   "fpsim.quantize": lambda: fpsim.quantize(arr, name)}
            t = best_times(fns, args.repeat)
            r = {"format": name, "input": src, **{k: n / v for k, v in t.items()},
                 "peer": "ml_dtypes" if md is not None else
                 "NumPy RNE bit trick on float32 bits (no NaN handling; float64 via float32)"}
            r["encode ratio"] = t["ml_dtypes encode"] / t["fpsim.encode"]
            r["quantize ratio"] = t["ml_dtypes round trip"] / t["fpsim.quantize"]
            rows.append(r)
            print(f"{name:5} {src:8} encode {r['encode ratio']:5.2f}x  quantize "
                  f"{r['quantize ratio']:5.2f}x  (peer {r['ml_dtypes encode'] / 1e6:7.1f} "
                  "M/s)", flush=True)
    small = x[:16]
    calls = best_times({"ml_dtypes": lambda: small.astype(FORMATS["e4m3"]),
                        "fpsim.encode": lambda: fpsim.encode(small, "e4m3"),
                        "fpsim.quantize": lambda: fpsim.quantize(small, "e4m3")}, 20000)
    per_call = {k: v * 1e6 for k, v in calls.items()}
    per_call["encode / ml_dtypes (time)"] = calls["fpsim.encode"] / calls["ml_dtypes"]
    print("16-element e4m3 call, microseconds:",
          {k: round(v, 2) for k, v in per_call.items()}, flush=True)
    torch_rows = [] if args.no_torch else _torch_rows(x, args)
    meta["load_average_after"] = os.getloadavg()

    print(f"\nfpsim / ml_dtypes throughput, {n:,} elements, best of {args.repeat}, same run "
          f"({meta['cpu']}, {meta['cores']} cores, load {meta['load_average_1_5_15'][0]:.1f} before, "
          f"{meta['load_average_after'][0]:.1f} after)")
    print(f"{'format':8}{'input':9}{'encode':>9}{'quantize':>10}")
    for r in rows:
        print(f"{r['format']:8}{r['input']:9}{r['encode ratio']:9.2f}{r['quantize ratio']:10.2f}")
    print("tf32's peer: NumPy's bit trick on float32 bits (no NaN handling; float64 input "
          "rounded to float32 first, two roundings); fp16's: NumPy's cast")
    print(f"16-element e4m3 encode: {per_call['fpsim.encode']:.2f} us, "
          f"{per_call['encode / ml_dtypes (time)']:.1f}x ml_dtypes' time")
    out = {"meta": {**meta, "elements": n, "repeat": args.repeat, "numpy": np.__version__,
                    "ml_dtypes": ml_dtypes.__version__, "unit": "elements per second",
                    "ratios": "peer time / fpsim time in the same run (> 1: fpsim faster); "
                              "quantize's peer is ml_dtypes' cast and cast back"},
           "rows": rows, "per_call_us": per_call, "torch_rows": torch_rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"\nwrote {args.out}")


def _tf32_trick(arr: np.ndarray, code: bool) -> np.ndarray:
    """tf32's peer: round-to-nearest-even of float32 bits by adding a bias (NaN, inf and
    overflow not handled); float64 input is first rounded to float32 (two roundings).  The
    19-bit codes, or the values in the input's dtype."""
    b = arr.astype(np.float32, copy=False).view(np.uint32)
    r = b + ((b >> np.uint32(13)) & np.uint32(1))
    r += np.uint32(0xFFF)
    if code:
        r >>= np.uint32(13)
        return r
    r &= np.uint32(0xFFFFE000)
    return r.view(np.float32).astype(arr.dtype, copy=False)


def _torch_rows(x: np.ndarray, args: argparse.Namespace) -> list[dict]:
    """fpsim on CPU tensors (NumPy driver, zero copy) and its torch-op path (what CUDA tensors
    run without Triton), eager and compiled (checked bit for bit), beside torch's own casts."""
    try:
        import torch
    except ImportError:
        return []
    torch.set_num_threads(os.cpu_count() or 1)
    tx = torch.from_numpy(x)
    rows = []
    for name, tname in TORCH_DTYPES.items():
        sat = name == "e4m3"  # torch saturates e4m3fn
        tdt = getattr(torch, tname)
        fns = {"torch .to()": lambda: tx.to(tdt),
               "fpsim tensor (auto)": lambda: fpsim.quantize(tx, name, saturate=sat),
               "fpsim torch ops eager": lambda: fpsim.quantize(tx, name, saturate=sat,
                                                               backend="torch")}
        exact = None
        if not args.no_compile:
            compiled = torch.compile(
                lambda t: fpsim.quantize(t, name, saturate=sat, backend="torch"), dynamic=False)
            fns["fpsim torch ops compiled"] = lambda: compiled(tx)
            exact = bool((compiled(tx).numpy().view(np.uint32) ==
                          fpsim.quantize(x, name, saturate=sat).view(np.uint32)).all())
        t = best_times(fns, args.repeat)
        rows.append({"format": name, **{k: x.size / v for k, v in t.items()},
                     "compiled bit-identical to numpy": exact})
        print(name, {k: round(x.size / v / 1e6, 1) for k, v in t.items()}, flush=True)
    return rows


if __name__ == "__main__":
    main()
