"""The Python tour (docs/tour.md, once the README's) runs, and its comments state what the
code returns.

The claims are read from docs/tour.md, not re-typed here: each tour line with a ``# comment`` is
run on its own and the literals of its comment are checked against what the line produced.
"""

import ast
import contextlib
import io
import re
from pathlib import Path

import numpy as np
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
LITERAL = re.compile(r"\[[\[\]\d.,\s-]*\]|-?\d+\.\d+(?:e-?\d+)?")   # [126, 127], [[2048.]], 0.1
DTYPE = re.compile(r"\b(?:np\.)?(u?int\d+|float\d+)\b")             # uint8, np.float32
COUNT = re.compile(r"\b\d+\b")                                       # 8, 128 (not E8M0, FP4)


TOUR = README.parent / "docs" / "tour.md"     # the README's tour, moved there (issue 29)


def python_blocks() -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", TOUR.read_text(), re.S)
    assert blocks, "docs/tour.md has a Python tour"
    return blocks


def tour() -> str:
    return next(b for b in python_blocks() if "fpsim.quantize(" in b)


def test_tour_runs(tmp_path, monkeypatch):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.image as mpimg

    monkeypatch.chdir(tmp_path)
    env = {}
    for code in python_blocks():
        if "model(" in code:  # the fake-quantization sketch needs a model of the reader's own
            continue
        exec(compile(code, "README.md", "exec"), env)
    png = mpimg.imread(tmp_path / "errors.png")                  # decodes as a PNG
    again = env["fpsim"].plot.error_histogram(env["x"], ["e4m3", "e5m2", "bf16"])
    width, height = again.canvas.get_width_height()
    assert png.shape[:2] == (height, width)
    colours = np.unique(png.reshape(-1, png.shape[-1]).round(2), axis=0)
    assert len(colours) > 10                                     # drawn on, not a blank page


def claims(comment: str) -> tuple[list, list[str], list[int]]:
    """(literals, dtype names, whole numbers) stated by one comment."""
    literals = [ast.literal_eval(s) for s in LITERAL.findall(comment)]
    return literals, DTYPE.findall(comment), [int(n) for n in COUNT.findall(comment)]


def check_line(stmt: ast.stmt, comment: str, env: dict) -> None:
    """Run one tour statement and check its comment's claims; fail on a comment with none."""
    code = ast.unparse(stmt)
    if isinstance(stmt, ast.Expr) and code.startswith("print("):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(code, env)
        stated = comment.removesuffix("...").strip()
        assert out.getvalue().startswith(stated), (code, out.getvalue(), stated)
        return
    if isinstance(stmt, ast.Expr):
        values = [eval(code, env)]
    else:
        exec(code, env)
        target = stmt.targets[0]
        names = target.elts if isinstance(target, ast.Tuple) else [target]
        values = [eval(ast.unparse(n), env) for n in names]
    literals, dtypes, counts = claims(comment)
    assert literals or counts, f"no checkable claim in the tour comment {comment!r}"
    first = np.asarray(values[0])
    if literals:
        assert first.tolist() == literals[0], (code, first.tolist(), literals[0])
    else:                                        # "8 E8M0 scales, 128 bytes": one per target
        assert [np.asarray(v).nbytes for v in values] == counts, (code, counts)
    for name in dtypes:
        assert first.dtype == np.dtype(name), (code, first.dtype, name)


def test_tour_comments_are_true(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = tour()
    lines = source.splitlines()
    env: dict = {}
    checked = 0
    for stmt in ast.parse(source).body:
        line = lines[stmt.lineno - 1]
        if "#" not in line:
            exec(ast.unparse(stmt), env)
            continue
        check_line(stmt, line.split("#", 1)[1].strip(), env)
        checked += 1
    assert checked >= 7, "the tour's commented lines were all found"
