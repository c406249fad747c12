"""``fpsim sweep CONFIG [options]``: run a sweep and write ``OUT/`` (docs/sweep.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fpsim.cliparse import OneLineParser

from . import config, executors, runner


def _count(text: str) -> int:
    """argparse type: a non-negative integer."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative integer")
    return int(text)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = OneLineParser(prog="fpsim sweep", description="Run every recipe of CONFIG (TOML or YAML) "
                      "on its models, seeds and held-out windows against the FP32 reference; "
                      "write OUT/tasks/*.json as tasks end, OUT/results.json, OUT/REPORT.md "
                      "and OUT/sweep.png.")
    p.add_argument("config", type=Path, metavar="CONFIG", help="sweep config (docs/sweep.md)")
    p.add_argument("--out", type=Path, help="output directory (default runs/sweep-<CONFIG "
                   "name>)")
    p.add_argument("--executor", choices=executors.EXECUTORS, default="inprocess",
                   help="where tasks run: this process (default), a local process pool, or Ray "
                        f"({executors.RAY_INSTALL})")
    p.add_argument("--workers", type=_count, help="pool processes, or CPUs of the local Ray "
                   "cluster started for the run (default: all cores)")
    p.add_argument("--address", help="with --executor ray: the cluster to join (ray://host:port "
                   "or auto) instead of starting a local one")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the workers run the models (Ray: one GPU per task)")
    p.add_argument("--resume", action="store_true",
                   help="keep the task results already in OUT/tasks and run only the others")
    p.add_argument("--retries", type=_count, default=2,
                   help="extra tries of a failing task before it is reported (default 2)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    if args.address and args.executor != "ray":
        p.error("--address joins a Ray cluster: add --executor ray")
    if args.workers == 0:
        p.error("--workers must be at least 1")
    if args.device == "cuda" and args.executor != "ray":
        import torch

        if not torch.cuda.is_available():
            p.error("--device cuda: torch sees no CUDA device here; use --device cpu")
    return args


def main(argv: list[str]) -> int:
    """Run the sweep; 0 when every task is done, 1 when some failed (each named on stderr)."""
    args = parse_args(argv)
    sweep = config.load(args.config)
    out = args.out or Path("runs") / f"sweep-{args.config.stem}"
    try:
        outcome = runner.run(sweep, out, args.executor, workers=args.workers,
                             address=args.address, device=args.device, resume=args.resume,
                             retries=args.retries, progress=not args.no_progress)
    except KeyboardInterrupt:
        kept = len(list((out / "tasks").glob("*.json")))
        print(f"fpsim sweep: interrupted; {kept} task result(s) kept in {out / 'tasks'}: rerun "
              "with --resume to compute the others", file=sys.stderr)
        return 130
    for f in outcome.failed:
        print(f"fpsim sweep: task {f['task']} failed: {f['error']}", file=sys.stderr)
    print(f"sweep: {len(outcome.computed)} task(s) computed, {len(outcome.skipped)} kept, "
          f"{len(outcome.failed)} failed: {out / 'REPORT.md'}")
    return 1 if outcome.failed else 0
