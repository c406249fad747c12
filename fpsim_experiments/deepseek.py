"""Experiment ``deepseek-accumulation``: can modelled Hopper FP8 sums give DeepSeek-V3's "nearly 2%"?

DeepSeek-V3 (arXiv 2412.19437, §3.3.2) reports that Hopper's FP8 tensor cores keep about 14 bits
when they accumulate, so that a GEMM of two random matrices with K = 4096 has a maximum relative
error of nearly 2%; their fix is to promote partial sums to FP32 every N_C = 128 products.
fpsim's ``hopper_fp8`` model (after MMA-Sim: groups of 32 exact products aligned to the largest
exponent and truncated to 13 fraction bits, the result truncated to E8M13, a 14-bit significand)
gives 7% on uniform [0, 1) inputs.  This experiment measures where the two differ:

* synthetic operands: uniform [0, 1) and normal(r, 1) for several mean/std ratios r, rounded to
  E4M3FN; K = 128 … 8192 (a smaller K sums the leading part of the same operands);
  ``hopper_fp8`` keeping 12 … 16 fraction bits (E8M<bits> result), with and without promotion
  to FP32 every 128 products;
* the tiny GPT-2's linear layers on captured operands under DeepSeek-V3's fine-grained scaling:
  1×128 activation tiles and 128×128 weight blocks of E4M3FN elements with FP32 scales
  (amax / 448).  The tensor core sums each 128-long block of raw elements; the CUDA cores multiply
  the block sum by its two scales and add it to an FP32 sum (DeepSeek-V3's promotion).  Per-block
  FP32 scales cannot enter a tensor-core sum, so "no promotion" is measured on the same sites
  with power-of-two (E8M0) scales, whose scaled products stay exact: one tensor-core sum then
  runs over the whole K, beside the promoted sum of the very same operands.

Errors are against the FP64 product of the same quantized operands (exact for the synthetic
ones), so they are the accumulator's alone: ``max``, the largest relative error |y − x| / |x| over
64 outputs (an 8×8 GEMM, or 64 columns of one token row), averaged over trials or rows;
``normwise``, ‖Y − X‖ / ‖X‖; ``signed``, Σ sign(x)·(y − x) / Σ |x|, negative when results shrink
toward zero, which is the bias truncation gives.  95% bootstrap intervals (1000 resamples,
seeded) resample trials (independent GEMMs) or token rows.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

import fpsim
from fpsim.arith import TENSOR_CORES, TensorCoreModel

from .bootstrap import digits_apart
from .context import Captured, Context
from .report import figure, num, pct, quick_note, save, table

NAME = "deepseek-accumulation"
PRESET = TENSOR_CORES["hopper_fp8"]
ELEMENTS = "e4m3fn"
BLOCK = 128          # DeepSeek-V3's promotion interval N_C, and its scaling tile
TRIAL = 8            # a synthetic trial is one independent TRIAL×K by K×TRIAL GEMM
CHECK_K = 4096       # the K of DeepSeek-V3's figure
NEARLY_2 = (0.015, 0.025)
RESAMPLES = 1000
SEED = 0
UNIFORM = "uniform[0,1)"
#: input distributions and their mean/std ratio (uniform [0, 1): 0.5 / sqrt(1/12))
RATIOS = (0.0, 0.5, 0.75, 1.0, 2.0, 4.0)
POST_HOC = 0.75     # the mean/std ratio added after the others were seen (reports say so)
DISTRIBUTIONS: dict[str, float] = {UNIFORM: math.sqrt(3), **{f"normal({r:g},1)": r for r in RATIOS}}
METRICS = ("max", "normwise", "signed")
VARIANTS = ("fp32 scales, promoted", "e8m0 scales, promoted", "e8m0 scales, no promotion")
DEEPSEEK = VARIANTS[0]


@dataclass(frozen=True)
class Sizes:
    """What is swept: fraction bits, K, synthetic trials per distribution, GPT-2 rows, columns."""

    frac_bits: tuple[int, ...]
    ks: tuple[int, ...]
    trials: int
    rows: int
    cols: int


FULL = Sizes((12, 13, 14, 15, 16), (128, 256, 512, 1024, 2048, 4096, 8192), 16, 32, 64)
QUICK = Sizes((13, 15), (128, 1024, CHECK_K), 4, 6, 64)


def model(frac_bits: int) -> TensorCoreModel:
    """``hopper_fp8`` keeping ``frac_bits`` bits below the group's largest exponent, with an
    E8M<frac_bits> result (13 is the preset)."""
    return dataclasses.replace(PRESET, frac_bits=frac_bits, accum=f"e8m{frac_bits}",
                               name=f"{PRESET.name}/{frac_bits}")


# --------------------------------------------------------------------------------------------
# Arithmetic: one tensor-core sum, DeepSeek-V3's promotion, the exact reference
# --------------------------------------------------------------------------------------------
def tensor_core(a: np.ndarray, b: np.ndarray, tc: TensorCoreModel,
                inputs: str | None = ELEMENTS) -> np.ndarray:
    """``a @ b`` summed by the tensor core over the whole K (no promotion), as float64."""
    y = fpsim.matmul(a, b, inputs=inputs, order="tensor_core", tensor_core=tc, backend="numpy")
    return np.asarray(y, dtype=np.float64)


def blocks(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """K cut into BLOCK-long blocks: a (..., M, K) -> (..., nb, M, BLOCK), b (..., K, N) ->
    (..., nb, BLOCK, N)."""
    k = a.shape[-1]
    if k % BLOCK or b.shape[-2] != k:
        raise ValueError(f"K={k} with b of shape {b.shape}: K must be a multiple of {BLOCK}")
    ab = np.moveaxis(a.reshape(*a.shape[:-1], k // BLOCK, BLOCK), -2, -3)
    return ab, b.reshape(*b.shape[:-2], k // BLOCK, BLOCK, b.shape[-1])


def promoted(a: np.ndarray, b: np.ndarray, tc: TensorCoreModel,
             scale: np.ndarray | None = None) -> np.ndarray:
    """DeepSeek-V3's promotion: the tensor core sums each BLOCK-long block of K of the E4M3
    elements; each block sum is multiplied by ``scale`` (FP32, shaped (..., nb, M, N): the product
    of the block's two scales; None: 1) and added to an FP32 sum, each step rounded to nearest
    even in FP32.  Returns that sum after every block, shaped (nb, ..., M, N): entry j is the
    result for K = (j + 1) * BLOCK.  With ``scale=None`` this is ``fpsim.matmul(...,
    tensor_core=tc, chunk=BLOCK)`` for every K at once."""
    ab, bb = blocks(a, b)
    part = np.moveaxis(np.asarray(fpsim.matmul(ab, bb, inputs=ELEMENTS, order="tensor_core",
                                               tensor_core=tc, backend="numpy"), np.float32), -3, 0)
    if scale is not None:
        part = np.moveaxis(scale.astype(np.float32), -3, 0) * part
    out = np.empty_like(part)
    total = np.full(part.shape[1:], -0.0, np.float32)
    for j, p in enumerate(part):
        total = total + p
        out[j] = total
    return out


def exact(a: np.ndarray, b: np.ndarray, scale: np.ndarray | None = None) -> np.ndarray:
    """FP64 sums of the same operands after every block, shaped (nb, ..., M, N) as
    ``promoted`` (``scale``: FP64 products of the block scales).  Exact for E4M3 elements
    without scales (every partial sum fits float64's 53 bits); with scales, to FP64 rounding."""
    ab, bb = blocks(a, b)
    part = np.moveaxis(ab @ bb, -3, 0)
    if scale is not None:
        part = np.moveaxis(scale, -3, 0) * part
    return np.cumsum(part, axis=0)


# --------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------
def unit_stats(y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Per unit (the leading axis; the rest are its outputs): the largest |y - x| / |x| (outputs
    with x = 0 left out), Σ(y - x)², Σx², Σ sign(x)(y - x), Σ|x|; shaped (units, 5)."""
    e = (y - x).reshape(len(x), -1)
    x = x.reshape(len(x), -1)
    rel = np.abs(e) / np.where(x == 0, np.inf, np.abs(x))
    return np.stack([rel.max(1), (e * e).sum(1), (x * x).sum(1), (np.sign(x) * e).sum(1),
                     np.abs(x).sum(1)], axis=1)


def metrics(stats: np.ndarray) -> np.ndarray:
    """``max`` (mean over units of their largest relative error), ``normwise`` and ``signed``
    from unit statistics shaped (..., units, 5); returns (..., 3)."""
    s = stats.sum(-2)
    return np.stack([stats[..., 0].mean(-1), np.sqrt(s[..., 1] / s[..., 2]), s[..., 3] / s[..., 4]],
                    axis=-1)


def resamples(units: int, seed: int = SEED) -> np.ndarray:
    """RESAMPLES bootstrap draws of ``units`` unit indices (seeded: the same every run)."""
    return np.random.default_rng(seed).integers(0, units, (RESAMPLES, units))


def summarize(stats: np.ndarray) -> dict[str, Any]:
    """Point value and 95% percentile bootstrap interval of every metric, and ``max_all``: the
    largest relative error of any output."""
    point, boot = metrics(stats), metrics(stats[resamples(len(stats))])
    lo, hi = np.percentile(boot, [2.5, 97.5], axis=0)
    out: dict[str, Any] = {m: {"value": float(point[i]), "lo": float(lo[i]), "hi": float(hi[i])}
                           for i, m in enumerate(METRICS)}
    return {**out, "max_all": float(stats[:, 0].max())}


def _parallel(jobs: dict[Any, Callable[[], Any]], workers: int) -> dict[Any, Any]:
    """Run independent jobs on ``workers`` threads (NumPy releases the GIL), in the order given
    (put the longest first); results keyed as ``jobs``."""
    with ThreadPoolExecutor(max(1, workers)) as pool:
        futures = {key: pool.submit(job) for key, job in jobs.items()}
        return {key: f.result() for key, f in futures.items()}


# --------------------------------------------------------------------------------------------
# Synthetic operands
# --------------------------------------------------------------------------------------------
def draw(dist: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Samples of a distribution of ``DISTRIBUTIONS``."""
    if dist == UNIFORM:
        return rng.random(shape)
    return rng.normal(DISTRIBUTIONS[dist], 1.0, shape)


def synthetic_operands(trials: int, k: int, seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """E4M3FN operands of ``trials`` independent TRIAL×k by k×TRIAL GEMMs per distribution,
    stacked in ``DISTRIBUTIONS`` order: (len(DISTRIBUTIONS) * trials, ...)."""
    a, b = [], []
    for i, dist in enumerate(DISTRIBUTIONS):
        rng = np.random.default_rng([seed, i])
        a.append(draw(dist, (trials, TRIAL, k), rng))
        b.append(draw(dist, (trials, k, TRIAL), rng))
    return fpsim.quantize(np.concatenate(a), ELEMENTS), fpsim.quantize(np.concatenate(b), ELEMENTS)


def synthetic(sizes: Sizes, workers: int) -> list[dict[str, Any]]:
    """Every distribution, fraction-bit setting and K, with and without promotion."""
    kmax = max(sizes.ks)
    a, b = synthetic_operands(sizes.trials, kmax)
    ref = exact(a, b)
    jobs: dict[Any, Callable[[], Any]] = {}
    for k in sorted(sizes.ks, reverse=True):
        for f in sizes.frac_bits:
            jobs[(f, k)] = lambda f=f, k=k: tensor_core(a[..., :k], b[..., :k, :], model(f))
            if k == kmax:
                jobs[(f, "promoted")] = lambda f=f: promoted(a, b, model(f))
    done = _parallel(jobs, workers)
    out = []
    for f in sizes.frac_bits:
        for promote in (False, True):
            for k in sizes.ks:
                y = done[(f, "promoted")][k // BLOCK - 1] if promote else done[(f, k)]
                x = ref[k // BLOCK - 1]
                shape = (len(DISTRIBUTIONS), sizes.trials, -1)
                for dist, yd, xd in zip(DISTRIBUTIONS, y.reshape(shape), x.reshape(shape)):
                    out.append({"distribution": dist, "ratio": DISTRIBUTIONS[dist], "frac_bits": f,
                                "promoted": promote, "k": k, **summarize(unit_stats(yd, xd))})
    return out


# --------------------------------------------------------------------------------------------
# GPT-2 operands under DeepSeek-V3's fine-grained scaling
# --------------------------------------------------------------------------------------------
def fine_grained(a: np.ndarray, w: np.ndarray, scale_dtype: str) -> tuple[np.ndarray, ...]:
    """DeepSeek-V3's fine-grained FP8: E4M3FN elements, one scale (amax / 448) per 1×BLOCK tile
    of the activation ``a`` (rows, K) and per BLOCK×BLOCK block of the weight ``w`` (K, N).
    Returns the elements (unscaled) and scales: a's (rows, K), (rows, K/BLOCK); w's (K, N),
    (K/BLOCK, N/BLOCK).  K and N off the BLOCK grid (GPT-2's vocabulary, 50257) are padded
    with zeros, as a GEMM library pads its last tile: zeros change no amax and add exact zero
    products, so the arrays returned are the padded ones."""
    pad_k, pad_n = -w.shape[0] % BLOCK, -w.shape[1] % BLOCK
    a = np.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, pad_k)])
    w = np.pad(w, [(0, pad_k), (0, pad_n)])
    k, n = w.shape
    qa = fpsim.scaled_quantize(a, ELEMENTS, granularity=("block", BLOCK), axis=-1,
                               scale_dtype=scale_dtype)
    tiles = w.reshape(k // BLOCK, BLOCK, n // BLOCK, BLOCK).transpose(0, 2, 1, 3)
    qw = fpsim.scaled_quantize(tiles.reshape(k // BLOCK, n // BLOCK, -1), ELEMENTS,
                               granularity=("block", BLOCK * BLOCK), axis=-1,
                               scale_dtype=scale_dtype)
    cw = fpsim.decode(qw.codes, ELEMENTS).reshape(k // BLOCK, n // BLOCK, BLOCK, BLOCK)
    return (fpsim.decode(qa.codes, ELEMENTS), np.asarray(qa.scales, np.float32),
            cw.transpose(0, 2, 1, 3).reshape(k, n),
            np.asarray(qw.scales, np.float32).reshape(k // BLOCK, n // BLOCK))


def sign_imbalance(a: np.ndarray, w: np.ndarray, ref: np.ndarray) -> float:
    """Mean over outputs of sign(output) · (P(product > 0) − P(product < 0)) along K: 1 when
    every product has the sign of the sum (uniform [0, 1) inputs), 0 when signs cancel."""
    return float(np.mean(np.sign(ref) * (np.sign(a) @ np.sign(w)) / a.shape[-1]))


def site_jobs(a: np.ndarray, w: np.ndarray, cols: np.ndarray,
              frac_bits: tuple[int, ...]) -> tuple[dict, dict, float]:
    """One linear site's GEMM under every variant and fraction-bit setting: the jobs (keyed by
    variant and bits), the exact references (keyed by variant) and the products' sign
    imbalance (``sign_imbalance``, on the FP32-scaled elements)."""
    jobs, refs = {}, {}
    for scale_dtype in ("fp32", "e8m0"):
        ca, sa, cw, sw = fine_grained(a, w, scale_dtype)
        cw, sw = cw[:, cols], sw[:, cols // BLOCK]                   # (K, C), (nb, C)
        s32 = (sa.T[:, :, None] * sw[:, None, :]).astype(np.float32)  # FP32 product, as on GPU
        s64 = sa.T.astype(np.float64)[:, :, None] * sw[:, None, :]   # exact
        name = f"{scale_dtype} scales, promoted"
        refs[name] = exact(ca, cw, s64)[-1]
        if scale_dtype == "fp32":
            imb = sign_imbalance(ca[:, :a.shape[-1]], cw[:a.shape[-1]], refs[name])  # unpadded K
        for f in frac_bits:
            jobs[(name, f)] = lambda f=f, ca=ca, cw=cw, s=s32: promoted(ca, cw, model(f), s)[-1]
        if scale_dtype == "e8m0":       # powers of two: scaled products stay exact
            va = ca * np.repeat(sa, BLOCK, axis=1)
            vw = cw * np.repeat(sw, BLOCK, axis=0)
            refs[VARIANTS[2]] = refs[name]
            for f in frac_bits:
                jobs[(VARIANTS[2], f)] = lambda f=f, va=va, vw=vw: tensor_core(va, vw, model(f),
                                                                               inputs=None)
    return jobs, refs, imb


def gpt2(ctx: Context, sizes: Sizes, workers: int) -> dict[str, Any]:
    """The linear sites' GEMMs on ``sizes.rows`` captured token rows and ``sizes.cols`` output
    columns per site: per site and pooled over sites (a row's unit statistics summed over
    sites; ``max`` then averages the per-site row maxima)."""
    rng = np.random.default_rng(SEED)
    tokens = ctx.capture_tokens
    rows = np.sort(rng.choice(tokens, sizes.rows, replace=False))
    jobs, refs, imb, ks = {}, {}, {}, {}

    def each(c: Captured) -> None:          # keeps the sampled rows and columns only
        site, name = c.full, c.name
        if site.kind != "linear":
            return
        a = site.a.reshape(-1, site.reduction)[rows].cpu().numpy()  # FP32, scaled in FP32
        w = site.b.cpu().numpy()
        cols = np.sort(rng.choice(w.shape[1], sizes.cols, replace=False))
        site_job, refs[name], imb[name] = site_jobs(a, w, cols, sizes.frac_bits)
        jobs.update({(name, *key): job for key, job in site_job.items()})
        ks[name] = site.reduction

    ctx.stream(each)
    done = _parallel(jobs, workers)
    runs = []
    for variant in VARIANTS:
        for f in sizes.frac_bits:
            per_site = {n: unit_stats(done[(n, variant, f)], refs[n][variant]) for n in ks}
            for n, st in per_site.items():
                runs.append({"variant": variant, "frac_bits": f, "site": n,
                             "k": ks[n], **summarize(st)})
            st = np.stack(list(per_site.values()))
            pooled = np.concatenate([st[..., :1].mean(0), st[..., 1:].sum(0)], axis=1)
            runs.append({"variant": variant, "frac_bits": f, "site": "all", "k": None,
                         **summarize(pooled)})
    return {"rows": int(sizes.rows), "cols": int(sizes.cols), "tokens": int(tokens),
            "sites": ks, "imbalance": imb, "runs": runs}


def run(ctx: Context) -> dict[str, Any]:
    """The synthetic sweep and the GPT-2 sites; threads as torch's (``--threads``)."""
    sizes = QUICK if ctx.quick else FULL
    workers = torch.get_num_threads()
    return {"settings": {"preset": dataclasses.asdict(PRESET), "elements": ELEMENTS,
                         "block": BLOCK, "trial": [TRIAL, TRIAL], "trials": sizes.trials,
                         "frac_bits": list(sizes.frac_bits), "ks": list(sizes.ks),
                         "distributions": DISTRIBUTIONS, "nearly_2": list(NEARLY_2),
                         "resamples": RESAMPLES, "seed": SEED},
            "synthetic": synthetic(sizes, workers), "gpt2": gpt2(ctx, sizes, workers)}


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------
def imbalance(dist: str) -> float:
    """P(product > 0) − P(product < 0) for two independent samples of ``dist``: 1 for uniform
    [0, 1), erf(r / √2)² for normal(r, 1) (2Φ(r) − 1 is the sign imbalance of one factor)."""
    return 1.0 if dist == UNIFORM else math.erf(DISTRIBUTIONS[dist] / math.sqrt(2)) ** 2


def _pick(rows: list[dict], **where: Any) -> dict:
    found = [r for r in rows if all(r[k] == v for k, v in where.items())]
    if len(found) != 1:
        raise KeyError(f"{len(found)} results match {where}")
    return found[0]


def ci(m: dict, percent: bool = True) -> str:
    """``value [lo, hi]`` of a metric, as percentages or in 3 significant digits."""
    d = digits_apart(m["lo"], m["hi"])
    if percent:
        return f"{pct(m['value'], d)} [{pct(m['lo'], d)}, {pct(m['hi'], d)}]"
    return f"{num(m['value'], d)} [{num(m['lo'], d)}, {num(m['hi'], d)}]"


def verdict(m: dict) -> str:
    """Whether a maximum error is "nearly 2%": its CI inside NEARLY_2 ("yes"), outside ("no"),
    or straddling a bound ("undecided")."""
    lo, hi = NEARLY_2
    if lo <= m["lo"] and m["hi"] <= hi:
        return "yes"
    return "no" if m["hi"] < lo or m["lo"] > hi else "undecided"


def _disjoint(a: dict, b: dict) -> bool:
    return a["hi"] < b["lo"] or b["hi"] < a["lo"]


def conclusions(data: dict) -> list[str]:
    """Which settings give "nearly 2%" at K = 4096, the mechanism, promotion, and GPT-2."""
    syn, s = data["synthetic"], data["settings"]
    bits, hw, k = s["frac_bits"], PRESET.frac_bits, CHECK_K
    kmin, kmax = min(s["ks"]), max(s["ks"])
    at = {(r["distribution"], r["frac_bits"]): r for r in syn if r["k"] == k and not r["promoted"]}
    uni = at[(UNIFORM, hw)]
    out = [f"Without promotion, the Hopper FP8 model ({hw} fraction bits) at K = {k} on "
           f"uniform [0, 1) inputs gives a maximum relative error (over 64 outputs) of "
           f"{ci(uni['max'])}; the signed error is {ci(uni['signed'])}: almost all of it is a "
           "one-sided bias (results too small), not noise."]
    yes = [f"{d} at {f} bits ({pct(r['max']['value'])})" for (d, f), r in at.items()
           if verdict(r["max"]) == "yes"]
    by = {v: [f"{d} ({pct(at[(d, hw)]['max']['value'])})" for d in DISTRIBUTIONS
              if verdict(at[(d, hw)]["max"]) == v] for v in ("no", "undecided")}
    lo, hi = NEARLY_2
    out.append(f'"Nearly 2%" at K = {k} (95% CI of the maximum error inside {pct(lo)}–{pct(hi)}): '
               + (", ".join(yes) if yes else "no setting") + f". At {hw} bits, not: "
               + (", ".join(by["no"]) or "none") + "; undecided (CI across a bound): "
               + (", ".join(by["undecided"]) or "none") + ". Uniform [0, 1) inputs at each bit "
               "count: " + ", ".join(f"{f}: {pct(at[(UNIFORM, f)]['max']['value'])}" for f in bits)
               + f". So the {hw}-bit model gives DeepSeek-V3's figure when the products are "
               "mostly, but not all, of one sign; DeepSeek-V3 does not say which random "
               "matrices it used, so this cannot tell whether theirs were of that kind or the "
               "H800 keeps more bits than MMA-Sim's model on all-positive data. A post-hoc "
               f"match: normal({POST_HOC:g},1) joined the sweep after the other "
               f"{len(DISTRIBUTIONS) - 1} distributions had been seen, because its sign imbalance "
               "put it near 2%; its interval (bootstrap over trials, independent GEMMs) covers "
               "those trials, not that choice.")
    ratios = ", ".join(f"{d}: {num(at[(d, hw)]['signed']['value'] / uni['signed']['value'], 2)}"
                       f" (predicted {num(imbalance(d), 2)})"
                       for d in DISTRIBUTIONS if d != UNIFORM)
    out.append("Mechanism: every product is truncated toward zero at 2^-bits of the running sum's "
               "binade, so each addition loses on average up to half that unit, with the sign of "
               "the product. With products of one sign the losses add up: the unit grows with the "
               "sum, so the relative bias grows with K, and it halves with each extra bit. With "
               "both signs the losses cancel except for P(product > 0) − P(product < 0), which "
               f"for normal(r, 1) inputs is erf(r/√2)². Signed error relative to uniform's at {hw} "
               f"bits, K = {k}: {ratios}.")
    grow = [-_pick(syn, distribution=UNIFORM, frac_bits=hw, promoted=False, k=kk)["signed"]["value"]
            for kk in s["ks"]]
    doubling = [b / a for a, b, kk in zip(grow, grow[1:], s["ks"][1:]) if kk >= 2048]
    per_bit = [-at[(UNIFORM, f)]["signed"]["value"] / -at[(UNIFORM, f + 1)]["signed"]["value"]
               for f in bits[:-1] if f + 1 in bits]
    bound = all(-r["signed"]["value"] <= r["k"] * 2.0 ** -r["frac_bits"] / (8 * math.log(2))
                for r in syn if r["distribution"] == UNIFORM and not r["promoted"])
    out.append(f"Uniform inputs at {hw} bits: the signed error grows from {pct(grow[0])} at "
               f"K = {kmin} to {pct(grow[-1])} at K = {kmax}"
               + (f" (×{num(min(doubling), 2)}–{num(max(doubling), 2)} per doubling from "
                  "K = 1024 on)" if doubling else "")
               + (f"; one more bit divides it by {num(min(per_bit), 2)}–{num(max(per_bit), 2)} at "
                  f"K = {k}" if per_bit else "")
               + ". The first-order estimate K·2^-bits / (8 ln 2) (half a unit lost per product "
               f"much wider than the unit; {pct(k * 2.0 ** -hw / (8 * math.log(2)))} here) "
               + ("bounds every uniform measurement from above: E4M3 products have few bits below "
                  "the unit, so they lose less." if bound else
                  "is exceeded by some uniform measurement."))
    zero = at[("normal(0,1)", hw)]
    out.append(f"Zero-mean normal(0,1) inputs: normwise error {ci(zero['normwise'])} and signed "
               f"{ci(zero['signed'])}, but the maximum relative error {ci(zero['max'])} (over all "
               f"{s['trials'] * TRIAL * TRIAL} outputs: {pct(zero['max_all'])}) is set by outputs "
               "that are nearly zero after cancellation and grows with the number of outputs "
               "examined: for such inputs only the normwise error describes the accumulator.")
    prom = {d: _pick(syn, distribution=d, frac_bits=hw, promoted=True, k=k) for d in DISTRIBUTIONS}
    first = {d: _pick(syn, distribution=d, frac_bits=hw, promoted=False, k=kmin)
             for d in DISTRIBUTIONS}
    flat = [d for d in DISTRIBUTIONS
            if prom[d]["normwise"]["value"] <= 1.1 * first[d]["normwise"]["value"]]
    out.append(f"Promotion to FP32 every {BLOCK} (DeepSeek-V3's fix, fpsim's `chunk={BLOCK}`): at "
               f"{hw} bits and K = {k} the maximum error on uniform inputs falls to "
               f"{ci(prom[UNIFORM]['max'])} and the signed error to {ci(prom[UNIFORM]['signed'])}. "
               f"The tensor core never sums more than {BLOCK} products, so the error stops growing "
               f"with K: the normwise error at K = {k} is at most 1.1× that of a single block "
               f"(K = {kmin}) for {len(flat)} of {len(DISTRIBUTIONS)} distributions"
               + (f" (not: {', '.join(d for d in DISTRIBUTIONS if d not in flat)})"
                  if len(flat) < len(DISTRIBUTIONS) else "") + ".")
    out += gpt2_conclusions(data)
    return out


def covers(data: dict) -> str:
    """What the GPT-2 intervals resample: token rows of the captured windows only."""
    from .range_findings import heldout_topics

    g, meta = data["gpt2"], data["meta"]
    n = max(1, g["tokens"] // meta["window"])
    topics = heldout_topics(meta, n)
    where = ("" if topics is None else f", all of held-out topic `{topics[0]}`"
             if len(set(topics)) == 1 else f", from {len(set(topics))} held-out topics")
    return (f"the intervals resample the {g['rows']} token rows, drawn from the {g['tokens']} "
            f"captured tokens of the first {n} held-out windows{where}: they cover the choice "
            "of rows there, not other windows or topics")


def gpt2_conclusions(data: dict) -> list[str]:
    """DeepSeek-V3's recipe on the tiny GPT-2's linear layers, with and without promotion."""
    g, hw = data["gpt2"], PRESET.frac_bits
    if hw not in data["settings"]["frac_bits"]:
        return []
    pooled = {v: _pick(g["runs"], variant=v, frac_bits=hw, site="all") for v in VARIANTS}
    big = [n for n, kk in g["sites"].items() if kk == max(g["sites"].values())]
    worst = max(big, key=lambda n: _pick(g["runs"], variant=VARIANTS[2], frac_bits=hw,
                                         site=n)["normwise"]["value"])
    site = {v: _pick(g["runs"], variant=v, frac_bits=hw, site=worst) for v in VARIANTS}
    ds, e8, np_ = pooled[DEEPSEEK], pooled[VARIANTS[1]], pooled[VARIANTS[2]]
    kbig = g["sites"][worst]
    gauss = [r for r in data["synthetic"] if r["distribution"] == "normal(0,1)" and r["k"] == kbig
             and r["frac_bits"] == hw and not r["promoted"]]
    plain = [_pick(g["runs"], variant=VARIANTS[2], frac_bits=hw, site=n)["normwise"]["value"]
             for n in big]
    tails = (f" Without promotion its K = {kbig} sites reach {pct(min(plain))}–{pct(max(plain))} "
             f"normwise, against {pct(gauss[0]['normwise']['value'])} for normal(0,1) inputs of "
             "the same K: more than their sign imbalance explains (heavier-tailed operands, "
             "whose large products set a group's alignment, are a likely cause; not measured "
             "here)." if gauss and min(plain) > gauss[0]["normwise"]["hi"] else "")
    return [
        f"Tiny GPT-2, {len(g['sites'])} linear sites (K = "
        f"{', '.join(str(kk) for kk in sorted(set(g['sites'].values())))}), {g['rows']} token rows "
        f"× {g['cols']} columns each, DeepSeek-V3's scaling and promotion at {hw} bits: normwise "
        f"error {ci(ds['normwise'])}, signed {ci(ds['signed'])} (all sites pooled; "
        f"{covers(data)}).",
        f"The same operands with power-of-two scales: promoted {ci(e8['normwise'])}, without "
        f"promotion {ci(np_['normwise'])} normwise"
        + (" (the intervals do not overlap)" if _disjoint(e8["normwise"], np_["normwise"])
           else " (the intervals overlap: no measurable difference)")
        + f"; at {worst} (K = {g['sites'][worst]}) {ci(site[VARIANTS[1]]['normwise'])} against "
        f"{ci(site[VARIANTS[2]]['normwise'])}. FP32 against power-of-two scales, both promoted: "
        + ("no measurable difference" if not _disjoint(ds["normwise"], e8["normwise"])
           else "different (intervals do not overlap)")
        + ". The tiny model's products are of mixed sign (sign imbalance "
        f"{num(min(g['imbalance'].values()), 2)}–{num(max(g['imbalance'].values()), 2)} by site; "
        "uniform inputs: 1) and its K ≤ 1024, so its sums stay far below the synthetic worst "
        "case; GPT-2 124M (K up to 3072) and DeepSeek-V3 (K = 7168) sum longer." + tails,
    ]


def _ks(ax: Any, ks: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(kk) for kk in ks], fontsize=7)
    ax.grid(alpha=0.3, which="both")


def _errorbar(ax: Any, x: list, rows: list[dict], key: str, sign: float = 1.0,
              **style: Any) -> Any:
    v = np.array([sign * r[key]["value"] for r in rows])
    lo, hi = np.array([sign * r[key]["lo"] for r in rows]), np.array([sign * r[key]["hi"]
                                                                          for r in rows])
    err = np.abs(np.stack([v - np.minimum(lo, hi), np.maximum(lo, hi) - v]))
    return ax.errorbar(x, v, yerr=err, capsize=2, lw=1.2, ms=3, **style)


def figures(data: dict, out: Path) -> list[str]:
    """Error vs K per distribution and bit count; the mechanism; GPT-2 against bits."""
    syn, s = data["synthetic"], data["settings"]
    ks, bits, hw = s["ks"], s["frac_bits"], PRESET.frac_bits
    colors = dict(zip(bits, ["tab:purple", "tab:red", "tab:orange", "tab:green", "tab:blue"]))
    fig, axes = figure(2, 4, width=3.6, height=3.2)
    for ax, dist in zip(axes.flat, DISTRIBUTIONS):
        for f in bits:
            for promote, ls, alpha in ((False, "-", 1.0), (True, "--", 0.6)):
                rows = [_pick(syn, distribution=dist, frac_bits=f, promoted=promote, k=kk)
                        for kk in ks]
                _errorbar(ax, ks, rows, "max", color=colors[f], ls=ls, marker="o", alpha=alpha,
                          label=f"{f} bits" + (f", promoted every {BLOCK}" if promote else ""))
        ax.axhspan(*NEARLY_2, color="0.85", zorder=0)
        ax.axvline(CHECK_K, color="0.5", ls=":", lw=1)
        ax.set_yscale("log")
        _ks(ax, ks)
        ax.set_title(f"{dist} (mean/std {num(DISTRIBUTIONS[dist], 2)})", fontsize=9)
        ax.set_xlabel("K", fontsize=8)
        ax.set_ylabel("max relative error over 64 outputs", fontsize=7)
    legend = axes.flat[-1]
    legend.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    legend.legend(handles + [plt_patch()], labels + [f"'nearly 2%' band {pct(NEARLY_2[0])}–"
                                                     f"{pct(NEARLY_2[1])}"],
                  loc="center", fontsize=8, title="hopper_fp8 accumulator", title_fontsize=8)
    fig.suptitle("Hopper FP8 tensor-core sums of E4M3 products: maximum relative error against K "
                 "(95% bootstrap CI; dotted: K = 4096)", fontsize=10)
    names = [save(fig, out / "error_vs_k.png")]

    fig, axes = figure(1, 3, width=4.6, height=3.8)
    ax = axes[0, 0]
    for dist in DISTRIBUTIONS:
        rows = [_pick(syn, distribution=dist, frac_bits=hw, promoted=False, k=kk) for kk in ks]
        _errorbar(ax, ks, rows, "signed", sign=-1.0, marker="o", label=dist)
    ax.set_yscale("symlog", linthresh=1e-4)
    _ks(ax, ks)
    ax.set_xlabel("K", fontsize=8)
    ax.set_ylabel("− signed relative error (shrinkage)", fontsize=8)
    ax.set_title(f"bias grows with K ({hw} bits, no promotion)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.18), ncol=2)
    ax = axes[0, 1]
    x = [imbalance(d) for d in DISTRIBUTIONS]
    for f in bits:
        at = {d: _pick(syn, distribution=d, frac_bits=f, promoted=False, k=CHECK_K)
              for d in DISTRIBUTIONS}
        ref = at[UNIFORM]["signed"]["value"]
        ax.plot(x, [at[d]["signed"]["value"] / ref for d in DISTRIBUTIONS], "o",
                color=colors[f], label=f"{f} bits")
    ax.plot([0, 1], [0, 1], "k:", lw=1, label="signed ∝ P(+) − P(−)")
    ax.set_xlabel("P(product > 0) − P(product < 0)", fontsize=8)
    ax.set_ylabel(f"signed error / uniform's (K = {CHECK_K})", fontsize=8)
    ax.set_title("bias follows the products' sign imbalance", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.18), ncol=3)
    ax = axes[0, 2]
    g = data["gpt2"]
    for v, color in zip(VARIANTS, ("black", "tab:blue", "tab:red")):
        rows = [_pick(g["runs"], variant=v, frac_bits=f, site="all") for f in bits]
        _errorbar(ax, bits, rows, "normwise", color=color, marker="o", label=v)
    ax.set_yscale("log")
    ax.set_xticks(bits)
    ax.grid(alpha=0.3, which="both")
    ax.set_xlabel("accumulator fraction bits", fontsize=8)
    ax.set_ylabel("normwise relative error, all linear sites", fontsize=8)
    ax.set_title("tiny GPT-2 linear layers, DeepSeek-V3 scaling", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.18))
    names.append(save(fig, out / "mechanism.png"))
    return names


def plt_patch() -> Any:
    """The legend entry of the 'nearly 2%' band."""
    from matplotlib.patches import Patch
    return Patch(color="0.85")


def render(data: dict, out: Path) -> str:
    """Figures and the Markdown report."""
    syn, s, g, hw = data["synthetic"], data["settings"], data["gpt2"], PRESET.frac_bits
    names = figures(data, out)
    at = {(r["distribution"], r["frac_bits"], r["promoted"]): r for r in syn if r["k"] == CHECK_K}
    t1 = table(["inputs (mean/std)", *(f"{f} bits" for f in s["frac_bits"])],
               [[f"{d} ({num(r, 2)})", *(f"{ci(at[(d, f, False)]['max'])} "
                                         f"{verdict(at[(d, f, False)]['max'])}"
                                         for f in s["frac_bits"])]
                for d, r in DISTRIBUTIONS.items()])
    t2 = table(["inputs", "P(+) − P(−)", "max", "normwise", "signed", "promoted: max",
                "promoted: normwise", "promoted: signed"],
               [[d, num(imbalance(d), 2), *(ci(at[(d, hw, p)][m]) for p in (False, True)
                                             for m in METRICS)] for d in DISTRIBUTIONS]) \
        if hw in s["frac_bits"] else ""
    imb = {**g["imbalance"], "all": float(np.mean(list(g["imbalance"].values())))}

    def cell(variant: str, site: str, metric: str) -> str:
        return ci(_pick(g["runs"], variant=variant, frac_bits=hw, site=site)[metric], False)

    t3 = table(["site", "K", "sign imbalance", *(f"{v}: normwise" for v in VARIANTS),
                f"{DEEPSEEK}: signed", f"{DEEPSEEK}: max"],
               [[n, kk or "-", num(imb[n], 2), *(cell(v, n, "normwise") for v in VARIANTS),
                 cell(DEEPSEEK, n, "signed"), cell(DEEPSEEK, n, "max")]
                for n, kk in [*g["sites"].items(), ("all", None)]]) if hw in s["frac_bits"] else ""
    meta = data["meta"]
    lines = [f"# Can modelled Hopper FP8 sums give DeepSeek-V3's 'nearly 2%'? ({meta['model']})", "",
             *quick_note(meta, size=(
                 f"{QUICK.trials} trials per setting, bits {list(QUICK.frac_bits)}, K "
                 f"{list(QUICK.ks)}, {QUICK.rows} GPT-2 token rows")),
             f"`{PRESET.name}` model: groups of {PRESET.group} exact products and the running sum "
             "aligned to the largest exponent, truncated to the given number of fraction bits, "
             f"summed, truncated to E8M<bits> (the preset keeps {hw}). Synthetic inputs: "
             f"{s['trials']} independent {TRIAL}×K by K×{TRIAL} GEMMs per distribution (a smaller "
             f"K takes the leading part of the same operands), rounded to {ELEMENTS.upper()}. "
             f"GPT-2: DeepSeek-V3's fine-grained scaling (1×{BLOCK} activation tiles, "
             f"{BLOCK}×{BLOCK} weight blocks, {ELEMENTS.upper()}, FP32 scales); "
             "the no-promotion comparison uses power-of-two scales (exact scaled products). "
             "Errors are against the FP64 product of the same quantized operands. max: the "
             "largest relative error over 64 outputs, averaged over trials (GPT-2: token rows); "
             "normwise: ‖Y − X‖/‖X‖; signed: Σ sign(x)(y − x)/Σ|x| (negative: too small). "
             f"Brackets: 95% bootstrap CI over trials or rows ({s['resamples']} resamples).", "",
             "## Conclusions", ""]
    lines += [f"- {c}" for c in conclusions(data)]
    lines += ["", f"![error vs K]({names[0]})", "", f"![mechanism]({names[1]})", "",
              f"## Maximum relative error at K = {CHECK_K}, no promotion", "",
              f'"yes": CI inside {pct(NEARLY_2[0])}–{pct(NEARLY_2[1])} ("nearly 2%"); "no": '
              "outside; otherwise undecided.", "", t1, "",
              f"## {hw} bits (the Hopper preset), K = {CHECK_K}", "", t2, "",
              f"## Tiny GPT-2 linear sites, {hw} bits", "",
              f"{g['rows']} of {g['tokens']} captured token rows, {g['cols']} output columns per "
              "site; 'all': every site pooled.", "", t3]
    return "\n".join(lines) + "\n"
