"""Per-run cost of the range-vs-precision study on each model (``fpsim experiment
range-vs-precision --model M``): one pass of the model over its inputs natively, under the FP32
reference, under unscaled and per-tensor E4M3 (IEEE-style, the study's e4m3_ieee) and the
capture pass (:meth:`Adapter.trace`: Whisper's without greedy decoding), interleaved, best of N; per unit (clip, sentence, window) and the full study's
cost on this machine from them.

    python benchmarks/model_study_bench.py --threads 2 --json benchmarks/results/model_study_bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import fpsim  # noqa: E402
from fpsim_experiments import model_study, models  # noqa: E402
from timing import best_times, machine  # noqa: E402

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
    best = best_times(fns, repeat)
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--models", nargs="*", default=list(SIZES))
    p.add_argument("--json", type=Path)
    args = p.parse_args()
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
