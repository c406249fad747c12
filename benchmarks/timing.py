"""Timing helpers shared by the CPU benchmarks: interleaved best-of-N and peak extra memory."""

from __future__ import annotations

import os
import platform
import time
import tracemalloc
from typing import Callable


def best_times(fns: dict[str, Callable[[], object]], repeat: int,
               clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Best time of each callable by ``clock`` (wall time; ``time.thread_time``: the CPU time
    of a one-thread run, which a loaded machine's scheduler does not stretch), the callables
    interleaved within each round so that a noisy neighbour slows every contender alike."""
    for fn in fns.values():
        fn()                                    # warm up (lookup tables, compilation)
    best = {k: float("inf") for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            t = clock()
            fn()
            best[k] = min(best[k], clock() - t)
    return best


def peak_extra_memory(fn: Callable[[], object]) -> int:
    """Peak bytes allocated while ``fn`` runs (NumPy allocations are traced)."""
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def machine() -> dict:
    """What the numbers were measured on: CPU model, cores, load average before the run."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": model, "cores": os.cpu_count(), "load_average_1_5_15": os.getloadavg(),
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M")}
