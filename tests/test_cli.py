"""The ``fpsim`` command line: tables, explanations, code listings, file quantization, errors."""

from __future__ import annotations

import math
import subprocess
import sys
import types

import numpy as np
import pytest

import fpsim
from fpsim import cli
from fpsim.summary import summarize


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def rows(out: str) -> dict[str, list[str]]:
    """Rows of the first table (up to the first blank line) keyed by their first column."""
    table = out.split("\n\n")[0]
    return {line.split()[0]: line.split() for line in table.splitlines() if line.strip()}


# -- formats ----------------------------------------------------------------------------------
def test_formats_lists_every_format_with_its_numbers(capsys):
    code, out, _ = run(capsys, "formats")
    assert code == 0
    table = rows(out)
    assert set(fpsim.FORMATS) <= set(table)
    e4m3 = table["fp8_e4m3fn"]
    assert e4m3[1:5] == ["8", "4", "3", "7"] and e4m3[5] == "448" and e4m3[-1] == "fn"
    assert table["fp16"][5] == "65504" and table["fp16"][-2:] == ["inf,", "ieee"]
    for name in ("int8", "int4", "uint8"):
        assert table[name][4] == "-", "integer formats have no exponent bias"


def test_formats_gpu_adds_peak_and_speedup_over_fp32(capsys):
    code, out, _ = run(capsys, "formats", "--gpu", "b100")
    assert code == 0
    table = rows(out)
    assert table["bf16"][-2:] == ["1,750.0", "29.17x"]        # 1750 / 60
    assert table["fp32"][-2:] == ["60.0", "1.00x"]
    assert table["fp4_e2m1"][-2:] == ["7,000.0", "116.67x"]
    assert table["int4"][-2:] == ["-", "-"] and table["e8m0"][-2:] == ["-", "-"]
    assert "bandwidth" in out and "not peak math" in out
    assert "source:" in out and "unverified:" in out


def test_formats_gpu_h100_dense_figures(capsys):
    _, out, _ = run(capsys, "formats", "--gpu", "h100")
    table = rows(out)
    assert table["bf16"][-2] == "989.4" and table["fp8_e4m3fn"][-2] == "1,978.9"
    assert table["fp6_e2m3"][-1] == "-", "Hopper has no FP6 tensor cores"


def test_gpu_data_file_is_complete_and_sourced():
    table = cli.load_gpu_peaks()
    assert set(table["gpus"]) == {"b100", "h100", "h200"}
    kinds = set(table["formats"].values())
    for name, g in table["gpus"].items():
        assert g["sources"] and g["tflops"]["fp32"] > 0, name
        assert set(g["tflops"]) <= kinds | {"fp32"}, name
    assert set(table["formats"]) <= set(fpsim.FORMATS)
    assert table["gpus"]["h200"]["tflops"] == table["gpus"]["h100"]["tflops"]


# -- explain ----------------------------------------------------------------------------------
def test_explain_prints_the_explanation_of_each_format_in_order(capsys):
    code, out, _ = run(capsys, "explain", "0.1", "--format", "bf16", "-f", "e4m3", "-r", "rtz")
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("0.1  bf16 ")
    assert lines[0].endswith(str(fpsim.explain(0.1, "bf16", rounding="rtz")))
    assert lines[1].split()[0] == "fp8_e4m3fn"
    assert lines[1].endswith(str(fpsim.explain(0.1, "e4m3", rounding="rtz")))
    assert "\x1b[" not in out, "no colour when not on a terminal"


def test_explain_accepts_negative_and_hex_values(capsys):
    code, out, _ = run(capsys, "explain", "-1e-3", "-inf", "0x1.8p-3", "-f", "bf16")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].endswith(str(fpsim.explain(-1e-3, "bf16")))
    assert lines[1].endswith("= -inf  (exact)")
    assert "= 0.1875  (exact)" in lines[2]


def test_explain_nan_into_a_format_without_nan(capsys):
    _, out, _ = run(capsys, "explain", "nan", "-f", "e2m1", "-f", "bf16")
    first, second = out.splitlines()
    assert "no NaN code" in first and first.split()[2:7] == ["0", "|", "00", "|", "0"]
    assert second.endswith("= nan")


def test_explain_saturate(capsys):
    _, out, _ = run(capsys, "explain", "1000", "-f", "e4m3", "--saturate")
    assert "= 448  (error -552)" in out


def test_explain_colours_only_on_a_terminal_without_no_color(capsys, monkeypatch):
    _, out, _ = run(capsys, "explain", "1.5", "-f", "e2m1", "--color", "always")
    assert "\x1b[35m0\x1b[0m | \x1b[32m01\x1b[0m | \x1b[36m1\x1b[0m" in out

    class Tty:
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert cli.use_color("auto", Tty())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not cli.use_color("auto", Tty())
    assert cli.use_color("always", Tty()) and not cli.use_color("never", Tty())


