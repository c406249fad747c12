"""The argument parser of every ``fpsim`` command: one line on stderr and exit status 2.

Its own small module so that ``fpsim.cli`` and ``fpsim_experiments.cli`` (which ``fpsim.cli`` loads
for ``fpsim experiment``) both import it without importing each other.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

#: Floats argparse must take as values, not options: -1, -.5, -1e-3, -inf, -nan, -0x1p-3.
NEGATIVE = re.compile(r"^-(\d|\.\d|inf|nan|0x)", re.IGNORECASE)


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


class OneLineParser(argparse.ArgumentParser):
    """Bad arguments: one line on stderr and exit status 2, no traceback."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = NEGATIVE

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
