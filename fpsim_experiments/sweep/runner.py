"""Run a sweep: plan its tasks, skip those already on disk, run the rest on an executor, write
each result as it ends, then combine them.

``OUT/tasks/<task>.json`` holds one task's result and the spec that made it (what the numbers
depend on: model, text, windows, batch, recipe, seed, device), written atomically (a temporary
file renamed), so a run killed at any moment leaves whole files only.  With ``resume`` a file
whose spec matches is kept and its task not run again; one from another spec is an error, never
silently reused.  ``OUT/results.json`` is built from the task files alone, in plan order, so it
is the same bytes whichever executor ran the tasks, in whatever order, over however many runs.
Run facts (executor, seconds per task, machine load) go to ``OUT/run.json``.
"""

from __future__ import annotations

import functools
import json
import math
import os
import platform
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import bootstrap
from ..endtoend import means
from ..progress import bar as progress_bar
from ..report import load_json, versions, write_json
from . import executors, render, work
from .config import Sweep, digest, display, rules_json
from .work import Task


@dataclass
class Outcome:
    """What a run did: the tasks it computed, skipped (on disk) and that failed (name, error);
    the results by task, and the seconds of each task it computed."""

    out: Path | None
    computed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[dict[str, str]] = field(default_factory=list)
    results: dict[Any, dict] = field(default_factory=dict, repr=False)
    seconds: dict[str, float] = field(default_factory=dict, repr=False)


