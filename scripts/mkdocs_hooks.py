"""MkDocs hooks of the documentation site (mkdocs.yml names this file).

* Pages listed in ``nav`` but absent from docs/ are dropped from the navigation instead of
  failing the strict build: several branches add their own pages (emulate.md, training.md,
  speed.md, ...), and the site builds before and after each lands.
* The experiments' reports live in results/ (written by ``fpsim experiment``, linked from the
  README); they are added to the site as they are, with their figures, under results/, so their
  relative links work unchanged and no copy is kept in docs/.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"


def _exists(page: str, docs: Path) -> bool:
    return (docs / page).is_file() or (page.startswith("results/") and (ROOT / page).is_file())


def _prune(items: list, docs: Path) -> list:
    """``nav`` without the pages that are not there (and sections left empty)."""
    kept = []
    for item in items:
        if isinstance(item, dict):
            (title, value), = item.items()
            if isinstance(value, list):
                value = _prune(value, docs)
                if value:
                    kept.append({title: value})
            elif isinstance(value, str) and (value.startswith("http") or _exists(value, docs)):
                kept.append(item)
        elif isinstance(item, str) and _exists(item, docs):
            kept.append(item)
    return kept


def on_config(config: Any) -> Any:
    config["nav"] = _prune(config["nav"] or [], Path(config["docs_dir"]))
    return config


def on_files(files: Files, config: Any) -> Files:
    for path in sorted(RESULTS.rglob("*")):
        if path.is_file() and path.suffix in (".md", ".png"):
            uri = path.relative_to(ROOT).as_posix()
            files.append(File(uri, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files
