"""Who runs a sweep's tasks: this process, a local process pool, or Ray.

What a task computes is its *work*, a picklable object with ``reference(task, device)`` and
``compute(task, ref, device)``: ``work.SweepWork`` for ``fpsim sweep``,
``fpsim_experiments.sweep.runs.ContextWork`` for the built-in experiments' end-to-end runs.
Every executor computes each needed reference (one per ``task.ref_key``) once, or takes it
ready from ``refs``, hands it to the tasks that compare with it (on Ray through the object
store) and reports each task to ``done(task, result)`` or ``failed(task, error)`` in this
process as soon as it ends, and how many run to ``running(n)``.  A task that raises is tried
``retries`` more times (on Ray by Ray itself: ``max_retries`` with ``retry_exceptions``, which
also reruns a task whose worker died) before it counts as failed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from .config import REPO

EXECUTORS = ("inprocess", "pool", "ray")
#: The line that says how to get Ray (the version the tests and the benchmark ran).
RAY_INSTALL = "pip install 'fpsim[sweep]' (or pip install ray==2.60.0)"

Task = Any                   # hashable, with ``name`` and ``ref_key``
Done = Callable[[Task, dict], None]
Failed = Callable[[Task, str], None]
Running = Callable[[int], None]

#: the packages whose code a spawned worker imports again from disk
PACKAGES = ("fpsim", "fpsim_experiments")


def code_digest(packages: tuple[str, ...] = PACKAGES) -> str:
    """A hash of the Python files of ``packages`` as they are on disk now.

    >>> len(code_digest())
    16
    """
    h = hashlib.sha256()
    for name in packages:
        spec = importlib.util.find_spec(name)
        for root in (spec.submodule_search_locations or []) if spec else []:
            for path in sorted(Path(root).rglob("*.py")):
                h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


#: the code this process imported (``code_digest`` when this module was imported)
IMPORTED = code_digest()


def same_code(code: str | None) -> None:
    """Refuse to compute when ``code``, the driver's :data:`IMPORTED`, is not this worker's: a
    pool's or Ray's workers import fpsim from disk themselves, and files changed between the
    driver's import and theirs would mix two versions of the code in one result (None: the
    caller is the driver itself)."""
    if code is not None and code != IMPORTED:
        raise RuntimeError(f"the Python files of {' and '.join(PACKAGES)} this worker imported "
                           "are not those the driver imported (they changed on disk after one "
                           "of them started): rerun with the same code everywhere (with "
                           "--resume the tasks already written are kept)")


def reference(work: Any, task: Task, device: str, code: str | None = None) -> Any:
    """``task``'s reference, computed by ``work`` (a module-level function: what a pool or Ray
    worker runs) if ``code`` is this worker's (:func:`same_code`)."""
    same_code(code)
    return work.reference(task, device)


def compute(work: Any, task: Task, ref: Any, device: str, code: str | None = None) -> dict:
    """``task``'s result against ``ref``, computed by ``work`` if ``code`` is this worker's
    (Ray titles its worker ``ray::compute`` while it runs)."""
    same_code(code)
    return work.compute(task, ref, device)


def describe(exc: BaseException) -> str:
    """An error in one line: its type and first line (Ray's wrapper unwrapped to its cause)."""
    cause = getattr(exc, "cause", None)
    exc = cause if isinstance(cause, BaseException) else exc
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def _groups(tasks: list[Task]) -> dict[tuple, list[Task]]:
    """Tasks by the reference they need, in order."""
    out: dict[tuple, list[Task]] = {}
    for t in tasks:
        out.setdefault(t.ref_key, []).append(t)
    return out


def _attempt(fn: Callable[[], Any], retries: int) -> Any:
    for left in range(retries, -1, -1):
        try:
            return fn()
        except Exception:
            if not left:
                raise
    raise AssertionError("unreachable")


def run_inprocess(work: Any, tasks: list[Task], device: str, retries: int, done: Done,
                  failed: Failed, running: Running, refs: dict | None = None) -> None:
    """Every task here, one after another (torch and fpsim use this process's threads)."""
    refs = refs or {}
    for key, group in _groups(tasks).items():
        try:
            ref = refs[key] if key in refs else _attempt(
                lambda: work.reference(group[0], device), retries)
        except Exception as exc:
            for t in group:
                failed(t, f"reference logits: {describe(exc)}")
            continue
        for t in group:
            running(1)
            try:
                result = _attempt(lambda: work.compute(t, ref, device), retries)
            except Exception as exc:
                running(0)
                failed(t, describe(exc))
            else:
                running(0)
                done(t, result)


def _pool_init(threads: int, driver: int) -> None:
    """A pool worker's start: ``threads`` for torch and fpsim, and a watch on ``driver``
    (:func:`exit_with`)."""
    import torch

    torch.set_num_threads(threads)
    os.environ["FPSIM_THREADS"] = str(threads)
    threading.Thread(target=exit_with, args=(driver,), daemon=True).start()


