"""The same sweep on a local Ray cluster of 1 and of 2 worker CPUs: wall time, speedup, cost
per task, and that both runs write the same results.json.

Each run starts its own cluster in a fresh process (``ray.init(num_cpus=N)``, timed apart:
``start_s``), then runs the sweep on it (``sweep_s``: task wall time, including the workers'
first imports).  The machine and its load before and after are recorded: on a shared machine
the speedup says as much about the neighbours as about Ray.

    python benchmarks/sweep_bench.py            # writes benchmarks/results/sweep_bench.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from timing import machine  # noqa: E402

from fpsim_experiments import sweep  # noqa: E402

#: Tasks of 4 windows of 256 tokens (a second or two each on one core): large enough that a
#: worker's start (its imports) does not hide how the sweep scales.
CONFIG = {"models": ["tiny"], "recipes": ["bf16", "e4m3", "e5m2"], "tokens": 4096,
          "window": 256, "batch": 4}
OUT = ROOT / "benchmarks" / "results" / "sweep_bench.json"


def one(workers: int, out: Path) -> dict:
    """Start a cluster of ``workers`` CPUs, run the sweep into ``out``, shut the cluster down."""
    import ray

    start = time.perf_counter()
    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    started = time.perf_counter()
    try:
        outcome = sweep.run(sweep.from_dict(CONFIG), out, "ray", progress=False)
    finally:
        ray.shutdown()
    end = time.perf_counter()
    run = json.loads((out / "run.json").read_text())
    secs = list(run["task_seconds"].values())
    return {"workers": workers, "start_s": round(started - start, 2),
            "sweep_s": round(end - started, 2), "tasks": len(outcome.computed),
            "failed": len(outcome.failed), "task_s_mean": round(sum(secs) / len(secs), 3),
            "task_s_max": round(max(secs), 3), "load_after": list(os.getloadavg())}


def summary(data: dict) -> str:
    """The sentence docs/sweep.md states (a test checks it against the JSON)."""
    one, two = data["runs"]
    m, c = data["machine"], data["config"]
    return (f"Measured on {m['cores']} cores ({m['cpu']}, load average "
            f"{m['load_average_1_5_15'][0]:.1f} before the run) with Ray {data['ray']}: the "
            f"sweep of `benchmarks/sweep_bench.py` ({one['tasks']} tasks of "
            f"{c['batch']} windows of {c['window']} tokens on `{c['models'][0]}`, "
            f"{len(c['recipes'])} recipes) cost {one['task_s_mean']:.2g} s per task with 1 Ray "
            f"worker and {two['task_s_mean']:.2g} s with 2; the sweep took {one['sweep_s']:.0f} s "
            f"on 1 worker and {two['sweep_s']:.0f} s on 2 (a {data['speedup_2_vs_1']}x "
            f"speedup), plus {one['start_s']:.0f} s to start a local cluster; the two runs "
            f"wrote {'the same' if data['same_results_json'] else 'different'} results.json. "
            f"On one worker the tasks' own time was {one['tasks'] * one['task_s_mean']:.1f} s "
            f"of the {one['sweep_s']:.0f} s (the rest: the references, the worker's start, "
            f"Ray's scheduling), and with two workers on {m['cores']} cores, beside the driver "
            f"and Ray's own processes, each task took {two['task_s_mean']:.2g} s instead of "
            f"{one['task_s_mean']:.2g} s.")


def readme(data: dict) -> str:
    """The cost per task the README states (a test checks it against the JSON)."""
    one, m, c = data["runs"][0], data["machine"], data["config"]
    return (f"a sweep task of {c['batch']} windows of {c['window']} tokens on "
            f"`{c['models'][0]}` cost {one['task_s_mean']:.2g} s on one Ray worker "
            f"({m['cores']} cores, load average {m['load_average_1_5_15'][0]:.1f})")


def main(argv: list[str]) -> int:
    """Each worker count in a fresh Python (one Ray cluster per process); then the summary."""
    if argv[:1] == ["--one"]:                           # the child: one cluster, one run
        print(json.dumps(one(int(argv[1]), Path(argv[2]))))
        return 0
    import ray

    info = machine()
    env = {**os.environ, "RAY_raylet_start_wait_time_s": "300"}   # a loaded machine is slow
    with tempfile.TemporaryDirectory() as tmp:
        runs = []
        for n in (1, 2):
            out = subprocess.run([sys.executable, __file__, "--one", str(n), f"{tmp}/w{n}"],
                                 env=env, check=True, capture_output=True, text=True).stdout
            runs.append(json.loads(out.strip().splitlines()[-1]))
        same = (Path(tmp) / "w1" / "results.json").read_bytes() == \
            (Path(tmp) / "w2" / "results.json").read_bytes()
    data = {"machine": info, "ray": ray.__version__, "config": CONFIG, "runs": runs,
            "speedup_2_vs_1": round(runs[0]["sweep_s"] / runs[1]["sweep_s"], 2),
            "same_results_json": same}
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(json.dumps(data, indent=1))
    print(summary(data))
    print(readme(data))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
