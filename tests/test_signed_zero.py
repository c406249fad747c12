"""IEEE 754 section 6.3 signed zeros in the emulated accumulators, every order and engine.

An exactly zero sum x + (-x) is +0 in every mode but rounding toward negative ("rdown"), where
it is -0; (-0) + (-0) is -0 and (+0) + (+0) is +0 in every mode.  The references are the exact
Fraction loops of test_arith, whose ``add_rounded`` applies that rule.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_arith import (DIRECTED, add_rounded, identity, ref_dot, ref_pairwise,
                        round_fraction, same_bits)

import fpsim
from fpsim import get_format

FP32 = get_format("fp32")
ENGINES = ("numpy", "torch")
VALUES = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 3.0, -3.0, 2.0**-24, -(2.0**-24)]


def ref_chunked(xs, ys, accum: str, mode: str, chunk: int) -> float:
    """Blocks of ``chunk`` terms summed in ``accum`` with ``mode``, each added to an FP32 outer
    sum rounded to nearest even (DeepSeek-V3's promotion)."""
    outer = -0.0
    for k0 in range(0, len(xs), chunk):
        block = ref_dot(xs[k0:k0 + chunk], ys[k0:k0 + chunk], accum, mode)
        outer = add_rounded(outer, block, FP32, "rne")
    return outer


def run(xs, ys, engine, **kw):
    out = fpsim.dot(np.array(xs, np.float32), np.array(ys, np.float32), backend=engine, **kw)
    return np.asarray(out.numpy() if hasattr(out, "numpy") else out, np.float64)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("order", ["sequential", "pairwise", "fma", "chunked"])
def test_cancellation_is_minus_zero_only_under_rdown(order, engine):
    kw = {"chunk": 2} if order == "chunked" else {}
    for mode in DIRECTED:
        got = run([1.0, -1.0], [1.0, 1.0], engine, accum="fp16", order=order, rounding=mode,
                  **kw)
        assert same_bits(got, -0.0 if mode == "rdown" else 0.0), (mode, got)
        for z in (0.0, -0.0):                             # z + z keeps the sign of z
            got = run([z, z], [1.0, 1.0], engine, accum="fp16", order=order, rounding=mode,
                      **kw)
            assert same_bits(got, z), (mode, z, got)


@pytest.mark.parametrize("engine", ENGINES)
def test_every_order_and_mode_against_the_exact_reference(engine):
    """All sign patterns of short vectors built from cancelling values and signed zeros."""
    for xs in itertools.product([1.0, -1.0, 0.0, -0.0], repeat=3):
        ys = [1.0, 1.0, 1.0]
        for mode in DIRECTED:
            opts = dict(accum="bf16", rounding=mode)
            assert same_bits(run(xs, ys, engine, **opts), ref_dot(xs, ys, "bf16", mode))
            assert same_bits(run(xs, ys, engine, order="pairwise", **opts),
                             ref_pairwise(xs, ys, "bf16", mode))
            assert same_bits(run(xs, ys, engine, order="chunked", chunk=2, **opts),
                             ref_chunked(xs, ys, "bf16", mode, 2))


@settings(max_examples=150, deadline=None)
@given(xs=st.lists(st.sampled_from(VALUES), min_size=1, max_size=9), data=st.data(),
       mode=st.sampled_from(DIRECTED), order=st.sampled_from(["sequential", "pairwise"]))
def test_property_signed_zeros(xs, data, mode, order):
    ys = data.draw(st.lists(st.sampled_from(VALUES), min_size=len(xs), max_size=len(xs)))
    ref = (ref_dot if order == "sequential" else ref_pairwise)(xs, ys, "fp16", mode)
    assert same_bits(run(xs, ys, "numpy", accum="fp16", order=order, rounding=mode), ref)


def test_rounded_products_and_output_keep_the_rule():
    """product= rounds each product first; a tiny negative product under rdown is not zero."""
    xs, ys = [2.0**-20, -(2.0**-20)], [2.0**-20, 2.0**-20]
    got = run(xs, ys, "numpy", accum="fp16", product="fp16", rounding="rdown", output="bf16")
    p = [round_fraction(Fraction(x) * Fraction(y), get_format("fp16"), "rdown")
         for x, y in zip(xs, ys)]
    acc = identity("rdown")
    for v in p:
        acc = add_rounded(acc, v, get_format("fp16"), "rdown")
    assert same_bits(got, acc)


def test_docstring_states_the_rule():
    assert "6.3" in fpsim.matmul.__doc__ and "rdown" in fpsim.matmul.__doc__


def test_compiled_engine_keeps_the_sign():
    pytest.importorskip("torch")
    for mode in ("rdown", "rne"):
        got = run([1.0, -1.0, 0.5, -0.5], [1.0] * 4, "compiled", accum="fp16", rounding=mode)
        assert same_bits(got, -0.0 if mode == "rdown" else 0.0)
