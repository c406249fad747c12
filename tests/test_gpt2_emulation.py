"""The GPT-2 experiments' end-to-end numbers stay bit for bit what they were.

``tests/data/gpt2_emulation_before.json`` holds, for a few quick recipes on the embedded tiny
GPT-2, the SHA-256 of the logits' bytes and the comparison metrics, recorded with the code of
``main`` before the experiments' arithmetic moved onto :func:`fpsim.emulate`.  Regenerate
only on purpose: ``PYTHONPATH=. python tests/test_gpt2_emulation.py``.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import torch

from fpsim_experiments.context import DEFAULT_MODEL
from fpsim_experiments.endtoend import RecipeRun, compare, logits
from fpsim_experiments.gpt2.checkpoint import load_gpt2
from fpsim_experiments.recipes import FP32, FP64, Recipe

FIXTURE = Path(__file__).parent / "data" / "gpt2_emulation_before.json"
E4M3 = Recipe("e4m3", scaling="tensor", name="e4m3 tensor")
RECIPES = {
    "fp32": FP32,
    "fp64": FP64,
    "e4m3 per-tensor": E4M3,
    "e3m4 unscaled, saturating": Recipe("e3m4", saturate=True, name="e3m4"),
    "e3m2 unscaled": Recipe("e3m2"),
    "mxfp8 e4m3": Recipe("mxfp8_e4m3", scaling="block", name="mxfp8"),
    "bf16 output, fp32 accum": Recipe("bf16", output="bf16", name="bf16"),
    "e5m2 lm_head only": {"lm_head": Recipe("e5m2")},
    "fp16 accumulator, attention": {f"h{i}.attn.{s}": Recipe(accum="fp16",
                                                            order="sequential", name="fp16 acc")
                                    for i in range(4) for s in ("qk", "av")},
}


def numbers(tolerances: dict[str, float] | None = None) -> dict[str, dict]:
    """Per recipe: SHA-256 of the logits (float32 bytes), the metrics and the event counts;
    ``tolerances`` (when given) receives each recipe's :func:`kl_tolerance`."""
    model = load_gpt2(DEFAULT_MODEL)
    wins = torch.randint(0, model.config.vocab_size, (2, 33),
                         generator=torch.Generator().manual_seed(5))
    ref = logits(model, wins)
    out = {}
    for name, recipe in RECIPES.items():
        ops = RecipeRun(recipe)
        z = torch.cat(logits(model, wins, ops))
        metrics = compare(model, wins, ref, RecipeRun(recipe))
        metrics.pop("windows")
        out[name] = {"sha256": hashlib.sha256(z.numpy().tobytes()).hexdigest(),
                     "metrics": {k: repr(v) for k, v in metrics.items()},
                     "nonfinite": ops.nonfinite,
                     "events": {k: v for k, v in ops.events.items()
                                if v["overflow"] or v["saturated"] or v["flushed"]}}
        if tolerances is not None:
            tolerances[name] = kl_tolerance(torch.cat(ref), z)
    return out


#: How many FP32 units in the last place a reference logit may move between hosts: the FP32
#: reference is deterministic but for its transcendentals (softmax's exp, GELU's tanh), which
#: torch evaluates with the host's vector kernels, each to within an ulp; a few such steps
#: upstream of a logit move it by a few ulps of the logits' largest magnitude.
REFERENCE_ULPS = 8


def kl_tolerance(r: torch.Tensor, z: torch.Tensor) -> float:
    """A bound on how far the mean KL(p_r || p_z) can move when the reference logits ``r``
    move by ``REFERENCE_ULPS`` FP32 ulps of their row's largest magnitude: dKL/dr_j =
    p_j (log p_j - log q_j - KL), so |dKL| <= max|dr| * sum_j p_j |log p_j/q_j - KL| per
    position, averaged over the positions whose logits are finite; plus the float64
    evaluation's own rounding (1e-12 relative)."""
    r, z = r.double().flatten(0, -2), z.double().flatten(0, -2)
    fin = torch.isfinite(z).all(-1)
    if not fin.any():
        return 0.0
    r, z = r[fin], z[fin]
    logp, logq = torch.log_softmax(r, -1), torch.log_softmax(z, -1)
    d = logp - logq
    kl = (logp.exp() * d).sum(-1, keepdim=True)
    spread = (logp.exp() * (d - kl).abs()).sum(-1)
    ulp = torch.exp2(torch.floor(torch.log2(r.abs().amax(-1))) - 23)
    return float((REFERENCE_ULPS * ulp * spread).mean())


def same_metric(got: str, want: str, abs_tol: float = 0.0) -> bool:
    """The metrics are float64 sums of ``log_softmax``/``exp`` over the logits: their last bits
    follow torch's vectorised transcendental kernels and reduction split, which differ between
    machines and torch builds (on a 2-core EPYC, with the logits' SHA-256 unchanged, a KL of
    2.85e-5 moved by 9e-17: 3e-12 relative, as KL is a small difference of log-probabilities of
    size 1-20, each good to ~1e-15).  The logits themselves are compared bit for bit, by hash.
    KL also reads the FP32 reference logits, which may move by a few ulps between hosts
    (``abs_tol``: :func:`kl_tolerance`; on an AVX-512 host a KL of 2.85e-5 moved by 1.8e-11)."""
    g, w = float(got), float(want)
    return (math.isnan(g) and math.isnan(w)) or math.isclose(g, w, rel_tol=1e-12,
                                                             abs_tol=max(abs_tol, 1e-15))


def test_gpt2_numbers_are_unchanged() -> None:
    want = json.loads(FIXTURE.read_text())
    tol: dict[str, float] = {}
    got = numbers(tol)
    assert set(got) == set(want)
    for name in want:
        g, w = dict(got[name]), dict(want[name])
        gm, wm = g.pop("metrics"), w.pop("metrics")
        assert g == w, name                           # logits' SHA-256, events, non-finite counts
        assert set(gm) == set(wm), name
        for k in wm:
            slack = tol[name] if k in ("kl", "kl_finite") else 0.0
            assert same_metric(gm[k], wm[k], slack), (name, k, gm[k], wm[k], slack)


def test_kl_tolerance_bounds_a_moved_reference() -> None:
    """Moving the reference logits by a few ulps moves KL by less than the bound, and the bound
    is small against KL itself (it would not hide a changed recipe)."""
    g = torch.Generator().manual_seed(0)
    r = 10 * torch.randn(64, 512, generator=g)
    z = r + 0.1 * torch.randn(64, 512, generator=g)
    step = torch.exp2(torch.floor(torch.log2(r.abs().amax(-1, keepdim=True))) - 23)
    moved = r + step * torch.randint(-4, 5, r.shape, generator=g)
    def kl(a: torch.Tensor) -> float:
        lp, lq = torch.log_softmax(a.double(), -1), torch.log_softmax(z.double(), -1)
        return float((lp.exp() * (lp - lq)).sum(-1).mean())
    bound = kl_tolerance(r, z)
    assert abs(kl(moved) - kl(r)) <= bound < 1e-3 * kl(r)


if __name__ == "__main__":
    FIXTURE.write_text(json.dumps(numbers(), indent=1, sort_keys=True) + "\n")
