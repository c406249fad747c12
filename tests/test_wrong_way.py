"""Errors and names that sent a new user the wrong way (issue 43): block formats by their common
names, short unknown-name errors, command-line fixes on the command line, the folder that does
not exist, overflow and underflow in explain, the IEEE-style E4M3's look-alike names, and the
values of block scales."""

from __future__ import annotations

import math
import warnings

import ml_dtypes
import numpy as np
import pytest
from test_cli_names_blocks import one_line_error, run

import fpsim
from fpsim import formats, mx

X = np.linspace(-3.0, 5.0, 70, dtype=np.float32).reshape(2, 35)


# -- block formats by their common names ------------------------------------------------------
@pytest.mark.parametrize("name", ["mxfp8", " MXFP8 ", "MxFp8"])
def test_mxfp8_is_mxfp8_e4m3(name):
    """torchao's and Transformer Engine's MXFP8: E4M3 elements."""
    a, b = mx.quantize(X, name), mx.quantize(X, "mxfp8_e4m3")
    assert a.fmt is b.fmt and np.array_equal(a.scales, b.scales)
    assert np.array_equal(a.codes, b.codes)


def test_mxfp6_names_both_formats_and_never_a_4_bit_one():
    with pytest.raises(ValueError, match="mxfp6_e2m3.*mxfp6_e3m2") as info:
        mx.quantize(X, "mxfp6")
    assert "mxfp4" not in str(info.value) and "max 7.5" in str(info.value)


def test_unknown_format_error_names_the_closest_few_and_where_the_rest_are():
    with pytest.raises(ValueError) as info:
        fpsim.get_format("e4m33x")
    msg = str(info.value)
    assert "Did you mean 'e4m3'?" in msg and "`fpsim formats`" in msg and len(msg) < 400
    assert "float8_e5m2fnuz" not in msg and "uint8" not in msg        # not the ~60 names
    for name, hint in (("fp8", "e4m3"), ("float8", "e4m3"), ("fp6", "e2m3")):
        with pytest.raises(ValueError) as info:                       # a hint stands alone
            fpsim.get_format(name)
        msg = str(info.value)
        assert f"Did you mean {hint!r}?" in msg and "Also close" not in msg and "fp4" not in msg


# -- the command line gives command-line fixes ------------------------------------------------
@pytest.fixture
def files(tmp_path):
    src = tmp_path / "x.npy"
    np.save(src, X)
    nan = tmp_path / "nan.npy"
    np.save(nan, np.float32([1.0, np.nan, -2.0]))
    return tmp_path, str(src), str(nan)


def test_cli_formats_says_what_mxfp8_and_mxfp6_mean(capsys):
    _, out, _ = run(capsys, "formats")
    assert "mxfp8 is mxfp8_e4m3; mxfp6 is mxfp6_e2m3 or mxfp6_e3m2 (name one)" in out


def test_cli_quantize_takes_mxfp8(capsys, files):
    tmp, src, _ = files
    code, out, err = run(capsys, "quantize", src, str(tmp / "y.npy"), "-f", "mxfp8", "--codes",
                         str(tmp / "c.npz"))
    assert code == 0, err
    assert "mxfp8 -> mxfp8_e4m3" in out
    assert np.array_equal(np.load(tmp / "c.npz")["codes"], mx.quantize(X, "mxfp8_e4m3").codes)


@pytest.mark.parametrize("name, elem, scale", [("nvfp4", "fp4_e2m1", "fp8_e4m3fn"),
                                               ("mxfp8", "fp8_e4m3fn", "e8m0")])
def test_cli_values_of_a_block_format_names_cli_commands(capsys, name, elem, scale):
    err = one_line_error(*run(capsys, "values", name)[::2])
    assert f"fpsim values {elem}" in err and f"fpsim values {scale}" in err
    assert "fpsim explain VALUE... -f" in err and "fpsim.mx" not in err


@pytest.mark.parametrize("argv", [["explain", "1", "-f", "mxfp9"], ["values", "mxint4"]])
def test_cli_unknown_block_names_are_unknown_block_formats(capsys, argv):
    err = one_line_error(*run(capsys, *argv)[::2])
    assert "unknown block format" in err and "fpsim.mx" not in err


