"""The built-in experiments' end-to-end runs as tasks of the sweep runner.

An experiment hands its end-to-end runs (each a name and how to build its GPT-2 ``ops``:
``Run``) to ``fpsim_experiments.context.Context.end_to_end_runs``, which computes them with
``.runner.execute`` on the context's ``Execution``: in this process (the default), on
a local process pool or on Ray, each result written to a task file as it ends, resumable after
a kill, and the same numbers whichever executor ran them.  A worker rebuilds the experiment's
context once per process from how it was built (``ContextWork``), without its reference
logits: those are computed once, in the driver, and handed to every task (on Ray through the
object store).
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from ..endtoend import RecipeRun, compact
from ..report import versions
from . import executors, runner

#: Every run of one context compares with the same reference logits.
REFERENCE = "reference"


class RunsFailed(RuntimeError):
    """Some end-to-end runs failed (each named with its error) after the others ended."""


@dataclass(frozen=True, eq=False)
class Run:
    """One end-to-end run: ``ops()`` builds its ``fpsim_experiments.endtoend.RecipeRun``
    (picklable: a class or a ``functools.partial`` of one, not a lambda); ``fp64``: the model
    itself in float64 (the FP64 baseline)."""

    name: str
    ops: Callable[[], RecipeRun]
    fp64: bool = False
    ref_key = REFERENCE

    @property
    def slug(self) -> str:
        return self.name


def recipe_run(name: str, recipe: Any, **options: Any) -> Run:
    """The run of ``RecipeRun`` ``(recipe, **options)`` (``weights``, ``attention``)."""
    return Run(name, functools.partial(RecipeRun, recipe, **options))


def describe(obj: Any) -> Any:
    """What a run's ops are, as plain data (part of its task spec: a changed recipe is a
    different task)."""
    if isinstance(obj, functools.partial):
        return {"call": describe(obj.func), "args": [describe(a) for a in obj.args],
                "keywords": {k: describe(v) for k, v in sorted(obj.keywords.items())}}
    if isinstance(obj, type):
        return f"{obj.__module__}.{obj.__qualname__}"
    if hasattr(obj, "to_json"):
        return obj.to_json()
    if isinstance(obj, Mapping):
        return {str(k): describe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [describe(v) for v in (sorted(obj) if isinstance(obj, (set, frozenset)) else obj)]
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    raise TypeError(f"a run's ops hold {type(obj).__name__}, which a task spec cannot name: "
                    "build them from recipes, site names and plain values")


@dataclass(frozen=True)
class Execution:
    """Where and how a context's end-to-end runs are computed: ``executor`` (``inprocess``,
    ``pool``, ``ray``) with ``workers`` / ``address`` as for ``fpsim sweep``; ``folder``: where
    task files go (None: nowhere; then nothing can be resumed); ``resume``: keep the task
    files already there."""

    executor: str = "inprocess"
    workers: int | None = None
    address: str | None = None
    folder: Path | None = None
    resume: bool = False
    retries: int = 2

    def finish(self) -> None:
        """Remove the task files once the experiment's results are written."""
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


#: The context (``fpsim_experiments.context.Context``) this process computes runs of, by how
#: it was built and its device (one at a time: a worker keeps it between tasks, a new one
#: replaces it).
_CONTEXTS: dict[tuple, Any] = {}


