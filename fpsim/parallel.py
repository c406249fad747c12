"""Large element-wise jobs split over the machine's cores.

NumPy releases the GIL inside its loops, so a flat array cut into a few contiguous pieces runs
on as many cores as there are pieces.  Every piece is rounded by the same deterministic plan,
so the bits do not depend on the number of threads; stochastic rounding never comes here (one
seed, one sequence of random bits).  Each worker runs in a copy of the caller's context, so
NumPy's ``errstate`` (a context variable) holds there too.
"""

from __future__ import annotations

import contextvars
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

#: Fewest elements per thread: below it one thread is faster than handing work over.
GRAIN = 1 << 18

_POOL: ThreadPoolExecutor | None = None


def workers() -> int:
    """Threads a job may use: ``FPSIM_THREADS`` if set, else every core."""
    env = os.environ.get("FPSIM_THREADS", "")
    return max(1, int(env)) if env.isdigit() else (os.cpu_count() or 1)


def pieces(n: int, grain: int = GRAIN) -> list[tuple[int, int]]:
    """``[lo, hi)`` bounds cutting ``n`` elements into at most ``workers`` pieces of at
    least ``grain`` elements (one piece for small jobs)."""
    k = max(1, min(workers(), n // grain))
    step = max(1, -(-n // k))
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)] or [(0, 0)]


def run(job: Callable[[int, int], Any], n: int, grain: int = GRAIN) -> list[Any]:
    """``job(lo, hi)`` over ``pieces`` of ``n``, the last one in the calling thread and the
    others on a shared thread pool; the results in order."""
    global _POOL
    parts = pieces(n, grain)
    if len(parts) == 1 or threading.current_thread().name.startswith("fpsim"):
        return [job(lo, hi) for lo, hi in parts]       # inside a worker: no waiting on the pool
    if _POOL is None:
        _POOL = ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="fpsim")
    futures = [_POOL.submit(contextvars.copy_context().run, job, lo, hi)
               for lo, hi in parts[:-1]]
    last = job(*parts[-1])                             # the caller works too: one wake-up fewer
    return [f.result() for f in futures] + [last]


def elementwise(plan: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    """``plan(flat, out)`` run over pieces of ``flat``/``out`` in parallel."""
    def parallel_plan(flat: Any, out: Any) -> None:
        if flat.size < 2 * GRAIN:
            plan(flat, out)
        else:
            run(lambda lo, hi: plan(flat[lo:hi], out[lo:hi]), flat.size)
    return parallel_plan
