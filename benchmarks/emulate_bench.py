"""fpsim.emulate: what the interception costs over calling fpsim.matmul on the same operands.

Each case is one ``nn.Linear`` (no bias) run under ``fpsim.emulate`` with a recipe whose
accumulator is emulated (operands rounded to ``inputs``, sums in ``accum`` with ``order``),
against ``fpsim.matmul(x, W.T, inputs=..., accum=..., order=...)`` called directly on the same
tensors: the same bits (checked), so the ratio is the overhead of the TorchFunctionMode, the
module hooks, the recipe lookup and the operand handling.  Two emulated variants: the context
entered for every call (hooks registered each time, weights quantized each time), and one
context around all calls (its weight cache quantizes W once).  Interleaved best-of-N in one
process; the machine and its load average are recorded.  Target: ratio <= 2.

    PYTHONPATH=. python benchmarks/emulate_bench.py [--repeat 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import fpsim
from fpsim import Recipe

from timing import best_times, machine

CASES = [  # (M, K, N, inputs, accum, order)
    (8, 64, 64, "e4m3", "fp16", "sequential"),
    (64, 256, 256, "e4m3", "fp16", "sequential"),
    (256, 256, 256, "e4m3", "fp16", "sequential"),
    (128, 768, 768, "bf16", "bf16", "pairwise"),
    (512, 256, 1024, "e5m2", "fp16", "chunked"),
]


def run_case(m: int, k: int, n: int, inputs: str, accum: str, order: str,
             repeat: int) -> dict:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=g)
    layer = torch.nn.Linear(k, n, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(n, k, generator=g) / k ** 0.5)
    recipe = Recipe(inputs, accum=accum, order=order, name="bench")
    w = layer.weight.detach()

    def direct() -> torch.Tensor:
        return fpsim.matmul(x, w.t(), inputs=inputs, accum=accum, order=order)

    def per_call() -> torch.Tensor:
        with torch.no_grad(), fpsim.emulate(recipe):
            return layer(x)

    ctx = fpsim.emulate(recipe)
    with torch.no_grad(), ctx:
        def one_context() -> torch.Tensor:
            return layer(x)

        same = torch.equal(per_call(), direct().to(x.dtype)) and torch.equal(
            one_context(), direct().to(x.dtype))
        best = best_times({"direct": direct, "emulate": per_call,
                           "emulate_cached": one_context}, repeat)
    return {"M": m, "K": k, "N": n, "inputs": inputs, "accum": accum, "order": order,
            "same_bits": same, **{f"{k}_s": v for k, v in best.items()},
            "ratio": best["emulate"] / best["direct"],
            "ratio_cached": best["emulate_cached"] / best["direct"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path,
                    default=Path(__file__).parent / "results" / "emulate_bench.json")
    args = ap.parse_args()
    info = machine()
    rows = [run_case(*c, repeat=args.repeat) for c in CASES]
    info["load_average_after"] = machine()["load_average_1_5_15"]
    print(f"machine: {info['cpu']}, {info['cores']} cores, load {info['load_average_1_5_15']}, "
          f"torch threads {torch.get_num_threads()}")
    head = (f"{'M x K x N':>16} {'inputs':>6} {'accum':>5} {'order':>10} {'direct ms':>10} "
            f"{'emulate ms':>11} {'ratio':>6} {'cached ms':>10} {'ratio':>6} bits")
    print(head)
    for r in rows:
        print(f"{r['M']:>5}x{r['K']:>4}x{r['N']:>5} {r['inputs']:>6} {r['accum']:>5} "
              f"{r['order']:>10} {r['direct_s'] * 1e3:>10.2f} {r['emulate_s'] * 1e3:>11.2f} "
              f"{r['ratio']:>6.2f} {r['emulate_cached_s'] * 1e3:>10.2f} "
              f"{r['ratio_cached']:>6.2f} {'same' if r['same_bits'] else 'DIFFER'}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"machine": info, "torch_threads": torch.get_num_threads(),
                                     "repeat": args.repeat, "cases": rows}, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
