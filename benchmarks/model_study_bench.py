"""Per-run cost of the range-vs-precision study on each model (``fpsim experiment
range-vs-precision --model M``): one pass of the model over its inputs natively (after one warm-up pass), under the FP32
reference, under unscaled and per-tensor E4M3 (IEEE-style, the study's e4m3_ieee) and the
capture pass (:meth:`Adapter.trace`: Whisper's without greedy decoding), interleaved, best of N; per unit (clip, sentence, window) and the full study's
cost on this machine from them.

    python benchmarks/model_study_bench.py --threads 2 --json benchmarks/results/model_study_bench.json

The table of docs/speed.md is :func:`table` of that JSON (``tests/test_model_study.py``
checks it); ``--merge A.json B.json --json OUT.json`` joins runs made one model at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from timing import machine

import fpsim
from fpsim_experiments import model_study, models

#: inputs per model timed (Whisper: sentences, packed into clips)
SIZES = {"whisper-tiny.en": 3, "minilm": 32, "tiny": 4}


def measure(name: str, repeat: int) -> dict:
    """Seconds per unit of each pass, and the full study's estimated seconds."""
    adapter = models.get(name)
    model = adapter.model()
    units = adapter.inputs(SIZES[name])
    with torch.no_grad(), fpsim.emulate(model_study.REFERENCE):
        ref = adapter.run(model, units)
    unscaled, scaled = model_study.arm(8, 4), model_study.arm(8, 4, scaling="tensor")

    def under(rules: fpsim.Rules, capture: bool = False):
        def go() -> None:
            with fpsim.emulate(rules, capture=capture):
                (adapter.trace if capture else adapter.run)(model, units, ref)
        return go

    fns = {"native": lambda: adapter.run(model, units, ref),
           "reference": under(model_study.REFERENCE),
           "e4m3_ieee": under(unscaled.rules()),
           "e4m3_ieee per-tensor": under(scaled.rules()),
           "capture (e4m3_ieee per-tensor)": under(scaled.rules(), capture=True)}
    fns["native"]()                                  # warm up (imports, lookup tables)
    best = {k: float("inf") for k in fns}
    for _ in range(repeat):                          # interleaved: a busy neighbour slows all
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t)
    per_unit = {k: v / len(units) for k, v in best.items()}
    full = adapter.sizes["full"]
    full_units = len(adapter.inputs(full)) if name == "whisper-tiny.en" else full
    arms = len(model_study.arms(False))
    capture = min(full_units, model_study.CAPTURE_UNITS["full"])
    arm_cost = per_unit["e4m3_ieee per-tensor"]
    estimate = (full_units * (per_unit["native"] + per_unit["reference"] + arms * arm_cost)
                + arms * capture * per_unit["capture (e4m3_ieee per-tensor)"])
    return {"model": name, "unit": adapter.unit, "units_timed": len(units),
            "describe": adapter.describe(units), "seconds": best, "seconds_per_unit": per_unit,
            "ratio_to_native": {k: v / best["native"] for k, v in best.items()},
            "full_study": {"units": full_units, "arms": arms, "capture_units": capture,
                           "estimated_seconds": estimate}}


COLUMNS = ("native", "reference", "e4m3_ieee", "e4m3_ieee per-tensor",
           "capture (e4m3_ieee per-tensor)")


def table(data: dict) -> str:
    """The Markdown table of docs/speed.md: seconds per unit of each pass, and the full
    study's estimated hours (units x arms, plus the capture passes)."""
    lines = ["| model (unit) | " + " | ".join(COLUMNS) + " | full study | estimated |",
             "|---|" + "---|" * (len(COLUMNS) + 2)]
    for r in data["rows"]:
        f = r["full_study"]
        lines.append(f"| {r['model']} ({r['unit']}) | "
                     + " | ".join(f"{r['seconds_per_unit'][k]:.3g} s" for k in COLUMNS)
                     + f" | {f['units']} {r['unit']}s × {f['arms']} arms | "
                     f"{f['estimated_seconds'] / 3600:.1f} h |")
    loads = [x for r in data["rows"] for x in (r["machine"]["load_average_1_5_15"][0],
                                              r["machine"]["load_average_after"][0])]
    cores = {r["machine"]["cores"] for r in data["rows"]}
    threads = {r["threads"] for r in data["rows"]}
    lines += ["", (f"Measured at one-minute load averages {min(loads):.1f}–{max(loads):.1f} on "
                   f"{'/'.join(map(str, sorted(cores)))} cores, "
                   f"{'/'.join(map(str, sorted(threads)))} threads.")]
    return "\n".join(lines)


def merge(paths: list[Path]) -> dict:
    """One JSON of several runs of this benchmark (rows joined; each keeps its machine)."""
    runs = [json.loads(p.read_text()) for p in paths]
    rows = [{**row, "machine": run["machine"], "threads": run["threads"],
             "repeat": run["repeat"]} for run in runs for row in run["rows"]]
    return {"rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--models", nargs="*", default=list(SIZES))
    p.add_argument("--json", type=Path)
    p.add_argument("--merge", nargs="+", type=Path, metavar="JSON",
                   help="join earlier runs' JSON into --json (nothing measured)")
    args = p.parse_args()
    if args.merge:
        args.json.write_text(json.dumps(merge(args.merge), indent=1) + "\n")
        print(table(json.loads(args.json.read_text())))
        return
    torch.set_num_threads(args.threads)
    os.environ["FPSIM_THREADS"] = str(args.threads)
    out = {"machine": machine(), "threads": args.threads, "repeat": args.repeat,
           "torch": torch.__version__, "rows": [measure(m, args.repeat) for m in args.models]}
    out["machine"]["load_average_after"] = os.getloadavg()
    text = json.dumps(out, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
