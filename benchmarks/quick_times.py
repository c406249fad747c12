"""How long ``fpsim experiment NAME --quick`` takes on the default tiny model, per experiment.

Runs each experiment with ``--quick`` in its own process (as :mod:`experiments_124m` does: wall
and CPU seconds of the child, peak resident memory), then ``all --quick``, and writes the JSON
with the machine and its load average before and after.  CPU seconds say more than wall time on
a shared machine: on 2 idle cores the wall time is about the CPU time divided by the cores
torch keeps busy.  ``model-seeds`` trains its two quick models on its first run (cached after).

    python benchmarks/quick_times.py --out benchmarks/results/quick_times.json
    python benchmarks/quick_times.py --markdown benchmarks/results/quick_times.json

``--markdown`` prints the table docs/experiments.md shows (tests/test_quick.py checks it).  A
row whose ``load_of`` is ``batch`` ran in a batch of rows whose load was recorded at its start
and end only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from experiments_124m import REPO, run  # noqa: E402  (beside this file)
from timing import machine  # noqa: E402

NAMES = ("activations", "range-vs-precision", "fp16-vs-bf16", "fp8", "practice",
         "accumulation", "histograms", "deepseek-accumulation", "training", "model-seeds",
         "range-cases", "all")
TINY = REPO / "fpsim_experiments" / "gpt2" / "tiny"


def markdown(data: dict) -> str:
    """The docs' table: per experiment wall and CPU seconds, with the load it ran under."""
    meta = data["meta"]
    rows = ["| `--quick` run | wall s | CPU s | peak GiB | load average before, after |",
            "|---|---|---|---|---|"]
    rows += [f"| `{r['experiment']}` | {r['wall_s']} | {r['cpu_s']} | {r['peak_rss_gib']} | "
             f"{r['load'][0]:.1f}, {r['load'][1]:.1f}"
             + (" (of its batch)" if r.get("load_of") == "batch" else "") + " |"
             for r in data["rows"]]
    return "\n".join(rows) + (
        f"\n\n{meta['cpu']}, {meta['cores']} cores shared with other jobs, {meta['threads']} "
        f"threads ({meta['date']}; `python benchmarks/quick_times.py`, "
        "`benchmarks/results/quick_times.json`).")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", default=list(NAMES), choices=NAMES)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--limit", type=int, default=1800, help="seconds per experiment")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "out" / "quick_times.json"))
    ap.add_argument("--markdown", type=Path, metavar="JSON",
                    help="print the docs' table of this JSON (nothing is run)")
    args = ap.parse_args()
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return 0
    meta = machine()
    settings = argparse.Namespace(quick=True, tokens=None, threads=args.threads,
                                  limit=args.limit)
    meta.update({"threads": args.threads, "model": "fpsim_experiments/gpt2/tiny"})
    data = {"meta": meta, "rows": []}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only:                     # written after each: a partial run is kept
            before = os.getloadavg()[0]
            row = run(name, TINY, settings, Path(tmp) / name)
            data["rows"].append({**row, "load": [before, os.getloadavg()[0]]})
            Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
            print(data["rows"][-1], flush=True)
    print(markdown(data))
    return 0 if all(r["status"] == 0 for r in data["rows"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
