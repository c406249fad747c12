"""``fpsim formats`` says what names mean; ``quantize`` says what it resolved, refuses a format
wider than the data, and takes scaling and block formats; ``explain`` shows blocks (issue 29)."""

from __future__ import annotations

import numpy as np
import pytest

import fpsim
from fpsim import cli
from fpsim.convert import decode


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code: int, err: str) -> str:
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


# -- names ------------------------------------------------------------------------------------
def test_formats_shows_families_aliases_the_grammar_and_the_experiments_names(capsys):
    code, out, _ = run(capsys, "formats")
    assert code == 0
    names = {line.split()[0]: line for line in out.split("\n\n")[1].splitlines()[1:]}
    assert set(fpsim.FORMATS) <= set(names)
    assert "OCP FP8" in names["fp8_e4m3fn"] and "e4m3, e4m3fn, float8_e4m3fn" in names["fp8_e4m3fn"]
    assert "IEEE-style" in names["fp8_e4m3"] and "float8_e4m3" in names["fp8_e4m3"]
    assert "fnuz" in names["fp8_e4m3fnuz"] and "OCP MX" in names["fp4_e2m1"]
    rule = [line for line in out.splitlines() if line.startswith("Grammar:")]
    assert len(rule) == 1 and "eXmY" in rule[0] and "IEEE-style" in rule[0]
    assert "e4m3_ieee" in out and "range-vs-precision" in out and "P3109" in out
    assert "mxfp4 (fp4_e2m1 x e8m0 per 32)" in out


def test_formats_p3109_lists_them(capsys):
    code, out, _ = run(capsys, "formats", "--p3109")
    assert code == 0 and "p3109_k8p3se" in out
    assert "P3109" in [ln for ln in out.splitlines() if ln.startswith("p3109_k8p3se ")][-1]


def test_family_of_grammar_formats():
    from fpsim.formats import family

    assert family("e4m3") == "OCP FP8" and family("e4m3_ieee") == "IEEE-style"
    assert family("e3m2fn") == "OCP MX" and family("e5m3fn") == "fn (OCP-style)"
    assert family("e5m3fnuz") == "fnuz" and family("binary8p3") == "P3109"


# -- quantize: the resolved format, and formats wider than the data ---------------------------
@pytest.fixture
def data(tmp_path):
    x = np.random.default_rng(0).standard_normal((4, 48)).astype(np.float32)
    x[1, 3] = 300.0
    np.save(tmp_path / "x.npy", x)
    return x, str(tmp_path / "x.npy"), tmp_path


def test_quantize_says_which_format_it_resolved(capsys, data):
    _, src, tmp = data
    code, out, _ = run(capsys, "quantize", src, str(tmp / "y.npy"), "-f", "E4M3")
    assert code == 0
    assert out.splitlines()[0] == ("format: E4M3 -> fp8_e4m3fn (OCP FP8): 8 bits (4 exponent, "
                                   "3 mantissa), max 448")
    code, out, _ = run(capsys, "quantize", src, str(tmp / "y.npy"), "-f", "e4m3_ieee")
    assert out.splitlines()[0] == ("format: e4m3_ieee (IEEE-style): 8 bits (4 exponent, "
                                   "3 mantissa), max 240")


def test_a_format_wider_than_the_data_is_refused(capsys, data):
    _, src, tmp = data
    dst = tmp / "y.npy"
    code, out, err = run(capsys, "quantize", src, str(dst), "-f", "e4m33")
    line = one_line_error(code, err)
    assert "38 bits" in line and "float32 (32 bits)" in line and "'e4m3'" in line
    assert "--allow-wider" in line and not dst.exists() and out == ""
    code, out, _ = run(capsys, "quantize", src, str(dst), "-f", "e4m33", "--allow-wider")
    assert code == 0 and "e4m33 (IEEE-style): 38 bits" in out and dst.exists()
    code, _, err = run(capsys, "quantize", src, str(dst), "-f", "fp64")
    assert "Did you mean" not in one_line_error(code, err)


# -- quantize: scaling and block formats ------------------------------------------------------
@pytest.mark.parametrize("argv, gran, axis", [
    (["--scaling", "tensor"], "tensor", None),
    (["--scaling", "channel", "--axis", "1"], "channel", 1),
    (["--scaling", "block", "--block-size", "16", "--scale-dtype", "e8m0"], ("block", 16), None),
])
def test_quantize_scaling_writes_scaled_quantize_codes_and_scales(capsys, data, argv, gran, axis):
    x, src, tmp = data
    code, out, _ = run(capsys, "quantize", src, str(tmp / "y.npy"), "-f", "e4m3",
                       "--codes", str(tmp / "c"), *argv)
    assert code == 0 and f"wrote {tmp / 'y.npy'} and {tmp / 'c.npz'}" in out
    want = fpsim.scaled_quantize(x, "e4m3", granularity=gran, axis=axis,
                                 scale_dtype="e8m0" if "e8m0" in argv else "fp32")
    np.testing.assert_array_equal(np.load(tmp / "y.npy").view(np.uint32),
                                  want.values.view(np.uint32))
    rec = np.load(tmp / "c.npz")
    assert str(rec["format"]) == "fp8_e4m3fn" and str(rec["scaling"]) == gran[0] \
        if isinstance(gran, tuple) else str(rec["scaling"]) == gran
    np.testing.assert_array_equal(rec["codes"], want.codes)
    np.testing.assert_array_equal(rec["scales"], want.scales)


