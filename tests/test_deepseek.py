"""Experiment ``deepseek-accumulation``: hand-computable sums, promotion, scaling, statistics, and
the quick run's JSON, reproducible to the bit."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import fpsim
from fpsim_experiments import context, deepseek as ds
from fpsim_experiments.report import load_json, write_json

BITS = ds.PRESET.frac_bits


@pytest.fixture(scope="module")
def ctx() -> context.Context:
    return context.build(context.DEFAULT_MODEL, context.QUICK, quick=True)


@pytest.fixture(scope="module")
def data(ctx: context.Context) -> dict:
    return ds.run(ctx)


def test_model_varies_only_the_fraction_bits() -> None:
    assert dataclasses.replace(ds.model(BITS), name=ds.PRESET.name) == ds.PRESET
    m = ds.model(15)
    assert (m.frac_bits, m.accum, m.group, m.rounding) == (15, "e8m15", 32, "rtz")


@pytest.mark.parametrize("bits", [12, 13])
def test_ones_stall_at_twice_two_to_the_bits(bits: int) -> None:
    """Adding 1s: once the sum reaches 2^(bits+1) a 1 lies below the kept bits and truncates to
    0, so K = 2^(bits+1) + 256 ones sum to 2^(bits+1); promoted every 128 they sum exactly."""
    k = 2 ** (bits + 1) + 256
    a, b = np.ones((1, k)), np.ones((k, 1))
    y = ds.tensor_core(a, b, ds.model(bits))
    assert y[0, 0] == 2.0 ** (bits + 1)
    x = ds.exact(a, b)[-1]
    assert x[0, 0] == k
    st = ds.unit_stats(y, x)
    np.testing.assert_array_equal(st[0], [256 / k, 256.0**2, float(k) ** 2, -256, k])
    assert ds.metrics(st).tolist() == pytest.approx([256 / k, 256 / k, -256 / k], rel=1e-15)
    assert ds.promoted(a, b, ds.model(bits))[-1][0, 0] == k


def test_promotion_is_fpsims_chunk_for_every_k() -> None:
    rng = np.random.default_rng(1)
    a = fpsim.quantize(rng.normal(0.5, 1, (3, 4, 512)), ds.ELEMENTS)
    b = fpsim.quantize(rng.normal(0.5, 1, (3, 512, 5)), ds.ELEMENTS)
    got = ds.promoted(a, b, ds.model(BITS))
    for j, k in enumerate(range(128, 513, 128)):
        want = np.asarray(fpsim.matmul(a[..., :k], b[..., :k, :], inputs=ds.ELEMENTS,
                                       order="tensor_core", tensor_core=ds.PRESET, chunk=128))
        assert got[j].dtype == want.dtype == np.float32
        np.testing.assert_array_equal(got[j].view(np.uint32), want.view(np.uint32))


def test_scaled_promotion_rounds_in_fp32_each_step() -> None:
    a, b = np.full((1, 256), 1.0), np.full((256, 1), 1.0)
    scale = np.array([[[1.0]], [[2.0**-30]]], dtype=np.float32)     # (nb, M, N)
    y = ds.promoted(a, b, ds.PRESET, scale)
    assert y[0, 0, 0] == 128 and y[1, 0, 0] == np.float32(128 + 128 * 2.0**-30) == 128
    assert ds.exact(a, b, scale.astype(np.float64))[1, 0, 0] == 128 + 2.0**-23


def test_fine_grained_scales_tiles_and_blocks() -> None:
    rng = np.random.default_rng(2)
    a = rng.normal(0, 1, (3, 256)).astype(np.float32)
    a[1, 128:] *= 100                                  # one tile with a larger amax
    w = np.kron(np.arange(1, 7).reshape(2, 3), np.ones((128, 128))).astype(np.float32)
    ca, sa, cw, sw = ds.fine_grained(a, w, "fp32")
    amax = np.abs(a.reshape(3, 2, 128)).max(-1)
    np.testing.assert_array_equal(sa, (amax / np.float32(448)).astype(np.float32))
    ids = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(sw, ids / np.float32(448))
    assert np.all(cw == 448) and np.abs(ca).max() == 448
    assert np.all(np.isin(np.abs(ca), fpsim.decode(np.arange(127), ds.ELEMENTS)))
    want = fpsim.scaled_quantize(a, ds.ELEMENTS, granularity=("block", 128), axis=-1).values
    np.testing.assert_array_equal((ca * np.repeat(sa, 128, axis=1)).astype(np.float32), want)
    _, s2, _, w2 = ds.fine_grained(a, w, "e8m0")
    assert np.all(np.log2(s2) == np.round(np.log2(s2))) and np.all(np.log2(w2) % 1 == 0)
    # K and N off the 128 grid (GPT-2's lm_head, N = 50257): zero padding, same tiles and blocks
    cut = ds.fine_grained(a[:, :200], w[:200, :300], "fp32")
    padded = ds.fine_grained(np.pad(a[:, :200], [(0, 0), (0, 56)]),
                             np.pad(w[:200, :300], [(0, 56), (0, 84)]), "fp32")
    for got, want in zip(cut, padded):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(cut[2][:200, :300], cw[:200, :300])
    assert cut[2].shape == (256, 384) and np.all(cut[2][200:] == 0) and np.all(cut[0][:, 200:] == 0)


def test_statistics_by_hand() -> None:
    x = np.array([[1.0, -2.0], [4.0, 0.0]])
    y = np.array([[0.5, -2.0], [3.0, 1.0]])
    st = ds.unit_stats(y, x)
    np.testing.assert_array_equal(st, [[0.5, 0.25, 5, -0.5, 3], [0.25, 2, 16, -1, 4]])
    np.testing.assert_allclose(ds.metrics(st), [0.375, np.sqrt(2.25 / 21), -1.5 / 7])
    s = ds.summarize(st)
    assert s["max_all"] == 0.5 and s["max"]["lo"] <= s["max"]["value"] <= s["max"]["hi"]
    assert ds.resamples(5).shape == (ds.RESAMPLES, 5) and ds.RESAMPLES >= 1000
    np.testing.assert_array_equal(ds.resamples(5), ds.resamples(5))


def test_verdict_and_imbalance() -> None:
    assert ds.verdict({"lo": 0.016, "hi": 0.024}) == "yes"
    assert ds.verdict({"lo": 0.010, "hi": 0.014}) == "no"
    assert ds.verdict({"lo": 0.014, "hi": 0.016}) == "undecided"
    assert ds.imbalance(ds.UNIFORM) == 1 and ds.imbalance("normal(0,1)") == 0
    rng = np.random.default_rng(3)
    p = rng.normal(1, 1, 10**6) * rng.normal(1, 1, 10**6)
    assert abs(np.mean(np.sign(p)) - ds.imbalance("normal(1,1)")) < 0.005


def test_quick_run_has_every_result(data: dict) -> None:
    s = data["settings"]
    assert s["frac_bits"] == list(ds.QUICK.frac_bits) and ds.CHECK_K in s["ks"]
    want = {(d, f, p, k) for d in ds.DISTRIBUTIONS for f in s["frac_bits"] for p in (False, True)
            for k in s["ks"]}
    assert {(r["distribution"], r["frac_bits"], r["promoted"], r["k"])
            for r in data["synthetic"]} == want
    for r in data["synthetic"] + data["gpt2"]["runs"]:
        for m in ds.METRICS:
            assert r[m]["lo"] <= r[m]["value"] <= r[m]["hi"], (r, m)
        assert r["max"]["value"] <= r["max_all"]
    g = data["gpt2"]
    assert set(g["sites"].values()) == {256, 1024} and len(g["sites"]) == 17
    assert len(g["runs"]) == len(ds.VARIANTS) * len(s["frac_bits"]) * 18


def test_uniform_at_4096_is_the_issues_seven_percent(data: dict) -> None:
    r = ds._pick(data["synthetic"], distribution=ds.UNIFORM, frac_bits=BITS, promoted=False,
                 k=ds.CHECK_K)
    assert 0.067 < r["max"]["value"] < 0.072 and -0.068 < r["signed"]["value"] < -0.064


def test_promotion_reduces_the_error(data: dict) -> None:
    for d in ds.DISTRIBUTIONS:
        plain, prom = (ds._pick(data["synthetic"], distribution=d, frac_bits=BITS, promoted=p,
                                k=ds.CHECK_K)["normwise"] for p in (False, True))
        assert prom["hi"] < plain["lo"], d
    runs = data["gpt2"]["runs"]
    plain, prom = (ds._pick(runs, variant=v, frac_bits=BITS, site="all")["normwise"]
                   for v in (ds.VARIANTS[2], ds.VARIANTS[1]))
    assert prom["hi"] < plain["lo"]


def test_same_numbers_with_other_thread_counts(ctx: context.Context) -> None:
    sizes = dataclasses.replace(ds.QUICK, frac_bits=(BITS,), ks=(128, 256), trials=3, rows=4)
    one, two = ds.synthetic(sizes, 1), ds.synthetic(sizes, 2)
    assert json.dumps(one) == json.dumps(two)
    again = ds.gpt2(ctx, sizes, 2)["runs"]
    assert json.dumps(again) == json.dumps(ds.gpt2(ctx, sizes, 1)["runs"])


def test_report_renders_from_json(data: dict, ctx: context.Context, tmp_path) -> None:
    data = {**data, "meta": {**ctx.meta(), "seconds": 0.0}}
    write_json(tmp_path / "results.json", data)
    text = ds.render(load_json(tmp_path / "results.json"), tmp_path)
    assert "](error_vs_k.png)" in text and "](mechanism.png)" in text
    assert all((tmp_path / f).stat().st_size > 10_000 for f in ("error_vs_k.png", "mechanism.png"))
    assert '"Nearly 2%" at K = 4096' in text and "Promotion to FP32 every 128" in text
