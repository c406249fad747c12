"""IEEE P3109 formats: every code decoded, every mode and saturation mode quantized, against the
draft's own definitions (``reference.p3109_*``, written from K and P alone), the Triton twin,
and gfloat (optional) where gfloat follows the draft."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

import fpsim
from fpsim.formats import P3109_FORMATS
from reference import P3109_MODES, P3109_SATURATION, p3109_decode, p3109_project

EIGHT_BIT = [n for n, f in P3109_FORMATS.items() if f.bits == 8]
SMALL = [n for n, f in P3109_FORMATS.items() if f.bits < 8]


def _kp(fmt: fpsim.Format) -> tuple[int, int, bool, bool]:
    return fmt.bits, fmt.mbits + 1, fmt.signed, fmt.inf


def _same_value(got: float, want: Fraction | str) -> bool:
    if want == "nan":
        return got != got
    if isinstance(want, str):
        return got == float(want)
    return got == got and Fraction(got) == want and not (got == 0 and math.copysign(1, got) < 0)


def dense_inputs(fmt: fpsim.Format, nudged: bool = True) -> np.ndarray:
    """Every value of ``fmt`` and its negation, every midpoint between neighbours (and the floats
    just beside it), beyond max, below the smallest subnormal, +-0, +-inf and NaN."""
    v = fpsim.decode(np.arange(fmt.num_codes), fmt)
    v = np.unique(v[np.isfinite(v)])
    top = v[-1] - v[-2]
    v = np.concatenate([v, [fmt.max + top / 4, fmt.max + top / 2, fmt.max + top, 2 * fmt.max]])
    v = np.unique(np.concatenate([v, -v]))
    mids = (v[1:] + v[:-1]) / 2
    tiny = fmt.min_subnormal * np.array([0.25, 0.5, 0.75, 1.5])
    parts = [v, mids, tiny, -tiny, [0.0, -0.0, np.inf, -np.inf, np.nan, 1e300, -1e300, 1e-300]]
    if nudged:
        parts += [np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf)]
    return np.concatenate(parts)


# --------------------------------------------------------------------------------------------
# The format model
# --------------------------------------------------------------------------------------------
def test_names_aliases_and_layout():
    f = fpsim.get_format("binary8p3")
    assert f is not None and f.name == "p3109_k8p3se"
    assert fpsim.get_format("p3109_k8p3") == f == fpsim.get_format("Binary8p3se")
    assert (f.ebits, f.mbits, f.bias, f.max, f.inf_code, f.nan_code) == (5, 2, 16, 49152.0,
                                                                         0x7F, 0x80)
    u = fpsim.get_format("binary8p4ue")
    assert (u.ebits, u.mbits, u.bias, u.inf_code, u.nan_code, u.max_code) == (5, 3, 16, 0xFE,
                                                                              0xFF, 0xFD)
    assert fpsim.get_format("p3109_k8p8uf").max == 1.984375      # unsigned P = K: 1 exponent bit
    # P=4 finite signed has fp8_e4m3fnuz's values (only the P=1 rounding rule tells them apart)
    assert np.array_equal(fpsim.values("p3109_k8p4sf"), fpsim.values("fp8_e4m3fnuz"))
    assert len(P3109_FORMATS) == 120 and len(EIGHT_BIT) == 30


@pytest.mark.parametrize("name, why", [("p3109_k8p8se", "1 <= p <= k-1"),
                                       ("binary2p1", "k >= 3"), ("p3109_k8p3sx", "Known names")])
def test_bad_names_say_what_is_wrong(name, why):
    with pytest.raises(ValueError, match=why):
        fpsim.get_format(name)


def test_saturate_takes_the_three_draft_modes():
    x = [1e9, -1e9, np.inf, -np.inf]
    enc = {s: list(fpsim.encode(x, "binary8p3", saturate=s)) for s in (False, True, "finite")}
    assert enc == {False: [0x7F, 0xFF, 0x7F, 0xFF], True: [0x7E, 0xFE, 0x7F, 0xFF],
                   "finite": [0x7E, 0xFE, 0x7E, 0xFE]}
    assert list(fpsim.quantize([np.inf, -np.inf], "fp16", saturate="finite")) == [65504, -65504]
    with pytest.raises(ValueError, match="saturate='fin'"):
        fpsim.quantize(1.0, "fp16", saturate="fin")


# --------------------------------------------------------------------------------------------
# Against the draft's definitions
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(P3109_FORMATS))
def test_every_code_decodes_as_the_draft_says(name):
    fmt = P3109_FORMATS[name]
    got = fpsim.decode(np.arange(fmt.num_codes), fmt)
    for code, g in enumerate(got):
        want = p3109_decode(code, *_kp(fmt))
        assert _same_value(float(g), want), (name, hex(code), g, want)


def _check_against_draft(fmt: fpsim.Format, x: np.ndarray, **kw) -> None:
    """encode and quantize in every mode and saturation mode vs the draft."""
    for mode in P3109_MODES:
        for sat, saturate in P3109_SATURATION.items():
            codes = fpsim.encode(x, fmt, rounding=mode, saturate=saturate, **kw)
            values = fpsim.quantize(x, fmt, rounding=mode, saturate=saturate, **kw)
            if not isinstance(codes, np.ndarray):
                codes, values = codes.numpy(), values.numpy()
            want = [p3109_project(float(xi), *_kp(fmt), mode, sat) for xi in x]
            bad = np.nonzero(codes.astype(np.int64) != want)[0]
            assert bad.size == 0, (fmt.name, mode, sat, x[bad[:4]], codes[bad[:4]],
                                   np.array(want)[bad[:4]])
            back = fpsim.decode(codes, fmt, dtype=values.dtype)
            assert np.array_equal(back.view(np.uint8), values.view(np.uint8)), (mode, sat)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", EIGHT_BIT)
def test_8bit_every_mode_and_saturation_against_the_draft(name, dtype):
    fmt = P3109_FORMATS[name]
    with np.errstate(over="ignore"):
        x = dense_inputs(fmt, nudged=dtype is np.float64).astype(dtype)
    _check_against_draft(fmt, x)


@pytest.mark.parametrize("k", range(3, 8))
def test_narrow_every_mode_and_saturation_against_the_draft(k):
    """Formats of 3 to 7 bits, through torch ops on a CPU tensor: round_bits itself, no table."""
    torch = pytest.importorskip("torch")
    for name in SMALL:
        fmt = P3109_FORMATS[name]
        if fmt.bits == k:
            x = dense_inputs(fmt, nudged=False)
            _check_against_draft(fmt, torch.from_numpy(x), backend="torch")


@pytest.mark.parametrize("name", ["p3109_k8p1se", "p3109_k8p3ue", "p3109_k5p2sf"])
def test_stochastic_lands_on_a_neighbour(name):
    fmt = P3109_FORMATS[name]
    x = dense_inputs(fmt, nudged=False)
    x = x[~np.isnan(x)]
    got = fpsim.encode(np.repeat(x, 8), fmt, rounding="stochastic", seed=3).reshape(-1, 8)
    down = fpsim.encode(x, fmt, rounding="rdown")[:, None]
    up = fpsim.encode(x, fmt, rounding="rup")[:, None]
    assert np.all((got == down) | (got == up))
    assert np.any(got != down) and np.any(got != up)


def test_p1_ties_go_to_the_even_code_unlike_e8m0():
    """P=1: no fraction bits, so the draft's "even" is the code's (the exponent's) last bit;
    E8M0 (as ml_dtypes) sends every tie up."""
    x = [1.5, 3.0, 6.0, 12.0]
    assert list(fpsim.quantize(x, "p3109_k8p1se")) == [1.0, 4.0, 4.0, 16.0]
    assert list(fpsim.quantize(x, "e8m0")) == [2.0, 4.0, 8.0, 16.0]
    assert list(fpsim.quantize([1.25, 3.0, 5.0], "p3109_k8p1se", rounding="rto")) == [2, 2, 8]


def test_unsigned_negatives_overflow_below_zero():
    x = [-0.0, -1e-30, -1.0, -np.inf]
    assert list(fpsim.encode(x, "p3109_k8p3ue")) == [0, 0, 0xFF, 0xFF]
    assert list(fpsim.encode(x, "p3109_k8p3ue", rounding="rtz")) == [0, 0, 0, 0xFF]
    assert list(fpsim.encode(x, "p3109_k8p3ue", saturate=True)) == [0, 0, 0, 0]
    assert list(fpsim.encode(x, "e8m0")) == [0xFF] * 4       # E8M0 has no zero: NaN as before


# --------------------------------------------------------------------------------------------
# The Triton twin (interpreter on CPU, or the GPU)
# --------------------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")
@pytest.mark.parametrize("name", ["p3109_k8p1se", "p3109_k8p2ue", "p3109_k8p3se", "p3109_k8p4sf",
                                  "p3109_k8p3ue", "p3109_k8p5uf", "p3109_k8p8uf", "p3109_k3p1sf",
                                  "p3109_k6p2ue"])
def test_triton_kernels_match(name):
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    import fpsim_kernels as kernels
    from test_kernels import _probe, _ref_codes, _same, _same_codes

    # every P3109 format fits float32 lanes except p3109_k8p1u*: 2^-127 (as E8M0), float64 only
    assert [n for n in P3109_FORMATS if not kernels.supports(n)] == ["p3109_k8p1ue",
                                                                     "p3109_k8p1uf"]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = _probe(name, n_random=300)
    xt = torch.from_numpy(x).to(device)
    for mode in P3109_MODES:
        for saturate in P3109_SATURATION.values():
            kw = dict(rounding=mode, saturate=saturate)
            _same(kernels.quantize(xt, name, **kw), fpsim.quantize(x, name, **kw), f"{kw}")
            _same_codes(kernels.encode(xt, name, on_nan="zero", **kw), _ref_codes(x, name, **kw),
                        f"encode {kw}")
    codes = np.arange(P3109_FORMATS[name].num_codes)
    tcodes = torch.from_numpy(codes).to(device).to(torch.uint8)
    _same(kernels.decode(tcodes, name, packed=False), fpsim.decode(codes, name, dtype=np.float32),
          "decode")


# --------------------------------------------------------------------------------------------
# Tools
# --------------------------------------------------------------------------------------------
def test_explain_and_values_show_the_specials(capsys):
    assert fpsim.explain(1e9, "binary8p3").kind == "inf"
    assert fpsim.explain(1e9, "binary8p3", saturate="finite").value == 49152.0
    from fpsim.cli import main

    assert main(["values", "binary8p3"]) == 0
    lines = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines()[1:]}
    assert lines["0x7F"].split()[-2:] == ["+inf", "inf"]
    assert lines["0x80"].split()[-2:] == ["nan", "nan"]
    assert lines["0xFF"].split()[-2:] == ["-inf", "inf"]
    assert lines["0x7E"].split()[-2:] == ["49152", "normal"]
    assert main(["explain", "inf", "-f", "binary8p3", "--saturate-finite", "--color", "never"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("= 49152")
    assert main(["explain", "inf", "-f", "binary8p3", "--saturate", "--color", "never"]) == 0
    assert "+inf" in capsys.readouterr().out


# --------------------------------------------------------------------------------------------
# gfloat (optional): where it follows the draft
# --------------------------------------------------------------------------------------------
def _gfloat_format(fmt: fpsim.Format):
    gf = pytest.importorskip("gfloat")
    from gfloat.formats import format_info_p3109

    fi = format_info_p3109(fmt.bits, fmt.mbits + 1,
                           gf.Signedness.Signed if fmt.signed else gf.Signedness.Unsigned,
                           gf.Domain.Extended if fmt.inf else gf.Domain.Finite)
    assert fi.name == fmt.name
    return gf, fi


@pytest.mark.parametrize("name", EIGHT_BIT + ["p3109_k5p1se", "p3109_k5p3uf"])
def test_gfloat_agrees_where_it_follows_the_draft(name):
    """gfloat's sat=True is SatFinite, sat=False SatNone.  Left out, as docs/semantics.md says:
    negative inputs into unsigned formats (gfloat does not saturate them at 0), ties-to-away
    below the smallest subnormal (gfloat's float64 ``delta + 0.5 >= 1`` rounds the float just
    below the tie up) and round-to-odd where gfloat has no ``RoundMode.ToOdd`` (before 0.6)."""
    fmt = P3109_FORMATS[name]
    gf, fi = _gfloat_format(fmt)
    codes = np.arange(fmt.num_codes)
    want = np.array([gf.decode_float(fi, int(c)).fval for c in codes])
    assert np.array_equal(fpsim.decode(codes, fmt), want, equal_nan=True)
    modes = {"rne": "TiesToEven", "rna": "TiesToAway", "rtz": "TowardZero",
             "rup": "TowardPositive", "rdown": "TowardNegative", "rto": "ToOdd"}
    x = dense_inputs(fmt)
    if not fmt.signed:
        x = x[~(np.signbit(x) & ~np.isnan(x))]
    for mode, gmode in modes.items():
        if not hasattr(gf.RoundMode, gmode):
            continue
        xs = x[~(np.abs(x) < fmt.min_subnormal)] if mode == "rna" else x
        for sat, saturate in ((False, False), (True, "finite")):
            got = fpsim.encode(xs, fmt, rounding=mode, saturate=saturate)
            ref = [gf.encode_float(fi, gf.round_float(fi, float(v), getattr(gf.RoundMode, gmode),
                                                      sat)) for v in xs]
            bad = np.nonzero(got != np.array(ref))[0]
            assert bad.size == 0, (mode, sat, xs[bad[:4]], got[bad[:4]], np.array(ref)[bad[:4]])