def plan(sweep: Sweep) -> list[Task]:
    """Every task, in a fixed order: model, seed, recipe, shard."""
    tasks = []
    for model in sweep.models:
        window = min(sweep.window, work.positions(model) or sweep.window)
        available = (work.token_ids(model, sweep.text).numel() - 1) // window
        if available < 1:
            raise ValueError(f"model {display(model)}: the held-out text has fewer than "
                             f"{window + 1} tokens")
        wanted = min(available, max(1, sweep.tokens // window))
        per_task = sweep.batch * sweep.task_batches
        for seed in sweep.seeds:
            picked = work.draw_windows(available, wanted, seed)
            shards = [tuple(picked[i:i + per_task]) for i in range(0, len(picked), per_task)]
            tasks += [Task(model, recipe, seed, i, shard, window)
                      for recipe in sweep.recipes for i, shard in enumerate(shards)]
    return tasks


def spec(sweep: Sweep, task: Task, device: str) -> dict[str, Any]:
    """What ``task``'s numbers depend on."""
    return {"model": display(task.model), "text": sweep.text and display(sweep.text),
            "text_digest": sweep.text and _text_digest(sweep.text), "window": task.window,
            "windows": list(task.windows),
            "batch": sweep.batch, "recipe": rules_json(sweep.recipes[task.recipe]),
            "recipe_name": task.recipe, "seed": task.seed, "shard": task.shard,
            "capture": sweep.capture, "device": device}


@functools.lru_cache(maxsize=4)
def _text_digest(path: str) -> str:
    return digest(Path(path).read_text(encoding="utf-8"))


def task_file(folder: Path, task: Any, task_spec: dict) -> Path:
    """Where ``task``'s result lives in ``folder``: a readable name (``task.slug``) plus the
    hash of its spec."""
    slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in task.slug)
    return folder / f"{slug[:80]}-{digest(task_spec)}.json"


def write_atomically(path: Path, data: dict) -> None:
    """``data`` as JSON at ``path`` via a temporary file in the same folder, renamed over it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write_json(Path(tmp), data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _combine_sites(parts: list[list[dict]]) -> list[dict[str, Any]]:
    """Per-site statistics of every shard added up (amax: the largest), as table rows."""
    from fpsim.emulation.sitestats import SiteStats

    total: dict[str, dict] = {}
    for rows in parts:
        for row in rows:
            t = total.setdefault(row["site"], {**row, "calls": 0, "elements": 0, "amax": 0.0,
                                               "overflow": 0, "saturated": 0, "flushed": 0,
                                               "outputs": 0, "nonfinite": 0, "signal": [],
                                               "noise": [], "swamped": row["swamped"] and 0})
            for key in ("calls", "elements", "overflow", "saturated", "flushed", "outputs",
                        "nonfinite"):
                t[key] += row[key]
            t["amax"] = max(t["amax"], row["amax"])
            t["signal"].append(row["signal"])
            t["noise"].append(row["noise"])
            if row["swamped"] is not None:
                t["swamped"] = (t["swamped"] or 0) + row["swamped"]
    return [SiteStats(**{**t, "signal": math.fsum(t["signal"]),
                         "noise": math.fsum(t["noise"])}).row() for t in total.values()]


def combine(sweep: Sweep, tasks: list[Task], results: dict[Task, dict],
            failed: list[dict[str, str]]) -> dict[str, Any]:
    """The sweep's numbers from its task results: per (model, seed, recipe) the end-to-end
    metrics over all its windows with bootstrap intervals, and the sites when captured;
    ``failed`` in plan order, whatever order the tasks ended in."""
    runs: dict[tuple, list[Task]] = {}
    for t in tasks:
        runs.setdefault((t.model, t.seed, t.recipe), []).append(t)
    out = []
    for (model, seed, recipe), shards in runs.items():
        run: dict[str, Any] = {"model": display(model), "seed": seed, "recipe": recipe,
                               "windows": sum(len(t.windows) for t in shards)}
        missing = [t.shard for t in shards if t not in results]
        if missing:
            out.append({**run, "missing_shards": missing})
            continue
        windows: dict[str, Any] = {"positions": shards[0].window}
        for t in shards:
            for key, values in results[t]["windows"].items():
                if key != "positions":
                    windows.setdefault(key, []).extend(values)
        e2e = means(windows)
        e2e["ci"] = bootstrap.intervals(windows)
        run["e2e"] = e2e
        if sweep.capture:
            run["sites"] = _combine_sites([results[t]["sites"] for t in shards])
        out.append(run)
    order = {t.name: i for i, t in enumerate(tasks)}
    return {"config": sweep.to_json(), "meta": {**versions(), "tasks": len(tasks)},
            "runs": out, "failed": sorted(failed, key=lambda f: order[f["task"]])}


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def differing(theirs: dict | None, here: dict) -> str:
    """The fields in which ``theirs`` (a result's ``versions``) and ``here`` differ, with both
    values ("" when none does)."""
    theirs = theirs or {}
    keys = sorted(k for k in {*theirs, *here} if theirs.get(k) != here.get(k))
    if not keys:
        return ""
    return (f"{', '.join(keys)}: { {k: theirs.get(k) for k in keys} } there, "
            f"{ {k: here.get(k) for k in keys} } here")


def saved(folder: Path, tasks: list[Task], specs: dict[Task, dict], files: dict[Task, Path],
          resume: bool, here: dict) -> dict[Task, dict]:
    """The results already in ``folder``: refused without ``resume``, when a file is not one
    of ``tasks`` with its spec, and when it was computed under other versions than ``here``,
    this process's (``report.versions``: its numbers would not be comparable with the rest)."""
    on_disk = {p.name for p in folder.glob("*.json")}
    foreign = on_disk - {p.name for p in files.values()}
    if on_disk and not resume:
        raise ValueError(f"{folder} already holds {len(on_disk)} task result(s); pass "
                         "--resume to keep them and run the rest, or choose another --out")
    if foreign:
        raise ValueError(f"{folder} holds {len(foreign)} result(s) of another configuration "
                         f"(e.g. {sorted(foreign)[0]}); --resume continues the same one only: "
                         "choose another --out")
    results = {}
    for t in tasks:
        if files[t].name in on_disk:
            if digest(json.loads(files[t].read_text()).get("spec")) != digest(specs[t]):
                raise ValueError(f"{files[t]} was not made by this task ({t.name}); remove it "
                                 "or choose another --out")
            result = load_json(files[t])["result"]
            if diff := differing(result.get("versions"), here):
                raise ValueError(
                    f"{files[t]} was computed under other versions ({diff}), so its numbers "
                    "would not be comparable with this run's: --resume under the same ones "
                    "(blas_order is MKL_CBWR, cpu_kernels ATEN_CPU_CAPABILITY) or choose "
                    "another --out")
            results[t] = result
    return results


def run(sweep: Sweep, out: str | Path, executor: str = "inprocess", *, workers: int | None = None,
        address: str | None = None, device: str = "cpu", resume: bool = False, retries: int = 2,
        progress: bool = True) -> Outcome:
    """Run ``sweep`` into ``out`` (see the module docstring); returns what was done.

    ``executor``: ``inprocess``, ``pool`` (``workers`` processes) or ``ray`` (the cluster at
    ``address``, else a local one of ``workers`` CPUs started for the run).

    >>> from fpsim_experiments.sweep import config
    >>> s = config.from_dict({"models": ["tiny"], "recipes": ["bf16"], "tokens": 64,
    ...                       "window": 32, "batch": 1})
    >>> run(s, tmp_path, progress=False).computed    # doctest: +SKIP
    ['tiny | bf16 | seed 0 | shard 0', 'tiny | bf16 | seed 0 | shard 1']
    """
    out = Path(out)
    started = time.perf_counter()
    tasks = plan(sweep)
    specs = {t: spec(sweep, t, device) for t in tasks}
    outcome = execute(work.SweepWork(sweep), tasks, specs, out / "tasks", executor,
                      workers=workers, address=address, device=device, resume=resume,
                      retries=retries, progress=progress)
    outcome.out = out
    data = combine(sweep, tasks, outcome.results, outcome.failed)
    write_atomically(out / "results.json", data)
    write_atomically(out / "run.json", {
        "executor": executor, "workers": workers, "address": address, "device": device,
        "computed": len(outcome.computed), "skipped": len(outcome.skipped),
        "failed": len(outcome.failed), "wall_seconds": round(time.perf_counter() - started, 2),
        "task_seconds": outcome.seconds, "cpus": os.cpu_count(), "load_after": _load(),
        "node": platform.node(), **versions()})
    render.write(out, data)
    return outcome


def check_executor(executor: str) -> None:
    """Refuse an unknown executor, and Ray when it is not installed (saying how to get it)."""
    if executor not in executors.EXECUTORS:
        raise ValueError(f"executor {executor!r} is not one of {', '.join(executors.EXECUTORS)}")
    if executor == "ray":
        executors.import_ray()


def execute(job: Any, tasks: list, specs: dict, folder: Path | None, executor: str = "inprocess",
            *, workers: int | None = None, address: str | None = None, device: str = "cpu",
            resume: bool = False, retries: int = 2, progress: bool = True,
            refs: dict | None = None, desc: str = "sweep") -> Outcome:
    """Compute ``tasks`` with ``job`` (see ``.executors``) on ``executor``; the shared core
    of ``fpsim sweep`` and the experiments' end-to-end runs.

    Each result is written atomically to ``folder`` (None: kept in memory only) as
    ``<task.slug>-<hash of its spec>.json`` the moment it arrives; with ``resume`` the files
    already there whose spec matches are read instead of computed (without it, a folder that
    holds results is refused).  ``refs``: references already computed, by ``ref_key``.  A
    result computed under other library versions than this process's counts as failed.  The
    outcome holds the results (``results``, by task) and each computed task's seconds.
    """
    check_executor(executor)
    files: dict = {}
    here = versions()
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        files = {t: task_file(folder, t, specs[t]) for t in tasks}
        results = saved(folder, tasks, specs, files, resume, here)
    else:
        results = {}
    outcome = Outcome(folder, skipped=[t.name for t in results], results=results)
    todo = [t for t in tasks if t not in results]
    bar = progress_bar(len(tasks), desc, "task", initial=len(results), enabled=progress)
    state = {"running": 0}

    def done(t: Any, result: dict) -> None:
        if diff := differing(result["versions"], here):
            return failed(t, f"its worker ran other versions ({diff}): the numbers would not "
                             "be comparable; install the same versions there (cpu_kernels: set "
                             "ATEN_CPU_CAPABILITY to the same on every node, blas_order: "
                             "MKL_CBWR)")
        outcome.seconds[t.name] = result["seconds"]
        if files:
            write_atomically(files[t], {"task": t.name, "spec": specs[t], "result": result})
        results[t] = result
        outcome.computed.append(t.name)
        bar.update()
        _postfix(bar, state["running"], len(outcome.failed))

    def failed(t: Any, error: str) -> None:
        outcome.failed.append({"task": t.name, "error": error})
        bar.update()
        _postfix(bar, state["running"], len(outcome.failed))

    def running(n: int) -> None:
        state["running"] = n
        _postfix(bar, n, len(outcome.failed))

    own_ray = executor == "ray" and bool(todo) and executors.start_ray(address, workers)
    try:
        if todo and executor == "pool":
            executors.run_pool(job, todo, device, retries, done, failed, running, refs, workers)
        elif todo:
            run_tasks = executors.run_ray if executor == "ray" else executors.run_inprocess
            run_tasks(job, todo, device, retries, done, failed, running, refs)
    finally:
        bar.close()
        if own_ray:
            executors.import_ray().shutdown()
    return outcome


def _postfix(bar: Any, running: int, failed: int) -> None:
    bar.set_postfix_str(f"running {running}, failed {failed}", refresh=True)
