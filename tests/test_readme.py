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


def python_blocks(page: Path = TOUR) -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    assert blocks, f"{page.name} has Python examples"
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
        exec(compile(code, "docs/emulate.md", "exec"), env)
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


def test_any_model_rules_example_reports_what_it_says():
    """The Rules example of docs/emulate.md (once the README's), run on a tiny Llama built here: each rule takes the sites it
    names (the lm_head rule too: it comes before the broader linear rule), the report says so,
    and it shows the sites the comment names."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import warnings

    import fpsim

    page = README.parent / "docs" / "emulate.md"
    code = next(b for b in python_blocks(page) if "fpsim.emulate(rules" in b)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=61,
                                   max_position_embeddings=16)
    env = {"torch": torch, "fpsim": fpsim, "model": transformers.LlamaForCausalLM(cfg).eval(),
           "ids": torch.randint(0, 61, (1, 6))}
    out = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(out):
        warnings.simplefilter("error")                 # no rule shadowed, nothing not emulated
        exec(compile(code, "docs/emulate.md", "exec"), env)
    rows = {line.split()[0]: line.split() for line in out.getvalue().splitlines()[1:]}
    comment = code.split("e.g.", 1)[1].split("\n")[0]
    named = [s.strip() for s in comment.split(",")]
    assert named and all(s in rows for s in named), (named, list(rows))
    def row(site: str) -> str:
        return " ".join(rows[site])
    assert "linear fp32 acc=fp16 sequential rule 0" in row("lm_head:linear")
    assert "linear e4m3/tensor rule 1" in row("model.layers.0.self_attn.q_proj:linear")
    assert "attention bf16 out=bf16 rule 2" in row("model.layers.0.self_attn:qk")
    assert "norm bf16 rule 3" in row("model.norm:rms_norm")       # norms only when asked



# --------------------------------------------------------------------------------------------
# Experiment prose: every number in a marked region is one the generated reports print
# --------------------------------------------------------------------------------------------
REPO = README.parent
REGION = re.compile(r"<!-- numbers: results -->(.*?)<!-- /numbers -->", re.S)
NUMBER = re.compile(r"(?<![\w.^])-?\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?(?![\w])")


def numbers(text: str) -> set[str]:
    """The numbers of ``text`` as printed, thousands separators dropped (``32,000`` -> ``32000``,
    but ``[4.33, 4.63]`` gives two numbers)."""
    out = set()
    for m in NUMBER.finditer(text):
        s = m.group().rstrip(",")
        parts = s.split(",")
        if len(parts) > 1 and all(len(p) == 3 for p in parts[1:]):
            out.add("".join(parts))
        else:
            out.update(p for p in parts if p)
    return out


def marked_regions() -> list[tuple[str, str]]:
    """(file, text) of every region marked ``<!-- numbers: results -->`` in README.md and the
    docs: prose whose numbers the experiments' reports must print."""
    files = [README, *sorted((REPO / "docs").rglob("*.md"))]
    return [(p.name, t) for p in files if p.exists() for t in REGION.findall(p.read_text())]


def test_experiment_prose_numbers_come_from_the_reports():
    """Every number in the marked README/docs prose appears in a REPORT.md under results/
    (each generated from its JSON, and re-rendered identically by test_experiments): a number
    that drifts from its JSON is no longer printed by any report and fails here."""
    regions = marked_regions()
    assert regions, "the README marks its experiment prose with <!-- numbers: results -->"
    printed = set()
    for report in (REPO / "results").rglob("REPORT.md"):
        printed |= numbers(report.read_text())
    for name, text in regions:
        missing = sorted(numbers(text) - printed)
        assert not missing, f"{name}: numbers no report prints: {missing}"


def test_number_extraction():
    assert numbers("KL 0.19× [0.183, 0.196] on 32,000 tokens, e4m3, h2.ln_1, B=8, 2^-10") == \
        {"0.19", "0.183", "0.196", "32000", "8", "2", "10"}