@dataclass(frozen=True)
class ContextWork:
    """A context's end-to-end runs, as an executor computes them.  ``source``: the call that
    built it (``fpsim_experiments.context.build`` with its arguments, a ``functools.partial``
    that takes ``device``), or ``("object", id)`` for a context made otherwise (this process
    only)."""

    source: Any

    @property
    def key(self) -> tuple:
        s = self.source
        return (s.args, tuple(sorted(s.keywords.items()))) if callable(s) else s

    def context(self, device: str) -> Any:
        key = (self.key, device)
        if key not in _CONTEXTS:
            _CONTEXTS.clear()
            _CONTEXTS[key] = self.source(device=device)
        return _CONTEXTS[key]

    def reference(self, task: Run, device: str) -> list[Tensor]:
        return self.context(device).ref_logits

    def compute(self, task: Run, ref: list[Tensor], device: str) -> dict[str, Any]:
        """The run's metrics (``Context.end_to_end_ops``, its keys of
        ``fpsim_experiments.endtoend.compare`` only for ``fp64``), where its unscaled operands
        overflowed (``overflows``, ``fpsim_experiments.endtoend.compact``), the versions and
        its seconds."""
        start = time.perf_counter()
        ctx = self.context(device)
        ops = task.ops()
        e2e = ctx.end_to_end_ops(ops, ref, ctx.model64 if task.fp64 else None)
        if task.fp64:
            e2e = {k: v for k, v in e2e.items() if k not in ("ci", "nonfinite_sites", "events")}
        return {"e2e": e2e, "overflows": compact(ops.overflows), "versions": versions(),
                "seconds": round(time.perf_counter() - start, 3)}


def register(ctx: Any, device: str) -> ContextWork:
    """The work of ``ctx``'s runs, with ``ctx`` itself used in this process."""
    work = ContextWork(ctx.source if ctx.source is not None else ("object", id(ctx)))
    _CONTEXTS.clear()
    _CONTEXTS[(work.key, device)] = ctx
    return work


def execute(ctx: Any, runs: Sequence[Run], label: str, desc: str | None) -> list[dict]:
    """Each run's result (``ContextWork.compute``) in order, computed on
    ``ctx.execution``, task files in its ``folder / label``; raises naming every run that
    failed, after the others ended."""
    ex, device = ctx.execution, ctx.device.type
    if ex.executor != "inprocess" and ctx.source is None:
        raise ValueError(f"--executor {ex.executor} rebuilds the context in each worker, and "
                         "this one was not made by fpsim_experiments.context.build: run in-process")
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise ValueError(f"end-to-end runs of {label!r} share a name: "
                         f"{sorted(n for n in set(names) if names.count(n) > 1)}")
    work = register(ctx, device)
    specs = {r: {"run": r.name, "ops": describe(r.ops), "fp64": r.fp64, "model": ctx.model_name,
                 "tokens": ctx.tokens, "window": ctx.wins.shape[1] - 1,
                 "batch": ctx.batch_size, "device": device} for r in runs}
    folder = None if ex.folder is None else ex.folder / label
    outcome = runner.execute(work, list(runs), specs, folder, ex.executor, workers=ex.workers,
                             address=ex.address, device=device, resume=ex.resume,
                             retries=ex.retries, progress=desc is not None,
                             refs={REFERENCE: ctx.ref_logits}, desc=desc or label)
    if outcome.failed:
        kept = f"; the {len(outcome.results)} finished are kept in {folder}: rerun with " \
               "--resume to compute only the others" if folder is not None else ""
        raise RunsFailed(f"{len(outcome.failed)} end-to-end run(s) of {label} failed: " +
                         "; ".join(f"{f['task']}: {f['error']}" for f in outcome.failed) + kept)
    return [outcome.results[r] for r in runs]


def execution(args: Any, name: str) -> Execution:
    """The ``Execution`` of ``fpsim experiment NAME``'s options (``--executor``,
    ``--workers``, ``--address``, ``--resume``), task files in ``OUT/NAME/tasks``."""
    return Execution(args.executor, args.workers, args.address, args.out / name / "tasks",
                     args.resume)


@contextlib.contextmanager
def cluster(args: Any) -> Iterator[None]:
    """The Ray cluster of ``fpsim experiment``'s ``--executor ray`` (``--address``,
    ``--workers``), started or joined once for the whole command and shut down after it (when
    this call started or joined it); nothing for the other executors or ``--render``."""
    started = args.executor == "ray" and not args.render and \
        executors.start_ray(args.address, args.workers)
    try:
        yield
    finally:
        if started:
            executors.import_ray().shutdown()