@pytest.mark.parametrize("fmt", ["mxfp4", "mxint8", "nvfp4", "mxfp6_e3m2"])
@pytest.mark.parametrize("axis", [-1, 0])
def test_quantize_block_formats_write_codes_and_scales_in_the_documented_layout(
        capsys, data, fmt, axis):
    x, src, tmp = data
    code, out, _ = run(capsys, "quantize", src, str(tmp / "y.npy"), "-f", fmt,
                       "--axis", str(axis), "--codes", str(tmp / "c.npz"))
    assert code == 0 and out.startswith(f"format: {fmt}: ")
    want = fpsim.mx.quantize(x, fmt, axis=axis)
    values = np.load(tmp / "y.npy")
    np.testing.assert_array_equal(values, want.dequantize())
    rec = np.load(tmp / "c.npz")
    np.testing.assert_array_equal(rec["codes"], want.codes)
    np.testing.assert_array_equal(rec["scale_codes"], want.scales)
    # the layout as documented: value = decode(code) * 2**element_exponent * scale [* ts]
    scales = np.repeat(rec["scales"].astype(np.float64), int(rec["block_size"]),
                       axis=int(rec["axis"]))
    scales = np.take(scales, range(x.shape[int(rec["axis"])]), axis=int(rec["axis"]))
    rebuilt = (decode(rec["codes"], str(rec["element_format"])) * 2.0 ** int(
        rec["element_exponent"]) * scales)
    if "tensor_scale" in rec:
        np.testing.assert_allclose(rebuilt * float(rec["tensor_scale"]), values, rtol=2**-23)
    else:
        np.testing.assert_array_equal(rebuilt.astype(np.float32), values)


@pytest.mark.parametrize("argv, words", [
    (["-f", "mxfp4", "--scaling", "tensor"], "block format"),
    (["-f", "e4m3", "--scaling", "block"], "--block-size"),
    (["-f", "e4m3", "--block-size", "8"], "--scaling block"),
    (["-f", "e4m3", "--axis", "0"], "--axis"),
    (["-f", "mxfp4", "--scale-dtype", "e8m0"], "fixes its scale format"),
    (["-f", "e4m3", "--scaling", "tensor", "--saturate"], "always saturates"),
    (["-f", "mxfp4", "--block-size", "0"], "block"),
    (["-f", "e4m3", "--scaling", "channel", "--axis", "5"], "axis"),
])
def test_bad_scaling_options_are_one_line_and_write_nothing(capsys, data, argv, words):
    _, src, tmp = data
    code, _, err = run(capsys, "quantize", src, str(tmp / "y.npy"), *argv)
    assert words in one_line_error(code, err)
    assert not (tmp / "y.npy").exists()


def test_a_failed_codes_write_leaves_both_files_unchanged(capsys, data, monkeypatch):
    _, src, tmp = data
    dst, codes = tmp / "y.npy", tmp / "c.npz"
    np.save(dst, np.arange(3.0))
    codes.write_bytes(b"old")
    before = dst.read_bytes()

    def fail(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", fail)
    code, _, err = run(capsys, "quantize", src, str(dst), "-f", "mxfp4", "--codes", str(codes))
    assert "cannot write" in one_line_error(code, err) and "unchanged" in err
    assert dst.read_bytes() == before and codes.read_bytes() == b"old"
    assert not [p for p in tmp.iterdir() if p.name.endswith(".tmp")]


# -- explain on blocks ------------------------------------------------------------------------
def test_explain_cli_shows_the_scale_bits_and_each_elements_bits(capsys):
    code, out, _ = run(capsys, "explain", "1", "0.3", "-2", "5", "-f", "mxfp4", "--color",
                       "never")
    assert code == 0
    lines = out.splitlines()
    q = fpsim.mx.quantize(np.array([1.0, 0.3, -2.0, 5.0]), "mxfp4")
    assert lines[0].startswith("mxfp4: fp4_e2m1 elements, e8m0 scale per 32")
    assert lines[1] == f"  block scale  {int(q.scales[0]):08b}  = 1"
    for line, c, v in zip(lines[2:], q.codes, q.dequantize()):
        bits = f"{int(c):04b}"
        assert f"{bits[0]} | {bits[1:3]} | {bits[3]}" in line and f" = {v:g}" in line
    assert lines[3] == "    0.3  0 | 00 | 1  = 0.5 x 1 = 0.5  (error +0.2)"


def test_explain_python_on_a_block_and_nvfp4():
    e = fpsim.explain(np.linspace(-1, 7, 20), "nvfp4")
    q = fpsim.mx.quantize(np.linspace(-1, 7, 20), "nvfp4")
    assert [s.code for s in e.scales] == q.scales.tolist() and e.padding == 12
    assert [el.element.code for b in e.elements for el in b] == q.codes.tolist()
    assert [el.value for b in e.elements for el in b] == q.dequantize(np.float32).tolist()
    assert "tensor scale (float32)" in str(e) and "block 1 scale  0 | 1111 |" in str(e)
    with pytest.raises(ValueError, match="one row of blocks"):
        fpsim.explain(np.ones((2, 2)), "mxfp4")


def test_explain_cli_block_with_saturate_is_refused(capsys):
    code, _, err = run(capsys, "explain", "1", "-f", "mxfp4", "--saturate")
    assert "always saturate" in one_line_error(code, err)