def exit_with(driver: int, every: float = 0.5) -> None:
    """End this process (a pool worker) once ``driver``, the process that spawned it, is gone.

    A driver killed by a signal (``pkill``, SIGKILL, a job's time limit) cannot shut its pool
    down; without this its workers went on computing tasks whose results nobody would receive,
    each holding a core.  The worker is then the child of another process, which is how this
    watch, polling every ``every`` seconds, sees it.
    """
    while os.getppid() == driver:
        time.sleep(every)
    os._exit(1)


def run_pool(work: Any, tasks: list[Task], device: str, retries: int, done: Done,
             failed: Failed, running: Running, refs: dict | None = None,
             workers: int | None = None) -> None:
    """The tasks on ``workers`` local processes (spawned; the cores shared out between them).

    A worker that dies takes the pool with it: the tasks still pending are reported failed
    with that error, and ``--resume`` computes them.  A driver that dies takes its workers with
    it (:func:`exit_with`).
    """
    import multiprocessing

    workers = workers or os.cpu_count() or 1
    threads = max(1, (os.cpu_count() or 1) // workers)
    groups = _groups(tasks)
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_pool_init, initargs=(threads, os.getpid()))
    try:
        jobs: dict[Future, tuple[str, Any, int]] = {}

        def submit(kind: str, item: Any, tries: int, ref: Any = None) -> None:
            args = (reference, work, item[0]) if kind == "ref" else (compute, work, item, ref)
            try:
                fut = pool.submit(*args, device, IMPORTED)
            except BrokenProcessPool as exc:             # a worker died: fail, do not raise
                fut = Future()
                fut.set_exception(exc)
            jobs[fut] = (kind, item if kind == "ref" else (item, ref), tries)

        for key, group in groups.items():
            if refs and key in refs:
                for t in group:
                    submit("task", t, 0, refs[key])
            else:
                submit("ref", group, 0)
        while jobs:
            running(min(workers, len(jobs)))
            finished, _ = wait(list(jobs), return_when=FIRST_COMPLETED)
            for fut in finished:
                kind, item, tries = jobs.pop(fut)
                exc = fut.exception()
                if exc is not None and tries < retries and not isinstance(exc, BrokenProcessPool):
                    submit(kind, item if kind == "ref" else item[0], tries + 1,
                           None if kind == "ref" else item[1])
                elif kind == "ref":
                    if exc is not None:
                        for t in item:
                            failed(t, f"reference logits: {describe(exc)}")
                    else:
                        for t in item:
                            submit("task", t, 0, fut.result())
                elif exc is not None:
                    failed(item[0], describe(exc))
                else:
                    done(item[0], fut.result())
        running(0)
    finally:                        # Ctrl-C: drop the queued tasks, do not wait
        pool.shutdown(wait=False, cancel_futures=True)


def import_ray() -> Any:
    """The ``ray`` module, or a one-line error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ValueError(f"--executor ray needs Ray, which is not installed: {RAY_INSTALL}; "
                         "--executor inprocess and pool need nothing more") from None
    return ray


def start_ray(address: str | None, workers: int | None) -> bool:
    """Connect to the cluster at ``address``, or start a local one with ``workers`` CPUs (the
    workers import this checkout); returns True when this call started or joined it (then the
    caller shuts it down), False when Ray was already initialised here."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
        ray.init(num_cpus=workers or os.cpu_count(), include_dashboard=False,
                 log_to_driver=False,     # one CPU per task: one thread for torch and fpsim
                 runtime_env={"env_vars": {"PYTHONPATH": path, "FPSIM_THREADS": "1",
                                              "MKL_CBWR": os.environ["MKL_CBWR"]}})
    return True


def run_ray(work: Any, tasks: list[Task], device: str, retries: int, done: Done,
            failed: Failed, running: Running, refs: dict | None = None) -> None:
    """The tasks as Ray tasks (one CPU each, or one GPU each with ``device="cuda"``) on the
    cluster Ray is connected to; each reference is put in the object store once and read
    there by every task that needs it."""
    ray = import_ray()
    options = {"max_retries": retries, "retry_exceptions": True, "num_cpus": 1,
               "num_gpus": 1 if device == "cuda" else 0}
    remote_reference = ray.remote(reference).options(**options)
    remote_compute = ray.remote(compute).options(**options)
    resources = ray.cluster_resources()
    slots = int(resources.get("GPU" if device == "cuda" else "CPU", 1)) or 1
    shared = ray.put(work)
    pending: dict[Any, Task] = {}
    for key, group in _groups(tasks).items():
        ref = ray.put(refs[key]) if refs and key in refs else \
            remote_reference.remote(shared, group[0], device, IMPORTED)
        for t in group:
            pending[remote_compute.remote(shared, t, ref, device, IMPORTED)] = t
        del ref                    # the tasks hold it; the object store frees it after them
    while pending:
        running(min(slots, len(pending)))
        ready, _ = ray.wait(list(pending), num_returns=1)
        for obj in ready:
            t = pending.pop(obj)
            try:
                result = ray.get(obj)
            except Exception as exc:
                failed(t, describe(exc))
            else:
                done(t, result)
    running(0)
