"""``fpsim sweep``: config parsing; the in-process, pool and Ray executors give the same
results.json bit for bit; resume after the driver or a Ray worker is killed; failing tasks.

The Ray tests share one local cluster of 2 CPUs started here; they are skipped, with the line
that installs Ray, when it is absent."""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import fpsim  # noqa: E402
from fpsim_experiments import context, practice, sweep  # noqa: E402
from fpsim_experiments.endtoend import RecipeRun, compact, compare, compare_logits  # noqa: E402
from fpsim_experiments.gpt2.checkpoint import load_gpt2  # noqa: E402
from fpsim_experiments.sweep import config, executors, runner, runs, work  # noqa: E402
from fpsim import Recipe, Rule, Rules  # noqa: E402
from fpsim.cli import main as fpsim_main  # noqa: E402
from fpsim.emulation.recipe import FP32, FP64  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
#: Three recipes on four windows of 16 tokens, two per task: six tasks, two references.
SMALL = {"models": ["tiny"], "recipes": ["fp32", "bf16", "e4m3"], "tokens": 64,
         "window": 16, "batch": 2}
TOML = """models = ["tiny"]
tokens = 64
window = 16
batch = 2
recipes = ["fp32", "bf16", "e4m3"]
"""
BAD = {"inputs": "e4m3", "order": "tensor_core", "tensor_core": "hopper_fp8"}


def failing(recipe: Recipe) -> Recipe:
    """``recipe`` made to fail when it runs, not when it is made: Recipe checks its tensor core
    at construction (``fpsim.Accumulator``), so the unknown name is set past that check."""
    object.__setattr__(recipe, "tensor_core", "no_such_core")
    return recipe


def with_bad(config: dict) -> object:
    """The sweep of ``config`` with its recipe "bad" made to fail when it runs."""
    s = sweep.from_dict(config)
    failing(s.recipes["bad"].default)
    return s


try:
    import ray
except ImportError:
    ray = None
needs_ray = pytest.mark.skipif(ray is None, reason="the Ray executor's tests need Ray: "
                               f"{executors.RAY_INSTALL}")


def names(tasks: list) -> list[str]:
    return [t.name for t in tasks]