# -- values -----------------------------------------------------------------------------------
def test_values_lists_every_code_with_value_and_class(capsys):
    code, out, _ = run(capsys, "values", "e2m1")
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 1 + 16
    values = [float(line.split()[-2]) for line in lines[1:]]
    np.testing.assert_array_equal(values, fpsim.decode(np.arange(16), "e2m1"))
    assert lines[2].split() == ["0x1", "0", "|", "00", "|", "1", "0.5", "subnormal"]
    assert lines[9].split()[-2:] == ["-0", "zero"]


def test_values_marks_nan_and_inf_codes(capsys):
    _, out, _ = run(capsys, "values", "e5m2")
    table = rows(out)
    assert table["0x7C"][-2:] == ["+inf", "inf"] and table["0x7F"][-2:] == ["nan", "nan"]
    _, out, _ = run(capsys, "values", "e4m3fnuz")
    assert rows(out)["0x80"][-2:] == ["nan", "nan"]


def test_values_refuses_wide_formats(capsys):
    code, out, err = run(capsys, "values", "bf16")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "at most 8 bits" in err and "fpsim.values('bf16')" in err


# -- quantize ---------------------------------------------------------------------------------
def test_quantize_writes_the_quantized_array_and_a_summary(capsys, tmp_path):
    x = np.array([0.1, 1000.0, -1e-5, 0.0, np.nan, 3.0, -500.0, 2.0], dtype=np.float32)
    src, dst = tmp_path / "x.npy", tmp_path / "y.npy"
    np.save(src, x)
    code, out, _ = run(capsys, "quantize", str(src), str(dst), "-f", "e4m3", "--saturate")
    assert code == 0
    y = np.load(dst)
    expected = fpsim.quantize(x, "e4m3", saturate=True)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, expected)
    stats = dict(line.split(None, 1) for line in out.splitlines()[1:]
                 if not line.strip().startswith(("max", "non-finite")))
    assert stats["overflow"].split()[0] == "2"                 # 1000 and -500 beyond 448
    assert stats["underflow"].split()[0] == "1"                # -1e-5 flushes to zero
    fin = np.isfinite(x)
    snr = 10 * np.log10(np.sum(x[fin].astype(float) ** 2)
                        / np.sum((expected[fin].astype(float) - x[fin]) ** 2))
    assert stats["SNR"] == f"{snr:.2f} dB"
    assert "non-finite     1 in, 1 out" in out


def test_quantize_bad_input_file_is_one_line(capsys, tmp_path):
    bad = tmp_path / "bad.npy"
    bad.write_text("hello")
    for path in (bad, tmp_path / "missing.npy"):
        code, out, err = run(capsys, "quantize", str(path), str(tmp_path / "o.npy"), "-f", "bf16")
        assert code == 2 and err.count("\n") == 1 and str(path) in err


def test_summarize_counts_and_limits():
    x = np.array([1.0, -300.0, 300.0, 1e-9, 0.0, np.inf])
    q = np.array([1.0, -240.0, np.nan, 0.0, 0.0, np.inf])
    s = summarize(x, q, "e4m3fnuz")
    assert (s.count, s.overflow, s.underflow) == (6, 2, 1)
    assert (s.nonfinite_in, s.nonfinite_out) == (1, 2)
    assert s.max_abs == 60.0 and s.max_rel == 1.0
    assert summarize([1.0, 2.0], [1.0, 2.0], "bf16").snr_db == math.inf
    assert summarize([-1.0], [0.0], "uint8").overflow == 1     # below an unsigned format's 0
    with pytest.raises(ValueError, match="quantized copy"):
        summarize([1.0, 2.0], [1.0], "bf16")


# -- experiment -------------------------------------------------------------------------------
def test_experiment_forwards_arguments(capsys, monkeypatch):
    seen = []
    fake = types.ModuleType(cli.EXPERIMENTS_MODULE)
    fake.main = lambda argv: seen.append(argv) or 3
    monkeypatch.setitem(sys.modules, cli.EXPERIMENTS_MODULE, fake)
    code, _, _ = run(capsys, "experiment", "gpt2", "--steps", "5")
    assert code == 3 and seen == [["gpt2", "--steps", "5"]]


def test_experiment_missing_module_is_one_line(capsys, monkeypatch):
    monkeypatch.setattr(cli, "EXPERIMENTS_MODULE", "fpsim_experiments.no_such_module_here")
    code, _, err = run(capsys, "experiment", "x")
    assert code == 2 and err.count("\n") == 1 and "not available" in err


