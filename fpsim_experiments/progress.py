"""Progress bars of the experiments and sweeps: tqdm on a terminal, a few plain lines elsewhere.

tqdm redraws its bar with carriage returns several times a second; sent to a file or a pipe
(a log, CI, ``2> run.log``) that is thousands of updates on one line.  ``bar`` gives tqdm
only when the stream is a terminal; otherwise a ``Lines`` that writes one line per tenth
of the work (one per step when there are at most ten), at most one a minute between those,
and one at the end.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any, TextIO

#: Longest silence of a non-terminal progress stream while work goes on, in seconds.
QUIET_SECONDS = 60.0


class Lines:
    """A progress counter for a stream that is not a terminal: newline-ended lines, few.

    >>> import io
    >>> out = io.StringIO()
    >>> p = Lines(total=1000, desc="runs", unit="task", file=out)
    >>> for _ in range(1000):
    ...     p.update()
    >>> p.close()
    >>> len(out.getvalue().splitlines())
    10
    """

    def __init__(self, total: int, desc: str | None, unit: str, initial: int = 0,
                 file: TextIO | None = None) -> None:
        self.total, self.desc, self.unit, self.n = total, desc or "progress", unit, initial
        self.file = file
        self.step = max(1, math.ceil(total / 10))
        self.postfix = ""
        self.start = self.last = time.monotonic()
        self.shown = -1                                 # the count of the last line written

    def _write(self) -> None:
        now = time.monotonic()
        tail = f", {self.postfix}" if self.postfix else ""
        print(f"{self.desc}: {self.n}/{self.total} {self.unit}s, {now - self.start:.0f} s"
              f"{tail}", file=self.file or sys.stderr, flush=True)
        self.last, self.shown = now, self.n

    def update(self, n: int = 1) -> None:
        """Count ``n`` more done; write a line at each tenth or after a quiet minute."""
        before, self.n = self.n, self.n + n
        if self.n // self.step > before // self.step and self.n < self.total \
                or time.monotonic() - self.last >= QUIET_SECONDS:
            self._write()

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        """Shown on the next line (as tqdm's postfix); writes nothing by itself."""
        self.postfix = s

    def close(self) -> None:
        """The last line (the final count), once."""
        if self.shown != self.n:
            self._write()


def bar(total: int, desc: str | None, unit: str, *, initial: int = 0, enabled: bool = True,
        file: TextIO | None = None) -> Any:
    """A progress bar over ``total`` steps: tqdm when ``file`` (default stderr) is a terminal,
    else ``Lines``; one that shows nothing when ``enabled`` is False or ``desc`` None."""
    stream = file or sys.stderr
    from tqdm import tqdm

    if not enabled or desc is None:
        return tqdm(total=total, disable=True)
    if not stream.isatty():
        return Lines(total, desc, unit, initial, stream)
    return tqdm(total=total, initial=initial, unit=unit, desc=desc, file=stream,
                dynamic_ncols=True)
