"""The planted-bug list stays usable: every mutant's line is in the package exactly once.

Running the mutants takes minutes (``python scripts/mutants.py``); this only checks that each
one still applies, so that a refactor which moves its line is noticed in CI, not when the
mutants are next run (``thread-pieces`` once went stale unnoticed that way)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _mutants():
    spec = importlib.util.spec_from_file_location("mutants", ROOT / "scripts" / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("mutants", module)
    spec.loader.exec_module(module)
    return module


MUTANTS = _mutants()


@pytest.mark.parametrize("m", MUTANTS.MUTANTS, ids=lambda m: m.name)
def test_every_mutant_still_applies(m) -> None:
    path, _ = MUTANTS.locate(ROOT, m.line)
    assert m.new.strip() != m.line.strip(), "a mutant must change its line"
    for test in m.tests:
        assert (ROOT / test.split("::")[0]).exists(), f"{m.name}: no test file {test}"


def test_a_missing_line_is_reported_as_stale() -> None:
    with pytest.raises(MUTANTS.Stale, match="found 0 times"):
        MUTANTS.locate(ROOT, "this_line_is_not_in_fpsim = True")
