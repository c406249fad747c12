"""fpsim installs only names it owns, and no folder of the repository shadows a published package.

Until transformers 5.25 the repository's top-level ``kernels/`` (fpsim's Triton kernels) could
sit beside Hugging Face's ``kernels`` package unnoticed; 5.25 imports Hugging Face's, and from
the repository root Python found fpsim's folder first, so transformers failed to import (and,
from any other folder, ``import kernels`` was Hugging Face's and fpsim's Triton entry points
broke).  The kernels and the experiments are now ``fpsim_kernels`` and ``fpsim_experiments``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: Top-level names of published packages that a folder of the repository must not take.
PUBLISHED = ("kernels", "experiments", "benchmarks", "scripts", "docs", "results")


def test_no_folder_of_the_repository_is_a_package_named_like_a_published_one() -> None:
    shadowing = [name for name in PUBLISHED
                 if (REPO / name / "__init__.py").exists() or (REPO / f"{name}.py").exists()]
    assert not shadowing, f"{shadowing} would shadow a published package from the repo root"
    owned = sorted(p.name for p in REPO.iterdir() if (p / "__init__.py").exists())
    assert all(name == "fpsim" or name.startswith("fpsim_") for name in owned), owned


@pytest.mark.parametrize("where", ["root", "elsewhere"])
def test_transformers_and_fpsim_kernels_side_by_side(where: str, tmp_path: Path) -> None:
    """With Hugging Face's ``kernels`` installed (transformers 5.25 and newer bring it),
    transformers builds a model and fpsim's Triton entry points run fpsim's kernels (on CPU
    tensors under ``TRITON_INTERPRET=1``), from the repository root and from another folder."""
    for needed in ("transformers", "triton", "kernels"):
        if importlib.util.find_spec(needed) is None:
            pytest.skip(f"{needed} is not installed (pip install -e '.[test,kernels]')")
    code = """
import kernels, torch, transformers, numpy as np, fpsim, fpsim_kernels
assert "site-packages" in kernels.__file__, kernels.__file__         # Hugging Face's package
assert hasattr(kernels, "get_kernel"), dir(kernels)
cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
model = transformers.GPT2LMHeadModel(cfg)
x = torch.linspace(-500, 500, 1001)
want = fpsim.quantize(x.numpy(), "e4m3", saturate=True)
got = fpsim.quantize(x, "e4m3", backend="triton", saturate=True)
assert np.array_equal(got.numpy().view(np.uint32), want.view(np.uint32))
got = fpsim_kernels.quantize(x, "e4m3", saturate=True)
assert np.array_equal(got.numpy().view(np.uint32), want.view(np.uint32))
print("ok", type(model).__name__)
"""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cwd = REPO if where == "root" else tmp_path      # elsewhere: fpsim as installed
    run = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0 and "ok GPT2LMHeadModel" in run.stdout, run.stderr[-3000:]


@pytest.mark.slow
def test_the_wheel_installs_only_fpsim_names(tmp_path: Path) -> None:
    """The built wheel's top-level names are the project's own."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w",
                    str(tmp_path), str(REPO)], check=True, capture_output=True, timeout=600)
    (wheel,) = tmp_path.glob("fpsim-*.whl")
    top = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    top.discard(next(t for t in top if t.endswith(".dist-info")))
    assert top == {"fpsim", "fpsim_kernels", "fpsim_experiments"}, top
    data = zipfile.ZipFile(wheel).namelist()
    assert "fpsim_experiments/gpt2/tiny/config.json" in data       # the shipped checkpoint


def test_ci_runs_the_readme_test_command_in_a_new_environment() -> None:
    """.ci/run makes a new virtual environment and runs the README's marked test block."""
    ci = (REPO / ".ci" / "run").read_text()
    assert "python3 -m venv" in ci and "<!-- ci: test -->" in ci
    assert "trap 'rm -rf \"$tmp\"' EXIT" in ci       # a run's venv (GBs) goes when it ends
    readme = (REPO / "README.md").read_text().splitlines()
    at = readme.index("<!-- ci: test -->")
    assert readme[at + 1] == "```bash" and "python -m pytest" in readme[at + 2]


def test_runs_without_out_never_write_the_committed_results() -> None:
    from fpsim_experiments.cli import out_folder, parse_args
    from fpsim_experiments.sweep.cli import parse_args as sweep_args

    for argv in (["fp8", "--quick"], ["all"], ["range-vs-precision"]):
        args = parse_args(argv)
        out = out_folder(args.out, args.quick)
        assert out.parts[0] == "runs", (argv, out)
    assert out_folder(parse_args(["all", "--out", "results"]).out, False) == Path("results")
    assert sweep_args([str(REPO / "README.md")]).out is None   # main() then picks runs/sweep-*
    assert "runs/" in (REPO / ".gitignore").read_text()
