"""The documentation site: ``mkdocs build --strict`` (warnings are errors) builds it once into a
temporary folder, and its HTML is read as a browser gets it: examples as code, no
reStructuredText roles as text, every public object on the API page, links that work opened
from disk."""

from __future__ import annotations

import html
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|data|attr|exc|obj|const):")
CODE = re.compile(r"<pre\b.*?</pre>|<code\b.*?</code>", re.S)
HREF = re.compile(r"""(?:href|src)="([^"#?]*)[^"]*\"""")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    for name in ("mkdocs", "mkdocstrings", "material"):
        pytest.importorskip(name, reason="the docs extra is not installed: pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def pages(site: Path) -> dict[str, str]:
    return {p.relative_to(site).as_posix(): p.read_text(encoding="utf-8")
            for p in sorted(site.rglob("*.html"))}


def test_the_site_builds_with_warnings_as_errors(site):
    assert (site / "index.html").is_file()
    assert (site / "results" / "REPORT.html").is_file()    # results/ served as they are


def test_docstring_examples_render_as_code_not_blockquotes(site):
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    assert api.count('<span class="gp">&gt;&gt;&gt; </span>') > 50    # prompts highlighted
    for name, text in pages(site).items():
        outside = CODE.sub("", text)
        assert "&gt;&gt;&gt;" not in outside, f"{name}: a >>> example outside a code block"


def test_no_restructuredtext_roles_show_as_text(site):
    for name, text in pages(site).items():
        prose = re.sub(r"<[^>]+>", "", CODE.sub("", text))    # a role named as code is fine
        found = ROLE.findall(html.unescape(prose))
        assert not found, f"{name}: {found[:3]}"


def test_the_api_page_has_every_public_object(site):
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    for ident in ("fpsim.emulation.recipe.Rule", "fpsim.emulation.recipe.Rules",
                  "fpsim.emulation.casts.Cast", "fpsim.emulation.casts.Backward",
                  "fpsim.arith.accumulator.Accumulator",
                  "fpsim.emulation.presets", "fpsim.emulation.presets.rules",
                  "fpsim.emulation.presets.get_preset", "fpsim.emulation.presets.Preset",
                  "fpsim.plot", "fpsim.plot.error_histogram", "fpsim.plot.number_line",
                  "fpsim.plot.range_precision", "fpsim.plot.value_coverage",
                  "fpsim.scaling.scaled_quantize", "fpsim.bridge.as_dtype"):
        assert f'id="{ident}"' in api, ident
    # cross-references in docstrings are links, e.g. Cast's "any other mode of fpsim.quantize"
    assert 'href="#fpsim.convert.quantize"><code>fpsim.quantize</code></a>' in api


def test_signatures_are_formatted_to_the_page(site):
    """ruff (the docs extra) splits long signatures, one parameter a line."""
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    blocks = re.findall(r'<div class="doc-signature highlight"><pre>(.*?)</pre>', api, re.S)
    assert blocks
    for block in blocks:
        text = html.unescape(re.sub(r"<[^>]+>", "", block))
        assert max(map(len, text.splitlines())) <= 100, \
            f"{text}\nunformatted: is ruff installed? pip install -e '.[docs]'"


def test_links_work_opened_from_disk(site):
    """No directory URLs: every link and image inside the site names a file that is there."""
    for name, text in pages(site).items():
        if name == "404.html":      # a web server's page: its links are absolute
            continue
        here = (site / name).parent
        for target in HREF.findall(text):
            if not target or "://" in target or target.startswith(("mailto:", "data:")):
                continue
            assert (here / target).is_file(), f"{name} links to {target}, not a file"


def test_pages_carry_no_internal_notes_or_doubled_text(site):
    for name, text in pages(site).items():
        assert "Moved here verbatim" not in text, name
        doubled = re.findall(r"<code>([^<]+)</code> \(<code>\1</code>\)", text)
        assert not doubled, f"{name}: {doubled}"
    tour = (site / "tour.html").read_text(encoding="utf-8")
    assert len(re.findall(r"<h[12][^>]*>A short tour", tour)) == 1


def test_the_readme_links_every_user_guide_page():
    yaml = pytest.importorskip("yaml")
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    guide = next(entry["User guide"] for entry in nav if "User guide" in entry)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for entry in guide:
        page = next(iter(entry.values()))
        assert f"(docs/{page})" in readme, f"the README's documentation list lacks docs/{page}"


def test_examples_are_fenced_where_doctest_ends_them():
    """scripts/griffe_examples.py: an example ends at a blank line; fenced code and an indented
    example stay as they are written."""
    pytest.importorskip("griffe")
    spec = importlib.util.spec_from_file_location("griffe_examples",
                                                  ROOT / "scripts" / "griffe_examples.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fence = module.fence_examples
    assert fence("a\n\n>>> 1\n1\n>>> 2\n2\n\nb") == "a\n\n```pycon\n>>> 1\n1\n>>> 2\n2\n```\n\nb"
    assert fence("```pycon\n>>> 1\n1\n```") == "```pycon\n>>> 1\n1\n```"
    assert fence("- item\n\n    >>> 1\n    1") == "- item\n\n    ```pycon\n    >>> 1\n    1\n    ```"
    assert fence("x >>> y") == "x >>> y"


PEERS = ("ml_dtypes", "gfloat", "pychop", "QPyTorch", "mptorch", "CPFloat", "microxcaling",
         "torchao", "Transformer Engine", "Brevitas", "MMA-Sim")


def test_the_comparison_has_a_row_for_each_library():
    """Each feature table of docs/comparison.md has a row per library (its first cell), each
    row a source for every cell it fills, and each library a line on what it does better."""
    page = (ROOT / "docs" / "comparison.md").read_text(encoding="utf-8")
    tables = [t for t in re.split(r"\n## ", page) if t.startswith(("Formats", "Block",
                                                                    "Arithmetic", "Where"))]
    assert len(tables) == 4
    for table in tables:
        rows = {line.split("|")[1].strip(): line for line in table.splitlines()
                if line.startswith("| ") and not line.startswith("| |")}    # not the header
        assert set(PEERS) <= set(rows), (table.splitlines()[0], set(PEERS) - set(rows))
        for name, row in rows.items():
            for cell in row.strip("|").split("|")[1:]:
                cell = cell.strip()
                assert cell.startswith("—") or "`" in cell, (name, cell)
    better = page.split("## What each does better than fpsim", 1)[1].split("\n## ", 1)[0]
    for name in PEERS:
        assert f"- **{name}**:" in better, name
