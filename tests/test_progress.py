"""Progress sent to a file or a pipe: a few newline-ended lines, not tqdm's carriage returns."""

from __future__ import annotations

import io

from fpsim_experiments import progress


def test_a_stream_that_is_not_a_terminal_gets_few_lines() -> None:
    out = io.StringIO()                                  # isatty() is False
    bar = progress.bar(10_000, "runs", "task", file=out)
    for i in range(10_000):
        bar.update()
        bar.set_postfix_str(f"running {i % 3}, failed 0")
    bar.close()
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert 2 <= len(lines) <= 11, lines
    assert lines[-1].startswith("runs: 10000/10000 tasks") and "failed 0" in lines[-1]


def test_few_steps_get_a_line_each_and_a_resumed_count_starts_where_it_was() -> None:
    out = io.StringIO()
    bar = progress.bar(4, "sites", "site", initial=1, file=out)
    for _ in range(3):
        bar.update()
    bar.close()
    assert out.getvalue().splitlines() == [
        line for line in out.getvalue().splitlines() if line.startswith("sites: ")]
    assert [line.split(",")[0] for line in out.getvalue().splitlines()] == [
        "sites: 2/4 sites", "sites: 3/4 sites", "sites: 4/4 sites"]


def test_disabled_or_unnamed_writes_nothing() -> None:
    out = io.StringIO()
    for bar in (progress.bar(5, "x", "task", enabled=False, file=out),
                progress.bar(5, None, "site", file=out)):
        bar.update()
        bar.close()
    assert out.getvalue() == ""


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_tqdm() -> None:
    out = _Terminal()
    bar = progress.bar(3, "runs", "task", file=out)
    bar.update(3)
    bar.close()
    assert "\r" in out.getvalue() and "3/3" in out.getvalue()
