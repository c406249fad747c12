"""MkDocs hooks of the documentation site (mkdocs.yml names this file).

* Links that leave docs/ (``../results/REPORT.md``, ``../benchmarks/...``: right on GitHub,
  which renders the Markdown where it lies) are rewritten for the site: results/ pages to the
  copies served there, anything else to the file in the repository when mkdocs.yml sets
  ``repo_url``, else to its path as text, once (a link whose text is the path stays that text).
* The experiments' reports live in results/ (written by ``fpsim experiment``, linked from the
  README); they are added to the site as they are, with their figures, under results/, so their
  relative links work unchanged and no copy is kept in docs/.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)#\s]+)(#[^)\s]*)?\)")


def on_files(files: Files, config: Any) -> Files:
    for path in sorted(RESULTS.rglob("*")):
        if path.is_file() and path.suffix in (".md", ".png"):
            uri = path.relative_to(ROOT).as_posix()
            files.append(File(uri, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Links out of docs/ (see the module doc) made to work on the site."""
    here = posixpath.dirname(page.file.src_uri)

    def fix(m: re.Match) -> str:
        bang, text, target, anchor = m.group(1), m.group(2), m.group(3), m.group(4) or ""
        if "://" in target or target.startswith("mailto:"):
            return m.group(0)
        repo = posixpath.normpath(posixpath.join("docs", here, target))
        if not repo.startswith("../") and not repo.startswith("docs/"):
            if repo.startswith("results/") and (ROOT / repo).is_file():
                rel = posixpath.relpath(repo, here or ".")
                return f"{bang}[{text}]({rel}{anchor})"
            if config.get("repo_url"):
                return f"{bang}[{text}]({config['repo_url'].rstrip('/')}/blob/HEAD/{repo}{anchor})"
            return text if text.strip("`").rstrip("/") == repo else f"{text} (`{repo}`)"
        return m.group(0)

    return LINK.sub(fix, markdown)
