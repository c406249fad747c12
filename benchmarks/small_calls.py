"""Small calls: a Python float, a NumPy scalar or a 16-element array through fpsim.quantize and
fpsim.encode, against ml_dtypes' cast of the same input (quantize: there and back).

Scalars take the scalar path (fpsim/convert.py ``_scalar_plan``: the format's lookup table as
steps, searched for the scalar's bits, or a Python float's value); arrays of at most 64 elements
the cached plan of their arguments and one binary search of the same steps, whether numba's
kernels are loaded or not (the "kernels not loaded" rows: a fresh process, before any large
cast or compiled matmul loads them).  Interleaved best of N in
one process, many short rounds (on a loaded machine a short round is likelier to run
uninterrupted); ratio = fpsim's time / ml_dtypes' time (the goal: at most 3, and at most
3 us); the machine and its load are recorded.

    PYTHONPATH=. python benchmarks/small_calls.py [--number 200] [--repeat 300] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit
from pathlib import Path

import ml_dtypes
import numpy as np

import fpsim
from fpsim import convert

from timing import machine

FMT, PEER = "fp8_e4m3fn", ml_dtypes.float8_e4m3fn


def cases() -> dict[str, tuple]:
    """name -> (fpsim call, ml_dtypes call) on the same input."""
    f, s32, s64 = 0.1, np.float32(0.1), np.float64(0.1)
    x16 = np.random.default_rng(0).standard_normal(16).astype(np.float32)
    return {
        "quantize Python float": (lambda: fpsim.quantize(f, FMT), lambda: float(PEER(f))),
        "quantize np.float32": (lambda: fpsim.quantize(s32, FMT),
                                lambda: np.float32(PEER(s32))),
        "quantize np.float64": (lambda: fpsim.quantize(s64, FMT),
                                lambda: np.float64(PEER(s64))),
        "encode Python float": (lambda: fpsim.encode(f, FMT),
                                lambda: np.asarray(PEER(f)).view(np.uint8)),
        "quantize 16 float32": (lambda: fpsim.quantize(x16, FMT),
                                lambda: x16.astype(PEER).astype(np.float32)),
        "encode 16 float32": (lambda: fpsim.encode(x16, FMT),
                              lambda: x16.astype(PEER).view(np.uint8)),
    }


def best_us(fn, number: int, repeat: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--number", type=int, default=200, help="calls per round")
    ap.add_argument("--repeat", type=int, default=300, help="rounds (best taken)")
    ap.add_argument("--json", type=Path,
                    default=Path(__file__).parent / "results" / "small_calls.json")
    args = ap.parse_args()
    info = machine()
    fpsim.quantize(np.ones(1 << 17, np.float32), FMT)      # loads numba's kernels
    rows = []
    for name, (ours, peer) in cases().items():
        variants = {"": None}
        if "16" in name:
            variants["; kernels not loaded"] = convert._KERNELS
        for label, hide in variants.items():
            saved = sys.modules.pop(hide) if hide else None
            try:
                ours(), peer()
                t_ours = t_peer = float("inf")
                for _ in range(args.repeat):                 # interleaved rounds
                    t_ours = min(t_ours, best_us(ours, args.number, 1))
                    t_peer = min(t_peer, best_us(peer, args.number, 1))
            finally:
                if saved is not None:
                    sys.modules[hide] = saved
            rows.append({"call": name + label, "fpsim_us": round(t_ours, 3),
                         "ml_dtypes_us": round(t_peer, 3), "ratio": round(t_ours / t_peer, 2)})
            print(f"{name + label:55} fpsim {t_ours:7.2f} us  ml_dtypes {t_peer:6.2f} us  "
                  f"ratio {t_ours / t_peer:5.2f}")
    info["load_average_after"] = machine()["load_average_1_5_15"]
    print(f"machine: {info['cpu']}, {info['cores']} cores, load {info['load_average_1_5_15']} "
          f"-> {info['load_average_after']}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"machine": info, "format": FMT, "number": args.number,
                                     "repeat": args.repeat, "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
