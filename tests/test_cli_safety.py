"""``fpsim quantize IN OUT`` never loses a file: real failing writes, Ctrl-C, OUT == IN.

The failing write is real: the CLI runs in a child process whose file-size limit
(RLIMIT_FSIZE, with SIGXFSZ ignored so that write() fails with EFBIG) is smaller than OUT.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fpsim
from fpsim import cli

resource = pytest.importorskip("resource")
ROOT = Path(__file__).resolve().parent.parent


def limited(max_bytes: int):
    def setup() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))
    return setup


def fpsim_cli(*argv: str, preexec=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "fpsim.cli", *argv], capture_output=True,
                          text=True, env=env, preexec_fn=preexec, timeout=300)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def one_line_error(proc: subprocess.CompletedProcess, code: int) -> str:
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.fixture
def files(tmp_path):
    src = tmp_path / "in.npy"
    np.save(src, np.random.default_rng(0).standard_normal(1 << 18))     # 2 MiB of float64
    dst = tmp_path / "out.npy"
    np.save(dst, np.arange(10.0))
    return src, dst


def test_failed_write_keeps_the_old_output(files):
    src, dst = files
    before = dst.read_bytes()
    proc = fpsim_cli("quantize", str(src), str(dst), "-f", "bf16", preexec=limited(1 << 20))
    line = one_line_error(proc, 2)
    assert f"cannot write {dst}" in line and "unchanged" in line
    assert dst.read_bytes() == before
    assert leftovers(dst.parent) == []


def test_failed_write_onto_the_input_keeps_the_input(files):
    src, _ = files
    before = src.read_bytes()
    proc = fpsim_cli("quantize", str(src), str(src), "-f", "bf16", preexec=limited(1 << 20))
    one_line_error(proc, 2)
    assert src.read_bytes() == before
    assert leftovers(src.parent) == []


def test_output_onto_the_input_succeeds(files):
    src, _ = files
    x = np.load(src)
    proc = fpsim_cli("quantize", str(src), str(src), "-f", "bf16")
    assert proc.returncode == 0, proc.stderr
    assert np.array_equal(np.load(src), fpsim.quantize(x, "bf16"))
    assert leftovers(src.parent) == []


def test_output_keeps_permissions(files, tmp_path):
    src, dst = files
    os.chmod(dst, 0o640)
    assert fpsim_cli("quantize", str(src), str(dst), "-f", "bf16").returncode == 0
    assert os.stat(dst).st_mode & 0o777 == 0o640


def test_output_directory_is_refused(files, tmp_path, capsys):
    src, _ = files
    folder = tmp_path / "dir"
    folder.mkdir()
    code = cli.main(["quantize", str(src), str(folder), "-f", "bf16"])
    err = capsys.readouterr().err
    assert code == 2 and f"{folder} is a directory" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "in.npy", "out.npy"]
    (tmp_path / "x.npy").mkdir()                       # np.save("x") would write x.npy
    assert cli.main(["quantize", str(src), str(tmp_path / "x"), "-f", "bf16"]) == 2
    assert "x.npy is a directory" in capsys.readouterr().err


def test_the_reported_path_is_the_written_file(files, tmp_path, capsys):
    src, _ = files
    code = cli.main(["quantize", str(src), str(tmp_path / "q"), "-f", "bf16"])
    out = capsys.readouterr().out
    assert code == 0 and f"wrote {tmp_path / 'q.npy'}" in out
    assert (tmp_path / "q.npy").is_file() and not (tmp_path / "q").exists()


#: Where a real SIGINT is raised inside the child process.  ``signal.raise_signal`` delivers it
#: to the calling (main) thread at once, so Python's handler raises KeyboardInterrupt on return:
#: the point of interruption is fixed, not a race with a timer (issue #33: a 0.3 s timer lost the
#: race at load 2.5 and the run finished with exit 0).
INTERRUPTS = {
    # half-way through writing the temporary file beside OUT
    "write": ("real_save = np.save\n"
              "def save(fh, arr, **kw):\n"
              "    fh.write(b'partial bytes' * 4096)\n"
              "    fh.flush()\n"
              "    signal.raise_signal(signal.SIGINT)\n"
              "    real_save(fh, arr, **kw)\n"
              "np.save = save\n"),
    # inside the stochastic quantize, on a piece run in the calling thread
    "compute": ("import fpsim.convert\n"
                "real_quantize = fpsim.convert.quantize\n"
                "def quantize(*a, **kw):\n"
                "    signal.raise_signal(signal.SIGINT)\n"
                "    return real_quantize(*a, **kw)\n"
                "fpsim.convert.quantize = quantize\n"),
}


@pytest.mark.parametrize("where", sorted(INTERRUPTS))
def test_ctrl_c_is_one_line_and_exit_130(tmp_path, where):
    """A real SIGINT at a fixed point of a stochastic quantize (during the work, or after part of
    the temporary file is written): exit 130, one line, no temporary file, OUT untouched."""
    src, dst = tmp_path / "big.npy", tmp_path / "out.npy"
    np.save(src, np.random.default_rng(1).standard_normal(1 << 20).astype(np.float32))
    np.save(dst, np.arange(3.0))
    before = dst.read_bytes()
    # Python's own SIGINT handler, as in a terminal: a parent started in the background by a
    # shell without job control (nohup ... &) passes SIGINT on ignored, and Python keeps it so
    script = ("import signal, sys\nimport numpy as np\nfrom fpsim import cli\n"
              "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
              + INTERRUPTS[where] +
              f"sys.exit(cli.main(['quantize', {str(src)!r}, {str(dst)!r}, '-f', 'e4m3', "
              "'-r', 'stochastic', '--seed', '1']))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=300)
    assert one_line_error(proc, 130) == "fpsim: interrupted"
    assert leftovers(tmp_path) == []
    assert dst.read_bytes() == before


def test_keyboard_interrupt_in_process(capsys, monkeypatch, files):
    src, dst = files
    before = dst.read_bytes()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(np, "save", interrupted)
    assert cli.main(["quantize", str(src), str(dst), "-f", "bf16"]) == 130
    assert capsys.readouterr().err == "fpsim: interrupted\n"
    assert dst.read_bytes() == before and leftovers(dst.parent) == []