def test_cli_nan_into_codes_names_a_flag_and_the_flag_works(capsys, files):
    tmp, _, nan = files
    out, codes = str(tmp / "y.npy"), str(tmp / "c.npz")
    err = one_line_error(*run(capsys, "quantize", nan, out, "-f", "e2m1", "--codes", codes)[::2])
    assert "--nan-to-zero" in err and "on_nan" not in err
    assert not (tmp / "y.npy").exists() and not (tmp / "c.npz").exists()
    code, _, _ = run(capsys, "quantize", nan, out, "-f", "e2m1", "--codes", codes, "--nan-to-zero")
    assert code == 0 and np.load(codes)["codes"].tolist() == [2, 0, 12]   # 1, NaN -> 0, -2
    assert np.isnan(np.load(out)[1])
    err = one_line_error(*run(capsys, "quantize", nan, out, "-f", "e2m1", "--nan-to-zero")[::2])
    assert "--nan-to-zero applies to --codes" in err


def test_cli_writing_into_a_missing_folder_names_the_folder(capsys, files):
    tmp, src, _ = files
    target = tmp / "missing" / "dir" / "y.npy"
    err = one_line_error(*run(capsys, "quantize", src, str(target), "-f", "e4m3")[::2])
    assert f"cannot write {target}: the folder {target.parent} does not exist" in err
    assert ".tmp" not in err
    err = one_line_error(*run(capsys, "quantize", src, src + "/y.npy", "-f", "e4m3")[::2])
    assert f"{src} is not a folder" in err


# -- explain: overflow, underflow, several numbers --------------------------------------------
def test_explain_says_overflow_with_the_max_and_the_fix():
    e = fpsim.explain(1000, "e4m3")
    assert e.overflow and not e.underflow
    assert str(e).endswith("= nan  (overflow: the largest finite value is 448; saturate=True "
                           "gives 448)")
    assert "saturate=True gives -65504" in str(fpsim.explain(-1e6, "fp16"))
    assert fpsim.explain(448, "e4m3").overflow is False
    assert not fpsim.explain(math.inf, "fp16").overflow                 # inf in: not an overflow


def test_explain_flags_underflow_to_zero():
    e = fpsim.explain(1e-9, "e4m3")
    assert e.underflow and "underflow to 0, the smallest non-zero value is 0.001953125" in str(e)
    assert not fpsim.explain(0.0, "e4m3").underflow
    assert not fpsim.explain(0.3, "int8").underflow                     # integers round to 0
    assert not fpsim.explain(math.nan, "e2m1").underflow                # NaN in: its own note
    assert fpsim.explain(-1e-9, "e4m3", rounding="rdown").value == -0.001953125


def test_cli_explain_spells_the_fixes_as_flags(capsys):
    _, out, _ = run(capsys, "explain", "1000", "nan", "-f", "e4m3", "-f", "e2m1")
    assert "--saturate gives 448" in out and "saturate=True" not in out
    assert "--nan-to-zero" in out and "on_nan" not in out


def test_python_explain_takes_several_numbers_as_the_cli_does():
    xs = [1000.0, 0.1, -1e-9, 3.0]
    many = fpsim.explain(np.array(xs), "e4m3")
    assert isinstance(many, fpsim.explain.__globals__["Explanations"]) and len(many) == 4
    assert [e.code for e in many] == [fpsim.explain(x, "e4m3").code for x in xs]
    lines = str(many).splitlines()
    assert [line.split()[0] for line in lines] == ["1000", "0.1", "-1e-09", "3"]
    assert lines[1].endswith(str(fpsim.explain(0.1, "e4m3")))
    assert isinstance(fpsim.explain([0.1], "e4m3"), fpsim.Explanation)   # one number: as before
    with pytest.raises(ValueError, match="1-D"):
        fpsim.explain(np.ones((2, 3)), "e4m3")
    with pytest.raises(ValueError, match="one number"):
        fpsim.explain([], "e4m3")


# -- the IEEE-style E4M3's look-alike names ---------------------------------------------------
@pytest.fixture
def fresh_notices(monkeypatch):
    monkeypatch.setattr(formats, "_WARNED", set())


@pytest.mark.parametrize("name", ["fp8_e4m3", "FLOAT8-E4M3"])
def test_look_alike_names_warn_once_and_still_work(fresh_notices, name):
    with pytest.warns(formats.NameWarning, match="IEEE-style E4M3 \\(max 240.*'e4m3' or "
                                                 "'fp8_e4m3fn'.*'e4m3_ieee'") as seen:
        assert fpsim.quantize(300.0, name) == math.inf                  # read deep inside fpsim
    assert seen[0].filename == __file__                                 # the user's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fpsim.quantize(300.0, name, saturate=True) == 240.0     # once per name
        for quiet in ("e4m3_ieee", "e4m3", "fp8_e4m3fn", "float8_e4m3fn"):
            fpsim.get_format(quiet)


