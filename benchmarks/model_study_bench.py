"""Per-run cost of the range-vs-precision study on each model (``fpsim experiment
range-vs-precision --model M``): one pass of the model over its inputs natively, under the FP32
reference, under unscaled and per-tensor E4M3 (IEEE-style, the study's e4m3_ieee) and the
capture pass (``Adapter.trace``: Whisper's without greedy decoding), interleaved, best of N, in
CPU seconds of this process on one thread (``time.process_time``: what a pool worker spends,
which a loaded machine's scheduler does not stretch) and wall seconds; per unit (clip,
sentence, window), and the full study's cost from them: in this process on one thread, and
with ``--executor pool --workers 2`` on 2 otherwise idle cores (the driver's native and
reference passes, then the arms shared by two one-thread workers).

    python benchmarks/model_study_bench.py --json benchmarks/results/model_study_bench.json

The table of docs/speed.md is ``table`` of that JSON (``tests/test_model_study.py`` checks
it); ``--merge A.json B.json --json OUT.json`` joins runs made one model at a time.
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

#: inputs per model timed (Whisper: sentences, packed into clips: 27 make 8 clips, one batch of
#: the study's, whose greedy steps read the 51,864-word output weight once for all 8)
SIZES = {"whisper-tiny.en": 27, "minilm": 32, "tiny": 4}


def measure(name: str, repeat: int) -> dict:
    """CPU and wall seconds per unit of each pass, and the full study's estimated seconds."""
    adapter = models.get(name)
    model = adapter.model()
    units = adapter.inputs(SIZES[name])
    with torch.no_grad(), fpsim.emulate(model_study.REFERENCE):
        ref = adapter.run(model, units)
    unscaled, scaled = model_study.arm(8, 4), model_study.arm(8, 4, scaling="tensor")

    def under(rules: fpsim.Rules, capture: bool = False):
        def go(n: int) -> None:
            with fpsim.emulate(rules, capture=capture):
                (adapter.trace if capture else adapter.run)(model, units[:n], ref[:n])
        return go

    fns = {"native": lambda n: adapter.run(model, units[:n], ref[:n]),
           "reference": under(model_study.REFERENCE),
           "e4m3_ieee": under(unscaled.rules()),
           "e4m3_ieee per-tensor": under(scaled.rules()),
           "capture (e4m3_ieee per-tensor)": under(scaled.rules(), capture=True)}
    cpu, wall = {k: float("inf") for k in fns}, {k: float("inf") for k in fns}
    for fn in fns.values():
        fn(1)                                        # warm up (imports, tables, compilation)
    for _ in range(repeat):                          # interleaved: a busy neighbour slows all
        for k, fn in fns.items():
            t, w = time.process_time(), time.perf_counter()
            fn(len(units))
            cpu[k] = min(cpu[k], time.process_time() - t)
            wall[k] = min(wall[k], time.perf_counter() - w)
    per_unit = {k: v / len(units) for k, v in cpu.items()}
    full = adapter.sizes["full"]
    full_units = len(adapter.inputs(full)) if name == "whisper-tiny.en" else full
    return {"model": name, "unit": adapter.unit, "units_timed": len(units),
            "describe": adapter.describe(units), "cpu_seconds": cpu, "seconds": wall,
            "cpu_seconds_per_unit": per_unit,
            "ratio_to_native": {k: v / cpu["native"] for k, v in cpu.items()},
            "full_study": full_study(per_unit, full_units, len(model_study.arms(False)))}


def full_study(per_unit: dict, units: int, arms: int) -> dict:
    """The full study's estimated seconds from the per-unit CPU seconds: the driver's native
    and reference passes, then every arm's per-tensor pass and capture pass, in this process
    or shared by a pool of 2."""
    capture = min(units, model_study.CAPTURE_UNITS["full"])
    driver = units * (per_unit["native"] + per_unit["reference"])
    arm_cost = units * per_unit["e4m3_ieee per-tensor"] \
        + capture * per_unit["capture (e4m3_ieee per-tensor)"]
    return {"units": units, "arms": arms, "capture_units": capture,
            "in_process_seconds": driver + arms * arm_cost,
            "pool_2_seconds": driver + arms * arm_cost / 2}


COLUMNS = ("native", "reference", "e4m3_ieee", "e4m3_ieee per-tensor",
           "capture (e4m3_ieee per-tensor)")


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def table(data: dict) -> str:
    """The Markdown table of docs/speed.md: CPU seconds per unit of each pass on one thread,
    and the full study's estimated time in this process and on a pool of 2 workers."""
    lines = ["| model (unit) | " + " | ".join(COLUMNS)
             + " | full study | in-process, 1 thread | pool of 2 |",
             "|---|" + "---|" * (len(COLUMNS) + 3)]
    for r in data["rows"]:
        f = r["full_study"]
        lines.append(f"| {r['model']} ({r['unit']}) | "
                     + " | ".join(f"{r['cpu_seconds_per_unit'][k]:.3g} s" for k in COLUMNS)
                     + f" | {f['units']} {r['unit']}s × {f['arms']} arms | "
                     f"{_duration(f['in_process_seconds'])} | "
                     f"{_duration(f['pool_2_seconds'])} |")
    loads = [x for r in data["rows"] for x in (r["machine"]["load_average_1_5_15"][0],
                                              r["machine"]["load_average_after"][0])]
    cores = {r["machine"]["cores"] for r in data["rows"]}
    threads = {r["threads"] for r in data["rows"]}
    lines += ["", (f"CPU seconds of {'/'.join(map(str, sorted(threads)))} thread(s), best of "
                   f"{'/'.join(sorted({str(r['repeat']) for r in data['rows']}))}, measured at "
                   f"one-minute load averages {min(loads):.1f}–{max(loads):.1f} on "
                   f"{'/'.join(map(str, sorted(cores)))} cores.")]
    return "\n".join(lines)


def merge(paths: list[Path]) -> dict:
    """One JSON of several runs of this benchmark (rows joined; each keeps its machine)."""
    runs = [json.loads(p.read_text()) for p in paths]
    rows = [{**row, "machine": run["machine"], "threads": run["threads"],
             "repeat": run["repeat"]} for run in runs for row in run["rows"]]
    return {"rows": rows}


def reprice(data: dict) -> dict:
    """``data`` with each row's full study priced at :func:`model_study.arms`'s present count
    from the row's measured CPU seconds per unit (its units kept)."""
    arms = len(model_study.arms(False))
    for row in data["rows"]:
        row["full_study"] = full_study(row["cpu_seconds_per_unit"], row["full_study"]["units"],
                                       arms)
    return data


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--models", nargs="*", default=list(SIZES))
    p.add_argument("--json", type=Path)
    p.add_argument("--merge", nargs="+", type=Path, metavar="JSON",
                   help="join earlier runs' JSON into --json (nothing measured)")
    p.add_argument("--reprice", action="store_true",
                   help="price every row of --json's full study at the study's present arms "
                        "from its measured seconds per unit (nothing measured)")
    args = p.parse_args()
    if args.reprice:
        data = json.loads(args.json.read_text())
        args.json.write_text(json.dumps(reprice(data), indent=1) + "\n")
        print(table(data))
        return
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