@pytest.fixture(scope="module")
def serial(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small sweep run in this process: the results every other run must reproduce."""
    out = tmp_path_factory.mktemp("serial")
    outcome = sweep.run(sweep.from_dict(SMALL), out, progress=False)
    assert len(outcome.computed) == 6 and not outcome.failed and not outcome.skipped
    return out


# -- config ----------------------------------------------------------------------------------
def test_config_toml_presets_tables_and_rules(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('models = ["tiny"]\nseeds = [3, 4]\n[recipes]\nbf16 = "bf16"\n'
                    'mx = "mxfp8_e4m3"\nfp8 = { inputs = "e4m3", scaling = "tensor", '
                    'saturate = true }\n'
                    '[recipes.linear]\ndefault = "torch"\n'
                    'rules = [{ recipe = "e4m3/tensor", kind = "linear" }]\n')
    s = config.load(path)
    assert s.seeds == (3, 4) and list(s.recipes) == ["bf16", "mx", "fp8", "linear"]
    assert s.recipes["bf16"] == Rules.of(Recipe(name="bf16", inputs="bf16"))
    assert s.recipes["mx"].default.scaling == "block"
    assert s.recipes["fp8"].default == Recipe(name="fp8", inputs="e4m3", scaling="tensor",
                                              saturate=True)
    lin = s.recipes["linear"]
    assert lin.default is None and lin.rules[0].kind == "linear"
    assert lin.rules[0].recipe == Recipe(name="e4m3/tensor", inputs="e4m3", scaling="tensor")
    yaml = pytest.importorskip("yaml")
    ypath = tmp_path / "s.yaml"
    ypath.write_text(yaml.safe_dump({"models": ["tiny"], "seeds": [3, 4], "recipes": {
        "bf16": "bf16", "mx": "mxfp8_e4m3", "fp8": {"inputs": "e4m3", "scaling": "tensor",
                                                     "saturate": True},
        "linear": {"default": "torch", "rules": [{"recipe": "e4m3/tensor", "kind": "linear"}]}}}))
    assert config.load(ypath) == s


def test_config_from_python_objects() -> None:
    rules = Rules([Rule(Recipe(name="fp8", inputs="e4m3", scaling="tensor"), kind="linear")])
    s = sweep.from_dict({"models": "tiny", "recipes": {"te": rules, "b": Recipe(name="b",
                                                                                 inputs="bf16")}})
    assert s.recipes == {"te": rules, "b": Rules.of(Recipe(name="b", inputs="bf16"))}
    assert sweep.from_dict({"models": ["tiny"], "recipes": [Recipe(name="x", inputs="bf16")]}) \
        .recipes == {"x": Rules.of(Recipe(name="x", inputs="bf16"))}


@pytest.mark.parametrize("data, message", [
    ({"models": ["tiny"], "recipes": ["bf16"], "seed": [1]}, "unknown key(s) seed"),
    ({"models": [], "recipes": ["bf16"]}, "names no model"),
    ({"models": ["no/such/dir"], "recipes": ["bf16"]}, "has no config.json"),
    ({"models": ["tiny"], "recipes": []}, "'recipes' is empty"),
    ({"models": ["tiny"], "recipes": ["e4m3/rows"]}, "scaling 'rows' is not one of"),
    ({"models": ["tiny"], "recipes": ["fp7"]}, "fp7"),
    ({"models": ["tiny"], "recipes": {"x": {"input": "e4m3"}}}, "unknown field(s) input"),
    ({"models": ["tiny"], "recipes": {"x": {"inputs": "e4m3", "rounding": "stochastic_c"}}},
     "stochastic rounding"),
    ({"models": ["tiny"], "recipes": {"x": {"rules": [{"kind": "linear"}]}}}, "rule 1 must"),
    ({"models": ["tiny"], "recipes": ["bf16"], "metrics": ["kl", "ppl"]}, "unknown metric(s)"),
    ({"models": ["tiny"], "recipes": ["bf16"], "batch": 0}, "batch must be a positive"),
    ({"models": ["tiny"], "recipes": ["bf16"], "seeds": 1}, "seeds must be a list"),
])
def test_config_errors_name_the_problem(data: dict, message: str) -> None:
    with pytest.raises(ValueError, match="sweep config|recipe|fp7") as exc:
        config.from_dict(data)
    assert message in str(exc.value)


def test_plan_shards_whole_batches_and_seeds_draw_windows() -> None:
    tasks = runner.plan(config.from_dict({**SMALL, "seeds": [0, 1], "task_batches": 2,
                                          "tokens": 96}))
    # 6 windows per seed in tasks of 2 batches of 2 windows: shards of 4 and 2 windows
    assert [len(t.windows) for t in tasks[:2]] == [4, 2] and len(tasks) == 2 * 3 * 2
    seed0, seed1 = tasks[0].windows + tasks[1].windows, tasks[6].windows + tasks[7].windows
    assert seed0 != seed1 and len(set(seed0)) == 6 and list(seed0) == sorted(seed0)
    assert runner.plan(config.from_dict({**SMALL, "seeds": [0, 1], "task_batches": 2,
                                         "tokens": 96})) == tasks     # the same on every call


# -- in-process run ----------------------------------------------------------------------------
def test_combined_numbers_are_one_pass_over_all_windows(serial: Path) -> None:
    """Shards joined in order give the bits of compare_logits over every window at once."""
    data = json.loads((serial / "results.json").read_text())
    s = sweep.from_dict(SMALL)
    picked = tuple(t for task in runner.plan(s)[:2] for t in task.windows)
    net = load_gpt2(config.BUILTIN_MODELS["tiny"])
    wins = work.cut(work.token_ids(s.models[0], None), 16, picked)
    with torch.no_grad():
        with fpsim.emulate(FP32):
            ref = [net(c[:, :-1]) for c in wins.split(2)]
        for run in data["runs"]:
            with fpsim.emulate(s.recipes[run["recipe"]]):
                outs = [net(c[:, :-1]) for c in wins.split(2)]
            e2e = compare_logits(wins, ref, outs, 2)
            for key in ("loss", "kl", "top1", "finite"):
                assert run["e2e"][key] == e2e[key], (run["recipe"], key)
            assert run["e2e"]["windows"] == json.loads(json.dumps(e2e["windows"]))
    assert [r["recipe"] for r in data["runs"]] == ["fp32", "bf16", "e4m3"]
    assert data["runs"][0]["e2e"]["kl"] == 0 < data["runs"][1]["e2e"]["kl"]
    assert (serial / "sweep.png").stat().st_size < 200_000
    assert "e4m3" in (serial / "REPORT.md").read_text()


def test_pool_gives_the_same_bytes_and_resume_computes_nothing(serial: Path,
                                                               tmp_path: Path) -> None:
    outcome = sweep.run(sweep.from_dict(SMALL), tmp_path, "pool", workers=2, progress=False)
    assert len(outcome.computed) == 6
    assert (tmp_path / "results.json").read_bytes() == (serial / "results.json").read_bytes()
    again = sweep.run(sweep.from_dict(SMALL), tmp_path, resume=True, progress=False)
    assert again.computed == [] and len(again.skipped) == 6
    assert (tmp_path / "results.json").read_bytes() == (serial / "results.json").read_bytes()


def test_existing_results_need_resume_and_the_same_config(serial: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="pass --resume"):
        sweep.run(sweep.from_dict(SMALL), serial, progress=False)
    with pytest.raises(ValueError, match="another configuration"):
        sweep.run(sweep.from_dict({**SMALL, "batch": 1}), serial, resume=True, progress=False)


def test_resume_refuses_results_computed_under_other_versions(serial: Path,
                                                             tmp_path: Path) -> None:
    """A task file computed under another BLAS order (or other library versions) is not mixed
    into a resumed run: the refusal names the file, what differs and how to match it."""
    out = tmp_path / "run"
    shutil.copytree(serial, out)
    task = min((out / "tasks").glob("*.json"))
    data = json.loads(task.read_text())
    assert data["result"]["versions"]["blas_order"] == os.environ["MKL_CBWR"]
    data["result"]["versions"]["blas_order"] = "AVX512"
    task.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=rf"{task.name} was computed under other versions "
                                         r"\(blas_order: .*'AVX512'.*MKL_CBWR"):
        sweep.run(sweep.from_dict(SMALL), out, resume=True, progress=False)


KILL_AFTER_TWO = """\
import os, signal, sys
from fpsim_experiments.sweep import runner
from fpsim import cli
write, written = runner.write_atomically, []

def write_then_die(path, data):          # the driver dies (SIGKILL) right after its 2nd task
    write(path, data)
    written.append(path)
    if path.parent.name == "tasks" and len(written) == 2:
        os.kill(os.getpid(), signal.SIGKILL)

runner.write_atomically = write_then_die
sys.exit(cli.main(sys.argv[1:]))
"""


def test_killed_driver_resumes_with_only_the_missing_tasks(serial: Path, tmp_path: Path) -> None:
    """The CLI in a subprocess, killed (SIGKILL) right after it wrote its second task file (at
    that point, not after a race with a timer); a resume computes exactly the others, leaves
    the two files as they were and writes the same results.json."""
    cfg = tmp_path / "small.toml"
    cfg.write_text(TOML)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", KILL_AFTER_TWO, "sweep", str(cfg), "--out",
                           str(out), "--no-progress"], cwd=REPO, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=900)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    kept = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in (out / "tasks").glob("*")}
    assert len(kept) == 2, proc.stderr.decode()          # no temporary file left over
    s = sweep.from_dict(SMALL)
    outcome = sweep.run(s, out, resume=True, progress=False)
    tasks = runner.plan(s)
    files = {t.name: runner.task_file(out, t, runner.spec(s, t, "cpu")).name for t in tasks}
    assert sorted(outcome.skipped) == sorted(n for n in files if files[n] in kept)
    assert sorted(outcome.computed) == sorted(n for n in files if files[n] not in kept)
    for name, (body, mtime) in kept.items():
        assert (out / "tasks" / name).read_bytes() == body
        assert (out / "tasks" / name).stat().st_mtime_ns == mtime
    assert (out / "results.json").read_bytes() == (serial / "results.json").read_bytes()


SLEEPING_POOL = """\
import os, sys, time
from pathlib import Path
from fpsim_experiments.sweep import executors


class Task:
    ref_key, name = "ref", "sleep"


class Sleep:                       # each task says its worker's pid, then sleeps
    def reference(self, task, device):
        return None

    def compute(self, task, ref, device):
        (Path(sys.argv[1]) / str(os.getpid())).touch()
        time.sleep(600)
        return {}


if __name__ == "__main__":
    nothing = lambda *a: None
    executors.run_pool(Sleep(), [Task(), Task()], "cpu", 0, nothing, nothing, nothing,
                       workers=2)
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not yet reaped by its new parent, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_pool_driver_leaves_no_worker_running(tmp_path: Path, sig: int) -> None:
    """A pool run's driver killed mid-task (as one stops a run to --resume it): its workers,
    busy with 10-minute tasks, end too instead of computing for nobody."""
    script = tmp_path / "driver.py"
    script.write_text(SLEEPING_POOL)
    started = tmp_path / "started"
    started.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    driver = subprocess.Popen([sys.executable, str(script), str(started)], cwd=REPO, env=env,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while len(list(started.iterdir())) < 2 and driver.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.2)
        workers = [int(p.name) for p in started.iterdir()]
        assert len(workers) == 2 and driver.poll() is None
        driver.send_signal(sig)
        assert driver.wait(timeout=60) == -sig
        deadline = time.monotonic() + 120             # each worker looks every 0.5 s
        while any(map(_alive, workers)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in workers if _alive(pid)]
    finally:
        driver.kill()
        for p in started.iterdir():
            if _alive(int(p.name)):
                os.kill(int(p.name), signal.SIGKILL)


def test_pool_workers_refuse_tasks_when_the_code_changed_after_the_driver_started(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A spawned (or Ray) worker imports fpsim again from disk: when its files are not those
    the driver imported (here the driver's record of them is changed), every task fails, named
    with the reason, instead of mixing two versions of the code."""
    monkeypatch.setattr(executors, "IMPORTED", "not the code on disk")
    s = sweep.from_dict(SMALL)
    done, failures = [], []
    executors.run_pool(work.SweepWork(s), runner.plan(s)[:2], "cpu", 0,
                       lambda t, r: done.append(t), lambda t, e: failures.append(e),
                       lambda n: None, workers=1)
    assert not done and len(failures) == 2
    assert all("not those the driver imported" in e for e in failures), failures
    with pytest.raises(RuntimeError, match="not those the driver imported"):
        executors.compute(None, None, None, "cpu", "other code")    # as a Ray worker runs it


def test_code_digest_follows_the_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "some_pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "mod.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = executors.code_digest(("some_pkg",))
    assert executors.code_digest(("some_pkg",)) == before
    (pkg / "sub" / "mod.py").write_text("x = 2\n")
    assert executors.code_digest(("some_pkg",)) != before


def test_failing_task_is_named_and_the_others_finish(tmp_path: Path) -> None:
    s = with_bad({**SMALL, "recipes": {"bf16": "bf16", "bad": BAD}})
    outcome = sweep.run(s, tmp_path, retries=1, progress=False)
    assert [f["task"] for f in outcome.failed] == ["tiny | bad | seed 0 | shard 0",
                                                   "tiny | bad | seed 0 | shard 1"]
    assert all("no_such_core" in f["error"] for f in outcome.failed)
    assert names(runner.plan(s))[:2] == outcome.computed
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["runs"][1] == {"model": "tiny", "seed": 0, "recipe": "bad", "windows": 4,
                               "missing_shards": [0, 1]}
    assert "Task tiny | bad | seed 0 | shard 0 failed" in (tmp_path / "REPORT.md").read_text()


def test_failures_are_listed_in_plan_order() -> None:
    """Whatever order tasks fail in (Ray's), results.json lists them in plan order."""
    s = sweep.from_dict(SMALL)
    tasks = runner.plan(s)
    data = runner.combine(s, tasks, {}, [{"task": t.name, "error": "x"} for t in tasks[::-1]])
    assert [f["task"] for f in data["failed"]] == names(tasks)
    assert all(r["missing_shards"] == [0, 1] for r in data["runs"])


def test_attempts_count_retries() -> None:
    calls = []

    def flaky() -> int:
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("transient")
        return 7

    assert executors._attempt(flaky, 2) == 7 and len(calls) == 3
    calls.clear()
    with pytest.raises(RuntimeError):
        executors._attempt(flaky, 1)
    assert len(calls) == 2


# -- the built-in experiments' end-to-end runs on the same runner ----------------------------
@pytest.fixture(scope="module")
def ctx() -> object:
    """The quick tiny context on one window (the experiments' runs cost a forward pass each)."""
    return context.build(sizes=dataclasses.replace(context.QUICK, tokens=64), quick=True)


def experiment_runs(ctx: object) -> list:
    """Three of practice's deployed recipes (per-site mappings: current and delayed scaling,
    tiles), an eager/causal pair with weights per channel, and the FP64 baseline."""
    e2m5 = Recipe("e2m5", name="e2m5")           # overflows: eager and causal differ
    w = Recipe("e4m3", scaling="channel", name="w")
    return [*practice.end_to_end_runs(ctx)[:3],
            runs.recipe_run("eager", e2m5, weights=w, attention="eager"),
            runs.recipe_run("causal", e2m5, weights=w, attention="causal"),
            runs.Run("fp64", functools.partial(RecipeRun, FP64), fp64=True)]


def dumps(results: list[dict]) -> str:
    return json.dumps([{k: v for k, v in r.items() if k in ("e2e", "overflows")}
                       for r in results], sort_keys=True)


@pytest.fixture(scope="module")
def in_process(ctx: object) -> str:
    """The runs in this process, no task files: what every executor must reproduce."""
    return dumps(ctx.end_to_end_runs(experiment_runs(ctx), "runs"))


def on(ctx: object, execution: runs.Execution) -> object:
    """``ctx`` with its runs computed on ``execution``."""
    return dataclasses.replace(ctx, execution=execution)


def test_experiment_runs_are_their_direct_computation(ctx: object, in_process: str) -> None:
    """Each result is the context's own end_to_end_ops of its ops, in order; the FP64 run
    is the float64 model (keys of compare only), against the same reference."""
    todo = experiment_runs(ctx)
    direct = []
    for r in todo[:-1]:
        ops = r.ops()
        direct.append({"e2e": ctx.end_to_end_ops(ops), "overflows": compact(ops.overflows)})
    m64 = copy.deepcopy(ctx.model).double()
    fp64 = compare(m64, ctx.wins, ctx.ref_logits, RecipeRun(FP64), ctx.batch_size)
    got = json.loads(in_process)
    assert json.dumps(got[:-1], sort_keys=True) == json.dumps(direct, sort_keys=True)
    assert json.dumps(got[-1]["e2e"], sort_keys=True) == json.dumps(fp64, sort_keys=True)
    assert got[3]["overflows"]["recorded"] != got[4]["overflows"]["recorded"] > 0
    assert 0 < got[-1]["e2e"]["kl"] < 1e-9


def test_experiment_run_specs_name_everything_their_numbers_depend_on(ctx: object) -> None:
    todo = experiment_runs(ctx)
    described = [json.dumps(runs.describe(r.ops), sort_keys=True) for r in todo]
    assert len(set(described)) == len(todo)
    assert '"attention": "causal"' in described[4] and '"scaling": "channel"' in described[4]
    assert "e4m3/delayed h=16 sat" in described[1]
    with pytest.raises(TypeError, match="cannot name"):
        runs.describe(functools.partial(RecipeRun, object()))


def test_experiment_runs_on_a_pool_are_the_same_bytes(ctx: object, in_process: str,
                                                     tmp_path: Path) -> None:
    ex = runs.Execution("pool", workers=2, folder=tmp_path)
    assert dumps(on(ctx, ex).end_to_end_runs(experiment_runs(ctx), "runs")) == in_process
    assert len(list((tmp_path / "runs").glob("*.json"))) == len(experiment_runs(ctx))


def test_a_worker_builds_the_same_context_and_reference(ctx: object) -> None:
    work = runs.ContextWork(ctx.source)
    runs._CONTEXTS.clear()                     # as in a fresh worker process
    fresh = work.context("cpu")
    assert fresh is not ctx and torch.equal(fresh.wins, ctx.wins)
    assert all(torch.equal(a, b) for a, b in zip(work.reference(None, "cpu"), ctx.ref_logits,
                                                 strict=True))


def test_experiment_runs_resume_and_compute_only_the_missing(ctx: object, in_process: str,
                                                            tmp_path: Path,
                                                            monkeypatch) -> None:
    todo = experiment_runs(ctx)
    first = on(ctx, runs.Execution(folder=tmp_path))
    first.end_to_end_runs(todo[:2], "runs")           # as if killed after two runs
    with pytest.raises(ValueError, match="pass --resume"):
        first.end_to_end_runs(todo, "runs")
    computed = []
    compute = runs.ContextWork.compute
    monkeypatch.setattr(runs.ContextWork, "compute",
                        lambda self, t, ref, device: computed.append(t.name) or
                        compute(self, t, ref, device))
    monkeypatch.setattr(runs.ContextWork, "reference", None)    # the driver's is handed over
    again = on(ctx, runs.Execution(folder=tmp_path, resume=True))
    assert dumps(again.end_to_end_runs(todo, "runs")) == in_process
    assert computed == [r.name for r in todo[2:]]
    other = [runs.recipe_run(todo[0].name, Recipe("e5m2", name="e5m2"))]   # same name, new ops
    with pytest.raises(ValueError, match="another configuration"):
        again.end_to_end_runs(other, "runs")


def test_failing_experiment_runs_are_named_and_the_others_kept(ctx: object,
                                                              tmp_path: Path) -> None:
    bad = failing(Recipe("e4m3", order="tensor_core", tensor_core="hopper_fp8", name="bad"))
    todo = [runs.recipe_run("bf16", Recipe("bf16", name="bf16")), runs.recipe_run("bad", bad)]
    with pytest.raises(runs.RunsFailed, match="1 end-to-end run.* bad: ValueError: .*"
                       "tensor_core 'no_such_core'.*rerun with --resume"):
        on(ctx, runs.Execution(folder=tmp_path, retries=0)).end_to_end_runs(todo, "runs")
    assert [p.name.split("-")[0] for p in (tmp_path / "runs").glob("*.json")] == ["bf16"]
    with pytest.raises(ValueError, match="share a name"):
        ctx.end_to_end_runs([todo[0], todo[0]], "runs")


def test_a_worker_on_other_cpu_kernels_fails_by_name(ctx: object, monkeypatch) -> None:
    """A result computed under other torch CPU kernels (AVX-512 against AVX2: the metrics'
    last bits differ) is not mixed in: its run fails, named, with the setting that fixes it."""
    compute = runs.ContextWork.compute

    def elsewhere(self, t, ref, device):
        result = compute(self, t, ref, device)
        return {**result, "versions": {**result["versions"], "cpu_kernels": "OTHER"}}

    monkeypatch.setattr(runs.ContextWork, "compute", elsewhere)
    with pytest.raises(runs.RunsFailed, match="bf16: its worker ran .*OTHER.*ATEN_CPU_CAP"):
        ctx.end_to_end_runs([runs.recipe_run("bf16", Recipe("bf16", name="bf16"))], "runs")


def test_experiment_cli_refuses_what_it_cannot_do(capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)          # import ray raises ImportError
    for argv, message in ((["training", "--executor", "pool"], "runs in this process only"),
                          (["practice", "--address", "auto"], "add --executor ray"),
                          (["practice", "--executor", "ray"], "pip install 'fpsim[sweep]'")):
        with pytest.raises(SystemExit) as exc:
            fpsim_main(["experiment", *argv])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and message in err and err.count("\n") <= 2, err


# -- command line ------------------------------------------------------------------------------
def test_cli_failure_exit_status_and_one_line_errors(tmp_path: Path, capsys) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text('models = ["tiny"]\nrecipes = ["bf16"]\nseed = 1\n')
    assert fpsim_main(["sweep", str(cfg), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown key(s) seed" in err
    cfg.write_text("models = [\n")
    assert fpsim_main(["sweep", str(cfg)]) == 2
    assert "not valid TOML" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        fpsim_main(["sweep", str(cfg), "--address", "auto"])
    assert exc.value.code == 2 and "add --executor ray" in capsys.readouterr().err


def test_cli_without_ray_says_how_to_install_it(tmp_path: Path, capsys, monkeypatch) -> None:
    cfg = tmp_path / "small.toml"
    cfg.write_text(TOML)
    monkeypatch.setitem(sys.modules, "ray", None)          # import ray raises ImportError
    assert fpsim_main(["sweep", str(cfg), "--executor", "ray", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'fpsim[sweep]'" in err
    assert not (tmp_path / "tasks").exists()


# -- Ray -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster() -> object:
    """A local Ray cluster of 2 CPUs whose workers import this checkout (given 5 minutes to
    start: on a loaded machine Ray's default minute is not always enough)."""
    os.environ.setdefault("RAY_raylet_start_wait_time_s", "300")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    yield ray
    ray.shutdown()


def busy_workers() -> list[int]:
    """Process ids of Ray workers running a task's compute (Ray titles them ray::compute)."""
    pids = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and (d / "cmdline").read_bytes().startswith(b"ray::compute"):
                pids.append(int(d.name))
        except OSError:
            pass
    return pids


@needs_ray
def test_ray_run_is_the_in_process_run_bit_for_bit(cluster: object, serial: Path,
                                                   tmp_path: Path) -> None:
    outcome = sweep.run(sweep.from_dict(SMALL), tmp_path, "ray", progress=False)
    assert len(outcome.computed) == 6 and not outcome.failed
    assert (tmp_path / "results.json").read_bytes() == (serial / "results.json").read_bytes()


@needs_ray
@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="finds workers in /proc")
def test_ray_worker_killed_mid_task_is_rerun_once(cluster: object, serial: Path,
                                                  tmp_path: Path) -> None:
    """SIGKILL to a worker computing a task: Ray reruns that task, every task reaches the
    driver once, results.json is the in-process bytes, and a resume computes nothing."""
    outcome: list = []
    run = threading.Thread(target=lambda: outcome.append(
        sweep.run(sweep.from_dict(SMALL), tmp_path, "ray", progress=False)))
    run.start()
    killed = []
    while run.is_alive() and not killed:
        for pid in busy_workers()[:1]:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        time.sleep(0.01)
    run.join()
    assert killed, "no worker was caught computing a task"
    done = outcome[0]
    assert sorted(done.computed) == sorted(names(runner.plan(sweep.from_dict(SMALL))))
    assert not done.failed
    assert (tmp_path / "results.json").read_bytes() == (serial / "results.json").read_bytes()
    again = sweep.run(sweep.from_dict(SMALL), tmp_path, "ray", resume=True, progress=False)
    assert again.computed == [] and len(again.skipped) == 6
    assert (tmp_path / "results.json").read_bytes() == (serial / "results.json").read_bytes()


@needs_ray
def test_ray_failing_task_is_retried_then_named(cluster: object, tmp_path: Path) -> None:
    s = with_bad({**SMALL, "recipes": {"bf16": "bf16", "bad": BAD}})
    outcome = sweep.run(s, tmp_path, "ray", retries=1, progress=False)
    assert sorted(outcome.computed) == names(runner.plan(s))[:2]
    assert sorted(f["task"] for f in outcome.failed) == names(runner.plan(s))[2:]
    assert all(f["error"].startswith("ValueError: ") and "tensor_core 'no_such_core'" in f["error"]
               for f in outcome.failed)
    data = json.loads((tmp_path / "results.json").read_text())
    assert [f["task"] for f in data["failed"]] == names(runner.plan(s))[2:]     # plan order


@needs_ray
def test_experiment_runs_on_ray_are_the_same_bytes(cluster: object, ctx: object, in_process: str,
                                                   tmp_path: Path) -> None:
    ex = runs.Execution("ray", folder=tmp_path)
    assert dumps(on(ctx, ex).end_to_end_runs(experiment_runs(ctx), "runs")) == in_process


@needs_ray
def test_experiment_cli_on_ray_writes_the_in_process_results(cluster: object,
                                                             tmp_path: Path) -> None:
    """``fpsim experiment practice --executor ray`` on the running cluster: the results.json of
    the run in this process (but its seconds), and no task files left."""
    common = ["experiment", "practice", "--quick", "--tokens", "64"]
    assert fpsim_main([*common, "--out", str(tmp_path / "here")]) == 0
    assert fpsim_main([*common, "--executor", "ray", "--out", str(tmp_path / "ray")]) == 0
    here, there = (json.loads((tmp_path / d / "practice" / "results.json").read_text())
                   for d in ("here", "ray"))
    del here["meta"]["seconds"], there["meta"]["seconds"]
    assert json.dumps(here, sort_keys=True) == json.dumps(there, sort_keys=True)   # NaN too
    assert not (tmp_path / "ray" / "practice" / "tasks").exists()
    assert ray.is_initialized()                  # the cluster it joined is left running


def test_cli_help_is_the_sweep_parser(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        fpsim_main(["sweep", "--help"])
    assert exc.value.code == 0 and "--executor {inprocess,pool,ray}" in capsys.readouterr().out


def test_any_hugging_face_causal_lm(tmp_path: Path) -> None:
    """A Llama saved with save_pretrained (256-byte vocabulary, 16 positions): transformers
    runs it under the recipes, windows shrink to its positions."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   vocab_size=256, max_position_embeddings=16)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "llama")
    s = sweep.from_dict({"models": ["llama"], "recipes": ["fp32", "bf16"], "tokens": 32,
                         "window": 64, "batch": 2}, base=tmp_path)
    outcome = sweep.run(s, tmp_path / "out", progress=False)
    assert len(outcome.computed) == 2 and not outcome.failed
    runs = json.loads((tmp_path / "out" / "results.json").read_text())["runs"]
    assert [r["windows"] for r in runs] == [2, 2]
    assert runs[0]["e2e"]["windows"]["positions"] == 16
    assert runs[0]["e2e"]["kl"] == 0 < runs[1]["e2e"]["kl"]


def test_docs_state_the_benchmarked_cost() -> None:
    """docs/sweep.md's cost per task, and the README's, are the sentences
    benchmarks/sweep_bench.py makes of its JSON."""
    import importlib.util

    path = REPO / "benchmarks" / "sweep_bench.py"
    spec = importlib.util.spec_from_file_location("sweep_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    data = json.loads((REPO / "benchmarks" / "results" / "sweep_bench.json").read_text())
    assert data["same_results_json"]
    docs = " ".join((REPO / "docs" / "sweep.md").read_text().split())
    assert bench.summary(data) in docs
    readme = " ".join((REPO / "README.md").read_text().split())
    assert bench.readme(data) in readme


@pytest.mark.parametrize("given", [None, "AVX2"])
def test_the_experiments_pin_mkls_summation_order_unless_told(given: str | None) -> None:
    """Importing fpsim_experiments sets MKL_CBWR=COMPATIBLE (MKL's CPU-independent kernels)
    before any matmul, so that FP64 sums round alike on every CPU; a value already set wins."""
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    if given:
        env["MKL_CBWR"] = given
    code = "import os, fpsim_experiments; print(os.environ['MKL_CBWR'])"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO,
                         env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                         timeout=300)
    assert out.stdout.strip() == (given or "COMPATIBLE"), out.stderr