def test_a_dtype_named_float8_e4m3_is_not_a_look_alike(fresh_notices):
    """ml_dtypes' float8_e4m3 arrays are the IEEE-style E4M3 by definition: no notice."""
    a = np.float32([[1.0, 2.0]]).astype(ml_dtypes.float8_e4m3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fpsim.matmul(a, np.ones((2, 1), np.float32), backend="numpy")[0, 0] == 3.0


@pytest.mark.filterwarnings("default::fpsim.formats.NameWarning")   # pyproject ignores it
def test_cli_shows_the_notice_as_one_line(capsys, fresh_notices):
    code, out, err = run(capsys, "explain", "300", "-f", "fp8_e4m3")
    assert code == 0 and "= +inf" in out
    assert err.startswith("fpsim: note: 'fp8_e4m3' is the IEEE-style E4M3")
    assert len(err.strip().splitlines()) == 1


# -- blocks: scale values, NVFP4 in explain ---------------------------------------------------
def _every_scale_code(name: str) -> mx.BlockArray:
    spec = mx.get_block_format(name)
    scales = np.arange(256, dtype=np.uint8).reshape(256, 1)
    codes = np.zeros((256, spec.block_size), np.uint8)
    return mx.BlockArray(scales, codes, spec, 1, spec.block_size, codes.shape,
                         None if spec.is_mx else 0.375)          # not in the block scales


def test_scale_values_of_every_e8m0_code_bit_exactly():
    b = _every_scale_code("mxfp4")
    want = np.float64([math.ldexp(1.0, c - 127) if c != 255 else math.nan for c in range(256)])
    for dtype in (np.float32, np.float64):
        got = b.scale_values(dtype)
        assert got.dtype == dtype and got.shape == (256, 1)
        assert np.array_equal(got.reshape(-1).view(f"u{got.itemsize}"),
                              want.astype(dtype).view(f"u{got.itemsize}"))


def test_scale_values_of_every_e4m3_code_bit_exactly():
    b = _every_scale_code("nvfp4")
    want = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    got = b.scale_values().reshape(-1)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan) and nan.sum() == 2
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def test_scale_values_of_torch_blocks_match_numpy():
    torch = pytest.importorskip("torch")
    for name in ("mxfp8", "nvfp4"):
        a, t = mx.quantize(X, name), mx.quantize(torch.from_numpy(X), name)
        assert np.array_equal(t.scale_values().numpy().view(np.uint32),
                              a.scale_values().view(np.uint32))


def test_explain_nvfp4_shows_short_float32_values():
    e = fpsim.explain([0.1, 0.3, 1000, 2.7], "nvfp4")
    text = str(e)
    q = mx.quantize(np.float32([0.1, 0.3, 1000, 2.7]), "nvfp4")
    assert repr(q.tensor_scale) not in text                        # 0.3720238208770752
    assert f"  tensor scale (float32)  {np.float32(q.tensor_scale)!s}" in text.splitlines()
    shown = [line.rsplit(" = ", 1)[1].split()[0] for line in text.splitlines()[3:]]
    assert [float(np.float32(s)) for s in shown] == q.dequantize().tolist()
    assert all(len(s) <= 10 for s in shown)


def test_explain_shows_float32_inputs_by_their_float32_decimal():
    w = np.float32([0.1, 3.7])
    for fmt in ("nvfp4", "mxfp4", "bf16"):
        text = str(fpsim.explain(w, fmt))
        assert "0.10000000149011612" not in text and "0.1  " in text, text
    assert "0.1  " in str(fpsim.explain([0.1, 3.7], "bf16"))          # float64 0.1 is "0.1"
    assert "0.10000000149011612  " in str(fpsim.explain([float(w[0]), 1.0], "bf16"))


def test_a_recipe_takes_the_common_block_names() -> None:
    """Recipe("mxfp8") is MXFP8 with E4M3 elements under its only scaling, bit for bit."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    layer, x = torch.nn.Linear(64, 8), torch.randn(4, 64)
    outs = []
    for name in ("mxfp8", "mxfp8_e4m3"):
        with torch.no_grad(), fpsim.emulate(fpsim.Recipe(name)):
            outs.append(layer(x))
    assert fpsim.Recipe("mxfp8").scaling == "block"
    assert torch.equal(outs[0].view(torch.int32), outs[1].view(torch.int32))
    with pytest.raises(ValueError, match="mxfp6_e2m3"):
        fpsim.Recipe("mxfp6")


def test_a_block_format_given_as_a_preset_lists_the_presets() -> None:
    from fpsim.emulation import presets

    with pytest.raises(ValueError, match=r"not a training preset; the presets are te-mxfp8, "):
        presets.rules("mxfp8")
    with pytest.raises(ValueError, match=r"Recipe\('mxfp4'\)"):
        presets.get_preset("mxfp4")
    assert presets.get_preset("nvfp4").name == "nvfp4"      # a preset of that name stays one