def test_experiment_errors_are_one_line(capsys, tmp_path):
    code, _, err = run(capsys, "experiment", "all", "--quick", "--model", str(tmp_path / "none"))
    assert code == 2 and err.count("\n") == 1 and "not found" in err and "Traceback" not in err
    try:
        code = cli.main(["experiment", "no-such-experiment"])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "invalid choice" in err


# -- tensor-cores ---------------------------------------------------------------------------
def test_tensor_cores_lists_every_preset_with_its_parameters(capsys):
    code, out, _ = run(capsys, "tensor-cores")
    table = rows(out)
    assert code == 0 and set(fpsim.arith.TENSOR_CORES) <= set(table)
    assert table["hopper_fp8"][1:5] == ["32", "13", "e8m13", "rtz"]
    assert table["ampere_fp16_f16"][1:7] == ["8", "24", "fp16", "rne", "fused", "nv_ptx.py"]
    assert table["hopper_fp64"][1:7] == ["1", "52", "fp64", "rne", "fma", "nv_ptx.py"]
    assert table["cdna3_fp32"][1:7] == ["1", "23", "fp32", "rne", "fma", "amd.py"]
    assert table["cdna2_bf16_k2"][1:7] == ["2", "23", "fp32", "rne", "fma_tree", "amd.py"]
    assert table["cdna3_fp16_k4"][1:3] == ["4", "24"]
    code, out, _ = run(capsys, "tensor-cores", "blackwell_tf32")
    assert code == 0 and "tcgen05.mma kind::tf32" in out and "MMA-Sim" in out
    code, out, _ = run(capsys, "tensor-cores", "cdna2_fp64")
    assert code == 0 and "v_mfma_f64_16x16x4f64" in out and "amd.py" in out


# -- errors and help --------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["explain", "abc"], ["explain", "1", "-r", "nearest"], ["explain", "1", "-f", "fp7"],
    ["formats", "--gpu", "a100"], ["quantize", "a.npy"], ["frobnicate"], [],
    ["values", "e4m3", "--color", "pink"], ["tensor-cores", "hopper_fp7"],
])
def test_bad_arguments_exit_2_with_one_line(capsys, argv):
    try:
        code = cli.main(argv)
    except SystemExit as exc:           # argparse's own errors exit; ours return the status
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("fpsim") and "Traceback" not in err


@pytest.mark.parametrize("command", ["formats", "explain", "values", "quantize", "tensor-cores",
                                     "experiment"])
def test_every_command_has_help(capsys, command):
    with pytest.raises(SystemExit) as exc:
        cli.main([command, "--help"])
    assert exc.value.code == 0
    assert f"usage: fpsim {command}" in capsys.readouterr().out


def test_console_entry_point_runs_without_traceback():
    proc = subprocess.run([sys.executable, "-m", "fpsim.cli", "explain", "1", "-f", "fp7"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "unknown format 'fp7'" in proc.stderr


def test_a_closed_pipe_ends_quietly():
    """`fpsim explain ... | head -1`: the reader leaves early; no error, status 0.  (The output,
    about 300 kB, is larger than a pipe's buffer, so the writer does meet the closed pipe.)"""
    values = [str(v) for v in range(3000)]
    proc = subprocess.Popen([sys.executable, "-m", "fpsim.cli", "explain", *values, "-f", "bf16"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()
    assert proc.wait(timeout=60) == 0
    with proc.stderr:
        assert proc.stderr.read() == b""


@pytest.mark.parametrize("argv", [["experiment", "--help"], ["experiment", "-h"], ["experiment"]])
def test_experiment_help_lists_every_experiment(argv, capsys):
    from fpsim.cli import main

    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    out = capsys.readouterr().out
    for name in ("range-vs-precision", "fp16-vs-bf16", "practice", "training", "all", "--quick"):
        assert name in out


def test_experiment_tokens_all_takes_every_window():
    from fpsim_experiments import cli, context
    from fpsim_experiments.gpt2.data import heldout_bytes, windows

    assert cli.parse_args(["fp8", "--tokens", "all"]).tokens == context.ALL_TOKENS
    assert cli.parse_args(["fp8", "--tokens", "4096"]).tokens == 4096
    data = heldout_bytes()
    assert len(windows(data, 256, context.ALL_TOKENS // 256)) == (data.numel() - 1) // 256
    assert context.FULL.tokens == context.ALL_TOKENS      # every held-out window by default
    assert context.SUBSET.tokens < (data.numel() - 1) // 256 * 256
    with pytest.raises(SystemExit):
        cli.parse_args(["fp8", "--tokens", "most"])
